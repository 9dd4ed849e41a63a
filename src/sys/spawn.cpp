#include "custos/sys/spawn.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <new>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <type_traits>
#include <unistd.h>

#include "custos/core/wire_names.hpp"
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

constexpr std::uint64_t kCloneVm = 0x00000100ULL;
constexpr std::uint64_t kClonePidfd = 0x00001000ULL;
constexpr std::uint64_t kCloneNewCgroup = 0x02000000ULL;
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;
// Linux 5.5: the child starts with every *handled* signal at SIG_DFL (flags and masks cleared);
// ignored signals stay ignored, as across execve.
constexpr std::uint64_t kCloneClearSighand = 0x100000000ULL;

// The kernel's struct sigaction for rt_sigaction on x86_64 (not glibc's): the child resets
// dispositions with the raw syscall so no sanitizer or libc wrapper runs between clone and exec.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  std::uint64_t mask;
};
constexpr int kMaxSignal = 64;

// The child reports a failed step by its SpawnStep number (plain ints: the child code only
// copies them into its report), or kReportReady once its setup is done.
constexpr int step_no(SpawnStep s) noexcept {
  return static_cast<int>(s);
}
constexpr int kStepSignals = step_no(SpawnStep::signals);
constexpr int kStepSetsid = step_no(SpawnStep::setsid);
constexpr int kStepControllingTty = step_no(SpawnStep::controlling_tty);
constexpr int kStepStdio = step_no(SpawnStep::stdio);
constexpr int kStepCloseRange = step_no(SpawnStep::close_range);
constexpr int kStepRlimit = step_no(SpawnStep::setrlimit);
constexpr int kStepSetgroups = step_no(SpawnStep::setgroups);
constexpr int kStepSetresgid = step_no(SpawnStep::setresgid);
constexpr int kStepSetresuid = step_no(SpawnStep::setresuid);
constexpr int kStepChdir = step_no(SpawnStep::fchdir);
constexpr int kStepBarrier = step_no(SpawnStep::barrier);
constexpr int kStepExecve = step_no(SpawnStep::execve);
constexpr int kReportReady = 0xff;  // not a failure: the child now waits on the barrier

constexpr auto kStepNames = core::wire_names<SpawnStep>({
    {SpawnStep::signals, "signals"},
    {SpawnStep::setsid, "setsid"},
    {SpawnStep::controlling_tty, "controlling_tty"},
    {SpawnStep::stdio, "stdio"},
    {SpawnStep::close_range, "close_range"},
    {SpawnStep::setrlimit, "setrlimit"},
    {SpawnStep::setgroups, "setgroups"},
    {SpawnStep::setresgid, "setresgid"},
    {SpawnStep::setresuid, "setresuid"},
    {SpawnStep::fchdir, "fchdir"},
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

using detail::ChildReport;

// Everything the child reads, prepared in the parent before clone3 inside the child's arena (see
// ChildArena): plain data and pointers into that same arena, which stays mapped and untouched by
// the parent until the child has exec'd or died.
struct ChildPlan {
  char const* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  // Plain arrays, not std::array: at -O0 its operator[] is an instrumented out-of-line call,
  // which the child must not make.
  int stdio[3] = {-1, -1, -1};
  int ctty_fd = -1;
  bool new_session = true;
  int keep[3] = {-1, -1, -1};  // sorted ascending, all >= 3; -1 entries at the end
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
  // Signals the child sets to SIG_DFL itself (bit n-1 for signal n), or every signal when
  // reset_all (a kernel without CLONE_CLEAR_SIGHAND). See "Signal dispositions" below.
  std::uint64_t reset_signals = 0;
  bool reset_all = true;
};

// --- child side: raw syscalls only, no allocation, no locks, no return ---------------------
//
// The child shares the daemon's memory (CLONE_VM) and runs on its own stack in the arena until
// execve. So it must not write anything the daemon uses: no libc call at all (even syscall(3)
// stores errno in the *parent thread's* TLS, which the child still points at), no sanitizer
// instrumentation (ASan/UBSan runtimes keep shared state), no stack protector read of the
// parent's TLS. Every function below is marked accordingly and only makes raw syscalls, whose
// results carry -errno in the return value.

#define CUSTOS_CHILD_CODE \
  __attribute__((no_sanitize("address", "undefined"), no_stack_protector, noinline))
#define CUSTOS_CHILD_INLINE \
  __attribute__((no_sanitize("address", "undefined"), no_stack_protector, always_inline)) inline

CUSTOS_CHILD_INLINE long raw_syscall(long nr, long a = 0, long b = 0, long c = 0, long d = 0) {
  long ret = 0;
  register long r10 asm("r10") = d;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
               : "rcx", "r11", "memory");
  return ret;
}

template <typename T>
CUSTOS_CHILD_INLINE long arg(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<long>(v);
  } else {
    return static_cast<long>(v);
  }
}

[[noreturn]] CUSTOS_CHILD_CODE void child_fail(ChildPlan const& plan, int step, long neg_err) {
  ChildReport const report{static_cast<int>(-neg_err), step};
  // Best effort: if the parent is gone there is nobody to tell.
  raw_syscall(SYS_write, plan.error_fd, arg(&report), sizeof report);
  raw_syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

[[noreturn]] CUSTOS_CHILD_CODE void child_main(void* plan_arg) {
  ChildPlan const& plan = *static_cast<ChildPlan const*>(plan_arg);
  long r = 0;
  // 1. Default dispositions for every signal (the daemon may ignore SIGPIPE or have handlers
  //    that must never run in the child), then an empty mask (the parent blocked everything
  //    around clone3 so no handler could run before this point). Without CLONE_SIGHAND the
  //    child's dispositions are its own copy: this does not touch the daemon's. With
  //    CLONE_CLEAR_SIGHAND the kernel already reset every handled signal, so only the ignored
  //    ones the parent named are left to reset here (the parent checks it named them all).
  KernelSigaction dfl{};
  dfl.handler = SIG_DFL;
  for (int sig = 1; sig <= kMaxSignal; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    if (!plan.reset_all && ((plan.reset_signals >> (sig - 1)) & 1U) == 0) continue;
    // EINVAL for signal numbers the kernel reserves is expected and harmless.
    raw_syscall(SYS_rt_sigaction, sig, arg(&dfl), 0, sizeof dfl.mask);
  }
  std::uint64_t const empty_mask = 0;
  r = raw_syscall(SYS_rt_sigprocmask, SIG_SETMASK, arg(&empty_mask), 0, sizeof empty_mask);
  if (r != 0) child_fail(plan, kStepSignals, r);

  // 2. New session; with a pty, make its slave the controlling terminal.
  if (plan.new_session && (r = raw_syscall(SYS_setsid)) < 0) child_fail(plan, kStepSetsid, r);
  if (plan.ctty_fd >= 0 && (r = raw_syscall(SYS_ioctl, plan.ctty_fd, TIOCSCTTY, 0)) != 0) {
    child_fail(plan, kStepControllingTty, r);
  }

  // 3. stdio. First move any source sitting on 0..2 out of the way so that dup2 onto one
  //    stdio number cannot clobber the source of another.
  int src[3] = {plan.stdio[0], plan.stdio[1], plan.stdio[2]};
  for (int i = 0; i < 3; ++i) {
    if (src[i] < 3 && src[i] != i) {
      long const moved = raw_syscall(SYS_fcntl, src[i], F_DUPFD_CLOEXEC, 3);
      if (moved < 0) child_fail(plan, kStepStdio, moved);
      src[i] = static_cast<int>(moved);
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (src[i] == i) {
      // Already in place: dup2 would be a no-op that leaves FD_CLOEXEC set.
      if ((r = raw_syscall(SYS_fcntl, i, F_SETFD, 0)) != 0) child_fail(plan, kStepStdio, r);
    } else if ((r = raw_syscall(SYS_dup2, src[i], i)) < 0) {
      child_fail(plan, kStepStdio, r);
    }
  }

  // 4. Close every other inherited descriptor except the ones still needed before execve (all
  //    of them O_CLOEXEC, so execve closes them).
  unsigned int low = 3;
  for (int i = 0; i < 3; ++i) {
    int const k = plan.keep[i];
    if (k < 0) break;
    auto const uk = static_cast<unsigned int>(k);
    if (uk > low && (r = raw_syscall(SYS_close_range, low, uk - 1, 0)) != 0) {
      child_fail(plan, kStepCloseRange, r);
    }
    low = uk + 1;
  }
  if ((r = raw_syscall(SYS_close_range, low, ~0U, 0)) != 0) child_fail(plan, kStepCloseRange, r);

  // 5. Resource limits, while still privileged enough to lower hard limits.
  for (std::size_t i = 0; i < plan.rlimit_count; ++i) {
    struct rlimit64 const lim{plan.rlimits[i].soft, plan.rlimits[i].hard};
    if ((r = raw_syscall(SYS_prlimit64, 0, plan.rlimits[i].resource, arg(&lim), 0)) != 0) {
      child_fail(plan, kStepRlimit, r);
    }
  }

  // 6. Credentials: groups, then gid, then uid (after setresuid we could no longer change the
  //    others). Raw syscalls on purpose: glibc's wrappers broadcast to all threads of the
  //    parent's image, which do not exist in this child.
  if (plan.set_credentials) {
    if ((r = raw_syscall(SYS_setgroups, static_cast<long>(plan.group_count), arg(plan.groups))) !=
        0) {
      child_fail(plan, kStepSetgroups, r);
    }
    if ((r = raw_syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid)) != 0) {
      child_fail(plan, kStepSetresgid, r);
    }
    if ((r = raw_syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid)) != 0) {
      child_fail(plan, kStepSetresuid, r);
    }
  }

  // 7. Working directory, resolved beneath the workspace root by the parent.
  if (plan.cwd_fd >= 0 && (r = raw_syscall(SYS_fchdir, plan.cwd_fd)) != 0) {
    child_fail(plan, kStepChdir, r);
  }

  // 8. Barrier: tell the parent that setup is complete, then wait. Nothing of the target runs
  //    until the parent has recorded ownership. EOF means the parent gave up (or died): leave
  //    without running anything.
  ChildReport const ready{0, kReportReady};
  if (raw_syscall(SYS_write, plan.error_fd, arg(&ready), sizeof ready) != sizeof ready) {
    raw_syscall(SYS_exit_group, 127);
  }
  char go = 0;
  for (;;) {
    long const n = raw_syscall(SYS_read, plan.barrier_fd, arg(&go), 1);
    if (n == 1) break;
    if (n == -EINTR) continue;
    child_fail(plan, kStepBarrier, n < 0 ? n : -ECANCELED);
  }

  // 9. execve with exactly the prepared environment.
  r = raw_syscall(SYS_execve, arg(plan.path), arg(plan.argv), arg(plan.envp));
  child_fail(plan, kStepExecve, r);
}

// clone3 into a child that shares this address space (CLONE_VM, no CLONE_VFORK: the parent goes
// on while the child waits at its barrier) and starts on `args->stack`, where it calls fn(arg)
// and never returns. Returns the child's pid or -errno, without touching errno. The child path
// leaves C++ right after the syscall: nothing in this frame is used on the new stack.
__attribute__((noinline)) long clone3_on_stack(CloneArgs* args, void (*fn)(void*), void* fn_arg) {
  long ret = 0;
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      // Child: fresh stack (16-byte aligned top), no caller frame to unwind into.
      "xor %%ebp, %%ebp\n\t"
      "mov %[fn_arg], %%rdi\n\t"
      "call *%[fn]\n\t"
      "ud2\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "a"(SYS_clone3), "D"(args), "S"(sizeof(CloneArgs)), [fn] "r"(fn), [fn_arg] "r"(fn_arg)
      : "rcx", "r11", "memory");
  return ret;
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

// ---- the child's arena -------------------------------------------------------------------
//
// One mapping per staged child: [guard page][stack][plan data]. The stack grows down from the
// start of the plan data towards the PROT_NONE guard page, so an overflow faults instead of
// overwriting memory. Arenas of the standard size are kept in a small pool, so a launch costs
// no mmap/mprotect/munmap (and no TLB shootdown of the daemon's other threads) in the steady
// state; a plan whose argv/envp do not fit gets a mapping of its own.
constexpr std::size_t kPage = 4096;
constexpr std::size_t kChildStack = std::size_t{60} * 1024;
constexpr std::size_t kStandardData = std::size_t{64} * 1024;
constexpr std::size_t kStandardArena = kPage + kChildStack + kStandardData;
constexpr std::size_t kArenaPoolMax = 8;

struct ArenaPool {
  std::mutex mu;
  std::vector<void*> free;
};

ArenaPool& arena_pool() {
  static ArenaPool* const pool = new ArenaPool();  // never destroyed: children may outlive main
  return *pool;
}

// detail::arena_stats.
std::atomic<std::size_t> g_arenas_mapped{0};
std::atomic<std::size_t> g_arena_mmaps{0};

Result<detail::ChildArena> make_arena(std::size_t data_bytes) {
  std::size_t const data =
      data_bytes <= kStandardData ? kStandardData : (data_bytes + kPage - 1) / kPage * kPage;
  std::size_t const size = kPage + kChildStack + data;
  if (size == kStandardArena) {
    std::lock_guard const lock(arena_pool().mu);
    auto& free = arena_pool().free;
    if (!free.empty()) {
      void* const base = free.back();
      free.pop_back();
      return detail::ChildArena(base, size);
    }
  }
  void* const base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (base == MAP_FAILED) return Error(Errc::sys_error, "mmap of the child's stack", errno);
  if (::mprotect(base, kPage, PROT_NONE) != 0) {
    int const err = errno;
    ::munmap(base, size);
    return Error(Errc::sys_error, "mprotect of the child's guard page", err);
  }
  g_arenas_mapped.fetch_add(1, std::memory_order_relaxed);
  g_arena_mmaps.fetch_add(1, std::memory_order_relaxed);
  return detail::ChildArena(base, size);
}

// Bump allocation of the plan data inside the arena.
class ArenaWriter {
 public:
  ArenaWriter(char* begin, char* end) noexcept : p_(begin), end_(end) {}
  template <typename T>
  T* take(std::size_t count) noexcept {
    auto const addr = reinterpret_cast<std::uintptr_t>(p_);
    std::uintptr_t const aligned = (addr + alignof(T) - 1) & ~(std::uintptr_t{alignof(T)} - 1);
    p_ = reinterpret_cast<char*>(aligned + sizeof(T) * count);
    return reinterpret_cast<T*>(aligned);
  }
  char* copy(std::string const& s) noexcept {
    char* const out = take<char>(s.size() + 1);
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
    return out;
  }
  char** pointers(std::vector<std::string> const& strings) noexcept {
    char** const out = take<char*>(strings.size() + 1);
    for (std::size_t i = 0; i < strings.size(); ++i) out[i] = copy(strings[i]);
    out[strings.size()] = nullptr;
    return out;
  }
  [[nodiscard]] bool overflowed() const noexcept { return p_ > end_; }

 private:
  char* p_;
  char* end_;
};

// Bytes of plan data spawn_staged writes for `spec` (an upper bound: every item padded).
std::size_t plan_bytes(SpawnSpec const& spec) {
  std::size_t n = sizeof(ChildPlan) + 64;
  n += spec.executable.size() + 1;
  for (auto const& a : spec.argv) n += a.size() + 1;
  for (auto const& e : spec.envp) n += e.size() + 1;
  n += (spec.argv.size() + spec.envp.size() + 2) * sizeof(char*) + 16;
  n += spec.rlimits.size() * sizeof(Rlimit) + 16;
  if (spec.credentials) n += spec.credentials->groups.size() * sizeof(gid_t) + 16;
  return n;
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

namespace detail {

ChildArena::ChildArena(ChildArena&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ChildArena& ChildArena::operator=(ChildArena&& other) noexcept {
  if (this != &other) {
    reset();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ChildArena::~ChildArena() {
  reset();
}

void ChildArena::reset() noexcept {
  if (base_ == nullptr) return;
  void* const base = std::exchange(base_, nullptr);
  std::size_t const size = std::exchange(size_, 0);
  if (size == kStandardArena) {
    std::lock_guard const lock(arena_pool().mu);
    auto& free = arena_pool().free;
    if (free.size() < kArenaPoolMax) {
      free.push_back(base);
      return;
    }
  }
  ::munmap(base, size);
  g_arenas_mapped.fetch_sub(1, std::memory_order_relaxed);
}

ArenaStats arena_stats() noexcept {
  std::size_t pooled = 0;
  {
    std::lock_guard const lock(arena_pool().mu);
    pooled = arena_pool().free.size();
  }
  return ArenaStats{g_arenas_mapped.load(std::memory_order_relaxed),
                    g_arena_mmaps.load(std::memory_order_relaxed), pooled};
}

void ChildArena::leak() noexcept {
  base_ = nullptr;
  size_ = 0;
}

}  // namespace detail

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
  UniqueFd cwd;             // the working directory, opened beneath the workspace root
  UniqueFd devnull;         // for the stdio streams the spec leaves unset
  UniqueFd channel_parent;  // our end of the barrier and report channel
  UniqueFd channel_child;   // the child's end: closed here once the child holds its copy
  detail::ChildArena arena;
  ChildPlan* plan = nullptr;
  char* stack_low = nullptr;
};

// Lays the plan out in the arena: argv/envp, stdio, the descriptors kept past close_range,
// limits and credentials. Nothing here can fail but the bound, which plan_bytes() guarantees.
Result<void> write_plan(SpawnSpec const& spec, PreparedChild& c) {
  char* const arena_base = static_cast<char*>(c.arena.base());
  c.stack_low = arena_base + kPage;
  ArenaWriter w(c.stack_low + kChildStack, arena_base + c.arena.size());
  ChildPlan* const plan = new (w.take<ChildPlan>(1)) ChildPlan();
  plan->path = w.copy(spec.executable);
  plan->argv = w.pointers(spec.argv);
  plan->envp = w.pointers(spec.envp);
  if (spec.pty_slave_fd >= 0) {
    for (int& fd : plan->stdio) fd = spec.pty_slave_fd;
    if (spec.controlling_tty) plan->ctty_fd = spec.pty_slave_fd;
  } else {
    plan->stdio[0] = spec.stdin_fd >= 0 ? spec.stdin_fd : c.devnull.get();
    plan->stdio[1] = spec.stdout_fd >= 0 ? spec.stdout_fd : c.devnull.get();
    plan->stdio[2] = spec.stderr_fd >= 0 ? spec.stderr_fd : c.devnull.get();
  }
  plan->new_session = spec.new_session;
  plan->keep[0] = c.channel_child.get();
  plan->keep[1] = c.cwd.valid() ? c.cwd.get() : -1;
  // Ascending with the -1 (absent) entry last.
  if (plan->keep[1] >= 0 && plan->keep[1] < plan->keep[0]) std::swap(plan->keep[0], plan->keep[1]);
  if (!spec.rlimits.empty()) {
    Rlimit* const limits = w.take<Rlimit>(spec.rlimits.size());
    std::copy(spec.rlimits.begin(), spec.rlimits.end(), limits);
    plan->rlimits = limits;
  }
  plan->rlimit_count = spec.rlimits.size();
  if (spec.credentials) {
    plan->set_credentials = true;
    plan->uid = spec.credentials->uid;
    plan->gid = spec.credentials->gid;
    auto const& groups = spec.credentials->groups;
    gid_t* const g = w.take<gid_t>(std::max<std::size_t>(groups.size(), 1));
    std::copy(groups.begin(), groups.end(), g);
    plan->groups = g;
    plan->group_count = groups.size();
  }
  plan->cwd_fd = c.cwd.valid() ? c.cwd.get() : -1;
  plan->barrier_fd = c.channel_child.get();
  plan->error_fd = c.channel_child.get();
  if (w.overflowed()) {
    // plan_bytes() is an upper bound of what the writer takes; this cannot happen.
    return Error(Errc::sys_error, "spawn plan larger than its arena", EOVERFLOW);
  }
  c.plan = plan;
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
  // The plan, argv/envp and the child's stack live in the arena; the child reads nothing else
  // of ours.
  c.arena = CUSTOS_TRY(make_arena(plan_bytes(spec)));
  CUSTOS_TRYV(write_plan(spec, c));
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
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd_raw);
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<std::uint64_t>(c.stack_low);
  args.stack_size = kChildStack;

  long pid = -1;
  {
    SignalBlock const blocked;
    // CLONE_VM without CLONE_VFORK: no copy of the daemon's address space (page tables, anon
    // VMAs) and nothing to tear down at execve, while the parent still goes on to record the
    // child's identity. The child runs child_main on the arena's stack.
    pid = clone3_on_stack(&args, &child_main, c.plan);
    if (pid == -EINVAL && clear_sighand) {
      // A kernel before 5.5 does not know CLONE_CLEAR_SIGHAND: without it, the child resets
      // every signal itself. Remembered only if the retry is accepted (EINVAL can have other
      // causes, which the retry reports).
      args.flags &= ~kCloneClearSighand;
      reset_all = true;
      c.plan->reset_all = true;
      pid = clone3_on_stack(&args, &child_main, c.plan);
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
  bool reset_all = !clear_sighand;
  c.plan->reset_all = reset_all;
  c.plan->reset_signals = reset_signals;
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
