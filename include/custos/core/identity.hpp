// The execution identity: who an execution belongs to, as the request names it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/error.hpp"

namespace custos::core {

// The full lineage of one execution (project → session → run → attempt → turn → action →
// process) plus what it runs against (workspace, resource, environment) and the revision tuple
// it was authorized at. Every id follows ids.hpp; generation and revision are any u64.
//
// kFieldCount is the number of data members. The canonical encoder destructures the struct into
// exactly that many bindings, so adding a member without encoding it does not compile, and the
// field-enumeration test checks it has one mutator per member.
struct ExecutionIdentity {
  static constexpr std::size_t kFieldCount = 12;

  std::string project_id;
  std::string session_id;
  std::string run_id;
  std::string attempt_id;
  std::string turn_id;
  std::string action_id;
  std::string process_id;
  std::string workspace_id;
  std::string resource_id;
  std::string environment_id;
  std::uint64_t generation = 0;
  std::uint64_t revision = 0;

  friend bool operator==(ExecutionIdentity const&, ExecutionIdentity const&) = default;
};

// The JSON names of the ten id members, in member order.
inline constexpr std::string_view kIdentityIdNames[] = {
    "project_id", "session_id", "run_id",       "attempt_id",  "turn_id",
    "action_id",  "process_id", "workspace_id", "resource_id", "environment_id"};

// Pointers to the ten id members, in the order of kIdentityIdNames.
[[nodiscard]] std::vector<std::string*> identity_ids(ExecutionIdentity& id);
[[nodiscard]] std::vector<std::string const*> identity_ids(ExecutionIdentity const& id);

// Every problem with the identity (plan.invalid_id / plan.nul_byte), each with its JSON pointer
// below `pointer_base` (e.g. "/identity"). Empty when valid.
[[nodiscard]] std::vector<Diagnostic> validate_identity(ExecutionIdentity const& id,
                                                        std::string_view pointer_base = "");

}  // namespace custos::core
