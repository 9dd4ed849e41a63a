// The pure cross-check: a start's authority (the admin's implicit one, or a grant with its lease,
// scope, budget and sandbox contract) against the plan and identity it is asked to launch.
#include <algorithm>
#include <string>
#include <vector>

#include "custos/gateway/authority.hpp"
#include "custos/sandbox/canonical.hpp"
#include "custos/sandbox/compile.hpp"
#include "custos/sandbox/json.hpp"

namespace custos::gateway {

namespace {

Error mismatch(Errc c, std::string what) {
  return Error{c, std::move(what)};
}

bool contains(std::vector<std::string> const& v, std::string const& s) {
  return std::binary_search(v.begin(), v.end(), s) || std::find(v.begin(), v.end(), s) != v.end();
}

// Writable access: the exact current lease of the workspace, held by this session, at the
// epoch the caller saw. `required`: whether a writable start without any lease is refused
// (always for grants; for the admin's implicit authority only when someone holds a lease).
Result<std::optional<std::string>> check_lease(CheckInput const& in, bool required) {
  auto const& claim = *in.claim;
  auto const& cur = *in.current;
  auto const& id = *in.identity;
  if (in.plan->workspace.access == core::WorkspaceAccess::read_only) {
    if (claim.lease_id) {
      return mismatch(Errc::auth_lease_surplus, "a read_only execution names lease " +
                                                    *claim.lease_id +
                                                    ": surplus mutation authority is refused");
    }
    return std::optional<std::string>{};
  }
  if (!claim.lease_id) {
    if (required || cur.workspace_lease) {
      return mismatch(Errc::auth_lease_required,
                      "writable workspace " + id.workspace_id + " needs its active lease");
    }
    return std::optional<std::string>{};
  }
  if (!cur.lease || !cur.lease->active) {
    return mismatch(Errc::auth_lease_stale, "lease " + *claim.lease_id + " is not active");
  }
  Lease const& l = *cur.lease;
  if (l.workspace_id != id.workspace_id) {
    return mismatch(Errc::auth_lease_stale,
                    "lease " + l.id + " is for workspace " + l.workspace_id);
  }
  if (l.holder_session != id.session_id) {
    return mismatch(Errc::auth_lease_stale,
                    "lease " + l.id + " is held by session " + l.holder_session);
  }
  if (claim.lease_epoch && *claim.lease_epoch != l.epoch) {
    return mismatch(Errc::auth_lease_stale, "lease " + l.id + " is at epoch " +
                                                std::to_string(l.epoch) + ", request names " +
                                                std::to_string(*claim.lease_epoch));
  }
  if (!cur.workspace_lease || cur.workspace_lease->id != l.id) {
    return mismatch(Errc::auth_lease_stale,
                    "lease " + l.id + " is not the workspace's current lease");
  }
  return std::optional<std::string>{l.id};
}

bool runs_as_caller(CheckInput const& in) {
  auto const& u = in.plan->user;
  return !u || (u->uid == in.caller.uid && u->gid == in.caller.gid && u->groups.empty());
}

Result<CheckOutcome> check_implicit(CheckInput const& in) {
  if (!in.caller.admin) {
    return mismatch(Errc::auth_denied,
                    "no grant named; only admins start executions without a grant");
  }
  if (in.claim->grant_revision) {
    return mismatch(Errc::auth_unknown_grant, "grant_revision given without grant_id");
  }
  if (in.claim->plan_digest && *in.claim->plan_digest != in.plan_digest) {
    return mismatch(Errc::auth_digest_mismatch,
                    "authority.plan_digest is not the plan's digest " + in.plan_digest);
  }
  // The admin's implicit authority covers every backend (exec.native, exec.reference, ...).
  if (!runs_as_caller(in)) {
    return mismatch(Errc::auth_user, "the admin's implicit authority runs as the caller only");
  }
  CUSTOS_TRYV(check_sandbox(in, nullptr));
  CheckOutcome out;
  out.implicit_admin = true;
  out.lease_id = CUSTOS_TRY(check_lease(in, false));
  return out;
}

}  // namespace

namespace {

// 1-2. The live grant is the caller's, gives runner, and is what the caller saw: the current
// epoch and revision, not expired, for this very plan.
Result<void> check_grant(CheckInput const& in, Grant const& g) {
  auto const& claim = *in.claim;
  auto const& cur = *in.current;
  if (!in.caller.is(g.principal)) {
    return mismatch(Errc::auth_denied, "grant " + g.id + " belongs to " + g.principal.to_string());
  }
  if (g.role < Role::runner) {
    return mismatch(Errc::auth_denied, "grant " + g.id + " gives role " +
                                           std::string{role_wire(g.role)} + ", not runner");
  }
  // 2. The authority the caller saw is the current one.
  if (claim.epoch != cur.epoch) {
    return mismatch(Errc::auth_stale_epoch, "authority epoch is " + std::to_string(cur.epoch) +
                                                ", request names " + std::to_string(claim.epoch));
  }
  if (claim.grant_revision && *claim.grant_revision != g.revision) {
    return mismatch(Errc::auth_stale_revision, "grant " + g.id + " is at revision " +
                                                   std::to_string(g.revision) + ", request names " +
                                                   std::to_string(*claim.grant_revision));
  }
  if (g.expires_ns && *g.expires_ns <= in.now_ns) {
    return mismatch(Errc::auth_expired, "grant " + g.id + " expired");
  }
  if (claim.plan_digest && *claim.plan_digest != in.plan_digest) {
    return mismatch(Errc::auth_digest_mismatch,
                    "authority.plan_digest is not the plan's digest " + in.plan_digest);
  }
  return ok();
}

// 3. What is run, where, with what: operation class, executable, workspace, environment and
// resource ids, environment entries, user, limit ceilings.
Result<void> check_scope(CheckInput const& in, Grant const& g) {
  auto const& id = *in.identity;
  auto const& plan = *in.plan;
  OperationClass const op = operation_of(plan.backend.kind);
  if (std::find(g.operations.begin(), g.operations.end(), op) == g.operations.end()) {
    return mismatch(Errc::auth_operation_class,
                    "grant " + g.id + " does not allow " + std::string{operation_wire(op)});
  }
  if ((op == OperationClass::exec_docker || op == OperationClass::exec_podman) &&
      std::none_of(g.containers.begin(), g.containers.end(),
                   [&](ContainerRule const& c) { return c.allows(plan.backend); })) {
    return mismatch(Errc::auth_container,
                    "grant " + g.id + " does not allow " +
                        std::string{core::to_string(plan.backend.kind)} + " container " +
                        plan.backend.container.value_or("") +
                        (plan.backend.socket ? " at " + *plan.backend.socket : std::string{}));
  }
  if (std::none_of(g.executables.begin(), g.executables.end(),
                   [&](ExecutableRule const& r) { return r.allows(plan.command.executable); })) {
    return mismatch(Errc::auth_executable,
                    "grant " + g.id + " does not allow executable " + plan.command.executable);
  }
  auto const ws =
      std::find_if(g.workspaces.begin(), g.workspaces.end(), [&](WorkspaceRule const& w) {
        return w.workspace_id == id.workspace_id && w.root == plan.workspace.root;
      });
  if (ws == g.workspaces.end()) {
    return mismatch(Errc::auth_workspace, "grant " + g.id + " does not cover workspace " +
                                              id.workspace_id + " at " + plan.workspace.root);
  }
  if (static_cast<int>(plan.workspace.access) > static_cast<int>(ws->max_access)) {
    return mismatch(Errc::auth_workspace, "grant " + g.id + " allows workspace " + id.workspace_id +
                                              " " + std::string{core::to_string(ws->max_access)} +
                                              " only");
  }
  if (!contains(g.environment_ids, id.environment_id)) {
    return mismatch(Errc::auth_environment,
                    "grant " + g.id + " does not cover environment " + id.environment_id);
  }
  if (!contains(g.resource_ids, id.resource_id)) {
    return mismatch(Errc::auth_resource,
                    "grant " + g.id + " does not cover resource " + id.resource_id);
  }
  for (auto const& e : plan.env) {
    if (e.inherits()) {
      if (!contains(g.inherit_env, e.name)) {
        return mismatch(Errc::auth_env_inherit,
                        "grant " + g.id + " does not allow inheriting " + e.name);
      }
    } else if (!g.literal_env) {
      // Inherit permission for the same name does not help: a literal is caller-chosen bytes.
      return mismatch(Errc::auth_env_literal,
                      "grant " + g.id + " does not allow the literal " + e.name);
    }
  }
  if (!runs_as_caller(in) &&
      !std::binary_search(g.run_as_uids.begin(), g.run_as_uids.end(), plan.user->uid)) {
    return mismatch(Errc::auth_user, "grant " + g.id + " does not allow running as uid " +
                                         std::to_string(plan.user->uid));
  }
  auto const limits = core::limit_members(plan.limits);
  auto const ceilings = core::limit_members(g.ceilings);
  for (std::size_t i = 0; i < limits.size(); ++i) {
    if (!*ceilings[i]) continue;
    if (!*limits[i] || **limits[i] > **ceilings[i]) {
      return mismatch(Errc::auth_limit_ceiling,
                      "limits." + std::string{core::kLimitNames[i]} + " " +
                          (*limits[i] ? std::to_string(**limits[i]) : std::string{"unlimited"}) +
                          " is above grant " + g.id + "'s ceiling " +
                          std::to_string(**ceilings[i]));
    }
  }
  return ok();
}

// 4. Budget: the plan's limits are reserved until the terminal record settles them.
Result<void> check_budget(CheckInput const& in, Grant const& g, CheckOutcome& out) {
  auto const& plan = *in.plan;
  BudgetUse const& u = in.current->budget_use;
  if (g.budget.executions && u.executions + 1 > *g.budget.executions) {
    return mismatch(Errc::auth_budget_exhausted,
                    "grant " + g.id + " has used " + std::to_string(u.executions) + " of " +
                        std::to_string(*g.budget.executions) + " executions");
  }
  auto reserve = [&](char const* name, std::optional<std::uint64_t> budget, core::Limit limit,
                     std::uint64_t used, std::uint64_t reserved,
                     std::uint64_t& into) -> Result<void> {
    into = limit.value_or(0);
    if (!budget) return ok();
    if (!limit) {
      return mismatch(Errc::auth_budget_exhausted, std::string{"an unlimited limits."} + name +
                                                       " cannot be reserved against grant " + g.id +
                                                       "'s finite " + name + " budget");
    }
    if (used + reserved + *limit > *budget) {
      return mismatch(Errc::auth_budget_exhausted, std::string{name} + ": " + std::to_string(used) +
                                                       " used + " + std::to_string(reserved) +
                                                       " reserved + " + std::to_string(*limit) +
                                                       " requested exceeds grant " + g.id +
                                                       "'s budget " + std::to_string(*budget));
    }
    return ok();
  };
  CUSTOS_TRYV(reserve("cpu_ms", g.budget.cpu_ms, plan.limits.cpu_ms, u.cpu_ms_used,
                      u.cpu_ms_reserved, out.cpu_ms_reserve));
  CUSTOS_TRYV(reserve("wall_ms", g.budget.wall_ms, plan.limits.wall_ms, u.wall_ms_used,
                      u.wall_ms_reserved, out.wall_ms_reserve));
  return ok();
}

}  // namespace

Result<CheckOutcome> cross_check(CheckInput const& in) {
  if (in.identity == nullptr || in.plan == nullptr || in.claim == nullptr ||
      in.current == nullptr) {
    return Error{Errc::internal, "cross_check: incomplete input"};
  }
  auto const& claim = *in.claim;
  auto const& cur = *in.current;
  if (!claim.grant_id) return check_implicit(in);

  // 1. The grant exists, is live, and is the caller's.
  if (!cur.grant || cur.grant->revoked) {
    return mismatch(Errc::auth_unknown_grant,
                    "grant " + *claim.grant_id + (cur.grant ? " was revoked" : " does not exist"));
  }
  Grant const& g = *cur.grant;
  CUSTOS_TRYV(check_grant(in, g));
  CUSTOS_TRYV(check_scope(in, g));
  CUSTOS_TRYV(check_sandbox(in, &g));
  CheckOutcome out;
  CUSTOS_TRYV(check_budget(in, g, out));
  // 5. The lease, last: it is the one piece another holder can change at any moment.
  out.lease_id = CUSTOS_TRY(check_lease(in, true));
  return out;
}

Result<void> check_sandbox(CheckInput const& in, Grant const* grant) {
  sandbox::CompileInput c;
  c.plan = in.plan;
  c.requirements = in.sandbox != nullptr ? &in.sandbox->requirements : nullptr;
  c.contract = grant != nullptr && grant->sandbox ? &*grant->sandbox : nullptr;
  c.contract_of = grant != nullptr ? "grant " + grant->id : std::string{};
  c.caller_uid = in.caller.uid;
  c.secret_exists = in.secret_exists;
  auto const compiled = CUSTOS_TRY(sandbox::compile(c));
  // The cross-check between the layers: what the authority compiles is what the plan's bytes
  // name (and so what plan_digest covers, and what will be enforced).
  std::optional<core::Digest> digest;
  if (compiled) digest = CUSTOS_TRY(sandbox::digest(*compiled));
  if (digest != in.plan->sandbox_digest) {
    return mismatch(Errc::auth_digest_mismatch,
                    "the plan's sandbox_digest is not the digest of its compiled sandbox");
  }
  return ok();
}

}  // namespace custos::gateway
