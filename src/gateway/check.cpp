// exec.check through the gateway: exec.start's refusals before the claim, as a dry run.
#include "custos/core/plan_canonical.hpp"
#include "custos/gateway/gateway.hpp"

#include "clock.hpp"

namespace custos::gateway {

Result<CheckAnswer> ExecutionGateway::check(Caller const& caller,
                                            supervisor::LaunchRequest const& request,
                                            AuthorityClaim const& claim) {
  if (manager_ == nullptr) return Error{Errc::internal, "gateway has no execution manager"};
  CheckAnswer answer;
  // Validated and digested as exec.start does (the encoder re-runs every plan rule).
  answer.plan_digest = CUSTOS_TRY(core::plan_digest(request.identity, request.plan)).to_string();
  CUSTOS_TRYV(sandbox::check_binding(request.plan, request.sandbox.get()));
  // The workspace and cwd against this host, where exec.start checks them (before the claim).
  CUSTOS_TRYV(manager_->check_workspace(request.plan));
  std::optional<Grant> grant;
  if (claim.grant_id) {
    auto found = CUSTOS_TRY(store_->get_grant(*claim.grant_id));
    // One answer for "no such grant", "revoked" and "another principal's": a dry run tells a
    // caller nothing about grants that are not its own.
    if (!found || found->first.revoked || (!caller.admin && !caller.is(found->first.principal))) {
      return Error{Errc::auth_unknown_grant,
                   "grant " + *claim.grant_id + ": no live grant of this caller by that id"};
    }
    if (found->first.expires_ns && *found->first.expires_ns <= realtime_ns()) {
      return Error{Errc::auth_expired, "grant " + *claim.grant_id + " expired"};
    }
    grant = std::move(found->first);
  }
  CheckInput in;
  in.caller = caller;
  in.identity = &request.identity;
  in.plan = &request.plan;
  in.sandbox = request.sandbox.get();
  in.secret_exists = options_.secret_exists;
  CUSTOS_TRYV(check_sandbox(in, grant ? &*grant : nullptr));
  answer.sandbox_digest = request.plan.sandbox_digest;
  answer.sandbox = request.sandbox.get();
  answer.admission =
      manager_->admission(request.plan, request.sandbox ? &request.sandbox->checked : nullptr);
  return answer;
}

}  // namespace custos::gateway
