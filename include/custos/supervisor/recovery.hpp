// Startup recovery, driven from the supervisor layer: every record a previous daemon left
// non-terminal ends with exactly one terminal record, and every execution whose root is
// provably still ours is adopted by the ExecutionManager instead of being killed on the side.
//
// Two steps, because the manager starts after recovery has looked at the registry:
//   recover()          at daemon start, after Registry::open and before the manager exists.
//                      Reads the records (registry/recovery.hpp, storage only), re-acquires each
//                      root by exact pidfs identity and cleans up after the gone ones
//                      (backend/native_recovery.hpp: the numbered algorithm, the identity rules),
//                      writes their terminal records (recovery_indeterminate), and removes the
//                      cgroups terminal executions left. The live ones are returned, each with
//                      its recovered pidfd: nothing has acted on them.
//   adopt_recovered()  once the manager runs, before any call is accepted: each live one is
//                      adopted (ExecutionManager::adopt); with RestartPolicy::cancel it is then
//                      cancelled with trigger supervisor_shutdown — through the same teardown.
// docs/registry.md "Recovery" describes the rules and the classifications.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "custos/backend/native_recovery.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"
#include "custos/registry/registry.hpp"
#include "custos/supervisor/types.hpp"

namespace custos::supervisor {

class ExecutionManager;

// What a restarted daemon does with the executions recovery proves are still its own.
enum class RestartPolicy : std::uint8_t {
  // Default: adopted and supervised on, as if the daemon had never stopped (no output kept).
  adopt,
  // Adopted, then cancelled at once with trigger supervisor_shutdown (graceful signal, grace,
  // kill, one terminal record `cancelled`, recovery live_owned).
  cancel,
};
// "adopt", "cancel".
[[nodiscard]] std::string_view restart_policy_wire(RestartPolicy p) noexcept;
[[nodiscard]] std::optional<RestartPolicy> restart_policy_from_wire(std::string_view w) noexcept;

struct RecoveryOptions {
  // The current boot id; empty: read /proc/sys/kernel/random/boot_id. Tests inject another one.
  std::string boot_id;
  // The pid namespace pids are looked up in; 0: the caller's own.
  std::uint64_t pid_ns_ino = 0;
  // Bound on waiting for a gone execution's killed cgroup to empty.
  std::chrono::milliseconds kill_timeout{5000};
  // The marker sweep of gone executions (not done across a reboot).
  bool marker_sweep = true;
  // /proc root for the marker sweep (tests may point it elsewhere).
  std::string proc_root = "/proc";
  // The daemon's subtree, under which each execution's cgroup is named by its id; empty when it
  // has none. A launch that crashed between creating its cgroup and recording it left one
  // there; so did executions terminal before this recovery whose teardown could not empty it.
  std::string execution_cgroup_parent;
};

struct RecoveredExecution {
  std::string execution_id;
  core::RecoveryPath classification = core::RecoveryPath::indeterminate;
  std::string detail;             // why this classification (human text)
  bool pid_looked_up = false;     // pidfd_open was called for this record (at most once)
  bool terminal_written = false;  // recover() wrote its terminal record (gone or unproven)
  core::Cleanup cleanup = core::Cleanup::unconfirmed;  // of a gone/unproven one
  // live_owned: everything adoption needs, the recovered pidfd inside (request->root.root).
  // adopt_recovered() takes it.
  std::optional<AdoptRequest> adopt;
  bool adopted = false;  // adopt_recovered() handed it to the manager
};

struct RecoveryReport {
  std::string boot_id;
  std::size_t already_terminal = 0;            // records that were terminal before recovery
  std::vector<RecoveredExecution> executions;  // every non-terminal record, in id order
  std::vector<registry::Claim> orphan_claims;  // kept, reported (never re-usable)
  std::vector<registry::QuarantinedRecord> quarantined;  // kept, reported, never acted on
  // Cgroups of executions terminal before this recovery, found under execution_cgroup_parent
  // and killed and removed (never those of quarantined or unknown ids, never those of this
  // recovery's own records).
  std::vector<backend::recovery::LeftoverCgroup> leftover_cgroups;
  std::uint32_t pidfd_opens = 0;  // total pidfd_open calls (tests: fences)

  [[nodiscard]] std::size_t count(core::RecoveryPath p) const noexcept;
};

// Classifies every non-terminal record, finishes the gone and unproven ones (terminal record
// recovery_indeterminate) and returns the live ones for adoption. Errors: registry.* on a
// write failure (the report so far is lost; the daemon must not start), sys.error when the
// current boot id cannot be read.
[[nodiscard]] Result<RecoveryReport> recover(registry::Registry& registry,
                                             RecoveryOptions const& options = {});

// Adopts every live_owned entry of `report` (its `adopt` request is consumed) into `manager`,
// in id order; with RestartPolicy::cancel each adopted one is cancelled with trigger
// supervisor_shutdown. Returns the failures: an execution the manager refused stays
// non-terminal and running, untouched, for the next start's recovery (its pidfd is closed).
[[nodiscard]] std::vector<std::pair<std::string, Error>> adopt_recovered(ExecutionManager& manager,
                                                                         RecoveryReport& report,
                                                                         RestartPolicy policy);

}  // namespace custos::supervisor
