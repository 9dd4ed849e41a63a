#include <boost/asio/post.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <sys/inotify.h>
#include <unistd.h>

#include "custos/sandbox/admission.hpp"
#include "custos/sys/probes.hpp"

#include "native_execution.hpp"
#include "native_sandbox.hpp"

namespace custos::backend {
namespace {

sys::MarkerSweepOptions sweeper_options(std::uint32_t rounds) {
  sys::MarkerSweepOptions o;
  o.signal = SIGKILL;
  o.max_rounds = rounds;
  return o;
}

}  // namespace

NativeBackend::NativeBackend(boost::asio::io_context& io, NativeConfig config)
    : io_(io),
      config_(std::move(config)),
      sandbox_host_(std::make_unique<SandboxHost const>(probe_sandbox_host(
          config_.instance.empty() ? "pid-" + std::to_string(::getpid()) : config_.instance))),
      alive_(std::make_shared<bool>(true)),
      sweeper_(sweeper_options(config_.marker_sweep_rounds)) {
  if (auto m = sys::find_cgroup2_mount()) {
    // value() after the check rather than operator->: GCC 12 at -O2 cannot see that the latter
    // is non-null there and fails the release build (-Wnull-dereference, -Werror).
    auto const& mount = m.value();
    cgroup_mount_ = mount.path;
    if (config_.detect_nsdelegate) config_.nsdelegate = mount.nsdelegate;
  }
  if (!config_.cgroup_subtree.empty() && config_.boundary != BoundaryPreference::marker) {
    // Not writable or absent: every execution falls back to the marker boundary (and its
    // record says so); the daemon logs the reason at startup.
    if (auto dir = sys::CgroupDir::open(config_.cgroup_subtree)) subtree_ = std::move(*dir);
  }
}

NativeBackend::~NativeBackend() {
  *alive_ = false;
  // A scan still running posts its completion to io_, which finds the execution detached. Join
  // here so no worker outlives the state it reads.
  workers_.join();
}

core::Boundary NativeBackend::boundary() const noexcept {
  return config_.boundary != BoundaryPreference::marker && subtree_ ? core::Boundary::cgroup
                                                                    : core::Boundary::marker;
}

Descriptor NativeBackend::descriptor() const {
  Descriptor d;
  d.kind = core::BackendKind::native;
  d.available = true;
  bool const cg = boundary() == core::Boundary::cgroup;
  d.add("boundary.cgroup", cg ? ControlFidelity::hard : ControlFidelity::none,
        cg ? "a per-execution cgroup v2 beneath " + config_.cgroup_subtree + ", cgroup.kill"
           : "no writable cgroup v2 subtree");
  d.add("boundary.marker", ControlFidelity::sampled,
        "a random marker in the environment, swept from /proc (cooperative)");
  d.add("io.pipes", ControlFidelity::hard, "three pipes");
  d.add("io.pty", ControlFidelity::hard, "a pseudo-terminal, the controlling tty of a new session");
  d.add("resources.cpu_ms", ControlFidelity::sampled, "sampled from the cgroup or /proc");
  // An rlimit bounds each process, not the tree's total (API.md: a per-process rlimit is not
  // enforcement), so the dimension is not `hard`: the tree's total is sampled.
  d.add("resources.descriptors", ControlFidelity::sampled,
        "RLIMIT_NOFILE of every process (per process; the tree's total is sampled)");
  d.add("resources.disk_bytes", ControlFidelity::sampled, "workspace walks off the loop");
  // A child of the subtree gets what the subtree enables for its children.
  std::set<std::string> enabled;
  if (cg) {
    if (auto c = subtree_->subtree_control()) enabled = *c;
  }
  bool const memory = enabled.contains("memory");
  d.add("resources.memory_bytes", memory ? ControlFidelity::hard : ControlFidelity::sampled,
        memory ? "memory.max of the execution's cgroup" : "sampled RSS (no memory controller)");
  d.add("resources.output_bytes", ControlFidelity::hard, "cut at the exact byte by the supervisor");
  bool const pids = enabled.contains("pids");
  d.add("resources.processes", pids ? ControlFidelity::hard : ControlFidelity::sampled,
        pids ? "pids.max of the execution's cgroup" : "sampled (no pids controller)");
  d.add("resources.wall_ms", ControlFidelity::hard, "the supervisor's deadline timer");
  // The sandbox's own controls, hard where this host enforces them (native_sandbox.cpp).
  describe_sandbox(d, *sandbox_host_, cg);
  return d;
}

Admission NativeBackend::admit(core::ExecutionPlan const& plan) const {
  Admission a;
  if (plan.backend.kind != core::BackendKind::native) {
    a.admitted = false;
    a.missing.emplace_back("backend." + std::string{core::to_string(plan.backend.kind)});
    a.detail = "the native backend runs native plans only";
    return a;
  }
  if (config_.boundary == BoundaryPreference::cgroup && !subtree_) {
    a.admitted = false;
    a.missing.emplace_back("boundary.cgroup");
    a.detail = "boundary=cgroup but no writable cgroup subtree";
  }
  return a;
}

std::shared_ptr<BackendExecution> NativeBackend::create(std::string execution_id) {
  return std::make_shared<NativeExecution>(*this, std::move(execution_id));
}

bool NativeBackend::is_root(std::int32_t pid) const {
  // Called per candidate on every reap (SIGCHLD): an index, not a scan of every execution.
  auto it = roots_.find(pid);
  return it != roots_.end() && it->second->is_root_pid(pid);
}

std::optional<std::string> NativeBackend::owner_of(std::int32_t pid) const {
  if (cgroup_owner_.empty()) return std::nullopt;
  auto pdir = sys::open_dir_path("/proc/" + std::to_string(pid));
  if (!pdir) return std::nullopt;
  auto text = sys::read_file_at(*pdir, "cgroup");
  if (!text) return std::nullopt;
  auto path = sys::parse_own_cgroup(*text);
  if (!path) return std::nullopt;
  std::string p = *path;
  if (auto del = p.find(" (deleted)"); del != std::string::npos) p.resize(del);
  auto owner = cgroup_owner_.find(p);
  if (owner == cgroup_owner_.end()) return std::nullopt;
  return owner->second;
}

void NativeBackend::note_root(std::int32_t pid, NativeExecution* exec) {
  if (pid > 0) roots_[pid] = exec;
}

void NativeBackend::forget_root(std::int32_t pid, NativeExecution const* exec) {
  auto it = roots_.find(pid);
  if (it != roots_.end() && it->second == exec) roots_.erase(it);
}

void NativeBackend::note_cgroup(std::string const& rel, std::string const& execution_id) {
  cgroup_owner_[rel] = execution_id;
}

void NativeBackend::forget_cgroup(std::string const& rel) {
  cgroup_owner_.erase(rel);
}

int NativeBackend::watch_events(std::string const& events_path, NativeExecution* exec) {
  if (!inotify_) {
    int const fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) return -1;
    inotify_.emplace(io_, fd);
  }
  int const wd = ::inotify_add_watch(inotify_->native_handle(), events_path.c_str(), IN_MODIFY);
  if (wd < 0) return -1;
  watches_[wd] = exec;
  arm_inotify();
  return wd;
}

void NativeBackend::unwatch_events(int wd) {
  if (watches_.erase(wd) == 0 || !inotify_) return;
  // Fails with EINVAL when the watch is already gone (the cgroup was removed): nothing to undo.
  (void)::inotify_rm_watch(inotify_->native_handle(), wd);
}

void NativeBackend::arm_inotify() {
  if (!inotify_ || inotify_waiting_) return;
  inotify_waiting_ = true;
  inotify_->async_wait(boost::asio::posix::descriptor_base::wait_read,
                       [weak = std::weak_ptr<bool>(alive_), this](boost::system::error_code ec) {
                         auto a = weak.lock();
                         if (!a || !*a) return;
                         inotify_waiting_ = false;
                         if (!ec) on_inotify();
                       });
}

void NativeBackend::on_inotify() {
  // Collect first, notify after: a notified execution may unwatch (erase from the map). The
  // owners are kept alive across the calls: a notification may end an execution.
  std::vector<std::shared_ptr<NativeExecution>> changed;
  alignas(inotify_event) char buf[4096];
  for (;;) {
    ssize_t const n = ::read(inotify_->native_handle(), buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      inotify_event ev{};
      std::memcpy(&ev, buf + off, sizeof ev);
      off += static_cast<ssize_t>(sizeof ev + ev.len);
      auto it = watches_.find(ev.wd);
      if (it == watches_.end()) continue;
      if ((ev.mask & IN_IGNORED) != 0) {
        watches_.erase(it);  // the kernel dropped the watch (cgroup removed)
        continue;
      }
      if (auto exec = it->second->weak_from_this().lock()) changed.push_back(std::move(exec));
    }
  }
  if (!watches_.empty()) arm_inotify();
  for (auto const& exec : changed) exec->on_events_changed();
}

}  // namespace custos::backend
