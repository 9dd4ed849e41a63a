// The native execution's tree: teardown (signal, kill, the final scan) and resource sampling.
// Part of NativeExecution (native_execution.hpp), split from the launch and I/O for size.
#include <boost/asio/post.hpp>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <signal.h>
#include <unistd.h>

#include "custos/sys/sampler.hpp"

#include "native_execution.hpp"

namespace custos::backend {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long unattributed orphans may take to finish dying before they count as survivors.
constexpr milliseconds kOrphanSettle{200};

// The 0:: entry of /proc/<pid>/cgroup, read by pid; used only as a re-check after a pidfd was
// opened for a pid listed in cgroup.procs (the pidfd pins the process, so a match after the
// open means the pidfd names a member).
std::optional<std::string> cgroup_of(std::int32_t pid) {
  auto dir = sys::open_dir_path("/proc/" + std::to_string(pid));
  if (!dir) return std::nullopt;
  auto text = sys::read_file_at(*dir, "cgroup");
  if (!text) return std::nullopt;
  auto own = sys::parse_own_cgroup(*text);
  if (!own) return std::nullopt;
  return *own;
}

// usage_usec of the cgroup's cpu.stat (it includes exited members).
std::optional<std::uint64_t> cgroup_cpu_usec(sys::CgroupDir const& cg) {
  auto text = sys::read_shown_file_at(cg.fd(), "cpu.stat");
  if (!text) return std::nullopt;
  std::string_view rest = *text;
  constexpr std::string_view kKey = "usage_usec ";
  if (!rest.starts_with(kKey)) {
    auto const at = rest.find("\nusage_usec ");
    if (at == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(at + 1);
  }
  rest.remove_prefix(kKey.size());
  std::uint64_t v = 0;
  auto const [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec != std::errc{} || end == rest.data()) return std::nullopt;
  return v;
}

std::optional<std::uint64_t> measured(sys::Measured const& m) {
  if (m.fidelity == sys::Fidelity::unavailable) return std::nullopt;
  return m.value;
}

}  // namespace

// ------------------------------------------------------------------------------ teardown

std::uint32_t NativeExecution::signal_tree(int sig) {
  std::uint32_t n = 0;
  if (root_ && !root_reaped_) {
    if (auto d = root_->send_signal(sig); d && *d) ++n;
  }
  if (cgroup_) {
    if (auto procs = cgroup_->procs()) {
      for (auto pid : procs.value()) {
        if (pid == root_pid_) continue;
        auto fd = sys::Pidfd::open(pid);
        if (!fd) continue;  // exited meanwhile
        // Re-check membership after the pidfd pins the process: the pid read from cgroup.procs
        // could have been recycled by a process outside the tree in between.
        if (cgroup_rel_.empty() || cgroup_of(pid) != cgroup_rel_) continue;
        if (auto d = fd.value().send_signal(sig); d && *d) ++n;
      }
    }
  } else if (marker_) {
    // A graceful signal does not end processes: one pass, no re-signalling.
    if (auto r = sys::marker_sweep(*marker_, sweep_options(sig, 1))) n += r->signalled;
  }
  return n;
}

std::uint32_t NativeExecution::kill_tree() {
  bool something = false;
  if (root_ && !root_reaped_) {
    if (auto d = root_->send_signal(SIGKILL); d && *d) something = true;
  }
  if (cgroup_ && tree_state() != TreeState::empty) {
    something = true;
    (void)cgroup_->kill();
  }
  std::uint32_t swept = 0;
  if (boundary_ == core::Boundary::marker && marker_) {
    auto o = sweep_options(SIGKILL, host_->config_.marker_sweep_rounds);
    if (auto r = sys::marker_sweep(*marker_, o)) swept = r->signalled;
  }
  return swept + (something ? 1U : 0U);
}

TreeState NativeExecution::tree_state() const {
  if (!cgroup_) return TreeState::unknown;  // marker boundary: only the final sweep can tell
  auto p = cgroup_->populated();
  // A cgroup removed under us (a container's engine removes its cgroup tree when the container
  // stops) was empty when it was removed — rmdir refuses a populated cgroup — and nothing can
  // enter a removed cgroup: it is empty for good.
  if (!p && p.error().sys_errno == ENOENT) return TreeState::empty;
  // Otherwise unreadable counts as populated: never claim empty without seeing it.
  return p && !*p ? TreeState::empty : TreeState::populated;
}

bool NativeExecution::watch_tree() {
  if (!cgroup_ || !live()) return false;
  if (events_wd_ < 0) events_wd_ = host_->watch_events(cgroup_->path() + "/cgroup.events", this);
  return events_wd_ >= 0;
}

void NativeExecution::unwatch_tree() {
  if (events_wd_ < 0) return;
  host_->unwatch_events(events_wd_);
  events_wd_ = -1;
}

void NativeExecution::on_events_changed() {
  if (live() && events_wd_ >= 0) port_->on_tree_change();
}

sys::MarkerSweepOptions NativeExecution::sweep_options(int sig, std::uint32_t rounds) const {
  sys::MarkerSweepOptions o;
  o.signal = sig;
  o.max_rounds = rounds;
  // Nothing that started before the root can descend from it: skipped before being read.
  if (root_start_ticks_ > 0) o.not_before_ticks = root_start_ticks_;
  // A container exec's tree lives in the container's PID namespace: nothing outside it is read.
  if (adoption_ && adoption_->pid_ns) o.pid_ns_inode = adoption_->pid_ns;
  return o;
}

void NativeExecution::collect_orphan_candidates(std::vector<sys::Pidfd>& out, bool& looked) const {
  // Children of this process (the subreaper) that no live execution owns as its root: with the
  // marker boundary they may be descendants of this execution that scrubbed their marker. They
  // cannot be attributed, so they are not signalled — but the cleanup cannot be confirmed.
  looked = false;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/task", ec);
  if (ec) return;  // cannot look: cannot confirm
  looked = true;
  for (auto const& t : it) {
    auto dir = sys::open_dir_path(t.path().string());
    if (!dir) continue;
    auto children = sys::read_file_at(*dir, "children");
    if (!children) continue;
    std::string_view rest = *children;
    while (!rest.empty()) {
      auto sp = rest.find(' ');
      auto tok = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
      std::int32_t pid = 0;
      if (std::from_chars(tok.data(), tok.data() + tok.size(), pid).ec != std::errc{} || pid <= 0) {
        continue;
      }
      if (host_->is_root(pid)) continue;
      // Inside another execution's cgroup: that execution's, not an escapee of this one.
      if (host_->owner_of(pid)) continue;
      // A zombie or an exiting process reads as not alive through its pidfd.
      if (auto fd = sys::Pidfd::open(pid); fd && fd->alive()) out.push_back(std::move(*fd));
    }
  }
}

FinalScan NativeExecution::scan_result(std::optional<Result<sys::MarkerSweepResult>> const& sweep,
                                       bool orphans_alive) {
  FinalScan scan;
  if (sweep) {
    auto const& sw = *sweep;
    if (!sw) {
      scan.unconfirmed.push_back("marker sweep failed: " + sw.error().message());
    } else {
      auto const& swr = sw.value();  // not operator->: GCC 12 -O2 warning
      if (!swr.confirmed) {
        std::string pids;
        for (auto pid : swr.unreadable_pids) pids += " " + std::to_string(pid);
        scan.unconfirmed.push_back("marker sweep unconfirmed: " + std::to_string(swr.remaining) +
                                   " marked left, " + std::to_string(swr.unreadable) +
                                   " unreadable" +
                                   (pids.empty() ? "" : " (" + pids.substr(1) + ")"));
      }
      scan.signalled = swr.signalled;
      final_signalled_ += swr.signalled;
    }
  }
  if (cgroup_) {
    // Only cpu.stat: the full stats() would read six more files here for nothing.
    if (auto usec = cgroup_cpu_usec(*cgroup_)) scan.usage.cpu_ms = *usec / 1000;
    if (tree_state() != TreeState::empty)
      scan.unconfirmed.push_back("cgroup still populated after kill_after_ms");
  }
  if (!root_gone()) scan.unconfirmed.push_back("root process still alive after kill_after_ms");
  if (adoption_ && !adoption_->unconfirmed.empty())
    scan.unconfirmed.push_back(adoption_->unconfirmed);
  if (orphans_alive) {
    scan.unconfirmed.push_back(
        "unattributed live orphans reparented to the daemon (a process may have dropped its "
        "marker)");
  }
  return scan;
}

void NativeExecution::final_scan(std::function<void(FinalScan)> done) {
  // Every teardown ends with a marker sweep, whatever the boundary: it catches a process that
  // left the cgroup (root without nsdelegate) but kept its environment. It reads every process
  // that started after the root (older ones are skipped by start time before any environ read),
  // a fraction of a millisecond per /proc pass: on the worker thread, through the backend's
  // MarkerSweeper, so teardowns ending at the same time share their passes.
  auto orphans = std::make_shared<std::vector<sys::Pidfd>>();
  bool looked = true;
  bool const check_orphans = boundary_ == core::Boundary::marker;
  if (check_orphans) collect_orphan_candidates(*orphans, looked);
  port_->task_begun();
  // Runs on the worker (or inline, below) with the sweep's result (none without a marker).
  auto finish = [self = shared_from_this(), orphans, looked, check_orphans, done = std::move(done)](
                    std::optional<Result<sys::MarkerSweepResult>> sweep) mutable {
    bool orphans_alive = false;
    if (check_orphans) {
      // Processes still in the middle of dying from the kill get a short bounded moment.
      auto const until = Clock::now() + kOrphanSettle;
      while (!orphans->empty()) {
        std::erase_if(*orphans, [](sys::Pidfd const& p) { return !p.alive(); });
        if (orphans->empty() || Clock::now() >= until) break;
        ::usleep(2000);  // the worker's own time: the loop is not blocked
      }
      orphans_alive = !looked || !orphans->empty();
    }
    auto s = std::make_shared<std::optional<Result<sys::MarkerSweepResult>>>(std::move(sweep));
    asio::post(self->io_, [self, s, orphans_alive, done = std::move(done)]() mutable {
      if (!self->live()) return;
      done(self->scan_result(*s, orphans_alive));
      self->port_->task_ended();
    });
  };
  if (!marker_) {
    asio::post(host_->workers_, [finish = std::move(finish)]() mutable { finish(std::nullopt); });
    return;
  }
  auto const opts = sweep_options(SIGKILL, host_->config_.marker_sweep_rounds);
  if (opts.pid_ns_inode) {
    // A container's tree, in its own PID namespace: the batched sweeper reads the daemon's
    // namespace only, so this sweep runs on its own (on the worker).
    asio::post(host_->workers_, [finish = std::move(finish), m = *marker_, opts]() mutable {
      finish(sys::marker_sweep(m, opts));
    });
    return;
  }
  auto shared_finish = std::make_shared<decltype(finish)>(std::move(finish));
  sys::MarkerSweeper::Request req{
      sys::MarkerSweepTarget{*marker_, opts.not_before_ticks},
      [shared_finish](Result<sys::MarkerSweepResult> r) { (*shared_finish)(std::move(r)); }};
  // A run already scheduled (or running) serves this request too; otherwise schedule one.
  if (!host_->sweeper_.enqueue(std::move(req))) return;
  // When no other root is live there is nothing else on the loop for the sweep to
  // hold up, and the two hand-offs to and from the worker (a cross-CPU wake-up each, ~30 us on
  // a small VM) would be most of its cost over a ~0.15 ms pass: run it here. Only for a cgroup
  // boundary: the marker boundary's completion may wait up to kOrphanSettle for orphans to
  // die, which belongs on the worker.
  if (!check_orphans && host_->roots_.empty()) {
    host_->sweeper_.run_pending();
    return;
  }
  asio::post(host_->workers_, [host = host_]() { host->sweeper_.run_pending(); });
}

// ------------------------------------------------------------------------------ resources

Usage NativeExecution::sample() {
  Usage u;
  std::vector<pid_t> pids;
  if (!root_reaped_ && root_pid_ > 0) pids.push_back(root_pid_);
  if (!cgroup_ && pids.empty()) return u;
  if (auto t = sys::sample_tree(cgroup_ ? &*cgroup_ : nullptr, pids)) {
    u.cpu_ms = measured(t->cpu_ms);
    u.rss_bytes = measured(t->rss_bytes);
    u.processes = measured(t->processes);
    u.open_fds = measured(t->open_fds);
  }
  return u;
}

bool NativeExecution::measure_disk(std::function<void(std::optional<std::uint64_t>)> done) {
  if (!disk_.workspace.valid() || disk_.walk_running || !live()) return false;
  // The walk may visit up to disk_walk_max_entries entries: far too slow for the loop. The
  // worker gets its own dup of the workspace fd, so closing ours at close cannot race it.
  auto fd = disk_.workspace.dup();
  if (!fd) return false;
  disk_.walk_running = true;
  port_->task_begun();
  auto root = std::make_shared<sys::UniqueFd>(std::move(*fd));
  std::uint64_t const max_entries = host_->config_.disk_walk_max_entries;
  asio::post(host_->workers_, [self = shared_from_this(), root, max_entries,
                               done = std::move(done)]() mutable {
    auto d = std::make_shared<Result<sys::DiskUsage>>(sys::walk_disk_usage(*root, max_entries));
    asio::post(self->io_, [self, d, done = std::move(done)]() {
      self->disk_.walk_running = false;
      if (!self->live()) return;
      std::optional<std::uint64_t> growth;
      if (*d) {
        auto const bytes = d->value().bytes;
        if (!self->disk_.baseline) {
          self->disk_.baseline = bytes;
        } else {
          growth = bytes > *self->disk_.baseline ? bytes - *self->disk_.baseline : 0;
        }
      }
      done(growth);
      self->port_->task_ended();
    });
  });
  return true;
}

}  // namespace custos::backend
