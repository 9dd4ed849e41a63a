// Native recovery: after a daemon restart, the process side of startup recovery for executions
// a previous daemon launched with the native backend. Everything here acts on processes and
// cgroups; the registry (storage only) says what was recorded, the supervisor layer's recovery
// driver (custos/supervisor/recovery.hpp) sequences the steps, and a root found alive is
// adopted by the ExecutionManager through the pidfd returned here (NativeExecution::adopt).
//
// The algorithm, for each non-terminal, non-quarantined record (docs/registry.md "Recovery"):
//   0. ownership unassigned: no program ever ran (the barrier protects it) -> absent_without_
//      terminal, and the cgroup its launch may have created before the staged write
//      (<CleanupOptions::execution_cgroup_parent>/<execution id>) is killed and removed.
//      legacy_unverified: refused for any process action                   -> indeterminate.
//   1. stored boot id != current boot id: no pid lookup at all             -> absent_without_
//      terminal, and the record's cgroup directory, if it exists and is empty, is removed.
//      stored pid namespace != ours: the pid means nothing here            -> indeterminate.
//   2. same boot: pidfd_open(pid) exactly once; ESRCH -> absent_without_terminal, any other
//      error -> indeterminate. fstat the pidfd: device and inode must equal the stored ones
//      exactly, else it is closed without action                          -> absent_without_
//      terminal (the pid now names another process, so ours has ended).
//   3. start time (when stored) must agree; a contradiction              -> indeterminate.
//      A process that has already exited                                 -> absent_without_
//      terminal — unless it is the caller's own unreaped child (a handover: the same process)
//      whose status waitid(WNOWAIT) still reads                         -> live_owned (adopted,
//      its end observed exactly).
//   4. otherwise                                                         -> live_owned, and that
//      same pidfd is kept for every later action (handed to adoption; never a numeric pid).
//   5. absent_without_terminal on the same boot: the tree is cleaned with exact ownership only —
//      the execution's own cgroup (cgroup.kill, wait empty, rmdir: only the daemon puts
//      processes there) and its marker (each match re-verified through its own pidfd before
//      SIGKILL). indeterminate: nothing is signalled.
//   6. the cgroups under the daemon's subtree whose execution was terminal before this recovery
//      (their teardown could not empty them) are killed and removed; unknown, quarantined and
//      other names are left alone.
// A pid and a start time are only negative evidence: they can rule a process out, never in.
// Steps 1-4 are reacquire_root(), 0 and 5 clean_up_gone(), 6 remove_leftover_cgroups().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/sys/pidfd.hpp"

namespace custos::backend::recovery {

// What a record stored about an execution's root: its pidfs identity (the positive authority)
// and the negative evidence beside it.
struct RecordedRoot {
  std::string boot_id;
  std::uint64_t pidfs_dev = 0;
  std::uint64_t pidfs_ino = 0;
  std::int32_t pid = 0;
  std::uint64_t start_time_ticks = 0;  // 0: unknown
  std::uint64_t pid_ns_ino = 0;        // 0: unknown
};

// Where the execution's tree lived, as recorded.
struct RecordedBoundary {
  std::optional<core::Boundary> kind;  // none: the root was never staged
  std::string cgroup_path;             // absolute
  std::string marker_hex;              // 32 hex digits, or empty
  // The PID namespace its marker sweep is limited to (a container's); 0: the daemon's.
  std::uint64_t marker_ns_ino = 0;
};

// The host recovery runs on: what steps 1-2 compare a record with.
struct HostIdentity {
  std::string boot_id;
  std::uint64_t pid_ns_ino = 0;
};
// The current boot id and pid namespace; a non-empty `boot_id` / non-zero `pid_ns_ino` stands in
// for the real one (tests inject another boot). Errors: sys.error when the boot id cannot be read.
[[nodiscard]] Result<HostIdentity> current_host(std::string boot_id = {},
                                                std::uint64_t pid_ns_ino = 0);

struct Reacquired {
  core::RecoveryPath path = core::RecoveryPath::indeterminate;
  std::string detail;               // why (human text)
  bool pid_looked_up = false;       // pidfd_open was called (at most once)
  std::optional<sys::Pidfd> pidfd;  // live_owned: the matched pidfd, for every later action
};

// Steps 1-4 for a record holding a pidfs identity (staged or committed). Never signals.
[[nodiscard]] Reacquired reacquire_root(RecordedRoot const& root, HostIdentity const& host);

struct CleanupOptions {
  // Bound on waiting for a killed cgroup to empty.
  std::chrono::milliseconds kill_timeout{5000};
  // The marker sweep of step 5 (off: tests that must not read /proc).
  bool marker_sweep = true;
  std::string proc_root = "/proc";
  // The cgroup under which the daemon creates each execution's cgroup, named by its id (the
  // daemon's subtree); empty when it has none.
  std::string execution_cgroup_parent;
  // The pid namespace marker sweeps look in (HostIdentity::pid_ns_ino).
  std::uint64_t pid_ns_ino = 0;
};

// An execution whose root is gone (absent_without_terminal).
struct GoneExecution {
  std::string execution_id;
  RecordedBoundary boundary;
  std::uint64_t start_time_ticks = 0;  // the root's, when recorded: bounds the marker sweep
  bool same_boot = false;              // the record is of this boot (else: no process survived)
  bool never_staged = false;           // ownership unassigned: the cgroup may be unrecorded
};

// Steps 0 and 5: cleans what the gone execution may have left, with exact ownership only.
// Returns confirmed when nothing can be left; `detail` gets every finding ("; "-separated).
[[nodiscard]] core::Cleanup clean_up_gone(GoneExecution const& gone, CleanupOptions const& options,
                                          std::string& detail);

// For an indeterminate record: reads (never signals) whether its cgroup still holds processes.
void describe_unproven(RecordedBoundary const& boundary, std::string& detail);

// A cgroup left under the daemon's subtree by an execution that was already terminal before this
// recovery: its teardown could not empty it before the terminal record was written (cleanup
// unconfirmed: a process that would not die within kill_after_ms), and nothing retried since.
struct LeftoverCgroup {
  std::string execution_id;
  core::Cleanup cleanup = core::Cleanup::unconfirmed;  // confirmed: killed (if needed) and removed
  std::string detail;
};

// Step 6: every directory under options.execution_cgroup_parent named like an execution id for
// which `was_terminal(id)` holds is killed and removed, in name order. `was_terminal` answers
// from the registry (false for unknown and quarantined ids, and for this recovery's own records).
[[nodiscard]] std::vector<LeftoverCgroup> remove_leftover_cgroups(
    CleanupOptions const& options, std::function<bool(std::string const&)> const& was_terminal);

// "ex-" and 16 lowercase hex digits: the ids the daemon gives executions (and their cgroups).
[[nodiscard]] bool is_execution_cgroup_name(std::string_view name) noexcept;

// How long ago a process started, from its start time (clock ticks after boot, as
// /proc/PID/stat and the recorded identity give it). nullopt when it cannot be told.
[[nodiscard]] std::optional<std::chrono::milliseconds> process_age(std::uint64_t start_time_ticks);

}  // namespace custos::backend::recovery
