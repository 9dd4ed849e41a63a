// The pure cross-check: one row per mismatch class, each asserting the exact code, plus the
// accepted shapes (grant with and without a lease, the admin's implicit authority).
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "custos/core/plan_canonical.hpp"
#include "custos/gateway/authority.hpp"
#include "custos/sandbox/json.hpp"

#include "identity_fixture.hpp"

namespace custos::gateway {
namespace {

constexpr std::int64_t kNow = 1'700'000'000'000'000'000;

// A valid reference backend (its script is required): an empty script, which exits 0.
core::Backend reference_backend() {
  return core::Backend{core::BackendKind::reference, std::nullopt, std::nullopt,
                       core::ReferenceScript{}};
}

struct Fixture {
  Caller caller{1000, 1000, {27}, false};
  core::ExecutionIdentity id;
  core::ExecutionPlan plan;
  AuthorityClaim claim;
  AuthoritySnapshot cur;
  std::shared_ptr<sandbox::PlanSandbox const> sb;
  std::function<bool(std::string_view)> secret_exists;

  // The plan gets this sandbox (compiled; its digest in the plan, as sandbox::parse_plan does).
  void sandbox_of(std::string_view requirements) {
    auto req = sandbox::parse_requirements(boost::json::parse(requirements), "/plan/sandbox");
    ASSERT_TRUE(req) << req.error().message();
    auto compiled = sandbox::compile_sandbox(*req, plan);
    ASSERT_TRUE(compiled) << compiled.error().message();
    sb = *compiled;
    plan.sandbox_digest = sb->digest;
  }
  void contract_of(std::string_view requirements) {
    auto req = sandbox::parse_requirements(boost::json::parse(requirements), "/sandbox");
    ASSERT_TRUE(req) << req.error().message();
    cur.grant->sandbox = *req;
  }

  Fixture() {
    id = fixture::fixture_identity(3);
    id.revision = 17;
    plan.command.executable = "/usr/bin/make";
    plan.command.argv = {"make", "test"};
    plan.workspace.root = "/srv/w1";
    plan.workspace.access = core::WorkspaceAccess::read_only;
    plan.env = {core::EnvEntry{"PATH", std::nullopt}, core::EnvEntry{"CI", std::string{"1"}}};
    plan.limits.wall_ms = 60'000;
    plan.limits.cpu_ms = 30'000;

    Grant g;
    g.id = "g7";
    g.revision = 4;
    g.principal = Principal{PrincipalKind::uid, 1000};
    g.role = Role::runner;
    g.operations = {OperationClass::exec_native};
    g.executables = {ExecutableRule{"/usr/bin", true}};
    g.workspaces = {WorkspaceRule{"w1", "/srv/w1", core::WorkspaceAccess::writable}};
    g.environment_ids = {"env1"};
    g.resource_ids = {"res1"};
    g.inherit_env = {"PATH"};
    g.literal_env = true;
    g.ceilings.wall_ms = 600'000;
    g.budget.executions = 10;
    g.budget.cpu_ms = 100'000;
    g.expires_ns = kNow + 1'000'000'000;
    cur.epoch = 12;
    cur.grant = g;
    claim.epoch = 12;
    claim.grant_id = "g7";
  }

  void make_writable() {
    plan.workspace.access = core::WorkspaceAccess::writable;
    Lease l{"l-1", "w1", "s1", 5, true, Principal{PrincipalKind::uid, 1000}, kNow};
    cur.lease = l;
    cur.workspace_lease = l;
    claim.lease_id = "l-1";
    claim.lease_epoch = 5;
  }

  Result<CheckOutcome> run() {
    auto d = core::plan_digest(id, plan);
    EXPECT_TRUE(d.has_value());
    CheckInput in;
    in.caller = caller;
    in.identity = &id;
    in.plan = &plan;
    in.plan_digest = d ? d->to_string() : std::string{};
    in.claim = &claim;
    in.current = &cur;
    in.now_ns = kNow;
    in.sandbox = sb.get();
    in.secret_exists = secret_exists;
    return cross_check(in);
  }
};

TEST(CrossCheck, AcceptsAMatchingGrantAndReservesThePlanLimits) {
  Fixture f;
  auto r = f.run();
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_FALSE(r->implicit_admin);
  EXPECT_EQ(r->cpu_ms_reserve, 30'000U);
  EXPECT_EQ(r->wall_ms_reserve, 60'000U);
  EXPECT_FALSE(r->lease_id.has_value());
}

TEST(CrossCheck, AcceptsWritableWithTheExactCurrentLease) {
  Fixture f;
  f.make_writable();
  auto r = f.run();
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->lease_id, std::optional<std::string>{"l-1"});
}

TEST(CrossCheck, AcceptsAGroupPrincipal) {
  Fixture f;
  f.cur.grant->principal = Principal{PrincipalKind::gid, 27};
  EXPECT_TRUE(f.run().has_value());
}

struct Row {
  char const* name;
  std::function<void(Fixture&)> mutate;
  Errc expected;
};

class Mismatch : public ::testing::TestWithParam<Row> {};

TEST_P(Mismatch, IsItsExactTypedError) {
  Fixture f;
  GetParam().mutate(f);
  auto r = f.run();
  ASSERT_FALSE(r.has_value()) << GetParam().name << " was accepted";
  EXPECT_EQ(r.error().code, GetParam().expected)
      << GetParam().name << ": got " << r.error().message();
}

// A docker plan for container `name` (at `socket`), and a grant allowing exec.docker.
void docker_plan(Fixture& f, std::string name, std::optional<std::string> socket = {}) {
  f.plan.backend =
      core::Backend{core::BackendKind::docker, std::move(name), std::move(socket), std::nullopt};
  f.cur.grant->operations = {OperationClass::exec_docker};
}

TEST(CrossCheck, AContainerRuleAllowsItsEngineNameAndSocketOnly) {
  Fixture f;
  docker_plan(f, "ci");
  f.cur.grant->containers = {ContainerRule{core::BackendKind::docker, "ci", std::nullopt}};
  EXPECT_TRUE(f.run().has_value());
  // Another socket, even with the same name, is another engine: the rule names none.
  docker_plan(f, "ci", "/run/other.sock");
  auto r = f.run();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::auth_container);
  f.cur.grant->containers.push_back(
      ContainerRule{core::BackendKind::docker, "ci", std::string{"/run/other.sock"}});
  EXPECT_TRUE(f.run().has_value());
}

Lease other_lease() {
  return Lease{"l-2", "w1", "s2", 6, true, Principal{PrincipalKind::uid, 1001}, kNow};
}

INSTANTIATE_TEST_SUITE_P(
    EveryClass, Mismatch,
    ::testing::Values(
        Row{"no_grant_non_admin", [](Fixture& f) { f.claim.grant_id.reset(); }, Errc::auth_denied},
        Row{"unknown_grant", [](Fixture& f) { f.cur.grant.reset(); }, Errc::auth_unknown_grant},
        Row{"revoked_grant", [](Fixture& f) { f.cur.grant->revoked = true; },
            Errc::auth_unknown_grant},
        Row{"other_principal",
            [](Fixture& f) {
              f.cur.grant->principal = Principal{PrincipalKind::uid, 1001};
            },
            Errc::auth_denied},
        Row{"observer_role", [](Fixture& f) { f.cur.grant->role = Role::observer; },
            Errc::auth_denied},
        Row{"stale_epoch", [](Fixture& f) { f.claim.epoch = 11; }, Errc::auth_stale_epoch},
        Row{"stale_revision", [](Fixture& f) { f.claim.grant_revision = 3; },
            Errc::auth_stale_revision},
        Row{"expired", [](Fixture& f) { f.cur.grant->expires_ns = kNow; }, Errc::auth_expired},
        Row{"digest", [](Fixture& f) { f.claim.plan_digest = "sha256:" + std::string(64, '0'); },
            Errc::auth_digest_mismatch},
        Row{"operation_class", [](Fixture& f) { f.plan.backend = reference_backend(); },
            Errc::auth_operation_class},
        Row{"container_not_granted", [](Fixture& f) { docker_plan(f, "ci"); },
            Errc::auth_container},
        Row{"container_other_name",
            [](Fixture& f) {
              docker_plan(f, "prod");
              f.cur.grant->containers = {
                  ContainerRule{core::BackendKind::docker, "ci", std::nullopt}};
            },
            Errc::auth_container},
        Row{"container_other_engine",
            [](Fixture& f) {
              docker_plan(f, "ci");
              f.cur.grant->containers = {
                  ContainerRule{core::BackendKind::podman, "ci", std::nullopt}};
            },
            Errc::auth_container},
        Row{"executable_outside_prefix",
            [](Fixture& f) { f.plan.command.executable = "/usr/binx/make"; },
            Errc::auth_executable},
        Row{"executable_exact_only",
            [](Fixture& f) {
              f.cur.grant->executables = {ExecutableRule{"/usr/bin/make", false}};
              f.plan.command.executable = "/usr/bin/make2";
            },
            Errc::auth_executable},
        Row{"workspace_id", [](Fixture& f) { f.id.workspace_id = "w2"; }, Errc::auth_workspace},
        Row{"workspace_root", [](Fixture& f) { f.plan.workspace.root = "/srv/w2"; },
            Errc::auth_workspace},
        Row{"workspace_access",
            [](Fixture& f) {
              f.cur.grant->workspaces[0].max_access = core::WorkspaceAccess::read_only;
              f.make_writable();
            },
            Errc::auth_workspace},
        Row{"environment", [](Fixture& f) { f.id.environment_id = "env2"; },
            Errc::auth_environment},
        Row{"resource", [](Fixture& f) { f.id.resource_id = "res2"; }, Errc::auth_resource},
        Row{"env_inherit",
            [](Fixture& f) {
              f.plan.env.push_back(core::EnvEntry{"HOME", std::nullopt});
            },
            Errc::auth_env_inherit},
        Row{"env_literal_not_saved_by_inherit",
            [](Fixture& f) {
              // Inherit permission for PATH does not turn into permission to set PATH.
              f.cur.grant->literal_env = false;
              f.plan.env = {core::EnvEntry{"PATH", std::string{"/evil"}}};
            },
            Errc::auth_env_literal},
        Row{"user",
            [](Fixture& f) {
              f.plan.user = core::UserSpec{0, 0, {}};
            },
            Errc::auth_user},
        Row{"limit_ceiling", [](Fixture& f) { f.plan.limits.wall_ms = 600'001; },
            Errc::auth_limit_ceiling},
        Row{"limit_unlimited_under_ceiling", [](Fixture& f) { f.plan.limits.wall_ms.reset(); },
            Errc::auth_limit_ceiling},
        Row{"budget_executions", [](Fixture& f) { f.cur.budget_use.executions = 10; },
            Errc::auth_budget_exhausted},
        Row{"budget_cpu",
            [](Fixture& f) {
              f.cur.budget_use.cpu_ms_used = 50'000;
              f.cur.budget_use.cpu_ms_reserved = 20'001;
            },
            Errc::auth_budget_exhausted},
        Row{"budget_unbounded_request", [](Fixture& f) { f.plan.limits.cpu_ms.reset(); },
            Errc::auth_budget_exhausted},
        Row{"lease_required",
            [](Fixture& f) {
              f.make_writable();
              f.claim.lease_id.reset();
            },
            Errc::auth_lease_required},
        Row{"lease_gone",
            [](Fixture& f) {
              f.make_writable();
              f.cur.lease.reset();
              f.cur.workspace_lease.reset();
            },
            Errc::auth_lease_stale},
        Row{"lease_other_session",
            [](Fixture& f) {
              f.make_writable();
              f.id.session_id = "s9";
            },
            Errc::auth_lease_stale},
        Row{"lease_epoch",
            [](Fixture& f) {
              f.make_writable();
              f.claim.lease_epoch = 4;
            },
            Errc::auth_lease_stale},
        Row{"lease_not_current",
            [](Fixture& f) {
              f.make_writable();
              f.cur.workspace_lease = other_lease();
            },
            Errc::auth_lease_stale},
        Row{"lease_surplus_on_read_only",
            [](Fixture& f) {
              f.make_writable();
              f.plan.workspace.access = core::WorkspaceAccess::read_only;
            },
            Errc::auth_lease_surplus},
        Row{"implicit_admin_other_user",
            [](Fixture& f) {
              f.caller.admin = true;
              f.claim.grant_id.reset();
              f.plan.user = core::UserSpec{1001, 1001, {}};
            },
            Errc::auth_user},
        Row{"implicit_admin_writable_while_leased",
            [](Fixture& f) {
              f.caller.admin = true;
              f.claim.grant_id.reset();
              f.plan.workspace.access = core::WorkspaceAccess::writable;
              f.cur.workspace_lease = other_lease();
            },
            Errc::auth_lease_required}),
    [](auto const& row_info) { return std::string{row_info.param.name}; });

TEST(CrossCheck, ImplicitAdminRunsNativeAsItselfWithoutGrantOrLease) {
  Fixture f;
  f.caller.admin = true;
  f.claim.grant_id.reset();
  f.plan.workspace.access = core::WorkspaceAccess::writable;
  auto r = f.run();
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_TRUE(r->implicit_admin);
  EXPECT_EQ(r->cpu_ms_reserve, 0U);
}

// API: admins need no grant for any backend, as for native.
TEST(CrossCheck, ImplicitAdminRunsTheReferenceBackendWithoutGrant) {
  Fixture f;
  f.caller.admin = true;
  f.claim.grant_id.reset();
  f.plan.backend = reference_backend();
  auto r = f.run();
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_TRUE(r->implicit_admin);
}

TEST(CrossCheck, PrefixRulesMatchWholeComponentsOnly) {
  ExecutableRule r{"/usr/bin", true};
  EXPECT_TRUE(r.allows("/usr/bin/make"));
  EXPECT_TRUE(r.allows("/usr/bin/sub/tool"));
  EXPECT_FALSE(r.allows("/usr/bin"));
  EXPECT_FALSE(r.allows("/usr/binaries/evil"));
  ExecutableRule exact{"/usr/bin/make", false};
  EXPECT_TRUE(exact.allows("/usr/bin/make"));
  EXPECT_FALSE(exact.allows("/usr/bin/make/x"));
}

TEST(GrantJson, RoundTripsAndRefusesAdminRoleAndUnknownKeys) {
  Fixture f;
  Grant g = *f.cur.grant;
  g.containers = {ContainerRule{core::BackendKind::docker, "ci", std::nullopt},
                  ContainerRule{core::BackendKind::podman, "build", std::string{"/run/p.sock"}}};
  boost::json::object o = grant_to_json(g, BudgetUse{});
  for (char const* k : {"revision", "spent", "revoked", "created_ns"}) o.erase(k);
  auto back = grant_from_json(o);
  ASSERT_TRUE(back.has_value()) << back.error().message();
  back->revision = g.revision;
  EXPECT_EQ(*back, g);

  boost::json::object admin = o;
  admin["role"] = "admin";
  EXPECT_FALSE(grant_from_json(admin).has_value());
  boost::json::object extra = o;
  extra["surprise"] = 1;
  auto e = grant_from_json(extra);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, Errc::plan_unknown_field);
  boost::json::object bad_engine = o;
  bad_engine["containers"] =
      boost::json::array{boost::json::object{{"engine", "native"}, {"name", "ci"}}};
  EXPECT_FALSE(grant_from_json(bad_engine).has_value());
  EXPECT_FALSE(Principal::parse("uid:4294967295").has_value());
  EXPECT_FALSE(Principal::parse("user:1").has_value());
  EXPECT_EQ(Principal::parse("gid:27")->to_string(), "gid:27");
}

TEST(AuthorityJson, StrictObject) {
  boost::json::value v = boost::json::parse(R"({"epoch":3,"grant_id":"g1","lease_id":null})");
  auto c = authority_from_json(&v);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->epoch, 3U);
  EXPECT_EQ(c->grant_id, std::optional<std::string>{"g1"});
  EXPECT_FALSE(c->lease_id.has_value());
  boost::json::value bad = boost::json::parse(R"({"epoch":3,"grant":"g1"})");
  EXPECT_FALSE(authority_from_json(&bad).has_value());
  EXPECT_TRUE(authority_from_json(nullptr).has_value());
}

// ------------------------------------------------------------------------------ the sandbox

// The fixture's plan sets PATH and CI: a sandbox must allow both names.
constexpr std::string_view kEnv = R"("environment": {"allow": ["PATH", "CI"]})";

std::string with_env(std::string_view more = {}) {
  return "{" + std::string{kEnv} + (more.empty() ? "" : ", " + std::string{more}) + "}";
}

TEST(CrossCheckSandbox, AContractRequiresASandbox) {
  Fixture f;
  f.contract_of("{}");
  auto r = f.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_required);
  EXPECT_EQ(r.error().diagnostics.at(0).pointer, "/plan/sandbox");
  EXPECT_NE(r.error().context.find("grant g7"), std::string::npos);
  // Without a contract, unsandboxed plans stay allowed.
  f.cur.grant->sandbox.reset();
  EXPECT_TRUE(f.run());
}

TEST(CrossCheckSandbox, WithinTheContractItPassesAndUndeclaredIsRefused) {
  Fixture f;
  f.contract_of(with_env(R"("network": {"outbound": {"tcp_connect": [443]}})"));
  f.sandbox_of(with_env(R"("network": {"outbound": {"tcp_connect": [443]}})"));
  EXPECT_TRUE(f.run());
  f.sandbox_of(with_env(R"("network": {"outbound": "any"})"));
  auto r = f.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_undeclared);
  EXPECT_EQ(r.error().diagnostics.at(0).pointer, "/plan/sandbox/network/outbound");
}

TEST(CrossCheckSandbox, ComesAfterTheScopeAndBeforeTheBudget) {
  Fixture f;
  f.contract_of(with_env());
  f.sandbox_of(with_env(R"("network": {"outbound": "any"})"));
  f.cur.budget_use.executions = 10;  // exhausted
  EXPECT_EQ(f.run().error().code, Errc::sandbox_undeclared);
  f.plan.command.executable = "/opt/evil";
  f.sandbox_of(with_env(R"("network": {"outbound": "any"})"));
  EXPECT_EQ(f.run().error().code, Errc::auth_executable);
}

TEST(CrossCheckSandbox, ARootCallerWithoutRunAsRootIsInvalid) {
  Fixture f;
  f.caller = Caller{0, 0, {}, true};
  f.claim = AuthorityClaim{};
  f.sandbox_of(with_env());
  auto r = f.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_invalid);
  EXPECT_EQ(r.error().diagnostics.at(0).pointer, "/plan/sandbox/process/run_as_root");
  f.sandbox_of(with_env(R"("process": {"run_as_root": true})"));
  auto ok = f.run();
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_TRUE(ok->implicit_admin);
}

TEST(CrossCheckSandbox, SecretsNeedTheStoresAnswer) {
  Fixture f;
  f.sandbox_of(with_env(R"("secrets": [{"ref": "db", "to": {"fd": 4}}])"));
  auto r = f.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_secret_unknown);
  f.secret_exists = [](std::string_view ref) { return ref == "db"; };
  EXPECT_TRUE(f.run());
}

TEST(CrossCheckSandbox, TheSandboxDigestIsCrossChecked) {
  Fixture f;
  f.sandbox_of(with_env());
  ASSERT_TRUE(f.run());
  // The plan names another checked plan than the one that comes with it.
  core::Digest other;
  other.bytes.fill(7);
  f.plan.sandbox_digest = other;
  EXPECT_EQ(f.run().error().code, Errc::auth_digest_mismatch);
  // A plan naming a sandbox that did not come with it.
  f.sb.reset();
  EXPECT_EQ(f.run().error().code, Errc::auth_digest_mismatch);
}

TEST(GrantJson, TheSandboxContractRoundTripsAndIsValidated) {
  auto v =
      boost::json::parse(R"({"id": "g-c", "principal": "uid:1000", "operations": ["exec.reference"],
      "sandbox": {"filesystem": [{"path": "/usr//", "allow": ["metadata", "read", "discover"]}],
                  "process": {"descendants": true, "max_processes": 8}}})");
  auto g = grant_from_json(v);
  ASSERT_TRUE(g) << g.error().message();
  ASSERT_TRUE(g->sandbox);
  EXPECT_EQ(g->sandbox->filesystem->at(0).path, "/usr");
  auto o = grant_to_json(*g, BudgetUse{});
  EXPECT_EQ(o.at("sandbox").at("process"),
            boost::json::parse(R"({"descendants": true, "max_processes": 8})"));
  for (char const* k : {"revision", "spent", "revoked", "created_ns"}) o.erase(k);
  auto back = grant_from_json(o);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->sandbox, g->sandbox);
  // No contract: no member.
  g->sandbox.reset();
  EXPECT_FALSE(grant_to_json(*g, BudgetUse{}).contains("sandbox"));
  // The contract's rules are the requirements' rules, pointed at within the grant.
  auto bad = boost::json::parse(
      R"({"principal": "uid:1000", "sandbox": {"process": {"descendants": true}}})");
  auto e = grant_from_json(bad);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Errc::sandbox_invalid);
  EXPECT_EQ(e.error().diagnostics.at(0).pointer, "/sandbox/process/max_processes");
}

}  // namespace
}  // namespace custos::gateway
