// Conversions between core/sys values and registry records.
#include "custos/registry/ownership.hpp"

#include "custos/core/plan_canonical.hpp"

namespace custos::registry {

Result<NewExecution> make_new_execution(std::string const& execution_id,
                                        core::ExecutionIdentity const& identity,
                                        core::ExecutionPlan const& plan,
                                        std::string const& expected_digest) {
  NewExecution ex;
  ex.execution_id = execution_id;
  ex.action_id = identity.action_id;
  ex.process_id = identity.process_id;
  ex.session_id = identity.session_id;
  ex.plan_canonical = CUSTOS_TRY(core::encode_execution(identity, plan));
  ex.plan_digest = sha256_tagged(ex.plan_canonical);
  if (!expected_digest.empty() && expected_digest != ex.plan_digest) {
    return Error{Errc::auth_digest_mismatch, execution_id + ": plan digest " + expected_digest +
                                                 " does not match the plan (" + ex.plan_digest +
                                                 ")"};
  }
  ex.backend = std::string{core::to_string(plan.backend.kind)};
  return ex;
}

Ownership modelled_ownership() {
  Ownership o;
  o.state = OwnershipState::modelled;
  return o;
}

Ownership staged_ownership(sys::PidfsIdentity const& id) {
  Ownership o;
  o.state = OwnershipState::staged;
  o.boot_id = id.boot_id;
  o.pidfs_dev = id.pidfs_dev;
  o.pidfs_ino = id.pidfs_ino;
  o.pid = id.pid;
  o.start_time_ticks = id.start_time_ticks;
  o.pid_ns_ino = current_pid_ns_ino();
  return o;
}

Ownership marked_ownership(std::uint64_t not_before_ticks) {
  Ownership o;
  o.state = OwnershipState::marked;
  o.start_time_ticks = not_before_ticks;
  return o;
}

BoundaryInfo boundary_info(core::Boundary boundary, std::string const& cgroup_path,
                           std::string const& marker_hex, std::uint64_t marker_ns_ino) {
  BoundaryInfo b;
  b.kind = boundary;
  b.cgroup_path = cgroup_path;
  b.marker_hex = marker_hex;
  b.marker_ns_ino = marker_ns_ino;
  return b;
}

int stream_index(core::Stream s) noexcept {
  return s == core::Stream::stderr_stream ? 1 : 0;
}

Result<TerminalBlob> terminal_blob(core::TerminalRecord const& rec) {
  TerminalBlob t;
  t.bytes = CUSTOS_TRY(core::canonical_bytes(rec));
  t.digest = sha256_tagged(t.bytes);
  t.classification = std::string{core::classification_wire(rec.classification)};
  t.recovery = std::string{core::recovery_path_wire(rec.recovery)};
  return t;
}

Result<core::TerminalRecord> decode_terminal(TerminalBlob const& blob) {
  return core::terminal_from_canonical(blob.bytes);
}

}  // namespace custos::registry
