// The authorizing transaction with the execution record inside it (AuthorizeRequest::record):
// one transaction for the checks, the authority writes, the claim and the record; a refusal
// anywhere in it (the gateway's checks or the registry's record step) writes nothing; a crash
// right after its commit leaves the claim, the authority use and the record together; the
// budget settlement queued ahead of the next immediate write commits in that write's
// transaction.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <stdlib.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/core/plan_canonical.hpp"
#include "custos/gateway/store.hpp"
#include "custos/registry/failpoint.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"

#include "identity_fixture.hpp"

namespace custos::gateway {
namespace {

constexpr std::int64_t kNow = 1'700'000'000'000'000'000;

class AuthorizeTxnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/custos-gw-txn-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    id_ = fixture::fixture_identity(1);
    plan_ = fixture::fixture_plan();
  }
  void TearDown() override {
    close();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // The registry is opened on demand: a forked child opens its own (one opener at a time).
  void open() {
    auto reg = registry::Registry::open(dir_);
    ASSERT_TRUE(reg.has_value()) << reg.error().message();
    reg_ = std::move(*reg);
    db_ = std::make_unique<RegistryDatabase>(*reg_);
    store_ = std::make_unique<AuthorityStore>(*db_);
  }
  void close() {
    store_.reset();
    db_.reset();
    reg_.reset();
  }

  static Grant grant_spec() {
    Grant g;
    g.id = "g1";
    g.principal = Principal{PrincipalKind::uid, 1000};
    g.operations = {OperationClass::exec_native};
    g.executables = {ExecutableRule{"/bin", true}};
    g.workspaces = {WorkspaceRule{"w1", "/srv/w1", core::WorkspaceAccess::read_only}};
    g.environment_ids = {"env1"};
    g.resource_ids = {"res1"};
    g.budget.executions = 3;
    g.budget.cpu_ms = 10'000;
    return g;
  }

  registry::NewExecution record_of(std::string const& exec_id) {
    auto ex = registry::make_new_execution(exec_id, id_, plan_, {});
    EXPECT_TRUE(ex.has_value());
    return ex ? *ex : registry::NewExecution{};
  }

  Result<AuthorityUse> authorize(AuthorityClaim claim, registry::NewExecution const& rec,
                                 registry::Durability d = registry::Durability::full) {
    AuthorizeRequest req;
    req.caller = Caller{1000, 1000, {}, false};
    req.identity = &id_;
    req.plan = &plan_;
    req.plan_digest = rec.plan_digest;
    req.claim = std::move(claim);
    req.execution_id = rec.execution_id;
    req.now_ns = kNow;
    req.record = &rec;
    req.durability = d;
    return store_->authorize(req);
  }

  AuthorityClaim claim_now() {
    AuthorityClaim c;
    c.epoch = *store_->epoch();
    c.grant_id = "g1";
    return c;
  }

  std::int64_t count(char const* table) { return fixture::row_count(*db_, table); }

  BudgetUse budget() {
    auto g = store_->get_grant("g1");
    EXPECT_TRUE(g.has_value() && g->has_value());
    return (g && *g) ? (*g)->second : BudgetUse{};
  }

  std::filesystem::path dir_;
  std::unique_ptr<registry::Registry> reg_;
  std::unique_ptr<RegistryDatabase> db_;
  std::unique_ptr<AuthorityStore> store_;
  core::ExecutionIdentity id_;
  core::ExecutionPlan plan_;
};

TEST_F(AuthorizeTxnTest, CreatesTheRecordInTheAuthorizingTransaction) {
  open();
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  auto const rec = record_of("ex-1");
  auto const before = reg_->write_stats();
  auto use = authorize(claim_now(), rec);
  ASSERT_TRUE(use.has_value()) << use.error().message();
  auto const after = reg_->write_stats();
  EXPECT_EQ(after.transactions - before.transactions, 1U)
      << "authority, claim and record share one transaction";
  EXPECT_EQ(after.full_commits - before.full_commits, 1U);

  auto stored = reg_->get("ex-1");
  ASSERT_TRUE(stored.has_value()) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::authorized);
  EXPECT_EQ(stored->plan_digest, rec.plan_digest);
  EXPECT_EQ(stored->action_id, "act-1");
  auto claim = reg_->find_claim("act-1", "proc-1");
  ASSERT_TRUE(claim.has_value() && claim->has_value());
  EXPECT_EQ((*claim)->execution_id, "ex-1");
  auto u = store_->get_use("ex-1");
  ASSERT_TRUE(u.has_value() && u->has_value());
  EXPECT_EQ((*u)->cpu_ms_reserved, 1000U);
  EXPECT_EQ(budget().executions, 1U);
  EXPECT_TRUE(reg_->orphan_claims()->empty());
}

TEST_F(AuthorizeTxnTest, GroupDurabilityIsAwaitedByTheStore) {
  open();
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  auto const rec = record_of("ex-1");
  ASSERT_TRUE(authorize(claim_now(), rec, registry::Durability::group).has_value());
  // Committed (readable) at once; on stable storage once await_durable returned.
  EXPECT_TRUE(reg_->get("ex-1").has_value());
  ASSERT_TRUE(store_->await_durable().has_value());
  EXPECT_FALSE(reg_->durability_pending());
}

TEST_F(AuthorizeTxnTest, ACheckRefusalWritesNothing) {
  open();
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  auto const budget_before = budget();
  auto const rec = record_of("ex-1");
  AuthorityClaim stale = claim_now();
  stale.epoch += 1;
  auto r = authorize(stale, rec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::auth_stale_epoch);
  EXPECT_EQ(count("claims"), 0);
  EXPECT_EQ(count("executions"), 0);
  EXPECT_EQ(count("authority_uses"), 0);
  EXPECT_EQ(budget(), budget_before);
  auto g = reg_->get("ex-1");
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.error().code, Errc::registry_not_found);
}

TEST_F(AuthorizeTxnTest, ARecordRefusalAfterTheAuthorityWritesUndoesThemAll) {
  open();
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  // An execution "ex-9" already exists (another action's claim and record): the gateway's
  // checks and writes for a new action pass, then the registry refuses to create "ex-9" again
  // in the same job, after the budget, the use and the claim were written.
  core::ExecutionIdentity other = id_;
  other.action_id = "act-other";
  auto taken = registry::make_new_execution("ex-9", other, plan_, {});
  ASSERT_TRUE(taken.has_value());
  ASSERT_TRUE(reg_->record_authorized(*taken).has_value());
  auto const budget_before = budget();

  auto r = authorize(claim_now(), record_of("ex-9"));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::registry_corrupt_record) << r.error().message();
  EXPECT_EQ(count("claims"), 1) << "only the other action's claim";
  EXPECT_FALSE(reg_->find_claim("act-1", "proc-1")->has_value());
  EXPECT_EQ(count("authority_uses"), 0);
  EXPECT_EQ(count("executions"), 1);
  EXPECT_EQ(budget(), budget_before);

  // Nothing was consumed: the same action authorizes under a fresh execution id.
  auto again = authorize(claim_now(), record_of("ex-10"));
  ASSERT_TRUE(again.has_value()) << again.error().message();
  EXPECT_EQ(budget().executions, budget_before.executions + 1);
}

TEST_F(AuthorizeTxnTest, ACrashRightAfterTheCommitKeepsClaimUseAndRecordTogether) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "failpoints are compiled in dev only";
  open();
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  AuthorityClaim const c = claim_now();
  auto const rec = record_of("ex-1");
  close();

  pid_t const pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The "daemon": authorizes with group durability and dies (SIGKILL) right after the
    // transaction committed, before anything awaited its fsync.
    ::setenv(std::string{registry::kFailpointEnv}.c_str(), "after_claim", 1);
    auto reg = registry::Registry::open(dir_);
    if (!reg) ::_exit(10);
    RegistryDatabase db(**reg);
    AuthorityStore store(db);
    AuthorizeRequest req;
    req.caller = Caller{1000, 1000, {}, false};
    req.identity = &id_;
    req.plan = &plan_;
    req.plan_digest = rec.plan_digest;
    req.claim = c;
    req.execution_id = rec.execution_id;
    req.now_ns = kNow;
    req.record = &rec;
    req.durability = registry::Durability::group;
    auto u = store.authorize(req);
    ::_exit(u ? 11 : 12);  // not reached when the failpoint fired
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  open();
  auto claim = reg_->find_claim("act-1", "proc-1");
  ASSERT_TRUE(claim.has_value() && claim->has_value());
  EXPECT_EQ((*claim)->execution_id, "ex-1");
  auto stored = reg_->get("ex-1");
  ASSERT_TRUE(stored.has_value()) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::authorized);
  auto u = store_->get_use("ex-1");
  ASSERT_TRUE(u.has_value() && u->has_value());
  EXPECT_EQ(budget().executions, 1U);
  EXPECT_TRUE(reg_->orphan_claims()->empty()) << "never a claim without its record";
}

TEST_F(AuthorizeTxnTest, AQueuedSettlementCommitsInTheNextWritesTransaction) {
  open();
  ASSERT_TRUE(store_->add_grant(grant_spec(), kNow).has_value());
  ASSERT_TRUE(authorize(claim_now(), record_of("ex-1")).has_value());
  ASSERT_EQ(budget().cpu_ms_reserved, 1000U);

  core::TerminalRecord t;
  t.resources.at(core::ResourceDim::cpu).value = 120;
  t.resources.at(core::ResourceDim::wall).value = 300;
  auto const before = reg_->write_stats();
  store_->queue_settle("ex-1", t);
  EXPECT_EQ(reg_->deferred_pending(), 1U);
  // The next immediate write (the terminal record's, in the daemon) carries it.
  ASSERT_TRUE(reg_->transact(registry::Durability::normal,
                             [](registry::sql::Db&) -> Result<void> { return ok(); })
                  .has_value());
  auto const after = reg_->write_stats();
  EXPECT_EQ(after.transactions - before.transactions, 1U);
  EXPECT_EQ(reg_->deferred_pending(), 0U);
  EXPECT_FALSE(reg_->take_deferred_error("ex-1").has_value());
  auto const b = budget();
  EXPECT_EQ(b.cpu_ms_reserved, 0U);
  EXPECT_EQ(b.cpu_ms_used, 120U);
  EXPECT_EQ(b.wall_ms_used, 300U);
  EXPECT_TRUE((*store_->get_use("ex-1"))->settled);

  // Idempotent: a second settlement (the direct one after a failed terminal write) is a no-op.
  ASSERT_TRUE(store_->settle("ex-1", t).has_value());
  EXPECT_EQ(budget(), b);
}

}  // namespace
}  // namespace custos::gateway
