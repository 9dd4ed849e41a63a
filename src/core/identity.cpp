#include "custos/core/identity.hpp"

#include "custos/core/ids.hpp"
#include "custos/core/json_pointer.hpp"

namespace custos::core {

std::vector<std::string*> identity_ids(ExecutionIdentity& id) {
  return {&id.project_id, &id.session_id, &id.run_id,       &id.attempt_id,  &id.turn_id,
          &id.action_id,  &id.process_id, &id.workspace_id, &id.resource_id, &id.environment_id};
}

std::vector<std::string const*> identity_ids(ExecutionIdentity const& id) {
  return {&id.project_id, &id.session_id, &id.run_id,       &id.attempt_id,  &id.turn_id,
          &id.action_id,  &id.process_id, &id.workspace_id, &id.resource_id, &id.environment_id};
}

std::vector<Diagnostic> validate_identity(ExecutionIdentity const& id,
                                          std::string_view pointer_base) {
  std::vector<Diagnostic> out;
  auto const ids = identity_ids(id);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::string const ptr = pointer_append(pointer_base, kIdentityIdNames[i]);
    if (ids[i]->find('\0') != std::string::npos) {
      out.push_back({Errc::plan_nul_byte, ptr, "contains a NUL byte"});
    } else if (auto why = id_problem(*ids[i])) {
      out.push_back({Errc::plan_invalid_id, ptr, "id " + *why});
    }
  }
  return out;
}

}  // namespace custos::core
