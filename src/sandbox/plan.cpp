// A whole plan with its sandbox (plan.hpp).
#include "custos/sandbox/plan.hpp"

#include <algorithm>

#include "custos/core/json_fields.hpp"
#include "custos/core/json_pointer.hpp"
#include "custos/core/plan_json.hpp"
#include "custos/sandbox/canonical.hpp"
#include "custos/sandbox/compile.hpp"
#include "custos/sandbox/json.hpp"

namespace custos::sandbox {
namespace json = boost::json;

Result<std::shared_ptr<PlanSandbox const>> compile_sandbox(SandboxRequirements requirements,
                                                           core::ExecutionPlan const& plan,
                                                           std::string_view plan_ptr) {
  auto checked = CUSTOS_TRY(compile_plan(requirements, plan, plan_ptr));
  auto d = CUSTOS_TRY(digest(checked));
  return std::make_shared<PlanSandbox const>(
      PlanSandbox{std::move(requirements), std::move(checked), d});
}

Result<ParsedPlan> parse_plan(json::value const& v, std::string_view pointer_base) {
  std::string const base{pointer_base};
  core::FieldReader r;
  auto plan = core::parse_plan(v, base, core::SandboxMember::skip);
  if (!plan) r.absorb(plan.error(), base);
  SandboxRequirements requirements;
  json::value const* member = nullptr;
  if (auto const* o = v.if_object()) member = core::FieldReader::optional(*o, "sandbox");
  if (member != nullptr) {
    read_requirements(r, *member, core::pointer_append(base, "sandbox"), requirements);
  }
  if (!r.ok()) {
    // Findings of the sandbox alone, all of one sandbox code, keep it (as compilation's do).
    auto const& d = r.diagnostics();
    bool const one_code = std::all_of(d.begin(), d.end(), [&d](Diagnostic const& x) {
      return x.code == d.front().code && x.code == Errc::sandbox_invalid;
    });
    if (one_code && d.size() > 1) return sandbox_error(Errc::sandbox_invalid, d);
    return std::move(r).error();
  }
  ParsedPlan out;
  out.plan = std::move(*plan);
  if (member != nullptr) {
    out.sandbox = CUSTOS_TRY(compile_sandbox(std::move(requirements), out.plan, base));
    out.plan.sandbox_digest = out.sandbox->digest;
  }
  return out;
}

Result<void> check_binding(core::ExecutionPlan const& plan, PlanSandbox const* sandbox) {
  if (sandbox == nullptr) {
    if (!plan.sandbox_digest) return ok();
    return Error{Errc::auth_digest_mismatch, "the plan names a sandbox that did not come with it"};
  }
  if (!plan.sandbox_digest || *plan.sandbox_digest != sandbox->digest) {
    return Error{Errc::auth_digest_mismatch, "the sandbox is not the one the plan's digest names"};
  }
  auto const d = digest(sandbox->checked);
  if (!d || *d != sandbox->digest) {
    return Error{Errc::auth_digest_mismatch,
                 "the checked sandbox plan does not hash to its digest"};
  }
  return ok();
}

json::value to_json(ParsedPlan const& p) {
  json::value v = core::to_json(p.plan);
  if (p.sandbox) v.as_object()["sandbox"] = to_json(p.sandbox->checked.policy);
  return v;
}

}  // namespace custos::sandbox
