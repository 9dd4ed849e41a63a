// The staged spawn's internals shared by spawn.cpp (the parent), spawn_child.cpp (the code the
// child runs between clone3 and execve) and spawn_arena.cpp (the memory it runs in, and the plan
// laid out there). Internal to src/sys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/rlimits.hpp"
#include "custos/sys/spawn.hpp"

namespace custos::sys::detail {

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
constexpr std::uint64_t kCloneNewNs = 0x00020000ULL;
constexpr std::uint64_t kCloneNewUts = 0x04000000ULL;
constexpr std::uint64_t kCloneNewIpc = 0x08000000ULL;
constexpr std::uint64_t kCloneNewPid = 0x20000000ULL;
constexpr std::uint64_t kCloneNewNet = 0x40000000ULL;
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;
// Linux 5.5: the child starts with every *handled* signal at SIG_DFL (flags and masks cleared);
// ignored signals stay ignored, as across execve.
constexpr std::uint64_t kCloneClearSighand = 0x100000000ULL;

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
constexpr int kStepFds = step_no(SpawnStep::fds);
constexpr int kStepRlimit = step_no(SpawnStep::setrlimit);
constexpr int kStepPidsCgroup = step_no(SpawnStep::pids_cgroup);
constexpr int kStepView = step_no(SpawnStep::view);
constexpr int kStepLoopback = step_no(SpawnStep::loopback);
constexpr int kStepSetgroups = step_no(SpawnStep::setgroups);
constexpr int kStepSetresgid = step_no(SpawnStep::setresgid);
constexpr int kStepSetresuid = step_no(SpawnStep::setresuid);
constexpr int kStepChdir = step_no(SpawnStep::fchdir);
constexpr int kStepCapabilities = step_no(SpawnStep::capabilities);
constexpr int kStepNoNewPrivs = step_no(SpawnStep::no_new_privs);
constexpr int kStepLandlock = step_no(SpawnStep::landlock);
constexpr int kStepSeccomp = step_no(SpawnStep::seccomp);
constexpr int kStepBarrier = step_no(SpawnStep::barrier);
constexpr int kStepExecve = step_no(SpawnStep::execve);
constexpr int kReportReady = 0xff;  // not a failure: the child now waits on the barrier

struct FdMapping {
  int source;
  int target;
};
struct ViewAttach {
  int fd;
  char const* target;
};
// struct landlock_path_beneath_attr (packed in the kernel's uapi).
struct __attribute__((packed)) LandlockPathAttr {
  std::uint64_t allowed_access;
  std::int32_t parent_fd;
};
// struct __user_cap_header_struct and one of the two __user_cap_data_struct of version 3.
struct CapHeader {
  std::uint32_t version;
  int pid;
};
struct CapData {
  std::uint32_t effective;
  std::uint32_t permitted;
  std::uint32_t inheritable;
};

struct ViewProc {
  char const* target;
  unsigned long flags;  // MS_* for mount(2)
};

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
  int const* keep = nullptr;  // sorted ascending, all >= 3, unique
  std::size_t keep_count = 0;
  Rlimit const* rlimits = nullptr;
  std::size_t rlimit_count = 0;
  bool set_credentials = false;
  uid_t uid = 0;
  gid_t gid = 0;
  gid_t const* groups = nullptr;
  std::size_t group_count = 0;
  int cwd_fd = -1;
  // The sandbox (SpawnSandbox), in the order the child applies it.
  FdMapping const* fd_maps = nullptr;
  std::size_t fd_map_count = 0;
  int pids_procs_fd = -1;
  bool new_mount_ns = false;  // the child is in a new mount namespace: make it private first
  int view_root_fd = -1;      // >= 0: pivot into this root (else an overlay on the host's)
  ViewAttach const* attaches = nullptr;
  std::size_t attach_count = 0;
  ViewProc const* procs = nullptr;
  std::size_t proc_count = 0;
  char const* view_cwd = nullptr;  // with a view: chdir here instead of fchdir(cwd_fd)
  void* loopback_ifreq = nullptr;  // non-null: bring "lo" up (a struct ifreq in the arena)
  bool drop_capabilities = false;
  bool no_new_privs = false;
  int landlock_fd = -1;
  LandlockPathAttr* proc_landlock = nullptr;  // non-null: a rule for /proc, added by the child
  void const* seccomp_fprog = nullptr;        // a struct sock_fprog in the arena
  int barrier_fd = -1;
  int error_fd = -1;
  // Signals the child sets to SIG_DFL itself (bit n-1 for signal n), or every signal when
  // reset_all (a kernel without CLONE_CLEAR_SIGHAND). See "signal dispositions" in spawn.cpp.
  std::uint64_t reset_signals = 0;
  bool reset_all = true;
};

// The child's entry point on its own stack (spawn_child.cpp): sets itself up as `plan` says,
// reports "ready", waits at the barrier and execs; reports the failing step otherwise. Never
// returns.
[[noreturn]] void child_main(void* plan);

// clone3 into a child that shares this address space (CLONE_VM, no CLONE_VFORK: the parent goes
// on while the child waits at its barrier) and starts on `args->stack`, where it calls fn(arg)
// and never returns. Returns the child's pid or -errno, without touching errno.
long clone3_on_stack(CloneArgs* args, void (*fn)(void*), void* fn_arg);

// The descriptors the plan names: /dev/null (for unset stdio), the child's end of the channel,
// the working directory (-1: none), and the sandbox's (kept past close_range; none of them on a
// number a FdMap targets).
struct PlanFds {
  int devnull = -1;
  int channel = -1;
  int cwd = -1;
  std::vector<int> sandbox_keep;
  std::vector<FdMapping> fd_maps;
  std::vector<ViewAttach> attaches;  // targets point into the spec's view (copied by write_plan)
  int view_root = -1;
  int landlock = -1;
  int pids_procs = -1;
};

// Where the plan lies in the arena, and the stack below it that the child starts on.
struct ChildLayout {
  ChildPlan* plan = nullptr;
  char* stack_low = nullptr;
  std::size_t stack_size = 0;
};

// An arena big enough for `spec`'s plan: a pooled one of the standard size when it fits.
// Errors: sys.error (mmap, mprotect).
[[nodiscard]] Result<ChildArena> make_child_arena(SpawnSpec const& spec);

// Lays the plan out in the arena: argv/envp, stdio, the descriptors kept past close_range,
// limits and credentials. Nothing here can fail but the bound, which plan_bytes() guarantees.
// Errors: sys.error when the plan does not fit (cannot happen: the arena was sized for it).
[[nodiscard]] Result<ChildLayout> write_plan(SpawnSpec const& spec, ChildArena& arena,
                                             PlanFds const& fds);

}  // namespace custos::sys::detail
