// Staged spawn: clone3(CLONE_PIDFD [| CLONE_INTO_CGROUP [| CLONE_NEWCGROUP]]) into a child that
// blocks on a barrier until the parent has recorded who it is.
//
// The sequence the daemon follows:
//   auto staged = CUSTOS_TRY(spawn_staged(spec));   // child exists, runs no user code
//   record(staged.identity());                      // durable ownership first
//   auto running = CUSTOS_TRY(std::move(staged).release());  // now execve happens
// Dropping a StagedChild without release() SIGKILLs the child through its pidfd and reaps it.
// The child shares the caller's memory until execve (CLONE_VM on a stack of its own) and makes
// only raw syscalls. The child setup order is documented in docs/process-model.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/mount_view.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/rlimits.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// A BPF instruction of a seccomp filter (the kernel's struct sock_filter).
struct BpfInsn {
  std::uint16_t code;
  std::uint8_t jt;
  std::uint8_t jf;
  std::uint32_t k;
};
static_assert(sizeof(BpfInsn) == 8);

// The sandbox part of a spawn (docs/sandbox.md, "Linux enforcement"). Descriptors and the view
// are borrowed like SpawnSpec's: they must stay open until spawn_staged() returns. The child
// applies it in this order: its descriptors (fds), the v1 pids cgroup, the view (a new mount
// namespace, pivoted into), the loopback, the credentials, the working directory, then
// no_new_privs, Landlock and seccomp, the last things before the barrier.
struct SpawnSandbox {
  // A new mount namespace entering this view; null: none (the daemon's filesystem).
  PrivateView const* view = nullptr;
  // With a view: the working directory, absolute inside the view (workspace_root_fd and cwd
  // are then only checked, not used: a descriptor of the host's tree would lead out of it).
  std::string cwd;
  bool new_pid_namespace = false;  // CLONE_NEWPID, with CLONE_NEWIPC and CLONE_NEWUTS
  bool new_net_namespace = false;  // CLONE_NEWNET; the child brings its loopback up
  int pids_cgroup_procs_fd = -1;   // >= 0: the child joins this cgroup by writing "0" to it
  bool no_new_privs = true;
  int landlock_fd = -1;  // >= 0: landlock_restrict_self with this ruleset
  // With a Landlock ruleset and a procfs in the view: what the program may do below /proc (the
  // fresh procfs exists only in the child, which adds this rule for it before restricting).
  std::uint64_t proc_landlock_access = 0;
  // The program runs as uid 0: every capability but a few that reach nothing outside the view
  // (chown, dac_override, fowner, fsetid, kill, setgid, setuid, net_bind_service) leaves the
  // bounding, permitted, effective and inheritable sets before execve.
  bool drop_capabilities = false;
  std::vector<BpfInsn> seccomp;  // non-empty: loaded (SECCOMP_SET_MODE_FILTER) last
  struct FdMap {
    int source;  // borrowed
    int target;  // >= 3: the program's descriptor number
  };
  std::vector<FdMap> fds;
};

struct SpawnCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, set exactly (empty clears them)
};

// Everything the child needs, prepared before clone3. File descriptors here are *borrowed*: they
// must stay open until spawn_staged() returns; the child gets its own copies.
struct SpawnSpec {
  std::string executable;             // absolute path, passed to execve as is (no PATH search)
  std::vector<std::string> argv;      // argv[0] included; must not be empty
  std::vector<std::string> envp;      // "NAME=VALUE", exactly the child's environment
  int stdin_fd = -1;                  // -1: /dev/null
  int stdout_fd = -1;                 // -1: /dev/null
  int stderr_fd = -1;                 // -1: /dev/null
  int pty_slave_fd = -1;              // >= 0: used for all three stdio fds, overrides the above
  bool controlling_tty = true;        // with a pty: TIOCSCTTY (needs new_session)
  int workspace_root_fd = -1;         // -1: the child keeps the daemon's cwd
  std::string cwd;                    // relative to workspace_root_fd; empty: the root itself
  std::vector<Rlimit> rlimits;        // applied in order in the child
  int cgroup_fd = -1;                 // >= 0: CLONE_INTO_CGROUP with this cgroup v2 dir fd
  bool new_cgroup_namespace = false;  // CLONE_NEWCGROUP; only together with cgroup_fd
  std::optional<SpawnCredentials> credentials;  // setgroups/setresgid/setresuid in the child
  bool new_session = true;                      // setsid()
  std::optional<SpawnSandbox> sandbox;          // see SpawnSandbox
  // Bounds each wait on the child: for its setup report in spawn_staged() and for the execve
  // verdict in release(). A child that overruns it is killed and reaped (spawn.failed, ETIMEDOUT).
  std::chrono::milliseconds setup_timeout{10000};
  // true: spawn_staged() returns only once the child has completed its setup and sits on the
  // barrier, so a setup failure is spawn_staged()'s error and a StagedChild is fully set up.
  // false: spawn_staged() returns right after clone3 (and the identity read), while the child
  // sets itself up; release() then collects the "ready" report (or the setup failure, with the
  // same step names) before the execve verdict. The barrier is the same: nothing of the target
  // runs before release(). One wait on the child instead of two, for callers that do not need
  // the setup done before they record ownership.
  bool wait_for_setup = true;
};

// The step of a launch that failed; spawn_step_wire gives the name a terminal record carries as
// spawn_error.code. The child's setup steps come first, in the order the child runs them
// (docs/process-model.md); the child reports them by number.
enum class SpawnStep : std::uint8_t {
  signals,          // default dispositions and an empty signal mask
  setsid,           // a new session
  controlling_tty,  // TIOCSCTTY on the pty
  stdio,            // stdin/stdout/stderr in place
  close_range,      // every other inherited descriptor closed
  fds,              // sandbox: descriptors placed where the plan wants them (secrets)
  setrlimit,        // the resource limits
  pids_cgroup,      // sandbox: joining the v1 pids cgroup
  view,             // sandbox: entering the private filesystem view
  loopback,         // sandbox: the private network namespace's loopback up
  setgroups,        // credentials: supplementary groups,
  setresgid,        //   gid,
  setresuid,        //   uid
  fchdir,           // the working directory
  capabilities,     // sandbox: capabilities dropped (a program running as uid 0)
  no_new_privs,     // sandbox: PR_SET_NO_NEW_PRIVS
  landlock,         // sandbox: landlock_restrict_self
  seccomp,          // sandbox: the seccomp filter
  barrier,          // waiting for (or watching) the parent's go
  execve,           // the target itself, or the wait for its verdict
  clone3,           // creating the child: the spec, its descriptors and memory, clone3 itself
  setup,            // the child's setup ended (or its report could not be read) without a step
  unknown,          // a torn report whose step could not be read
};

// "signals", "setsid", "controlling_tty", "stdio", "close_range", "fds", "setrlimit",
// "pids_cgroup", "view", "loopback", "setgroups", "setresgid", "setresuid", "fchdir",
// "capabilities", "no_new_privs", "landlock", "seccomp", "barrier", "execve", "clone3", "setup",
// "unknown".
[[nodiscard]] std::string_view spawn_step_wire(SpawnStep step) noexcept;

// A failed spawn: the error (spawn.failed with the child's errno, or the parent's own error:
// plan.*, workspace.escape, sys.*) and the step it failed at, as a field. It is an Error, so a
// caller that only passes the failure on (CUSTOS_TRY into a Result<T>) keeps code, errno and
// context; one that records it reads `step` instead of the text.
struct SpawnError : Error {
  SpawnStep step = SpawnStep::clone3;

  SpawnError() = default;
  SpawnError(SpawnStep s, Error e) : Error(std::move(e)), step(s) {}
};

template <class T = void>
using SpawnResult = boost::system::result<T, SpawnError>;

class RunningChild;

namespace detail {
// What a staged child writes to its report channel: fixed size, far below PIPE_BUF, so one
// write is atomic. `step` is a SpawnStep's number, or kReportReady.
struct ChildReport {
  int err;
  int step;
};

// The memory a staged child runs in until execve: spawn_staged clones it with CLONE_VM onto a
// stack in this mapping ([guard page][stack][plan, argv, envp]), so it must stay mapped and
// untouched until the child has exec'd or was reaped. Move-only; destruction returns it to a
// small pool (or unmaps it). Internal to spawn_staged/StagedChild.
class ChildArena {
 public:
  ChildArena() noexcept = default;
  ChildArena(void* base, std::size_t size) noexcept : base_(base), size_(size) {}
  ChildArena(ChildArena&& other) noexcept;
  ChildArena& operator=(ChildArena&& other) noexcept;
  ChildArena(ChildArena const&) = delete;
  ChildArena& operator=(ChildArena const&) = delete;
  ~ChildArena();

  [[nodiscard]] void* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  // Forgets the mapping without unmapping it (its child could not be reaped).
  void leak() noexcept;

 private:
  void reset() noexcept;
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

// For tests and diagnostics: the child arenas mapped now (in use, pooled, or leaked after a child
// could not be reaped), the mmaps made for them since the process started, and the arenas in the
// pool now. mapped_now and mapped_ever stay put while launches reuse pooled arenas; with no
// launch in flight, mapped_now - pooled counts the arenas held (by a staged child still alive) or
// leaked. Read without one lock over all three: exact only while no other thread launches.
struct ArenaStats {
  std::size_t mapped_now = 0;
  std::size_t mapped_ever = 0;
  std::size_t pooled = 0;
};
[[nodiscard]] ArenaStats arena_stats() noexcept;
}  // namespace detail

// A child blocked on its barrier. Move-only; the destructor kills and reaps an unreleased child.
class StagedChild {
 public:
  StagedChild(StagedChild&&) noexcept = default;
  StagedChild& operator=(StagedChild&& other) noexcept;
  StagedChild(StagedChild const&) = delete;
  StagedChild& operator=(StagedChild const&) = delete;
  ~StagedChild();

  [[nodiscard]] std::int32_t pid() const noexcept { return pidfd_.pid(); }
  [[nodiscard]] Pidfd const& pidfd() const noexcept { return pidfd_; }
  [[nodiscard]] PidfsIdentity const& identity() const noexcept { return identity_; }

  // Lets the child run: writes the barrier byte, then blocks until the child's end of the
  // channel closes (execve succeeded: CLOEXEC closed it) or carries an {errno, step} report. Only
  // the steps after the barrier (barrier, execve) can fail here; setup failures surface
  // earlier, from spawn_staged() — or here, with their own steps, when the spec had
  // wait_for_setup = false. Errors: spawn.failed with the step and the child's errno (the child
  // has then exited and been reaped); spawn.failed at step execve when the verdict did not come
  // within the setup timeout or the channel could not be read. The StagedChild is consumed
  // either way.
  [[nodiscard]] SpawnResult<RunningChild> release() &&;

  // release() in steps that never block, for an event loop: send_go() lets the child run on;
  // then, each time the channel is readable (wait on a watch_channel() duplicate),
  // poll_verdict() reads what arrived and returns true once the verdict is in; finish() then
  // returns what release() would have, consuming the StagedChild. The caller bounds the wait
  // (release() gives up after the spec's setup_timeout; dropping the StagedChild kills and
  // reaps the child). Errors of poll_verdict: spawn.failed at step execve when the channel
  // cannot be read.
  void send_go() noexcept;
  [[nodiscard]] Result<UniqueFd> watch_channel() const;
  [[nodiscard]] SpawnResult<bool> poll_verdict();
  [[nodiscard]] SpawnResult<RunningChild> finish() &&;
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  friend SpawnResult<StagedChild> spawn_staged(SpawnSpec const& spec);
  StagedChild(Pidfd pidfd, UniqueFd channel, detail::ChildArena arena, std::string executable,
              std::chrono::milliseconds timeout) noexcept;
  void kill_and_reap() noexcept;

  Pidfd pidfd_;
  PidfsIdentity identity_;
  std::string executable_;  // for error contexts only
  std::chrono::milliseconds timeout_{0};
  // Our end of the socketpair that is both the barrier (we send the go byte) and the child's
  // report channel (reports in, EOF once its CLOEXEC end closes at execve).
  UniqueFd channel_;
  // The child's "ready" report is still to be read (SpawnSpec::wait_for_setup == false).
  bool setup_pending_ = false;
  // poll_verdict's progress: the report being read (got_ bytes of it so far) and the verdict
  // once known (ok: execve succeeded; an error: the step that failed).
  detail::ChildReport report_{};
  std::size_t got_ = 0;
  std::optional<SpawnResult<void>> verdict_;
  // Declared last: destroyed after the destructor body has killed and reaped the child.
  detail::ChildArena arena_;
};

// A child that has passed execve. Holds its Pidfd and identity. If the pidfd is still held when
// it is destroyed and the child has not been reaped, it is SIGKILLed and reaped (no zombie and no
// unowned process); take the pidfd (take_pidfd) to manage the process elsewhere.
class RunningChild {
 public:
  RunningChild(RunningChild&&) noexcept = default;
  RunningChild& operator=(RunningChild&& other) noexcept;
  RunningChild(RunningChild const&) = delete;
  RunningChild& operator=(RunningChild const&) = delete;
  ~RunningChild();

  [[nodiscard]] std::int32_t pid() const noexcept { return pidfd_.pid(); }
  [[nodiscard]] Pidfd& pidfd() noexcept { return pidfd_; }
  [[nodiscard]] Pidfd const& pidfd() const noexcept { return pidfd_; }
  [[nodiscard]] PidfsIdentity const& identity() const noexcept { return identity_; }
  // Hands the process over; this object no longer kills it on destruction.
  [[nodiscard]] Pidfd take_pidfd() && noexcept { return std::move(pidfd_); }

 private:
  friend class StagedChild;
  RunningChild(Pidfd pidfd, PidfsIdentity identity) noexcept
      : pidfd_(std::move(pidfd)), identity_(std::move(identity)) {}

  Pidfd pidfd_;
  PidfsIdentity identity_;
};

// Creates the child and returns once it has completed its whole setup (signals, session, stdio,
// fds, limits, credentials, cwd) and is blocked on its barrier, with its identity read.
// Errors: spawn.failed at the setup step that failed in the child, with the child's errno (the
// child is reaped), or at step setup when the child died without a report or did not report
// within the setup timeout; at step clone3: plan.invalid_executable / plan.empty_argv /
// plan.nul_byte / plan.invalid_value for a malformed spec, workspace.escape when cwd leaves the
// workspace root, sys.unsupported when the kernel has no clone3 (ENOSYS), spawn.failed for other
// clone3 failures (EPERM, EBUSY from CLONE_INTO_CGROUP into a cgroup with controllers in use,
// EAGAIN ...), sys.error for pipe/open failures in the parent, and the identity read's errors.
[[nodiscard]] SpawnResult<StagedChild> spawn_staged(SpawnSpec const& spec);

}  // namespace custos::sys
