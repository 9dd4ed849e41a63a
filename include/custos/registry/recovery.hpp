// Startup recovery, the storage half: what the registry holds for recovery to act on, and the
// terminal records of executions whose end nobody observed.
//
// The registry is storage only: nothing here opens a pidfd, signals, writes a cgroup or reads
// /proc. The process half — re-acquiring a root by exact pidfs identity, cleaning up after the
// executions that are gone, and adopting the live ones — is the supervisor layer's
// (custos/supervisor/recovery.hpp drives it; custos/backend/native_recovery.hpp holds the
// identity rules). docs/registry.md "Recovery" describes both halves.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/registry/registry.hpp"

namespace custos::registry {

// Everything recovery looks at, read once at daemon start (after Registry::open validated and
// quarantined): the records that are not terminal and not quarantined, in id order, and the
// findings that are only reported.
struct RecoveryWork {
  std::vector<ExecutionRecord> records;        // non-terminal, trusted
  std::vector<Claim> orphan_claims;            // kept, reported (never re-usable)
  std::vector<QuarantinedRecord> quarantined;  // kept, reported, never acted on
  std::size_t already_terminal = 0;            // terminal before this recovery
};

// Errors: registry.* from the reads.
[[nodiscard]] Result<RecoveryWork> read_recovery_work(Registry& registry);

// What a stored record alone says about its process, before anything looks at one.
enum class StoredEvidence : std::uint8_t {
  // Ownership unassigned: no child was ever staged, so the barrier was never released and no
  // program ran.
  nothing_staged,
  // legacy_unverified: pid and start time only; never acted on (indeterminate).
  legacy,
  // staged or committed: a pidfs identity the supervisor layer may try to re-acquire exactly.
  pidfs_identity,
  // modelled: a reference execution's model, which lived in the previous daemon's memory only:
  // nothing of it can have survived, and there is no process to look for.
  modelled,
  // marked: an ungated container exec, known by its marker and PID namespace only: nothing to
  // re-acquire, so it is swept (a live one too) and never adopted.
  marker_only,
};
[[nodiscard]] StoredEvidence stored_evidence(ExecutionRecord const& rec) noexcept;

// The terminal record of an execution whose end nobody observed (`via` absent_without_terminal
// or indeterminate): classification recovery_indeterminate, the stored trigger, every stream's
// output accounted incomplete (what was in flight was never read), resources unavailable,
// containment escapable (nothing is known about it after a restart), the cleanup as given.
[[nodiscard]] core::TerminalRecord unobserved_terminal(ExecutionRecord const& rec,
                                                       core::RecoveryPath via,
                                                       core::Cleanup cleanup);

// Writes unobserved_terminal() as the record's one terminal record (Registry::record_recovered:
// one transaction, no failpoint). Errors: registry.illegal_phase (already terminal),
// registry.*; lifecycle.* when `via` is not a recovery without an observed end.
[[nodiscard]] Result<void> record_unobserved_end(Registry& registry, ExecutionRecord const& rec,
                                                 core::RecoveryPath via, core::Cleanup cleanup);

}  // namespace custos::registry
