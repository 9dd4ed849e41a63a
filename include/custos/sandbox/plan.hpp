// A whole execution plan with its sandbox: the JSON `plan` of exec.start and exec.check.
//
// Core parses and digests every member of a plan but `sandbox`, whose requirements are this
// layer's types (core/plan_json.hpp, SandboxMember). parse_plan here is the one reader of a
// complete plan: core's parse for the other members, read_requirements for `plan.sandbox`
// (every diagnostic of both reported at once), then compile_plan, whose digest becomes the
// plan's sandbox_digest and so enters its canonical bytes and plan_digest. What the sandbox's
// checks against a grant, a caller and the secret store decide comes later (compile()); none of
// it can change the checked plan or its digest.
#pragma once

#include <boost/json/value.hpp>

#include <memory>
#include <string_view>

#include "custos/core/digest.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::sandbox {

// A plan's sandbox: what the request said (for the diagnostics of later checks) and what it
// compiled to. digest == canonical digest(checked) == the plan's sandbox_digest.
struct PlanSandbox {
  SandboxRequirements requirements;
  CheckedSandboxPlan checked;
  core::Digest digest;
};

struct ParsedPlan {
  core::ExecutionPlan plan;
  std::shared_ptr<PlanSandbox const> sandbox;  // null: no `plan.sandbox`, an unsandboxed plan
};

// Errors: every diagnostic of the plan and of its sandbox's structure at once (one keeps its
// code, several give plan.invalid); then compile_plan's (sandbox.invalid).
[[nodiscard]] Result<ParsedPlan> parse_plan(boost::json::value const& v,
                                            std::string_view pointer_base = "");

// A compiled sandbox for `plan` from its requirements (compile_plan + digest). For tests and
// callers that build requirements in C++.
[[nodiscard]] Result<std::shared_ptr<PlanSandbox const>> compile_sandbox(
    SandboxRequirements requirements, core::ExecutionPlan const& plan,
    std::string_view plan_ptr = "/plan");

// Whether `sandbox` is the one `plan` names: both absent, or sandbox->digest equal to
// plan.sandbox_digest and to the digest of sandbox->checked recomputed. Errors:
// auth.digest_mismatch naming which.
[[nodiscard]] Result<void> check_binding(core::ExecutionPlan const& plan,
                                         PlanSandbox const* sandbox);

// The effective plan: core's to_json, plus `sandbox` (the policy: every domain and default)
// when it has one. parse_plan(to_json(p)) gives p back.
[[nodiscard]] boost::json::value to_json(ParsedPlan const& p);

}  // namespace custos::sandbox
