// Compilation: requirements (+ the plan they belong to, + the grant's contract, + who asks, + the
// secret store's answer) -> an inert CheckedSandboxPlan, or every reason it cannot be one
// (API.md "Sandbox requirements and contracts"; docs/sandbox.md).
//
// The checked plan is a function of the requirements alone (effective() then
// required_controls()): the plan, the contract, the caller and the store only decide whether it
// may exist. So its digest — the plan's sandbox_digest — is the same wherever it is computed
// (exec.check, exec.start, a conformance runner), whatever grant it is then checked against.
//
// The errors, in the order compile() decides them (every diagnostic of a kind at once, each with
// its RFC 6901 pointer into the request):
//   sandbox.required        the contract demands a sandbox and the plan has none
//   sandbox.invalid         a rule against the plan (compile_plan below) or the caller (uid 0
//                           without run_as_root: /plan/sandbox/process/run_as_root)
//   sandbox.undeclared      an item the contract does not allow (undeclared below)
//   sandbox.secret_unknown  a secret ref the store does not hold (asked only once the contract
//                           allowed it, so nobody learns what the store holds beyond that)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::sandbox {

// What `requirements` mean: every absent domain and field at its strictest value, every list a
// set (types.hpp, SandboxPolicy). Total on requirements read_requirements accepted.
[[nodiscard]] SandboxPolicy effective(SandboxRequirements const& requirements);

// The rules of a plan's requirements against the plan itself, each a sandbox.invalid
// diagnostic (pointers below `plan_ptr`, the plan's own pointer, e.g. "/plan"):
//   - every name of plan.env is in environment.allow (/plan/env/N/name);
//   - plan.io.mode is one of terminal.modes, and io.resize needs terminal.resize;
//   - a dimension in resources.enforce has a finite limit in plan.limits (enforcing unlimited
//     is nothing);
//   - a secret delivered to env is not also an entry of plan.env; with a secret delivered to a
//     file, plan.env does not set CUSTOS_SECRETS_DIR (the daemon names that directory); a secret
//     fd is below a finite limits.open_files;
//   - a read_only workspace stays read-only: no create, write or remove right reaches the
//     workspace root or anything below it (the grant approved read_only, without a lease).
[[nodiscard]] std::vector<Diagnostic> plan_rules(SandboxRequirements const& requirements,
                                                 SandboxPolicy const& policy,
                                                 core::ExecutionPlan const& plan,
                                                 std::string_view plan_ptr);

// A plan's checked sandbox plan: plan_rules, then the policy and its controls. Errors:
// sandbox.invalid with the diagnostics.
[[nodiscard]] Result<CheckedSandboxPlan> compile_plan(SandboxRequirements const& requirements,
                                                      core::ExecutionPlan const& plan,
                                                      std::string_view plan_ptr = "/plan");

// Every item of the plan's requirements that the contract does not allow, each a
// sandbox.undeclared diagnostic at the item's pointer below `sandbox_ptr` ("/plan/sandbox"):
// a right on a path (…/filesystem/N/allow/M) where the contract's rules give less (at that path
// or at any path below it the plan's rule reaches), descendants, a larger max_processes,
// run_as_root, an environment name, outbound any or a TCP port, a secret delivery, an io mode,
// input, resize; and, the other way round, a resource dimension the contract requires enforced
// that the plan does not enforce (the contract's resources.enforce is a floor: asking for
// enforcement is no authority, going without it is). `contract_of` names the contract's owner
// in the messages ("grant g7").
[[nodiscard]] std::vector<Diagnostic> undeclared(SandboxRequirements const& requirements,
                                                 SandboxRequirements const& contract,
                                                 std::string_view sandbox_ptr,
                                                 std::string_view contract_of);

struct CompileInput {
  core::ExecutionPlan const* plan = nullptr;
  // The plan's requirements; null when the plan has no sandbox.
  SandboxRequirements const* requirements = nullptr;
  // The contract of the grant the plan runs under; null when there is none (no grant, or a grant
  // without a contract).
  SandboxRequirements const* contract = nullptr;
  std::string contract_of;  // "grant g7", for messages
  // The caller's uid (SO_PEERCRED): the execution runs as it unless plan.user names another.
  std::uint32_t caller_uid = 0;
  // Whether the secret store holds `ref`. Empty: there is no store, so no ref is known.
  std::function<bool(std::string_view ref)> secret_exists;
  std::string plan_ptr = "/plan";
};

// The whole compilation (the file comment's order). nullopt: an unsandboxed plan that may run
// unsandboxed.
[[nodiscard]] Result<std::optional<CheckedSandboxPlan>> compile(CompileInput const& in);

// An error of `code` carrying `diagnostics` (one: its pointer and message as the context;
// several: their count). Every diagnostic keeps its own code.
[[nodiscard]] Error sandbox_error(Errc code, std::vector<Diagnostic> diagnostics);

}  // namespace custos::sandbox
