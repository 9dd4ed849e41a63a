// Startup recovery: re-acquire the processes of non-terminal records by exact pidfs identity,
// or prove they are gone, and end every record with exactly one terminal record.
//
// Run once at daemon start, after Registry::open (which already validated and quarantined) and
// before any call is accepted. For each non-terminal, non-quarantined record
// (docs/registry.md "Recovery"):
//   0. ownership unassigned: no program ever ran (the barrier protects it) ->
//   absent_without_terminal, and the cgroup its launch may have created before the staged
//   write (RecoveryOptions::execution_cgroup_parent) is removed.
//      legacy_unverified: refused for any process action               -> indeterminate.
//   1. stored boot id != current boot id: no pid lookup at all          -> absent_without_terminal,
//      and the record's cgroup directory, if any, is removed.
//      stored pid namespace != ours: the pid means nothing here         -> indeterminate.
//   2. same boot: pidfd_open(pid) exactly once; ESRCH -> absent_without_terminal, any other
//      error -> indeterminate. fstat the pidfd: device and inode must equal the stored ones
//      exactly, else it is closed without action                      -> absent_without_terminal
//      (the pid now names another process, so ours has ended).
//   3. start time (when stored) must agree; a contradiction           -> indeterminate.
//      A process that has already exited                             -> absent_without_terminal.
//   4. otherwise                                                      -> live_owned, and that same
//      pidfd is kept for every later action (returned to the caller; never a numeric pid).
// recover() writes the terminal record of every absent_without_terminal / indeterminate record
// itself (classification recovery_indeterminate; output accounted incomplete), and cleans up the
// boundary where exact ownership allows it (the execution's own cgroup; its marker).
// live_owned records are left to apply_restart_policy().
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/registry/registry.hpp"
#include "custos/sys/pidfd.hpp"

namespace custos::registry {

enum class RestartPolicy : std::uint8_t {
  // Default: every live_owned execution is killed (its cgroup via cgroup.kill, else through the
  // recovered pidfd plus a marker sweep), waited for, and terminal-recorded as cancelled by
  // supervisor_shutdown with recovery live_owned.
  cancel_and_reap,
  // Leave live_owned executions running and non-terminal; the caller takes the returned pidfds
  // and supervises them (exec.cancel works through them). Their terminal records are then the
  // caller's to write.
  keep_running,
};

[[nodiscard]] std::string_view restart_policy_wire(RestartPolicy p) noexcept;
[[nodiscard]] std::optional<RestartPolicy> restart_policy_from_wire(std::string_view w) noexcept;

struct RecoveryOptions {
  // The current boot id; empty: read /proc/sys/kernel/random/boot_id. Tests inject another one.
  std::string boot_id;
  // The pid namespace pids are looked up in; 0: the caller's own.
  std::uint64_t pid_ns_ino = 0;
  RestartPolicy policy = RestartPolicy::cancel_and_reap;
  // Bound on waiting for a killed tree (cgroup empty, root pidfd exited) per execution.
  std::chrono::milliseconds kill_timeout{5000};
  // Final marker sweep for executions that carry a marker (not done across a reboot: no process
  // can have survived it, and the sweep would read every /proc entry).
  bool marker_sweep = true;
  // /proc root for the marker sweep (tests may point it elsewhere).
  std::string proc_root = "/proc";
  // The cgroup under which the daemon creates each execution's cgroup, named by its id (the
  // daemon's subtree); empty when it has none (marker boundary). A record whose ownership was
  // never staged has no cgroup recorded (the boundary is written with the staged ownership),
  // yet a crash after the launch created the cgroup and the staged child, before that write,
  // leaves <execution_cgroup_parent>/<execution id> behind: recovery kills what is in it (at
  // most the child at its barrier, which ran nothing) and removes it. Also the cgroups that
  // executions terminal before this recovery left there (RecoveryReport::leftover_cgroups).
  std::string execution_cgroup_parent;
};

struct RecoveredExecution {
  std::string execution_id;
  core::RecoveryPath classification = core::RecoveryPath::indeterminate;
  std::string detail;               // why this classification (human text)
  bool pid_looked_up = false;       // pidfd_open was called for this record (at most once)
  std::optional<sys::Pidfd> pidfd;  // live_owned: the matched pidfd, for every later action
  bool terminal_written = false;
  core::Cleanup cleanup = core::Cleanup::unconfirmed;
  std::optional<core::ExitStatus> exit;  // live_owned after apply_restart_policy, when known
};

// A cgroup left under the daemon's subtree by an execution that was already terminal before this
// recovery: its teardown could not empty it before the terminal record was written (cleanup
// unconfirmed: a process that would not die within kill_after_ms), and nothing retried since.
struct LeftoverCgroup {
  std::string execution_id;
  core::Cleanup cleanup = core::Cleanup::unconfirmed;  // confirmed: killed (if needed) and removed
  std::string detail;
};

struct RecoveryReport {
  std::string boot_id;
  std::size_t already_terminal = 0;            // records that were terminal before recovery
  std::vector<RecoveredExecution> executions;  // every non-terminal record, in id order
  std::vector<Claim> orphan_claims;            // kept, reported (never re-usable)
  std::vector<QuarantinedRecord> quarantined;  // kept, reported, never acted on
  // Cgroups of executions terminal before this recovery, found under execution_cgroup_parent
  // and killed and removed (never those of quarantined or unknown ids, never those of this
  // recovery's own records, which the steps above handled).
  std::vector<LeftoverCgroup> leftover_cgroups;
  std::uint32_t pidfd_opens = 0;  // total pidfd_open calls (tests: fences)

  [[nodiscard]] std::size_t count(core::RecoveryPath p) const noexcept;
};

// Classifies every non-terminal record and finishes the ones whose process is gone or
// unprovable (see the header comment). Errors: registry.* on a write failure (the report so far
// is lost; the daemon must not start), sys.error when the current boot id cannot be read.
[[nodiscard]] Result<RecoveryReport> recover(Registry& registry,
                                             RecoveryOptions const& options = {});

// Applies options.policy to the live_owned entries of `report` (cancel_and_reap: kill, wait,
// terminal record with recovery live_owned; keep_running: nothing). Entries are updated in
// place (terminal_written, cleanup, exit; the pidfd stays with the entry).
// Errors: registry.* on a write failure.
[[nodiscard]] Result<void> apply_restart_policy(Registry& registry, RecoveryReport& report,
                                                RecoveryOptions const& options = {});

// The live_owned executions a keep_running restart left running, held by their recovered
// pidfds so that exec.cancel can still end them (the ExecutionManager cannot adopt a process it
// did not spawn: no pipes, no exit notification as parent). Single-threaded (the daemon's loop).
//
// Watching: the owner (the daemon) waits for readiness of watch_fd() — the pidfd becomes
// readable when the root exits — and then calls finish_exited(), which ends the rest of the
// tree and writes the terminal record with the root's exit status (waitid when the process is
// ours, otherwise PIDFD_GET_INFO once its parent reaped it; recovery_indeterminate when
// neither can say). Limit, stated plainly: a kept execution has no pipes and no output events;
// its output accounting stays as the previous daemon left it (incomplete).
class KeptExecutions {
 public:
  // Takes the pidfd of every live_owned entry of `report` that has no terminal record yet (the
  // report's entries keep everything else). Empty for any other policy's report.
  KeptExecutions(Registry& registry, RecoveryReport& report, RecoveryOptions options);

  [[nodiscard]] bool contains(std::string_view execution_id) const;
  [[nodiscard]] std::vector<std::string> ids() const;
  [[nodiscard]] bool empty() const noexcept { return kept_.empty(); }

  struct Cancelled {
    bool accepted = false;                 // `trigger` became the first accepted trigger
    std::optional<core::Trigger> trigger;  // the first accepted trigger, if any
    // The one terminal record just written; none when the root had already exited on its own
    // (its end is recorded by finish_exited, which the owner is about to call).
    std::optional<core::TerminalRecord> terminal;
    core::Cleanup cleanup = core::Cleanup::unconfirmed;
    std::string detail;
  };
  // Records `trigger` (unless the previous daemon recorded one first), kills the tree — the
  // execution's cgroup (cgroup.kill, wait empty, rmdir), SIGKILL through the recovered pidfd,
  // the final marker sweep — waits for it (bounded by RecoveryOptions::kill_timeout, on the
  // caller's thread) and writes the one terminal record with recovery `live_owned`. The
  // execution is no longer kept afterwards. When the root has already exited (the owner has
  // not finished it yet), nothing is recorded or signalled: not accepted, as for a supervised
  // execution whose exit decided its outcome; the execution stays kept for finish_exited.
  // Errors: exec.not_found (not kept here); registry.* (the execution then stays kept).
  [[nodiscard]] Result<Cancelled> cancel(std::string_view execution_id, core::Trigger trigger);

  // A duplicate of the kept execution's recovered pidfd, for readiness (readable once the root
  // process exited). It shares the file status flags with the recovered pidfd (an event loop
  // that makes it non-blocking makes both so); every wait on a recovered pidfd is WNOHANG.
  // Errors: exec.not_found; sys.error.
  [[nodiscard]] Result<sys::UniqueFd> watch_fd(std::string_view execution_id) const;

  // True once the root exited and its exit status can be read (waitid without reaping when it
  // is our child, PIDFD_GET_INFO once its own parent reaped it), or can never be (a kernel
  // without PIDFD_INFO_EXIT); also for an id not kept here. The parent (init, usually) reaps on
  // its own schedule: the owner polls this, bounded, before finish_exited().
  [[nodiscard]] bool exit_observable(std::string_view execution_id);

  struct Finished {
    core::TerminalRecord terminal;  // the one terminal record just written
    core::Cleanup cleanup = core::Cleanup::unconfirmed;
    std::string detail;
  };
  // The root exited on its own: kills what is left of its tree (cgroup.kill and wait empty,
  // the final marker sweep; bounded by RecoveryOptions::kill_timeout, on the caller's thread),
  // records no trigger of its own (one the previous daemon recorded stays), and writes the one
  // terminal record with the root's exit status (recovery `live_owned`; `indeterminate`, class
  // recovery_indeterminate, when the status cannot be read). The execution is no longer kept
  // afterwards. Errors: exec.not_found (not kept here); exec.not_running (the root has not
  // exited: use cancel()); registry.* (the execution then stays kept).
  [[nodiscard]] Result<Finished> finish_exited(std::string_view execution_id);

 private:
  using Kept = std::map<std::string, RecoveredExecution, std::less<>>;
  // Ends the execution at `it` (finish_live with `trigger`, or none: the root exited on its
  // own) and reads back its terminal record; on failure it stays kept.
  [[nodiscard]] Result<Finished> end_kept(Kept::iterator it, std::optional<core::Trigger> trigger);

  Registry* registry_;
  RecoveryOptions options_;
  Kept kept_;
};

}  // namespace custos::registry
