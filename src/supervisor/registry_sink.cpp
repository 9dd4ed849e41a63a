#include "custos/supervisor/registry_sink.hpp"

#include "custos/registry/ownership.hpp"
#include "custos/sys/identity.hpp"

namespace custos::supervisor {

Result<> RegistrySink::record_authorized(std::string const& execution_id,
                                         core::ExecutionIdentity const& identity,
                                         core::ExecutionPlan const& plan,
                                         std::string const& plan_digest) {
  auto ex = registry::make_new_execution(execution_id, identity, plan, plan_digest);
  if (!ex) return ex.error();
  return registry_->record_authorized(*ex);
}

Result<> RegistrySink::record_staged(std::string const& execution_id,
                                     sys::PidfsIdentity const& identity, Boundary boundary,
                                     std::string const& cgroup_path,
                                     std::string const& marker_value) {
  return registry_->record_staged(execution_id, registry::staged_ownership(identity),
                                  registry::boundary_info(boundary, cgroup_path, marker_value));
}

Result<> RegistrySink::record_committed(std::string const& execution_id) {
  return registry_->record_committed(execution_id);
}

Result<> RegistrySink::record_phase(std::string const& execution_id, core::Phase phase) {
  return registry_->record_phase(execution_id, phase);
}

Result<> RegistrySink::record_trigger(std::string const& execution_id, core::Trigger trigger) {
  return registry_->record_trigger(execution_id, trigger);
}

Result<> RegistrySink::record_output(std::string const& execution_id, StreamId stream,
                                     core::StreamAccounting const& accounting) {
  return registry_->record_output(execution_id, registry::stream_index(stream), accounting);
}

Result<> RegistrySink::record_terminal(std::string const& execution_id,
                                       core::TerminalRecord const& record) {
  auto blob = registry::terminal_blob(record);
  if (!blob) return blob.error();
  return registry_->record_terminal(execution_id, *blob);
}

}  // namespace custos::supervisor
