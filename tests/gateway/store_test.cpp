// The authority store against a real SQLite file: every mutation bumps revision/epoch in its
// own transaction; a refused authorization leaves claims, budgets, leases and uses untouched;
// replay, budget exhaustion and settlement, lease contention.
#include "custos/gateway/store.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <stdlib.h>
#include <string>

#include "custos/core/plan_canonical.hpp"
#include "custos/registry/registry.hpp"

#include "identity_fixture.hpp"

namespace custos::gateway {
namespace {

constexpr std::int64_t kNow = 1'700'000'000'000'000'000;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/custos-gw-store-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto reg = registry::Registry::open(dir_);
    ASSERT_TRUE(reg.has_value()) << reg.error().message();
    reg_ = std::move(*reg);
    db_ = std::make_unique<RegistryDatabase>(*reg_);
    store_ = std::make_unique<AuthorityStore>(*db_);
    id_ = fixture::fixture_identity(2);
    plan_ = fixture::fixture_plan();
  }
  void TearDown() override {
    store_.reset();
    db_.reset();
    reg_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  Grant grant_spec() {
    Grant g;
    g.id = "g1";
    g.principal = Principal{PrincipalKind::uid, 1000};
    g.operations = {OperationClass::exec_native};
    g.executables = {ExecutableRule{"/bin", true}};
    g.workspaces = {WorkspaceRule{"w1", "/srv/w1", core::WorkspaceAccess::writable}};
    g.environment_ids = {"env1"};
    g.resource_ids = {"res1"};
    g.budget.executions = 2;
    g.budget.cpu_ms = 1500;
    return g;
  }

  std::int64_t count(char const* table) { return fixture::row_count(*db_, table); }

  Result<AuthorityUse> authorize(AuthorityClaim claim, std::string exec_id = "ex-1") {
    auto d = core::plan_digest(id_, plan_);
    EXPECT_TRUE(d.has_value());
    AuthorizeRequest req;
    req.caller = Caller{1000, 1000, {}, false};
    req.identity = &id_;
    req.plan = &plan_;
    req.plan_digest = d->to_string();
    req.claim = std::move(claim);
    req.execution_id = std::move(exec_id);
    req.now_ns = kNow;
    return store_->authorize(req);
  }

  AuthorityClaim claim_now() {
    AuthorityClaim c;
    c.epoch = *store_->epoch();
    c.grant_id = "g1";
    return c;
  }

  std::filesystem::path dir_;
  std::unique_ptr<registry::Registry> reg_;
  std::unique_ptr<RegistryDatabase> db_;
  std::unique_ptr<AuthorityStore> store_;
  core::ExecutionIdentity id_;
  core::ExecutionPlan plan_;
};

TEST_F(StoreTest, EveryMutationBumpsTheEpochAndGrantRevision) {
  EXPECT_EQ(*store_->epoch(), 0U);
  auto g = store_->add_grant(grant_spec(), kNow);
  ASSERT_TRUE(g.has_value()) << g.error().message();
  EXPECT_EQ(g->revision, 1U);
  EXPECT_EQ(*store_->epoch(), 1U);
  auto again = store_->add_grant(grant_spec(), kNow);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, Errc::plan_invalid_id);
  EXPECT_EQ(*store_->epoch(), 1U);  // a refused mutation changes nothing

  auto l = store_->acquire_lease("w1", "s1", Principal{PrincipalKind::uid, 1000}, kNow);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->epoch, 1U);
  EXPECT_EQ(*store_->epoch(), 2U);
  ASSERT_TRUE(store_->end_lease(l->id).has_value());
  EXPECT_EQ(*store_->epoch(), 3U);
  auto l2 = store_->acquire_lease("w1", "s1", Principal{PrincipalKind::uid, 1000}, kNow);
  ASSERT_TRUE(l2.has_value());
  EXPECT_EQ(l2->epoch, 3U) << "release moves the workspace's lease epoch too";

  auto r = store_->revoke_grant("g1");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->revision, 2U);
  EXPECT_TRUE(r->revoked);
  auto stored = store_->get_grant("g1");
  ASSERT_TRUE(stored.has_value() && stored->has_value());
  EXPECT_EQ((*stored)->first.revision, 2U);
  EXPECT_EQ(*store_->epoch(), 5U);
  auto twice = store_->revoke_grant("g1");
  ASSERT_FALSE(twice.has_value());
  EXPECT_EQ(twice.error().code, Errc::auth_unknown_grant);
}

TEST_F(StoreTest, LeaseContentionAllowsOneActiveLeasePerWorkspace) {
  auto a = store_->acquire_lease("w1", "s1", Principal{PrincipalKind::uid, 1000}, kNow);
  ASSERT_TRUE(a.has_value());
  auto b = store_->acquire_lease("w1", "s2", Principal{PrincipalKind::uid, 1001}, kNow);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code, Errc::lease_conflict);
  EXPECT_TRUE(
      store_->acquire_lease("w2", "s2", Principal{PrincipalKind::uid, 1001}, kNow).has_value());
  auto ended = store_->end_lease(a->id);
  ASSERT_TRUE(ended.has_value());
  auto gone = store_->end_lease(a->id);
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code, Errc::lease_not_found);
  EXPECT_TRUE(
      store_->acquire_lease("w1", "s2", Principal{PrincipalKind::uid, 1001}, kNow).has_value());
  auto active = store_->list_leases(true);
  ASSERT_TRUE(active.has_value());
  EXPECT_EQ(active->size(), 2U);
}

TEST_F(StoreTest, AuthorizeConsumesClaimBudgetAndRecordsTheUseInOneTransaction) {
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  auto u = authorize(claim_now());
  ASSERT_TRUE(u.has_value()) << u.error().message();
  EXPECT_EQ(u->cpu_ms_reserved, 1000U);
  EXPECT_EQ(count("claims"), 1);
  EXPECT_EQ(count("authority_uses"), 1);
  auto g = store_->get_grant("g1");
  EXPECT_EQ((*g)->second.executions, 1U);
  EXPECT_EQ((*g)->second.cpu_ms_reserved, 1000U);

  // Replay of the same (action, process) with fresh authority: refused, nothing changes.
  auto replay = authorize(claim_now(), "ex-2");
  ASSERT_FALSE(replay.has_value());
  EXPECT_EQ(replay.error().code, Errc::auth_replay);
  EXPECT_EQ(count("claims"), 1);
  EXPECT_EQ(count("authority_uses"), 1);
  EXPECT_EQ((*store_->get_grant("g1"))->second.executions, 1U);
}

TEST_F(StoreTest, RefusalLeavesNoTrace) {
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  auto before = (*store_->get_grant("g1"))->second;
  auto epoch = *store_->epoch();
  AuthorityClaim stale = claim_now();
  stale.epoch += 1;
  auto r = authorize(stale);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::auth_stale_epoch);
  plan_.workspace.access = core::WorkspaceAccess::writable;
  auto nolease = authorize(claim_now());
  ASSERT_FALSE(nolease.has_value());
  EXPECT_EQ(nolease.error().code, Errc::auth_lease_required);
  EXPECT_EQ(count("claims"), 0);
  EXPECT_EQ(count("authority_uses"), 0);
  EXPECT_EQ((*store_->get_grant("g1"))->second, before);
  EXPECT_EQ(*store_->epoch(), epoch);
}

TEST_F(StoreTest, WritableUsesTheLeaseAndReleaseMakesItStale) {
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  auto l = store_->acquire_lease("w1", "s1", Principal{PrincipalKind::uid, 1000}, kNow);
  ASSERT_TRUE(l.has_value());
  plan_.workspace.access = core::WorkspaceAccess::writable;
  AuthorityClaim c = claim_now();
  c.lease_id = l->id;
  c.lease_epoch = l->epoch;
  auto u = authorize(c);
  ASSERT_TRUE(u.has_value()) << u.error().message();
  EXPECT_EQ(u->lease_id, std::optional<std::string>{l->id});
  auto deps = store_->uses_of_lease(l->id, true);
  ASSERT_TRUE(deps.has_value());
  EXPECT_EQ(deps->size(), 1U);

  ASSERT_TRUE(store_->end_lease(l->id).has_value());
  id_.action_id = "act-2";
  plan_.limits.cpu_ms = 100;  // within what is left of the cpu budget: only the lease is wrong
  AuthorityClaim c2 = claim_now();
  c2.lease_id = l->id;
  auto stale = authorize(c2, "ex-2");
  ASSERT_FALSE(stale.has_value());
  EXPECT_EQ(stale.error().code, Errc::auth_lease_stale);
}

TEST_F(StoreTest, BudgetIsReservedThenSettledToActualAndExhausts) {
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  ASSERT_TRUE(authorize(claim_now(), "ex-1").has_value());
  // 1000 reserved + 1000 requested > 1500: the second start is refused while the first runs.
  id_.action_id = "act-2";
  auto second = authorize(claim_now(), "ex-2");
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error().code, Errc::auth_budget_exhausted);

  core::TerminalRecord t;
  t.resources.at(core::ResourceDim::cpu).value = 120;
  t.resources.at(core::ResourceDim::wall).value = 300;
  ASSERT_TRUE(store_->settle("ex-1", t).has_value());
  ASSERT_TRUE(store_->settle("ex-1", t).has_value());  // idempotent
  auto use = (*store_->get_grant("g1"))->second;
  EXPECT_EQ(use.cpu_ms_used, 120U);
  EXPECT_EQ(use.cpu_ms_reserved, 0U);
  EXPECT_EQ(use.wall_ms_used, 300U);
  EXPECT_EQ(use.executions, 1U);

  auto third = authorize(claim_now(), "ex-2");
  ASSERT_TRUE(third.has_value()) << third.error().message();
  // Two executions of two: the next is exhausted whatever its limits.
  id_.action_id = "act-3";
  plan_.limits.cpu_ms = 1;
  auto fourth = authorize(claim_now(), "ex-3");
  ASSERT_FALSE(fourth.has_value());
  EXPECT_EQ(fourth.error().code, Errc::auth_budget_exhausted);
}

TEST_F(StoreTest, StoredAdminPrincipals) {
  Caller c{1000, 1000, {27}, false};
  EXPECT_FALSE(*store_->is_admin(c));
  ASSERT_TRUE(store_->set_admin(Principal{PrincipalKind::gid, 27}, true).has_value());
  EXPECT_TRUE(*store_->is_admin(c));
  ASSERT_TRUE(store_->set_admin(Principal{PrincipalKind::gid, 27}, false).has_value());
  EXPECT_FALSE(*store_->is_admin(c));
}

}  // namespace
}  // namespace custos::gateway
