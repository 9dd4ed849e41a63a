#include "custos/sys/spawn.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "custos/sys/openat2.hpp"

namespace custos::sys {
namespace {

// struct clone_args as of Linux 5.7 (CLONE_ARGS_SIZE_VER2, with the cgroup field). Spelled out so
// the build does not depend on which linux/sched.h is installed.
struct CloneArgs {
  std::uint64_t flags;
  std::uint64_t pidfd;
  std::uint64_t child_tid;
  std::uint64_t parent_tid;
  std::uint64_t exit_signal;
  std::uint64_t stack;
  std::uint64_t stack_size;
  std::uint64_t tls;
  std::uint64_t set_tid;
  std::uint64_t set_tid_size;
  std::uint64_t cgroup;
};
static_assert(sizeof(CloneArgs) == 88);

constexpr std::uint64_t kClonePidfd = 0x00001000ULL;
constexpr std::uint64_t kCloneNewCgroup = 0x02000000ULL;
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;

// The kernel's struct sigaction for rt_sigaction on x86_64 (not glibc's): the child resets
// dispositions with the raw syscall so no sanitizer or libc wrapper runs between clone and exec.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  std::uint64_t mask;
};
constexpr int kMaxSignal = 64;

enum ChildStep : int {
  kStepSignals = 0,
  kStepSetsid,
  kStepControllingTty,
  kStepStdio,
  kStepCloseRange,
  kStepRlimit,
  kStepSetgroups,
  kStepSetresgid,
  kStepSetresuid,
  kStepChdir,
  kStepBarrier,
  kStepExecve,
  kStepReady,  // not a failure: the child finished its setup and now waits on the barrier
  kStepCount,
};

constexpr std::array<char const*, kStepCount> kStepNames{
    "signals",   "setsid",    "controlling_tty", "stdio",   "close_range", "setrlimit", "setgroups",
    "setresgid", "setresuid", "fchdir",          "barrier", "execve",      "ready"};

// What the child writes to the error pipe: fixed size, far below PIPE_BUF, so one write is atomic.
struct ChildReport {
  int err;
  int step;
};

// Everything the child reads, prepared in the parent before clone3. Only plain data and pointers
// into memory that the child's copy of the address space keeps valid until execve.
struct ChildPlan {
  char const* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  std::array<int, 3> stdio{-1, -1, -1};
  int ctty_fd = -1;
  bool new_session = true;
  std::array<int, 3> keep{-1, -1, -1};  // sorted ascending, all >= 3; -1 entries at the end
  Rlimit const* rlimits = nullptr;
  std::size_t rlimit_count = 0;
  bool set_credentials = false;
  uid_t uid = 0;
  gid_t gid = 0;
  gid_t const* groups = nullptr;
  std::size_t group_count = 0;
  int cwd_fd = -1;
  int barrier_fd = -1;
  int error_fd = -1;
};

// --- child side: raw syscalls only, no allocation, no locks, no return ---------------------

[[noreturn]] void child_fail(ChildPlan const& plan, int step, int err) noexcept {
  ChildReport const report{err, step};
  // Best effort: if the parent is gone there is nobody to tell.
  static_cast<void>(::syscall(SYS_write, plan.error_fd, &report, sizeof report));
  ::syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

[[noreturn]] void child_main(ChildPlan const& plan) noexcept {
  // 1. Default dispositions for every signal (the daemon may ignore SIGPIPE or have handlers
  //    that must never run in the child), then an empty mask (the parent blocked everything
  //    around clone3 so no handler could run before this point).
  KernelSigaction dfl{};
  dfl.handler = SIG_DFL;
  for (int sig = 1; sig <= kMaxSignal; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    // EINVAL for signal numbers the kernel reserves is expected and harmless.
    static_cast<void>(::syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof dfl.mask));
  }
  std::uint64_t const empty_mask = 0;
  if (::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty_mask, nullptr, sizeof empty_mask) != 0) {
    child_fail(plan, kStepSignals, errno);
  }

  // 2. New session; with a pty, make its slave the controlling terminal.
  if (plan.new_session && ::syscall(SYS_setsid) < 0) child_fail(plan, kStepSetsid, errno);
  if (plan.ctty_fd >= 0 && ::syscall(SYS_ioctl, plan.ctty_fd, TIOCSCTTY, 0) != 0) {
    child_fail(plan, kStepControllingTty, errno);
  }

  // 3. stdio. First move any source sitting on 0..2 out of the way so that dup2 onto one
  //    stdio number cannot clobber the source of another.
  std::array<int, 3> src = plan.stdio;
  for (int i = 0; i < 3; ++i) {
    if (src[static_cast<std::size_t>(i)] < 3 && src[static_cast<std::size_t>(i)] != i) {
      long const moved = ::syscall(SYS_fcntl, src[static_cast<std::size_t>(i)], F_DUPFD_CLOEXEC, 3);
      if (moved < 0) child_fail(plan, kStepStdio, errno);
      src[static_cast<std::size_t>(i)] = static_cast<int>(moved);
    }
  }
  for (int i = 0; i < 3; ++i) {
    int const s = src[static_cast<std::size_t>(i)];
    if (s == i) {
      // Already in place: dup2 would be a no-op that leaves FD_CLOEXEC set.
      if (::syscall(SYS_fcntl, i, F_SETFD, 0) != 0) child_fail(plan, kStepStdio, errno);
    } else if (::syscall(SYS_dup2, s, i) < 0) {
      child_fail(plan, kStepStdio, errno);
    }
  }

  // 4. Close every other inherited descriptor except the ones still needed before execve (all
  //    of them O_CLOEXEC, so execve closes them).
  unsigned int low = 3;
  for (int k : plan.keep) {
    if (k < 0) break;
    auto const uk = static_cast<unsigned int>(k);
    if (uk > low && ::syscall(SYS_close_range, low, uk - 1, 0U) != 0) {
      child_fail(plan, kStepCloseRange, errno);
    }
    low = uk + 1;
  }
  if (::syscall(SYS_close_range, low, ~0U, 0U) != 0) child_fail(plan, kStepCloseRange, errno);

  // 5. Resource limits, while still privileged enough to lower hard limits.
  for (std::size_t i = 0; i < plan.rlimit_count; ++i) {
    struct rlimit64 const lim{plan.rlimits[i].soft, plan.rlimits[i].hard};
    if (::syscall(SYS_prlimit64, 0, plan.rlimits[i].resource, &lim, nullptr) != 0) {
      child_fail(plan, kStepRlimit, errno);
    }
  }

  // 6. Credentials: groups, then gid, then uid (after setresuid we could no longer change the
  //    others). Raw syscalls on purpose: glibc's wrappers broadcast to all threads of the
  //    parent's image, which do not exist in this child.
  if (plan.set_credentials) {
    if (::syscall(SYS_setgroups, plan.group_count, plan.groups) != 0) {
      child_fail(plan, kStepSetgroups, errno);
    }
    if (::syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) != 0) {
      child_fail(plan, kStepSetresgid, errno);
    }
    if (::syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0) {
      child_fail(plan, kStepSetresuid, errno);
    }
  }

  // 7. Working directory, resolved beneath the workspace root by the parent.
  if (plan.cwd_fd >= 0 && ::syscall(SYS_fchdir, plan.cwd_fd) != 0)
    child_fail(plan, kStepChdir, errno);

  // 8. Barrier: tell the parent that setup is complete, then wait. Nothing of the target runs
  //    until the parent has recorded ownership. EOF means the parent gave up (or died): leave
  //    without running anything.
  ChildReport const ready{0, kStepReady};
  if (::syscall(SYS_write, plan.error_fd, &ready, sizeof ready) != sizeof ready) {
    ::syscall(SYS_exit_group, 127);
  }
  char go = 0;
  for (;;) {
    long const n = ::syscall(SYS_read, plan.barrier_fd, &go, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    child_fail(plan, kStepBarrier, n < 0 ? errno : ECANCELED);
  }

  // 9. execve with exactly the prepared environment.
  ::syscall(SYS_execve, plan.path, plan.argv, plan.envp);
  child_fail(plan, kStepExecve, errno);
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

std::vector<char*> pointer_array(std::vector<std::string> const& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  // execve takes char* const[] but never writes through it.
  for (auto const& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

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

}  // namespace

char const* spawn_step_name(int step) noexcept {
  if (step < 0 || step >= kStepCount) return "unknown";
  return kStepNames[static_cast<std::size_t>(step)];
}

StagedChild::StagedChild(Pidfd pidfd, UniqueFd barrier, UniqueFd error, std::string executable,
                         std::chrono::milliseconds timeout) noexcept
    : pidfd_(std::move(pidfd)),
      executable_(std::move(executable)),
      timeout_(timeout),
      barrier_(std::move(barrier)),
      error_(std::move(error)) {}

StagedChild& StagedChild::operator=(StagedChild&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pidfd_ = std::move(other.pidfd_);
    identity_ = std::move(other.identity_);
    executable_ = std::move(other.executable_);
    timeout_ = other.timeout_;
    barrier_ = std::move(other.barrier_);
    error_ = std::move(other.error_);
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
  barrier_.reset();
  static_cast<void>(pidfd_.wait());
  pidfd_ = Pidfd();
}

Result<RunningChild> StagedChild::release() && {
  StagedChild self = std::move(*this);
  char const go = 1;
  for (;;) {
    // MSG_NOSIGNAL: a child that already died must not SIGPIPE the daemon.
    ssize_t const n = ::send(self.barrier_.get(), &go, 1, MSG_NOSIGNAL);
    if (n == 1 || (n < 0 && errno != EINTR)) break;
  }
  self.barrier_.reset();

  // Wait for the verdict: EOF (the CLOEXEC write end closed by a successful execve, or by the
  // child's death) or one report. This blocks only for the few syscalls between the barrier
  // and execve.
  ChildReport report{};
  // On a timeout `self` goes out of scope armed: the child is killed and reaped.
  std::size_t const got = CUSTOS_TRY(read_report(self.error_, report, self.timeout_));
  self.error_.reset();

  if (got == 0) {
    return RunningChild(std::move(self.pidfd_), std::move(self.identity_));
  }
  std::string const context =
      std::string("step=") + spawn_step_name(report.step) + " executable=" + self.executable_;
  if (got != sizeof report) {
    return Error(Errc::spawn_failed, context + " (truncated report)", EIO);  // dtor kills+reaps
  }
  // The child exits right after reporting; reap it now so no zombie is left behind.
  static_cast<void>(self.pidfd_.wait());
  return Error(Errc::spawn_failed, context, report.err);
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

Result<StagedChild> spawn_staged(SpawnSpec const& spec) {
  CUSTOS_TRYV(validate(spec));

  // Working directory first: an escape is the caller's error and must cost no process.
  UniqueFd cwd;
  if (spec.workspace_root_fd >= 0) {
    UniqueFd opened = CUSTOS_TRY(open_beneath(spec.workspace_root_fd, spec.cwd, true));
    cwd = CUSTOS_TRY(above_stdio(std::move(opened)));
  }

  UniqueFd devnull;
  bool const use_pty = spec.pty_slave_fd >= 0;
  if (!use_pty && (spec.stdin_fd < 0 || spec.stdout_fd < 0 || spec.stderr_fd < 0)) {
    devnull.reset(::open("/dev/null", O_RDWR | O_CLOEXEC | O_NOCTTY));
    if (!devnull.valid()) return Error(Errc::sys_error, "open /dev/null", errno);
  }

  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Error(Errc::sys_error, "socketpair for the spawn barrier", errno);
  }
  UniqueFd barrier_parent(sv[0]);
  UniqueFd barrier_child = CUSTOS_TRY(above_stdio(UniqueFd(sv[1])));
  auto [error_read, error_write_raw] = CUSTOS_TRY(make_pipe());
  UniqueFd error_write = CUSTOS_TRY(above_stdio(std::move(error_write_raw)));

  std::vector<char*> const argv = pointer_array(spec.argv);
  std::vector<char*> const envp = pointer_array(spec.envp);

  ChildPlan plan;
  plan.path = spec.executable.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  if (use_pty) {
    plan.stdio = {spec.pty_slave_fd, spec.pty_slave_fd, spec.pty_slave_fd};
    if (spec.controlling_tty) plan.ctty_fd = spec.pty_slave_fd;
  } else {
    plan.stdio = {spec.stdin_fd >= 0 ? spec.stdin_fd : devnull.get(),
                  spec.stdout_fd >= 0 ? spec.stdout_fd : devnull.get(),
                  spec.stderr_fd >= 0 ? spec.stderr_fd : devnull.get()};
  }
  plan.new_session = spec.new_session;
  plan.keep = {barrier_child.get(), error_write.get(), cwd.valid() ? cwd.get() : -1};
  // Sort ascending with the -1 (absent) entry last.
  std::sort(plan.keep.begin(), plan.keep.end(), [](int a, int b) {
    if (a < 0) return false;
    if (b < 0) return true;
    return a < b;
  });
  plan.rlimits = spec.rlimits.data();
  plan.rlimit_count = spec.rlimits.size();
  if (spec.credentials) {
    plan.set_credentials = true;
    plan.uid = spec.credentials->uid;
    plan.gid = spec.credentials->gid;
    plan.groups = spec.credentials->groups.data();
    plan.group_count = spec.credentials->groups.size();
  }
  plan.cwd_fd = cwd.valid() ? cwd.get() : -1;
  plan.barrier_fd = barrier_child.get();
  plan.error_fd = error_write.get();

  int pidfd_raw = -1;
  CloneArgs args{};
  args.flags = kClonePidfd;
  if (spec.cgroup_fd >= 0) {
    args.flags |= kCloneIntoCgroup;
    args.cgroup = static_cast<std::uint64_t>(spec.cgroup_fd);
    if (spec.new_cgroup_namespace) args.flags |= kCloneNewCgroup;
  }
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd_raw);
  args.exit_signal = SIGCHLD;

  long pid = -1;
  int clone_errno = 0;
  {
    SignalBlock const blocked;
    // Fork-style clone3 (no CLONE_VM, no CLONE_VFORK): the child gets a copy of this address
    // space, so `plan` and the arrays it points to stay valid in the child until execve while
    // the parent goes on to record the child's identity.
    pid = ::syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) child_main(plan);
    clone_errno = errno;
  }
  if (pid < 0) {
    if (clone_errno == ENOSYS) {
      return Error(Errc::sys_unsupported, "clone3 is not available on this kernel", clone_errno);
    }
    return Error(Errc::spawn_failed, "step=clone3 executable=" + spec.executable, clone_errno);
  }

  // From here on the StagedChild is the guard: any early return kills and reaps the child.
  StagedChild staged(Pidfd::adopt(UniqueFd(pidfd_raw), static_cast<std::int32_t>(pid)),
                     std::move(barrier_parent), std::move(error_read), spec.executable,
                     spec.setup_timeout);

  // Wait until the child has finished its setup and sits on the barrier, so that a setup
  // failure (cwd, credentials, limits ...) is reported here, before any ownership is recorded,
  // and so that everything the setup changed (limits, session, cgroup) is in place when the
  // caller looks at the staged child.
  error_write.reset();
  ChildReport report{};
  std::size_t const got = CUSTOS_TRY(read_report(staged.error_, report, spec.setup_timeout));
  if (got != sizeof report || report.step != kStepReady) {
    std::string context =
        "step=" + std::string(got == sizeof report ? spawn_step_name(report.step) : "setup") +
        " executable=" + spec.executable;
    int const err = got == sizeof report ? report.err : ECHILD;
    if (got == 0) context += " (child exited during setup)";
    if (got == sizeof report)
      static_cast<void>(staged.pidfd_.wait());  // reap; dtor is then a no-op
    return Error(Errc::spawn_failed, context, err);
  }
  staged.identity_ = CUSTOS_TRY(read_identity(staged.pidfd_));
  // barrier_child, cwd and devnull close as the function returns; the child holds its copies.
  return staged;
}

}  // namespace custos::sys
