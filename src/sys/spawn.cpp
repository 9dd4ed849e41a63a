#include "custos/sys/spawn.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "custos/core/wire_names.hpp"
#include "custos/sys/openat2.hpp"

#include "spawn_internal.hpp"

namespace custos::sys {
namespace {

using detail::child_main;
using detail::ChildArena;
using detail::ChildLayout;
using detail::ChildReport;
using detail::clone3_on_stack;
using detail::CloneArgs;
using detail::kCloneClearSighand;
using detail::kCloneIntoCgroup;
using detail::kCloneNewCgroup;
using detail::kClonePidfd;
using detail::kCloneVm;
using detail::kReportReady;
using detail::kStepExecve;
using detail::make_child_arena;
using detail::PlanFds;
using detail::write_plan;

constexpr auto kStepNames = core::wire_names<SpawnStep>({
    {SpawnStep::signals, "signals"},
    {SpawnStep::setsid, "setsid"},
    {SpawnStep::controlling_tty, "controlling_tty"},
    {SpawnStep::stdio, "stdio"},
    {SpawnStep::close_range, "close_range"},
    {SpawnStep::fds, "fds"},
    {SpawnStep::setrlimit, "setrlimit"},
    {SpawnStep::pids_cgroup, "pids_cgroup"},
    {SpawnStep::view, "view"},
    {SpawnStep::loopback, "loopback"},
    {SpawnStep::setgroups, "setgroups"},
    {SpawnStep::setresgid, "setresgid"},
    {SpawnStep::setresuid, "setresuid"},
    {SpawnStep::fchdir, "fchdir"},
    {SpawnStep::capabilities, "capabilities"},
    {SpawnStep::no_new_privs, "no_new_privs"},
    {SpawnStep::landlock, "landlock"},
    {SpawnStep::seccomp, "seccomp"},
    {SpawnStep::barrier, "barrier"},
    {SpawnStep::execve, "execve"},
    {SpawnStep::clone3, "clone3"},
    {SpawnStep::setup, "setup"},
    {SpawnStep::unknown, "unknown"},
});
static_assert(kStepNames.complete());

// The step a child's report names: one the child runs (signals .. execve), else unknown.
SpawnStep reported_step(int no) noexcept {
  if (no < 0 || no > kStepExecve) return SpawnStep::unknown;
  return static_cast<SpawnStep>(no);
}

// --- parent side ------------------------------------------------------------------------------

bool has_nul(std::string const& s) {
  return s.find('\0') != std::string::npos;
}

Result<void> validate(SpawnSpec const& spec) {
  if (spec.executable.empty() || spec.executable.front() != '/') {
    return Error(Errc::plan_invalid_executable, "executable must be an absolute path", EINVAL);
  }
  if (spec.argv.empty())
    return Error(Errc::plan_empty_argv, "argv must hold at least argv[0]", EINVAL);
  if (has_nul(spec.executable)) return Error(Errc::plan_nul_byte, "NUL byte in executable", EINVAL);
  for (auto const& a : spec.argv) {
    if (has_nul(a)) return Error(Errc::plan_nul_byte, "NUL byte in argv", EINVAL);
  }
  for (auto const& e : spec.envp) {
    if (has_nul(e)) return Error(Errc::plan_nul_byte, "NUL byte in environment", EINVAL);
    auto const eq = e.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Error(Errc::plan_invalid_env_name, "environment entry is not NAME=VALUE", EINVAL);
    }
  }
  if (has_nul(spec.cwd)) return Error(Errc::plan_nul_byte, "NUL byte in cwd", EINVAL);
  if (!spec.cwd.empty() && spec.workspace_root_fd < 0) {
    return Error(Errc::plan_invalid_cwd, "cwd given without a workspace root", EINVAL);
  }
  if (spec.new_cgroup_namespace && spec.cgroup_fd < 0) {
    return Error(Errc::plan_invalid_value, "a new cgroup namespace needs a cgroup_fd", EINVAL);
  }
  if (spec.pty_slave_fd >= 0 && spec.controlling_tty && !spec.new_session) {
    return Error(Errc::plan_invalid_io, "a controlling tty needs a new session", EINVAL);
  }
  if (spec.setup_timeout.count() <= 0) {
    return Error(Errc::plan_invalid_value, "setup_timeout must be positive", EINVAL);
  }
  for (auto const& r : spec.rlimits) CUSTOS_TRYV(validate_rlimit(r));
  return ok();
}

// The fds the child keeps past close_range must not sit on 0..2, where dup2 would replace them.
Result<UniqueFd> above_stdio(UniqueFd fd) {
  if (fd.get() >= 3) return fd;
  int const moved = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3);
  if (moved < 0) return Error(Errc::sys_error, "fcntl(F_DUPFD_CLOEXEC, 3)", errno);
  return UniqueFd(moved);
}

// ---- signal dispositions ---------------------------------------------------------------------
//
// The child must start the target with every disposition at SIG_DFL. Resetting all 64 from the
// child cost ~16 us of rt_sigaction calls on the launch's critical path (the parent waits for
// the child's "ready"). Instead:
//   * clone3(CLONE_CLEAR_SIGHAND) makes the kernel reset every *handled* signal at creation, so
//     no daemon handler can ever run in the child (not even between clone and the reset);
//   * the child resets every real-time signal (32..64) and, of the standard ones (1..31), those
//     in g_ignored_signals: the ones the daemon was seen ignoring;
//   * the parent reads the child's ignored-signal mask of the standard signals in the same
//     /proc/<pid>/stat read that gives the identity's start time (no extra syscall; the kernel
//     shows only signals 1..31 there, hence the real-time ones are always reset). The child was
//     created with the daemon's dispositions of that moment and only ever un-ignores signals of
//     the set it was given, so a bit outside that set is a signal the daemon ignored that
//     nobody named: the set learns it and the spawn starts over with a fresh child (the first
//     one is killed at its barrier; no target code ran). The set only grows, so that happens
//     once per signal the daemon ever ignores (SIGPIPE at the first launch).
constexpr std::uint64_t kStandardSignals = 0x7fffffffULL;  // bits of signals 1..31
std::atomic<std::uint64_t> g_ignored_signals{0};
// Set when the kernel refused CLONE_CLEAR_SIGHAND (before 5.5): the child resets all 64.
std::atomic<bool> g_no_clear_sighand{false};

// Blocks every signal for the calling thread for the duration of clone3, so that the child
// cannot run one of the daemon's handlers before it has reset them.
class SignalBlock {
 public:
  SignalBlock() noexcept {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~SignalBlock() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalBlock(SignalBlock const&) = delete;
  SignalBlock& operator=(SignalBlock const&) = delete;

 private:
  sigset_t old_{};
};

// Reads one ChildReport from the error pipe. Returns the number of bytes read: 0 at EOF,
// sizeof(ChildReport) for a whole report, anything else for a torn one.
// Waits at most `timeout` in total; ETIMEDOUT when the child neither reported nor closed the pipe.
Result<std::size_t> read_report(UniqueFd const& fd, ChildReport& report,
                                std::chrono::milliseconds timeout) {
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  std::size_t got = 0;
  auto* bytes = reinterpret_cast<char*>(&report);
  while (got < sizeof report) {
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd.get(), POLLIN, 0};
    int const ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Error(Errc::spawn_failed, "polling the child's error pipe", errno);
    }
    if (ready == 0) {
      return Error(Errc::spawn_failed, "the child did not finish its setup in time", ETIMEDOUT);
    }
    ssize_t const n = ::read(fd.get(), bytes + got, sizeof report - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(Errc::spawn_failed, "reading the child's error pipe", errno);
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
}

// A report that is not "ready", `got` bytes of it read: a whole one names the step that failed
// and its errno; less (the child died before it reported) is a setup failure.
SpawnError report_failure(std::size_t got, ChildReport const& report,
                          std::string const& executable) {
  bool const whole = got == sizeof report;
  SpawnStep const step = whole ? reported_step(report.step) : SpawnStep::setup;
  std::string context = "step=" + std::string(spawn_step_wire(step)) + " executable=" + executable;
  if (got == 0) context += " (child exited during setup)";
  return SpawnError(step, Error(Errc::spawn_failed, context, whole ? report.err : ECHILD));
}

// Reads the child's setup report: ok for "ready"; otherwise the child failed its setup (or
// died without a word) and is reaped when it reported, and the error names the step.
SpawnResult<void> collect_setup_report(UniqueFd const& channel, Pidfd& pidfd,
                                       std::string const& executable,
                                       std::chrono::milliseconds timeout) {
  ChildReport report{};
  auto const got = read_report(channel, report, timeout);
  if (!got) return SpawnError(SpawnStep::setup, got.error());
  if (*got == sizeof report && report.step == kReportReady) return {};
  if (*got == sizeof report) static_cast<void>(pidfd.wait());  // reap; the guard is then a no-op
  return report_failure(*got, report, executable);
}

}  // namespace

std::string_view spawn_step_wire(SpawnStep step) noexcept {
  return kStepNames.wire(step);
}

StagedChild::StagedChild(Pidfd pidfd, UniqueFd channel, detail::ChildArena arena,
                         std::string executable, std::chrono::milliseconds timeout) noexcept
    : pidfd_(std::move(pidfd)),
      executable_(std::move(executable)),
      timeout_(timeout),
      channel_(std::move(channel)),
      arena_(std::move(arena)) {}

StagedChild& StagedChild::operator=(StagedChild&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pidfd_ = std::move(other.pidfd_);
    identity_ = std::move(other.identity_);
    executable_ = std::move(other.executable_);
    timeout_ = other.timeout_;
    channel_ = std::move(other.channel_);
    setup_pending_ = other.setup_pending_;
    report_ = other.report_;
    got_ = other.got_;
    verdict_ = std::move(other.verdict_);
    arena_ = std::move(other.arena_);  // ours is released only now, with our child reaped
  }
  return *this;
}

StagedChild::~StagedChild() {
  kill_and_reap();
}

void StagedChild::kill_and_reap() noexcept {
  if (!pidfd_.valid() || pidfd_.reaped_status()) return;
  // The child is blocked on the barrier and has run nothing of the target: kill it outright.
  // Errors are ignored on purpose: there is no caller to report them to, and a failed kill of
  // a child we still hold a pidfd for cannot happen short of EPERM from a foreign LSM.
  static_cast<void>(pidfd_.send_signal(SIGKILL));
  channel_.reset();
  if (!pidfd_.wait()) {
    // Not reaped: the child may still run on the arena's stack in our memory. Never reuse or
    // unmap it (a leak of one arena is the price of an impossible failure).
    arena_.leak();
  }
  pidfd_ = Pidfd();
}

SpawnResult<RunningChild> StagedChild::release() && {
  StagedChild self = std::move(*this);
  self.send_go();
  // Then the verdict: EOF (the child's CLOEXEC end closed by a successful execve, or by the
  // child's death) or one report — after its "ready" report when the setup was not awaited
  // (the go byte is already queued: the child reads it right after reporting "ready", so
  // both arrive within this one wait). This blocks only for the few syscalls before execve.
  auto const deadline = std::chrono::steady_clock::now() + self.timeout_;
  while (!CUSTOS_TRY(self.poll_verdict())) {
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{self.channel_.get(), POLLIN, 0};
    int const ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno != EINTR) {
      return SpawnError(SpawnStep::execve,
                        Error(Errc::spawn_failed, "polling the child's error pipe", errno));
    }
    if (ready == 0) {
      // `self` goes out of scope armed: the child is killed and reaped.
      return SpawnError(
          SpawnStep::execve,
          Error(Errc::spawn_failed, "the child did not finish its setup in time", ETIMEDOUT));
    }
  }
  return std::move(self).finish();
}

void StagedChild::send_go() noexcept {
  char const go = 1;
  for (;;) {
    // MSG_NOSIGNAL: a child that already died must not SIGPIPE the daemon. A failed send is
    // not an error here: the verdict (EOF, no report) says what became of the child.
    ssize_t const n = ::send(channel_.get(), &go, 1, MSG_NOSIGNAL);
    if (n == 1 || (n < 0 && errno != EINTR)) break;
  }
}

Result<UniqueFd> StagedChild::watch_channel() const {
  return channel_.dup();
}

SpawnResult<bool> StagedChild::poll_verdict() {
  if (verdict_) return true;
  auto* bytes = reinterpret_cast<char*>(&report_);
  for (;;) {
    if (got_ == sizeof report_) {
      if (setup_pending_ && report_.step == kReportReady) {
        setup_pending_ = false;  // set up; the verdict of the barrier and execve follows
        got_ = 0;
        report_ = ChildReport{0, -1};  // a torn verdict then names no step ("unknown")
        continue;
      }
      // A failure report, of a setup step or of the barrier/execve: the child exits after it.
      verdict_ = report_failure(got_, report_, executable_);
      return true;
    }
    ssize_t const n = ::recv(channel_.get(), bytes + got_, sizeof report_ - got_, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return SpawnError(SpawnStep::execve,
                        Error(Errc::spawn_failed, "reading the child's error pipe", errno));
    }
    if (n == 0) {
      if (setup_pending_) {
        verdict_ = report_failure(got_, report_, executable_);  // gone before "ready"
      } else if (got_ != 0) {
        SpawnStep const step = reported_step(report_.step);
        verdict_ = SpawnError(step, Error(Errc::spawn_failed,
                                          "step=" + std::string(spawn_step_wire(step)) +
                                              " executable=" + executable_ + " (truncated report)",
                                          EIO));
      } else {
        verdict_ = SpawnResult<void>();  // execve closed the child's end: it runs the target now
      }
      return true;
    }
    got_ += static_cast<std::size_t>(n);
  }
}

SpawnResult<RunningChild> StagedChild::finish() && {
  StagedChild self = std::move(*this);
  if (!self.verdict_) {  // the destructor kills and reaps the child
    return SpawnError(SpawnStep::execve,
                      Error(Errc::internal, "StagedChild::finish before its verdict"));
  }
  self.channel_.reset();
  if (*self.verdict_) {
    // execve replaced the child's memory before it closed its descriptors (or the child died),
    // so the arena is no longer in use: `self` returns it as it goes out of scope.
    return RunningChild(std::move(self.pidfd_), std::move(self.identity_));
  }
  // A whole report: the child exits right after it; reap it now so no zombie is left behind.
  // Anything else (a torn report, no "ready"): `self` kills and reaps it as it goes.
  if (self.got_ == sizeof self.report_) static_cast<void>(self.pidfd_.wait());
  return self.verdict_->error();
}

RunningChild& RunningChild::operator=(RunningChild&& other) noexcept {
  if (this != &other) {
    RunningChild discard(std::move(*this));
    pidfd_ = std::move(other.pidfd_);
    identity_ = std::move(other.identity_);
  }
  return *this;
}

RunningChild::~RunningChild() {
  if (!pidfd_.valid() || pidfd_.reaped_status()) return;
  static_cast<void>(pidfd_.send_signal(SIGKILL));
  static_cast<void>(pidfd_.wait());
}

namespace {

// Everything made for one child before clone3: its descriptors, and its arena holding the plan
// and the stack it starts on. The plan points into the arena, which does not move.
struct PreparedChild {
  UniqueFd cwd;                 // the working directory, opened beneath the workspace root
  std::vector<UniqueFd> moved;  // sandbox descriptors moved off a number a FdMap targets
  UniqueFd devnull;             // for the stdio streams the spec leaves unset
  UniqueFd channel_parent;      // our end of the barrier and report channel
  UniqueFd channel_child;       // the child's end: closed here once the child holds its copy
  ChildArena arena;
  ChildLayout layout{};
};

// The descriptors the sandbox's child keeps past close_range, none of them on a number one of
// its FdMaps targets (dup2 onto it would replace a descriptor the child still needs): a
// colliding one is duplicated onto a free number the child does not target, held by `c`.
Result<void> sandbox_fds(SpawnSandbox const& sb, PreparedChild& c, PlanFds& fds) {
  std::vector<int> targets;
  for (auto const& m : sb.fds) {
    if (m.target < 3 || m.source < 0) {
      return Error(Errc::plan_invalid_value, "a mapped descriptor is below 3", EINVAL);
    }
    targets.push_back(m.target);
  }
  auto const targeted = [&](int fd) {
    return std::find(targets.begin(), targets.end(), fd) != targets.end();
  };
  auto const place = [&](int fd) -> Result<int> {
    if (fd < 0 || !targeted(fd)) return fd;
    std::vector<UniqueFd> tried;  // numbers that were free but targeted: released at the end
    for (;;) {
      int const d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (d < 0) return Error(Errc::sys_error, "moving a sandbox descriptor", errno);
      if (!targeted(d)) {
        c.moved.emplace_back(d);
        return d;
      }
      tried.emplace_back(d);
    }
  };
  fds.channel = CUSTOS_TRY(place(fds.channel));
  fds.cwd = CUSTOS_TRY(place(fds.cwd));
  for (auto const& m : sb.fds) {
    int const src = CUSTOS_TRY(place(m.source));
    fds.fd_maps.push_back(detail::FdMapping{src, m.target});
    fds.sandbox_keep.push_back(src);
  }
  fds.pids_procs = CUSTOS_TRY(place(sb.pids_cgroup_procs_fd));
  fds.landlock = CUSTOS_TRY(place(sb.landlock_fd));
  if (sb.view != nullptr) {
    fds.view_root = sb.view->root().valid() ? CUSTOS_TRY(place(sb.view->root().get())) : -1;
    for (auto const& a : sb.view->attaches()) {
      fds.attaches.push_back(detail::ViewAttach{CUSTOS_TRY(place(a.fd.get())), a.target.c_str()});
    }
    if (fds.view_root >= 0) fds.sandbox_keep.push_back(fds.view_root);
    for (auto const& a : fds.attaches) fds.sandbox_keep.push_back(a.fd);
  }
  for (int fd : {fds.pids_procs, fds.landlock}) {
    if (fd >= 0) fds.sandbox_keep.push_back(fd);
  }
  for (int fd : fds.sandbox_keep) {
    if (fd < 3) return Error(Errc::plan_invalid_value, "a sandbox descriptor is below 3", EBADF);
  }
  return ok();
}

// The parent's half of a spawn before clone3: the spec checked, the working directory opened,
// the channel made, the plan written. No process exists yet.
Result<PreparedChild> prepare_child(SpawnSpec const& spec) {
  CUSTOS_TRYV(validate(spec));
  PreparedChild c;
  // Working directory first: an escape is the caller's error and must cost no process.
  if (spec.workspace_root_fd >= 0) {
    UniqueFd opened = CUSTOS_TRY(open_beneath(spec.workspace_root_fd, spec.cwd, true));
    c.cwd = CUSTOS_TRY(above_stdio(std::move(opened)));
  }
  if (spec.pty_slave_fd < 0 && (spec.stdin_fd < 0 || spec.stdout_fd < 0 || spec.stderr_fd < 0)) {
    c.devnull.reset(::open("/dev/null", O_RDWR | O_CLOEXEC | O_NOCTTY));
    if (!c.devnull.valid()) return Error(Errc::sys_error, "open /dev/null", errno);
  }
  // One socketpair is both the barrier and the report channel: the child writes its reports
  // ({errno, step}, "ready") to its end and reads the go byte from it; its end is O_CLOEXEC, so
  // a successful execve closes it and the parent reads EOF.
  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Error(Errc::sys_error, "socketpair for the spawn barrier", errno);
  }
  c.channel_parent = UniqueFd(sv[0]);
  c.channel_child = CUSTOS_TRY(above_stdio(UniqueFd(sv[1])));
  PlanFds fds;
  fds.devnull = c.devnull.get();
  fds.channel = c.channel_child.get();
  fds.cwd = c.cwd.valid() ? c.cwd.get() : -1;
  if (spec.sandbox) CUSTOS_TRYV(sandbox_fds(*spec.sandbox, c, fds));
  // The plan, argv/envp and the child's stack live in the arena; the child reads nothing else
  // of ours.
  c.arena = CUSTOS_TRY(make_child_arena(spec));
  c.layout = CUSTOS_TRY(write_plan(spec, c.arena, fds));
  return c;
}

// clone3 into child_main on the arena's stack, all signals blocked meanwhile. Returns the pid
// and sets `pidfd_raw`; on a kernel before 5.5 (no CLONE_CLEAR_SIGHAND) it retries without the
// flag and sets `reset_all`. Errors: sys.unsupported without clone3; spawn.failed otherwise.
Result<long> clone_child(SpawnSpec const& spec, PreparedChild& c, bool clear_sighand,
                         bool& reset_all, int& pidfd_raw) {
  CloneArgs args{};
  args.flags = kCloneVm | kClonePidfd | (clear_sighand ? kCloneClearSighand : 0);
  if (spec.cgroup_fd >= 0) {
    args.flags |= kCloneIntoCgroup;
    args.cgroup = static_cast<std::uint64_t>(spec.cgroup_fd);
    if (spec.new_cgroup_namespace) args.flags |= kCloneNewCgroup;
  }
  if (auto const& sb = spec.sandbox) {
    if (sb->view != nullptr) args.flags |= detail::kCloneNewNs;
    if (sb->new_pid_namespace) {
      args.flags |= detail::kCloneNewPid | detail::kCloneNewIpc | detail::kCloneNewUts;
    }
    if (sb->new_net_namespace) args.flags |= detail::kCloneNewNet;
  }
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd_raw);
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<std::uint64_t>(c.layout.stack_low);
  args.stack_size = c.layout.stack_size;

  long pid = -1;
  {
    SignalBlock const blocked;
    // CLONE_VM without CLONE_VFORK: no copy of the daemon's address space (page tables, anon
    // VMAs) and nothing to tear down at execve, while the parent still goes on to record the
    // child's identity. The child runs child_main on the arena's stack.
    pid = clone3_on_stack(&args, &child_main, c.layout.plan);
    if (pid == -EINVAL && clear_sighand) {
      // A kernel before 5.5 does not know CLONE_CLEAR_SIGHAND: without it, the child resets
      // every signal itself. Remembered only if the retry is accepted (EINVAL can have other
      // causes, which the retry reports).
      args.flags &= ~kCloneClearSighand;
      reset_all = true;
      c.layout.plan->reset_all = true;
      pid = clone3_on_stack(&args, &child_main, c.layout.plan);
      if (pid >= 0) g_no_clear_sighand.store(true, std::memory_order_relaxed);
    }
  }
  if (pid < 0) {
    int const clone_errno = static_cast<int>(-pid);
    if (clone_errno == ENOSYS) {
      return Error(Errc::sys_unsupported, "clone3 is not available on this kernel", clone_errno);
    }
    return Error(Errc::spawn_failed, "step=clone3 executable=" + spec.executable, clone_errno);
  }
  return pid;
}

}  // namespace

SpawnResult<StagedChild> spawn_staged(SpawnSpec const& spec) {
  auto at_clone3 = [](Error e) { return SpawnError(SpawnStep::clone3, std::move(e)); };
  auto prepared = prepare_child(spec);
  if (!prepared) return at_clone3(std::move(prepared).error());
  PreparedChild& c = *prepared;

  bool const clear_sighand = !g_no_clear_sighand.load(std::memory_order_relaxed);
  std::uint64_t const reset_signals =
      (g_ignored_signals.load(std::memory_order_relaxed) & kStandardSignals) | ~kStandardSignals;
  // A sandbox's child resets every disposition itself: the start-over of "signal dispositions"
  // would need a second child, and the first may already have attached the view's detached
  // mounts, which are single-use (a second attach fails with EINVAL).
  bool reset_all = !clear_sighand || spec.sandbox.has_value();
  c.layout.plan->reset_all = reset_all;
  c.layout.plan->reset_signals = reset_signals;
  int pidfd_raw = -1;
  auto const pid = clone_child(spec, c, clear_sighand, reset_all, pidfd_raw);
  if (!pid) return at_clone3(pid.error());

  // From here on the StagedChild is the guard: any early return kills and reaps the child.
  StagedChild staged(Pidfd::adopt(UniqueFd(pidfd_raw), static_cast<std::int32_t>(*pid)),
                     std::move(c.channel_parent), std::move(c.arena), spec.executable,
                     spec.setup_timeout);

  // Wait until the child has finished its setup and sits on the barrier, so that a setup
  // failure (cwd, credentials, limits ...) is reported here, before any ownership is recorded,
  // and so that everything the setup changed (limits, session, cgroup) is in place when the
  // caller looks at the staged child.
  c.channel_child.reset();  // the child's copy is now the only one: its exit or execve means EOF
  // The identity (pidfs inode, boot id, start time) is read while the child runs its setup on
  // another CPU rather than after it: it does not depend on the setup. A child that failed its
  // setup meanwhile reports that failure below, which takes precedence.
  std::uint64_t child_ignored = 0;
  auto identity = read_identity(staged.pidfd_, child_ignored);
  if (identity && !reset_all) {
    // See "signal dispositions": an ignored signal the child was not told to reset.
    std::uint64_t const missed = child_ignored & kStandardSignals & ~reset_signals;
    if (missed != 0) {
      g_ignored_signals.fetch_or(missed, std::memory_order_relaxed);
      { auto discard = std::move(staged); }  // killed and reaped at its barrier
      return spawn_staged(spec);             // at most once per newly ignored set of signals
    }
  }
  if (!spec.wait_for_setup && identity) {
    // release() collects the setup report (see SpawnSpec::wait_for_setup). A failed identity
    // read may mean the child already died in its setup: that failure is reported below.
    staged.identity_ = std::move(*identity);
    staged.setup_pending_ = true;
    return staged;
  }
  if (auto setup =
          collect_setup_report(staged.channel_, staged.pidfd_, spec.executable, spec.setup_timeout);
      !setup) {
    return std::move(setup).error();
  }
  if (!identity) return at_clone3(std::move(identity).error());
  staged.identity_ = std::move(*identity);
  // cwd and devnull close as the function returns; the child holds its copies.
  return staged;
}

}  // namespace custos::sys
