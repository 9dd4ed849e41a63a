// Startup recovery, the storage half: the records to recover and the terminal records of
// executions whose end nobody observed. No process is looked at here (recovery.hpp).
#include "custos/registry/recovery.hpp"

#include "custos/registry/ownership.hpp"

namespace custos::registry {

Result<RecoveryWork> read_recovery_work(Registry& registry) {
  RecoveryWork w;
  w.quarantined = CUSTOS_TRY(registry.quarantined());
  w.orphan_claims = CUSTOS_TRY(registry.orphan_claims());
  w.records = CUSTOS_TRY(registry.non_terminal());
  w.already_terminal = CUSTOS_TRY(registry.count_terminal());
  return w;
}

StoredEvidence stored_evidence(ExecutionRecord const& rec) noexcept {
  switch (rec.ownership.state) {
    case OwnershipState::unassigned:
      return StoredEvidence::nothing_staged;
    case OwnershipState::legacy_unverified:
      return StoredEvidence::legacy;
    case OwnershipState::staged:
    case OwnershipState::committed:
      return StoredEvidence::pidfs_identity;
    case OwnershipState::modelled:
      return StoredEvidence::modelled;
    case OwnershipState::marked:
      return StoredEvidence::marker_only;
  }
  return StoredEvidence::legacy;  // unreachable: an unknown slot is never acted on
}

core::TerminalRecord unobserved_terminal(ExecutionRecord const& rec, core::RecoveryPath via,
                                         core::Cleanup cleanup) {
  core::TerminalRecord t;
  t.classification = core::Classification::recovery_indeterminate;
  t.recovery = via;
  t.trigger = rec.trigger;
  // Whatever was in flight when the daemon died was never read: neither stream is complete.
  auto incomplete = [](core::StreamAccounting const& a) {
    auto m = core::account_mark_incomplete(a);
    return m ? *m : core::StreamAccounting{a.observed, a.retained, a.dropped, false};
  };
  t.output[core::Stream::stdout_stream] = incomplete(rec.out.accounting);
  t.output[core::Stream::stderr_stream] = incomplete(rec.err.accounting);
  t.tree.boundary = rec.boundary.kind.value_or(core::Boundary::marker);
  t.tree.cleanup = cleanup;
  // After a restart nothing is known about nsdelegate/uid at launch time: claim the weaker one.
  t.tree.containment = core::Containment::escapable;
  for (auto& d : t.resources.dims) d.fidelity = core::Fidelity::unavailable;
  return t;
}

Result<void> record_unobserved_end(Registry& registry, ExecutionRecord const& rec,
                                   core::RecoveryPath via, core::Cleanup cleanup) {
  if (via != core::RecoveryPath::absent_without_terminal &&
      via != core::RecoveryPath::indeterminate) {
    return Error{Errc::lifecycle_illegal_transition,
                 rec.execution_id +
                     ": an unobserved end is absent_without_terminal or "
                     "indeterminate, not " +
                     std::string{core::recovery_path_wire(via)}};
  }
  TerminalBlob blob = CUSTOS_TRY(terminal_blob(unobserved_terminal(rec, via, cleanup)));
  return registry.record_recovered(rec.execution_id, {}, blob, via);
}

}  // namespace custos::registry
