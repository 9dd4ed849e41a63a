// The code a staged child runs between clone3 and execve (see spawn.hpp and
// docs/process-model.md, "Staged spawn"), and the clone3 that starts it on its own stack.
#include <cstdint>
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <type_traits>
#include <unistd.h>

#include "spawn_internal.hpp"

namespace custos::sys::detail {
namespace {

// The kernel's struct sigaction for rt_sigaction on x86_64 (not glibc's): the child resets
// dispositions with the raw syscall so no sanitizer or libc wrapper runs between clone and exec.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  std::uint64_t mask;
};
constexpr int kMaxSignal = 64;

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

CUSTOS_CHILD_INLINE long raw_syscall5(long nr, long a, long b, long c, long d, long e) {
  long ret = 0;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
               : "rcx", "r11", "memory");
  return ret;
}

// Spelled here: linux/mount.h and linux/seccomp.h cannot be included beside every libc header.
constexpr long kMoveMountFEmptyPath = 0x00000004;
constexpr long kSeccompSetModeFilter = 1;
constexpr long kLandlockRulePathBeneath = 1;
constexpr std::uint32_t kCapabilityVersion3 = 0x20080522;
// chown, dac_override, fowner, fsetid, kill, setgid, setuid, net_bind_service.
constexpr std::uint64_t kKeptCapabilities = (1ULL << 0) | (1ULL << 1) | (1ULL << 3) | (1ULL << 4) |
                                            (1ULL << 5) | (1ULL << 6) | (1ULL << 7) | (1ULL << 10);

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

}  // namespace

// The child's whole life between clone3 and execve is one straight line of raw syscalls in one
// uninstrumented frame (docs/process-model.md); every call out of it would be another function
// that must carry the child attributes.
// NOLINTNEXTLINE(readability-function-size): one straight line in one frame, see above
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
  //    of them O_CLOEXEC, so execve closes them); then the sandbox's descriptors go where the
  //    plan wants them (dup2 clears O_CLOEXEC on the copy). None of the kept ones sits on a
  //    target (the parent saw to it).
  unsigned int low = 3;
  for (std::size_t i = 0; i < plan.keep_count; ++i) {
    auto const uk = static_cast<unsigned int>(plan.keep[i]);
    if (uk > low && (r = raw_syscall(SYS_close_range, low, uk - 1, 0)) != 0) {
      child_fail(plan, kStepCloseRange, r);
    }
    low = uk + 1;
  }
  if ((r = raw_syscall(SYS_close_range, low, ~0U, 0)) != 0) child_fail(plan, kStepCloseRange, r);
  for (std::size_t i = 0; i < plan.fd_map_count; ++i) {
    r = raw_syscall(SYS_dup2, plan.fd_maps[i].source, plan.fd_maps[i].target);
    if (r < 0) child_fail(plan, kStepFds, r);
  }

  // 5. Resource limits, while still privileged enough to lower hard limits.
  for (std::size_t i = 0; i < plan.rlimit_count; ++i) {
    struct rlimit64 const lim{plan.rlimits[i].soft, plan.rlimits[i].hard};
    if ((r = raw_syscall(SYS_prlimit64, 0, plan.rlimits[i].resource, arg(&lim), 0)) != 0) {
      child_fail(plan, kStepRlimit, r);
    }
  }

  // 5b. Sandbox, while still privileged: the v1 pids cgroup ("0" is the writer itself), then
  //     the view: the copy of the daemon's mounts this new namespace starts with becomes
  //     private (nothing propagates back), the view's root goes on top of "/", the child
  //     pivots into it and drops the old root, and attaches the rest — every target resolves
  //     inside the view now. Then the private network namespace's loopback comes up.
  if (plan.pids_procs_fd >= 0) {
    char const zero = '0';
    if ((r = raw_syscall(SYS_write, plan.pids_procs_fd, arg(&zero), 1)) != 1) {
      child_fail(plan, kStepPidsCgroup, r < 0 ? r : -EIO);
    }
  }
  if (plan.new_mount_ns) {
    static char const kRoot[] = "/";
    static char const kDot[] = ".";
    static char const kEmpty[] = "";
    if ((r = raw_syscall5(SYS_mount, 0, arg(kRoot), 0, MS_REC | MS_PRIVATE, 0)) != 0) {
      child_fail(plan, kStepView, r);
    }
    if (plan.view_root_fd >= 0) {
      if ((r = raw_syscall5(SYS_move_mount, plan.view_root_fd, arg(kEmpty), AT_FDCWD, arg(kRoot),
                            kMoveMountFEmptyPath)) != 0) {
        child_fail(plan, kStepView, r);
      }
      if ((r = raw_syscall(SYS_fchdir, plan.view_root_fd)) != 0) child_fail(plan, kStepView, r);
      if ((r = raw_syscall(SYS_pivot_root, arg(kDot), arg(kDot))) != 0) {
        child_fail(plan, kStepView, r);
      }
      if ((r = raw_syscall(SYS_umount2, arg(kDot), MNT_DETACH)) != 0) {
        child_fail(plan, kStepView, r);
      }
      if ((r = raw_syscall(SYS_chdir, arg(kRoot))) != 0) child_fail(plan, kStepView, r);
    }
    for (std::size_t i = 0; i < plan.attach_count; ++i) {
      r = raw_syscall5(SYS_move_mount, plan.attaches[i].fd, arg(kEmpty), AT_FDCWD,
                       arg(plan.attaches[i].target), kMoveMountFEmptyPath);
      if (r != 0) child_fail(plan, kStepView, r);
    }
    static char const kProc[] = "proc";
    for (std::size_t i = 0; i < plan.proc_count; ++i) {
      r = raw_syscall5(SYS_mount, arg(kProc), arg(plan.procs[i].target), arg(kProc),
                       static_cast<long>(plan.procs[i].flags), 0);
      if (r != 0) child_fail(plan, kStepView, r);
    }
  }
  if (plan.loopback_ifreq != nullptr) {
    long const sock = raw_syscall(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0) child_fail(plan, kStepLoopback, sock);
    auto* const ifr = static_cast<struct ifreq*>(plan.loopback_ifreq);
    if ((r = raw_syscall(SYS_ioctl, sock, SIOCGIFFLAGS, arg(ifr))) != 0) {
      child_fail(plan, kStepLoopback, r);
    }
    ifr->ifr_flags = static_cast<short>(ifr->ifr_flags | IFF_UP);
    if ((r = raw_syscall(SYS_ioctl, sock, SIOCSIFFLAGS, arg(ifr))) != 0) {
      child_fail(plan, kStepLoopback, r);
    }
    raw_syscall(SYS_close, sock);
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

  // 7. Working directory, resolved beneath the workspace root by the parent; in a view, by its
  //    path inside the view (the parent checked it beneath the workspace root too).
  if (plan.view_cwd != nullptr) {
    if ((r = raw_syscall(SYS_chdir, arg(plan.view_cwd))) != 0) child_fail(plan, kStepChdir, r);
  } else if (plan.cwd_fd >= 0 && (r = raw_syscall(SYS_fchdir, plan.cwd_fd)) != 0) {
    child_fail(plan, kStepChdir, r);
  }

  // 7b. The sandbox's restrictions, last: nothing after them but the barrier and execve. A
  //     program that stays uid 0 first loses every capability but a harmless few (bounding set
  //     first: capset cannot raise what it no longer bounds). Then no_new_privs (Landlock and
  //     an unprivileged seccomp filter require it), the /proc rule only the child can add (its
  //     procfs exists only here), Landlock, and seccomp.
  if (plan.drop_capabilities) {
    for (int cap = 0; cap < 64; ++cap) {
      if (((kKeptCapabilities >> cap) & 1U) != 0) continue;
      r = raw_syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0);
      if (r == -EINVAL) break;  // past the last capability this kernel knows
      if (r != 0) child_fail(plan, kStepCapabilities, r);
    }
    CapHeader header{kCapabilityVersion3, 0};
    CapData data[2] = {};
    data[0].effective = data[0].permitted = static_cast<std::uint32_t>(kKeptCapabilities);
    if ((r = raw_syscall(SYS_capset, arg(&header), arg(&data[0]))) != 0) {
      child_fail(plan, kStepCapabilities, r);
    }
  }
  if (plan.no_new_privs && (r = raw_syscall5(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) != 0) {
    child_fail(plan, kStepNoNewPrivs, r);
  }
  if (plan.proc_landlock != nullptr) {
    static char const kProcPath[] = "/proc";
    long const proc = raw_syscall(SYS_openat, AT_FDCWD, arg(kProcPath), O_PATH | O_CLOEXEC);
    if (proc < 0) child_fail(plan, kStepLandlock, proc);
    plan.proc_landlock->parent_fd = static_cast<std::int32_t>(proc);
    r = raw_syscall(SYS_landlock_add_rule, plan.landlock_fd, kLandlockRulePathBeneath,
                    arg(plan.proc_landlock), 0);
    if (r != 0) child_fail(plan, kStepLandlock, r);
    raw_syscall(SYS_close, proc);
  }
  if (plan.landlock_fd >= 0 &&
      (r = raw_syscall(SYS_landlock_restrict_self, plan.landlock_fd, 0)) != 0) {
    child_fail(plan, kStepLandlock, r);
  }
  if (plan.seccomp_fprog != nullptr &&
      (r = raw_syscall(SYS_seccomp, kSeccompSetModeFilter, 0, arg(plan.seccomp_fprog))) != 0) {
    child_fail(plan, kStepSeccomp, r);
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

}  // namespace custos::sys::detail
