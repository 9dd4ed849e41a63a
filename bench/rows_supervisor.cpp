// Product rows through the supervisor: an ExecutionManager (the code the daemon runs) on this
// process's own event loop, with its per-execution cgroups beneath this run's bench cgroup.
//
// Launch, teardown and output are measured from the manager's API to the terminal record, so
// they include everything the supervisor does for an execution (staged spawn with barrier,
// pidfs identity, cgroup create/remove, pumps and spools, events, sampler, close, terminal
// record) except the RPC layer and the registry's durable writes (the sink is null here).
#include <boost/asio/io_context.hpp>

#include <cstdio>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <memory>
#include <poll.h>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/supervisor/manager.hpp"

#include "../tests/support/launch_permit_minter.hpp"
#include "bench.hpp"
#include "launch_request.hpp"

namespace custos::bench {
namespace {

namespace fs = std::filesystem;
namespace sup = custos::supervisor;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kGiB = 1ULL << 30;

// One ExecutionManager with its own cgroup subtree and state dir; tears everything down.
class Harness {
 public:
  Harness(Env const& env, std::string const& name) {
    if (!env.cgroup_root.empty()) {
      std::string const sub = env.cgroup_root + "/" + name;
      if (::mkdir(sub.c_str(), 0755) == 0) subtree_ = sub;
    }
    dir_ = fs::path(env.work_dir) / name;
    std::error_code ec;
    fs::create_directories(dir_ / "ws", ec);
    sup::ManagerConfig cfg = bench_manager_config(subtree_, dir_);
    mgr_ = std::make_unique<sup::ExecutionManager>(io_, std::move(cfg));
  }

  Harness(Harness const&) = delete;
  Harness& operator=(Harness const&) = delete;

  ~Harness() {
    cancel_remaining(*mgr_, io_);
    mgr_.reset();
    remove_bench_dirs(subtree_, dir_);
  }

  [[nodiscard]] bool has_cgroup() const { return !subtree_.empty(); }
  [[nodiscard]] std::string const& subtree() const { return subtree_; }
  sup::ExecutionManager& mgr() { return *mgr_; }

  core::ExecutionPlan plan(std::vector<std::string> argv) const {
    core::ExecutionPlan p;
    p.command.executable = argv.at(0);
    p.command.argv = std::move(argv);
    p.workspace.root = (dir_ / "ws").string();
    // Writable, as `custos run` declares it by default: a read-only workspace is enforced with a
    // private mount namespace per execution, whose cost the rpc rows show on a row of its own.
    p.workspace.access = core::WorkspaceAccess::writable;
    p.escalation.grace_ms = 0;  // teardown compares with a bare cgroup.kill: no grace to wait out
    p.escalation.kill_after_ms = 20000;
    return p;
  }

  // The daemon's one launch path (start_async) driven to its answer: the loop runs until the
  // start is answered (start_with_test_permit), then the caller waits for the record.
  Result<sup::StartResult> start(core::ExecutionPlan p) {
    return sup::start_with_test_permit(*mgr_, request(std::move(p)));
  }
  // The daemon's event-loop launch: `done` at once or later from the loop.
  void start_async(core::ExecutionPlan p, std::function<void(Result<sup::StartResult>)> done) {
    sup::start_async_with_test_permit(*mgr_, request(std::move(p)), std::move(done));
  }

  sup::LaunchRequest request(core::ExecutionPlan p) {
    sup::LaunchRequest r = bench_request(++seq_);
    r.plan = std::move(p);
    return r;
  }

  // Runs the loop until `pred` holds; completion callbacks call wake() (see drive_until).
  bool drive(std::function<bool()> const& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds slice = 20ms) {
    return drive_until(io_, pred, timeout, slice);
  }

  void wake() { io_.stop(); }
  boost::asio::io_context& io() { return io_; }

  std::optional<core::TerminalRecord> wait(std::string const& id,
                                           std::chrono::milliseconds timeout) {
    std::optional<Result<core::TerminalRecord>> got;
    mgr_->wait(id, timeout, [&](Result<core::TerminalRecord> r) {
      got = std::move(r);
      wake();
    });
    drive([&] { return got.has_value(); }, timeout + 5s);
    if (!got || !*got) return std::nullopt;
    return **got;
  }

 private:
  boost::asio::io_context io_;
  std::string subtree_;
  fs::path dir_;
  std::unique_ptr<sup::ExecutionManager> mgr_;
  std::uint64_t seq_ = 0;
};

bool clean_exit(std::optional<core::TerminalRecord> const& t) {
  return t.has_value() && t->classification == core::Classification::exited && t->exit.code == 0;
}

std::vector<std::int32_t> read_pids(std::string const& procs_file) {
  std::ifstream in(procs_file);
  std::vector<std::int32_t> out;
  std::int32_t pid = 0;
  while (in >> pid) out.push_back(pid);
  return out;
}

// ---- launch ----------------------------------------------------------------------------------

// CPU time of the calling thread (the loop's) and of the whole process (the loop, the sweeper
// worker, the kernel's work for both), in microseconds.
double thread_cpu_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}
double process_cpu_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// Sets `note` to the medians of the loop thread's and the process's CPU per launch: figures that
// move much less with a busy neighbour than the wall time does.
std::optional<double> launch_sequential_ms(Env const& env, std::string& why, std::string& note) {
  Harness h(env, "sup-launch");
  if (!h.has_cgroup()) {
    why = "no writable cgroup v2 for the executions";
    return std::nullopt;
  }
  std::size_t const n = env.quick ? 60 : 400;
  std::vector<double> ms;
  std::vector<double> loop_cpu;
  std::vector<double> proc_cpu;
  for (std::size_t i = 0; i < n && Clock::now() < env.deadline; ++i) {
    auto const t0 = Clock::now();
    double const c0 = thread_cpu_us();
    double const p0 = process_cpu_us();
    auto r = h.start(h.plan({env.noop_path}));
    if (!r) {
      why = "start failed: " + r.error().message();
      return std::nullopt;
    }
    auto t = h.wait(r->execution_id, 10s);
    if (!clean_exit(t)) {
      why = "the no-op did not end as exited 0";
      return std::nullopt;
    }
    ms.push_back(seconds_since(t0) * 1000.0);
    loop_cpu.push_back(thread_cpu_us() - c0);
    proc_cpu.push_back(process_cpu_us() - p0);
  }
  char buf[160];
  std::snprintf(
      buf, sizeof buf,
      "%zu launches; CPU per launch (medians): loop thread %.0f us, whole process %.0f us",
      ms.size(), median(loop_cpu), median(proc_cpu));
  note = buf;
  return median(ms);
}

std::optional<double> launch_concurrent_per_s(Env const& env, std::string& why) {
  Harness h(env, "sup-concurrent");
  if (!h.has_cgroup()) {
    why = "no writable cgroup v2 for the executions";
    return std::nullopt;
  }
  constexpr std::size_t kInFlight = 16;
  std::size_t const total = kInFlight * (env.quick ? 20 : 120);
  // The daemon's event-loop launch (start_async): the loop goes on while a launch awaits the
  // child's verdict.
  return launches_per_second(h.mgr(), h.io(),
                             AsyncStart{[&](std::function<void(Result<sup::StartResult>)> done) {
                               h.start_async(h.plan({env.noop_path}), std::move(done));
                             }},
                             kInFlight, total, env.deadline, why);
}

// ---- teardown --------------------------------------------------------------------------------

// One 1,000-process tree through the supervisor: wait until all are in the execution's cgroup,
// open a pidfd on each (so pid reuse cannot fake a survivor or hide one), cancel, wait for the
// terminal record, then count the pidfds that are not yet readable (still alive).
std::optional<double> teardown_once(Env const& env, Harness& h, std::string& why) {
  constexpr int kTree = 1000;
  auto p = h.plan({env.self_path, "--helper-tree", std::to_string(kTree)});
  p.limits.processes = 4 * kTree;  // the sampler must not cancel the tree for its size
  auto r = h.start(std::move(p));
  if (!r) {
    why = "start failed: " + r.error().message();
    return std::nullopt;
  }
  std::string const procs = h.subtree() + "/" + r->execution_id + "/cgroup.procs";
  int full = 0;
  h.drive(
      [&] {
        full = read_pids(procs).size() >= static_cast<std::size_t>(kTree) ? full + 1 : 0;
        return full >= 3;
      },
      30s);
  auto const pids = read_pids(procs);
  std::vector<int> pidfds;
  for (auto pid : pids) {
    long const fd = ::syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) pidfds.push_back(static_cast<int>(fd));
  }
  auto const t0 = Clock::now();
  auto c = h.mgr().cancel(r->execution_id, core::Trigger::user, "bench teardown");
  auto t = h.wait(r->execution_id, 60s);
  double const ms = seconds_since(t0) * 1000.0;
  std::size_t survivors = 0;
  for (int fd : pidfds) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) == 0) ++survivors;
    ::close(fd);
  }
  if (pids.size() < static_cast<std::size_t>(kTree)) {
    why = "the tree did not reach " + std::to_string(kTree) + " processes in time";
    return std::nullopt;
  }
  if (!c || !t) {
    why = "cancel or terminal record failed";
    return std::nullopt;
  }
  if (survivors > 0 || t->tree.cleanup != core::Cleanup::confirmed) {
    why = std::to_string(survivors) + " survivors, cleanup " +
          std::string{core::cleanup_wire(t->tree.cleanup)};
    return std::nullopt;
  }
  return ms;
}

// ---- output ----------------------------------------------------------------------------------

std::optional<double> output_once(Env const& env, Harness& h, bool pty, std::uint64_t bytes,
                                  std::string& why) {
  auto p = h.plan({env.self_path, "--helper-write", std::to_string(bytes)});
  if (pty) {
    p.io.mode = core::IoMode::pty;
    p.io.rows = core::kDefaultPtyRows;
    p.io.cols = core::kDefaultPtyCols;
  }
  p.limits.output_bytes = 2 * bytes;
  p.output.spool_bytes = 2 * bytes;  // everything is kept: the figure is pipe/PTY -> spool file
  p.output.max_events = 10'000'000;
  auto const t0 = Clock::now();
  auto r = h.start(std::move(p));
  if (!r) {
    why = "start failed: " + r.error().message();
    return std::nullopt;
  }
  auto t = h.wait(r->execution_id, 120s);
  double const secs = seconds_since(t0);
  if (!clean_exit(t)) {
    why = "the writer did not end as exited 0";
    return std::nullopt;
  }
  auto const stream = pty ? core::Stream::pty : core::Stream::stdout_stream;
  auto const it = t->output.find(stream);
  if (it == t->output.end() || it->second.observed != bytes || !it->second.complete) {
    why = "output accounting does not show every byte kept";
    return std::nullopt;
  }
  return static_cast<double>(bytes) / static_cast<double>(kGiB) / secs;
}

std::optional<double> output_median(Env const& env, bool pty, std::uint64_t bytes,
                                    std::string& why) {
  Harness h(env, pty ? "sup-pty" : "sup-pipe");
  std::vector<double> v;
  int const runs = env.quick ? 1 : 3;
  for (int i = 0; i < runs && Clock::now() < env.deadline; ++i) {
    // The spools of earlier runs stay (exec.output serves them), as they would in the daemon;
    // each run starts with them written back, as each run of the floor starts with no dirty
    // file of its own left.
    settle_page_cache(env);
    auto const r = output_once(env, h, pty, bytes, why);
    if (!r.has_value()) return std::nullopt;
    v.push_back(*r);
  }
  if (v.empty()) {
    why = "the run's time limit was reached";
    return std::nullopt;
  }
  return median(v);
}

// ---- memory ----------------------------------------------------------------------------------

std::optional<std::uint64_t> rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream s(line.substr(6));
      std::uint64_t kib = 0;
      s >> kib;
      return kib;
    }
  }
  return std::nullopt;
}

std::optional<double> idle_rss_kib_per_execution(Env const& env, std::string& why) {
  Harness h(env, "sup-memory");
  std::size_t const warm = 20;
  std::size_t const n = env.quick ? 100 : 1000;
  auto launch = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      auto r = h.start(h.plan({env.self_path, "--helper-sleep"}));
      if (!r || r->phase == core::Phase::terminal) {
        why = r ? "a sleeper did not start" : "start failed: " + r.error().message();
        return false;
      }
    }
    return true;
  };
  // Warm up pools and the allocator first, so the growth measured is per execution.
  if (!launch(warm)) return std::nullopt;
  h.drive([] { return false; }, 500ms);
  // Give freed heap back first: earlier rows leave free pages that later allocations would reuse
  // without any RSS growth, hiding the cost per execution.
  ::malloc_trim(0);
  auto const before = rss_kib();
  if (!launch(n)) return std::nullopt;
  h.drive([] { return false; }, 1500ms);  // a few sampler rounds: steady state, not a burst
  ::malloc_trim(0);
  auto const after = rss_kib();
  std::size_t const live = h.mgr().live_count();
  if (!before || !after || live != warm + n) {
    why = "not every sleeper was still running";
    return std::nullopt;
  }
  double const growth = static_cast<double>(*after) - static_cast<double>(*before);
  return growth / static_cast<double>(n);
}

}  // namespace

std::vector<Row> supervisor_launch_rows(Env const& env, Floors const& f) {
  std::string why_seq;
  std::string why_conc;
  std::string note_seq;
  auto const seq = launch_sequential_ms(env, why_seq, note_seq);
  auto const conc = launch_concurrent_per_s(env, why_conc);
  Row a = unmeasured("launch + wait of a static no-op through the supervisor (median)", "ms",
                     "clone3 into fresh cgroup + pidfd wait + rmdir", f.launch_seq_ms, 1.3,
                     Better::lower, why_seq);
  a.value = seq;
  if (seq.has_value()) a.note = note_seq;
  Row b = unmeasured("same, 16 concurrent executions", "launches/s",
                     "clone3 floor, 16 concurrent launchers", f.launch_concurrent_per_s, 0.8,
                     Better::higher, why_conc);
  b.value = conc;
  return {a, b};
}

std::vector<Row> teardown_rows(Env const& env, Floors const& f) {
  std::string why;
  std::optional<double> value;
  {
    Harness h(env, "sup-teardown");
    if (!h.has_cgroup()) {
      why = "no writable cgroup v2 for the executions";
    } else {
      std::vector<double> v;
      int const runs = env.quick ? 1 : 3;
      for (int i = 0; i < runs && Clock::now() < env.deadline; ++i) {
        auto const r = teardown_once(env, h, why);
        if (!r.has_value()) {
          v.clear();
          break;
        }
        v.push_back(*r);
      }
      if (!v.empty()) value = median(v);
    }
  }
  Row r = unmeasured(
      "teardown of a 1,000-process tree with setsid/double-fork escapees (zero survivors)", "ms",
      "bare cgroup.kill + wait-empty", f.tree_kill_ms, 1.2, Better::lower, why);
  r.value = value;
  return {r};
}

std::vector<Row> output_rows(Env const& env, Floors const& f) {
  std::string why_pipe;
  std::string why_pty;
  auto const pipe = output_median(env, false, env.quick ? kGiB / 8 : kGiB, why_pipe);
  auto const pty = output_median(env, true, env.quick ? kGiB / 64 : kGiB / 4, why_pty);
  Row a = unmeasured(env.quick ? "output: 128 MiB on stdout through the supervisor"
                               : "output: 1 GiB on stdout through the supervisor",
                     "GiB/s", "raw pipe -> file", f.pipe_gib_s, 0.85, Better::higher, why_pipe);
  a.value = pipe;
  Row b = unmeasured("output: PTY stream through the supervisor", "GiB/s", "raw PTY -> file",
                     f.pty_gib_s, 0.9, Better::higher, why_pty);
  b.value = pty;
  return {a, b};
}

std::vector<Row> memory_rows(Env const& env, Floors const& /*f*/) {
  // No kernel floor exists for this one: the comparison is with the budget itself (32 KiB per
  // idle execution; a conmon costs ~2.5 MiB per container), so ratio <= 1.0 means within budget.
  // Measured in this process, which hosts the same ExecutionManager the daemon does.
  std::string why;
  auto const v = idle_rss_kib_per_execution(env, why);
  Row r = unmeasured(env.quick ? "RSS growth per idle running execution (100 sleeping)"
                               : "RSS growth per idle running execution (1,000 sleeping)",
                     "KiB", "budget per execution", 32.0, 1.0, Better::lower, why);
  r.value = v;
  return {r};
}

}  // namespace custos::bench
