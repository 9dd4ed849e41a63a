// ExecutionGateway with a real ExecutionManager on a real io_context and real processes:
// starts only through the gateway, every refusal has no effect, replay, revoke/release/expiry
// fences (trigger lease_fence, stdin closed at the commit), revoke racing start, budgets,
// holder quiescence (live, unconfirmed cleanup, all ended).
#include "custos/gateway/gateway.hpp"

#include <boost/asio/post.hpp>
#include <gtest/gtest.h>

#include <fstream>
#include <grp.h>
#include <random>
#include <sstream>
#include <thread>
#include <time.h>
#include <unistd.h>

#include "custos/registry/registry.hpp"
#include "custos/supervisor/registry_sink.hpp"

#include "supervisor/harness.hpp"
#include "support/gateway_start.hpp"

namespace custos::gateway {
namespace {

using namespace std::chrono_literals;
using supervisor::BoundaryPreference;
using supervisor::testing::SupervisorTest;

std::int64_t now_ns() {
  timespec ts{};
  (void)clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

class GatewayTest : public SupervisorTest {
 protected:
  void SetUp() override {
    SupervisorTest::SetUp();
    // The daemon's chain: the registry, its sink behind the gateway's, the authority tables in
    // the registry's own database.
    auto reg = registry::Registry::open(state_ / "registry");
    ASSERT_TRUE(reg.has_value()) << reg.error().message();
    reg_ = std::move(*reg);
    inner_ = std::make_unique<supervisor::RegistrySink>(*reg_, io_);
    db_ = std::make_unique<RegistryDatabase>(*reg_);
    store_ = std::make_unique<AuthorityStore>(*db_);
    gateway_ =
        std::make_unique<ExecutionGateway>(io_, *store_, GatewayOptions{reg_.get(), inner_.get()});
  }
  void TearDown() override {
    SupervisorTest::TearDown();  // stops every execution and destroys the manager first
    gateway_.reset();
    store_.reset();
    db_.reset();
    inner_.reset();
    reg_.reset();
  }

  supervisor::ExecutionManager& gw_manager(
      BoundaryPreference pref = BoundaryPreference::automatic) {
    auto& m = manager(pref, [this](supervisor::ManagerConfig& c) { c.sink = &gateway_->sink(); });
    gateway_->attach(m);
    return m;
  }

  Caller runner() const {
    return Caller{static_cast<std::uint32_t>(::geteuid()),
                  static_cast<std::uint32_t>(::getegid()),
                  {},
                  false};
  }

  Grant spec(std::string id) {
    Grant g;
    g.id = std::move(id);
    g.principal = Principal{PrincipalKind::uid, static_cast<std::uint32_t>(::geteuid())};
    g.operations = {OperationClass::exec_native};
    g.executables = {ExecutableRule{"/bin", true}, ExecutableRule{"/usr/bin", true}};
    g.workspaces = {WorkspaceRule{"w1", workspace_.string(), core::WorkspaceAccess::writable}};
    g.environment_ids = {"env1"};
    g.resource_ids = {"res1"};
    g.literal_env = true;
    return g;
  }

  Grant add(Grant g) {
    Caller admin = runner();
    admin.admin = true;
    auto r = gateway_->grant(admin, std::move(g));
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message());
    return r ? *r : Grant{};
  }

  AuthorityClaim claim(std::string const& grant_id) {
    AuthorityClaim c;
    c.epoch = *store_->epoch();
    c.grant_id = grant_id;
    return c;
  }

  Result<supervisor::StartResult> gw_start(core::ExecutionPlan p, AuthorityClaim const& c,
                                           supervisor::LaunchRequest* out = nullptr) {
    auto req = request(std::move(p));
    if (out != nullptr) *out = req;
    return start_and_wait(*gateway_, io_, runner(), std::move(req), c);
  }

  std::int64_t count(char const* table) {
    std::int64_t n = -1;
    EXPECT_TRUE(db_->read([&](registry::sql::Db& db) -> Result<void> {
                     auto v = db.query_int(std::string{"SELECT COUNT(*) FROM "} + table);
                     if (!v) return v.error();
                     n = v->value_or(-1);
                     return ok();
                   })
                    .has_value());
    return n;
  }

  void revoke_races_start(unsigned seed);

  // What start_async answered. The completion holds it too: it may run after a failed
  // assertion ended the test body, while TearDown still drives the loop.
  using Answer = std::shared_ptr<std::optional<Result<supervisor::StartResult>>>;
  Answer async_start(supervisor::LaunchRequest req, AuthorityClaim const& c) {
    auto a = std::make_shared<std::optional<Result<supervisor::StartResult>>>();
    gateway_->start_async(runner(), std::move(req), c,
                          [a](Result<supervisor::StartResult> r) { *a = std::move(r); });
    return a;
  }

  std::unique_ptr<registry::Registry> reg_;
  std::unique_ptr<supervisor::RegistrySink> inner_;
  std::unique_ptr<RegistryDatabase> db_;
  std::unique_ptr<AuthorityStore> store_;
  std::unique_ptr<ExecutionGateway> gateway_;
};

TEST_F(GatewayTest, StartsThroughTheGatewayAndSettlesTheBudgetAtTheTerminalRecord) {
  gw_manager();
  Grant g = spec("g1");
  g.budget.executions = 5;
  g.budget.wall_ms = 100'000;
  add(g);
  auto p = sh("exit 0");
  p.limits.wall_ms = 20'000;
  auto st = gw_start(p, claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  auto during = (*store_->get_grant("g1"))->second;
  EXPECT_EQ(during.executions, 1U);
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  auto after = (*store_->get_grant("g1"))->second;
  EXPECT_EQ(after.executions, 1U);
  EXPECT_EQ(after.wall_ms_reserved, 0U);
  EXPECT_LT(after.wall_ms_used, 20'000U) << "settled to the actual wall time, not the limit";
  auto use = store_->get_use(st->execution_id);
  ASSERT_TRUE(use.has_value() && use->has_value());
  EXPECT_TRUE((*use)->settled);
}

TEST_F(GatewayTest, AManagerStartThatBypassesTheGatewayCreatesNothing) {
  auto& m = gw_manager();
  // Even a well-formed permit from outside the gateway (only tests can mint one) launches
  // nothing in a manager wired to the gateway: its sink knows no authorized launch for the id.
  auto r = supervisor::start_with_test_permit(m, request(sh("exit 0")));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::auth_denied);
  EXPECT_TRUE(m.list({}).empty());
  EXPECT_EQ(count("claims"), 0);
}

struct NoEffectRow {
  char const* name;
  std::function<void(GatewayTest&, core::ExecutionPlan&, AuthorityClaim&)> mutate;
  Errc expected;
};

TEST_F(GatewayTest, EveryRefusalHasNoEffect) {
  auto& m = gw_manager();
  Grant g = spec("g1");
  g.budget.executions = 3;
  g.ceilings.wall_ms = 60'000;
  g.inherit_env = {"PATH"};
  g.literal_env = false;
  add(g);
  auto const budget_before = (*store_->get_grant("g1"))->second;
  std::vector<NoEffectRow> const rows = {
      {"stale_epoch", [](GatewayTest&, core::ExecutionPlan&, AuthorityClaim& c) { c.epoch += 1; },
       Errc::auth_stale_epoch},
      {"unknown_grant",
       [](GatewayTest&, core::ExecutionPlan&, AuthorityClaim& c) { c.grant_id = "nope"; },
       Errc::auth_unknown_grant},
      {"stale_revision",
       [](GatewayTest&, core::ExecutionPlan&, AuthorityClaim& c) { c.grant_revision = 9; },
       Errc::auth_stale_revision},
      {"executable",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim&) {
         p.command.executable = "/sbin/true-not";
       },
       Errc::auth_executable},
      {"workspace",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim&) { p.workspace.root = "/var/tmp"; },
       Errc::auth_workspace},
      {"env_literal", [](GatewayTest&, core::ExecutionPlan&, AuthorityClaim&) {},
       Errc::auth_env_literal},
      {"env_inherit",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim&) {
         p.env = {core::EnvEntry{"HOME", std::nullopt}};
       },
       Errc::auth_env_inherit},
      {"ceiling",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim&) {
         p.env.clear();
         p.limits.wall_ms = 60'001;
       },
       Errc::auth_limit_ceiling},
      {"lease_required",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim&) {
         p.env.clear();
         p.workspace.access = core::WorkspaceAccess::writable;
       },
       Errc::auth_lease_required},
      {"lease_surplus",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim& c) {
         p.env.clear();
         c.lease_id = "l-any";
       },
       Errc::auth_lease_surplus},
      {"digest",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim& c) {
         p.env.clear();
         c.plan_digest = "sha256:" + std::string(64, 'a');
       },
       Errc::auth_digest_mismatch},
      {"user",
       [](GatewayTest&, core::ExecutionPlan& p, AuthorityClaim&) {
         p.env.clear();
         p.user = core::UserSpec{::geteuid() + 1, ::getegid(), {}};
       },
       Errc::auth_user},
  };
  for (auto const& row : rows) {
    auto p = sh("echo should-not-run");
    p.limits.wall_ms = 10'000;
    auto c = claim("g1");
    row.mutate(*this, p, c);
    auto r = gw_start(p, c);
    ASSERT_FALSE(r.has_value()) << row.name << " started";
    // plan.invalid_user may come from the manager's own check before the sink for another uid;
    // either way nothing ran and nothing was consumed.
    if (r.error().code != Errc::auth_user || row.expected != Errc::auth_user) {
      EXPECT_EQ(r.error().code, row.expected) << row.name << ": " << r.error().message();
    }
    EXPECT_TRUE(m.list({}).empty()) << row.name << ": an execution exists";
    EXPECT_EQ(count("claims"), 0) << row.name;
    EXPECT_EQ(count("authority_uses"), 0) << row.name;
    EXPECT_EQ(count("executions"), 0) << row.name << ": a record exists";
    EXPECT_EQ((*store_->get_grant("g1"))->second, budget_before) << row.name;
  }
}

TEST_F(GatewayTest, ReplayOfAnActionIsRefused) {
  auto& m = gw_manager();
  add(spec("g1"));
  supervisor::LaunchRequest req;
  auto first = gw_start(sh("exit 0"), claim("g1"), &req);
  ASSERT_TRUE(first.has_value()) << first.error().message();
  ASSERT_TRUE(terminal(first->execution_id));
  auto again = start_and_wait(*gateway_, io_, runner(), req, claim("g1"));
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, Errc::auth_replay);
  EXPECT_EQ(m.list({}).size(), 1U);
  EXPECT_EQ(count("claims"), 1);
}

TEST_F(GatewayTest, BudgetExhaustion) {
  gw_manager();
  Grant g = spec("g1");
  g.budget.executions = 2;
  add(g);
  for (int i = 0; i < 2; ++i) {
    auto st = gw_start(sh("exit 0"), claim("g1"));
    ASSERT_TRUE(st.has_value()) << st.error().message();
    ASSERT_TRUE(terminal(st->execution_id));
  }
  auto third = gw_start(sh("exit 0"), claim("g1"));
  ASSERT_FALSE(third.has_value());
  EXPECT_EQ(third.error().code, Errc::auth_budget_exhausted);
  EXPECT_EQ(count("claims"), 2);
}

TEST_F(GatewayTest, RevokeFencesARunningExecution) {
  gw_manager();
  add(spec("g1"));
  auto st = gw_start(sh("sleep 30"), claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  Caller admin = runner();
  admin.admin = true;
  auto rv = gateway_->revoke(admin, "g1");
  ASSERT_TRUE(rv.has_value()) << rv.error().message();
  ASSERT_EQ(rv->fence.fenced.size(), 1U);
  EXPECT_EQ(rv->fence.fenced[0], st->execution_id);
  EXPECT_TRUE(gateway_->fenced(st->execution_id));
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::lease_fence});
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  // And the revoked grant authorizes nothing more.
  auto after = gw_start(sh("exit 0"), claim("g1"));
  ASSERT_FALSE(after.has_value());
  EXPECT_EQ(after.error().code, Errc::auth_unknown_grant);
}

TEST_F(GatewayTest, ReleasingTheLeaseFencesWritableExecutionsAndLeaseContention) {
  gw_manager();
  add(spec("g1"));
  auto lease = gateway_->acquire_lease(runner(), "w1", "s1");
  ASSERT_TRUE(lease.has_value()) << lease.error().message();
  auto contender = gateway_->acquire_lease(runner(), "w1", "s2");
  ASSERT_FALSE(contender.has_value());
  EXPECT_EQ(contender.error().code, Errc::lease_conflict);

  auto p = sh("sleep 30");
  p.workspace.access = core::WorkspaceAccess::writable;
  auto c = claim("g1");
  c.lease_id = lease->id;
  c.lease_epoch = lease->epoch;
  auto st = gw_start(p, c);
  ASSERT_TRUE(st.has_value()) << st.error().message();

  Caller stranger{::geteuid() + 1, ::getegid() + 1, {}, false};
  auto denied = gateway_->release_lease(stranger, lease->id, false);
  ASSERT_FALSE(denied.has_value());
  EXPECT_EQ(denied.error().code, Errc::auth_denied);
  auto broke = gateway_->release_lease(stranger, lease->id, true);
  ASSERT_FALSE(broke.has_value());
  EXPECT_EQ(broke.error().code, Errc::auth_denied);

  auto rel = gateway_->release_lease(runner(), lease->id, false);
  ASSERT_TRUE(rel.has_value()) << rel.error().message();
  ASSERT_EQ(rel->fence.fenced.size(), 1U);
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::lease_fence});
  EXPECT_TRUE(gateway_->acquire_lease(runner(), "w1", "s2").has_value());
}

TEST_F(GatewayTest, ContinuousStdinWriterSeesNothingAfterTheRevokeReturned) {
  gw_manager();
  add(spec("g1"));
  // Outside the workspace: the plan's is read-only (and so is the workspace for the program).
  auto const log = std::filesystem::temp_directory_path() /
                   ("custos-gw-stdin-" + std::to_string(::getpid()) + ".log");
  struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } const remove_log{log};
  auto st = gw_start(sh("cat > " + log.string()), claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  Caller admin = runner();
  admin.admin = true;
  int revoked_at = -1;
  int accepted_after = 0;
  int refused_after = 0;
  for (int i = 0; i < 400; ++i) {
    std::string const line = std::to_string(i) + "\n";
    auto r = gateway_->input(st->execution_id,
                             std::span<std::uint8_t const>(
                                 reinterpret_cast<std::uint8_t const*>(line.data()), line.size()),
                             false);
    if (revoked_at >= 0) {
      if (r) {
        ++accepted_after;
      } else {
        EXPECT_EQ(r.error().code, Errc::exec_input_closed);
        ++refused_after;
      }
    } else {
      ASSERT_TRUE(r.has_value()) << i << ": " << r.error().message();
    }
    drive([] { return false; }, 1ms);  // let the supervisor pump stdin in between
    if (i == 200) {
      ASSERT_TRUE(gateway_->revoke(admin, "g1").has_value());
      revoked_at = i;
    }
  }
  EXPECT_EQ(accepted_after, 0);
  EXPECT_EQ(refused_after, 199);
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::lease_fence});
  std::ifstream in(log);
  std::string line;
  int last = -1;
  while (std::getline(in, line)) {
    int const v = std::stoi(line);
    EXPECT_LE(v, revoked_at) << "a byte sent after the revoke returned reached the process";
    last = v;
  }
  EXPECT_LE(last, revoked_at);
}

// Revokes and starts posted to the loop in an order drawn from `seed`; the start is the
// daemon's (start_async: its transaction races the revoke's on the authorizer thread).
void GatewayTest::revoke_races_start(unsigned seed) {
  gw_manager();
  std::mt19937 rng(seed);
  int started = 0;
  int refused = 0;
  std::vector<std::string> ids;
  Caller admin = runner();
  admin.admin = true;
  for (int round = 0; round < 24; ++round) {
    std::string const gid = "race-" + std::to_string(round);
    add(spec(gid));
    auto answer = std::make_shared<std::optional<Result<supervisor::StartResult>>>();
    auto& st = *answer;
    bool revoked = false;
    auto do_start = [&] {
      gateway_->start_async(
          runner(), request(sh("sleep 30")), claim(gid),
          [answer](Result<supervisor::StartResult> r) { *answer = std::move(r); });
    };
    auto do_revoke = [&] { revoked = gateway_->revoke(admin, gid).has_value(); };
    if (rng() % 2 == 0) {
      boost::asio::post(io_, do_start);
      boost::asio::post(io_, do_revoke);
    } else {
      boost::asio::post(io_, do_revoke);
      boost::asio::post(io_, do_start);
    }
    ASSERT_TRUE(drive([&] { return st.has_value() && revoked; }, 10s)) << round;
    if (*st) {
      ++started;
      ids.push_back((*st)->execution_id);
      EXPECT_TRUE(gateway_->fenced((*st)->execution_id)) << round;
    } else {
      ++refused;
      EXPECT_EQ(st->error().code, Errc::auth_unknown_grant) << round;
      auto g = store_->get_grant(gid);
      EXPECT_EQ((*g)->second.executions, 0U) << round;
    }
  }
  EXPECT_EQ(started + refused, 24);
  EXPECT_EQ(count("claims"), started);
  for (auto const& id : ids) {
    auto rec = terminal(id);
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::lease_fence}) << id;
  }
}

TEST_F(GatewayTest, RevokeRacingStartNeverLaunchesUnderRevokedAuthority) {
  revoke_races_start(12345);
}

TEST_F(GatewayTest, RevokeRacingStartNeverLaunchesUnderRevokedAuthorityOtherOrders) {
  revoke_races_start(54321);
}

// start_async (the daemon's exec.start) on a busy daemon: the authorizing transaction runs off
// the loop, the launch back on it. A revoke that commits after the authorization but before the
// launch ran fences the execution as it is launched, before its caller hears of the start.
TEST_F(GatewayTest, ARevokeWhileTheAuthorizationIsInFlightFencesTheLaunch) {
  auto& m = gw_manager();
  add(spec("g1"));
  add(spec("busy"));
  // Something runs: the next start is not authorized on the loop.
  auto busy = gw_start(sh("sleep 30"), claim("busy"));
  ASSERT_TRUE(busy.has_value()) << busy.error().message();
  ASSERT_EQ(m.live_count(), 1U);
  auto const answer = async_start(request(sh("sleep 30")), claim("g1"));
  auto const& st = *answer;
  EXPECT_EQ(gateway_->inflight(), 1U);
  EXPECT_EQ(m.live_count(), 1U) << "launched before the loop ran";
  // The loop is not run, so the launch waits; the transaction commits on the authorizer.
  auto const deadline = std::chrono::steady_clock::now() + 10s;
  while (count("claims") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(count("claims"), 2);
  EXPECT_FALSE(st.has_value());
  Caller admin = runner();
  admin.admin = true;
  auto rv = gateway_->revoke(admin, "g1");
  ASSERT_TRUE(rv.has_value()) << rv.error().message();
  ASSERT_EQ(rv->fence.fenced.size(), 1U);
  std::string const id = rv->fence.fenced[0];
  EXPECT_TRUE(gateway_->fenced(id));
  ASSERT_TRUE(drive([&] { return st.has_value(); }, 10s));
  ASSERT_TRUE(st->has_value()) << st->error().message();
  EXPECT_EQ((*st)->execution_id, id);
  EXPECT_EQ(gateway_->inflight(), 0U);
  auto rec = terminal(id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::lease_fence});
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  ASSERT_TRUE(m.cancel(busy->execution_id, core::Trigger::user, "test").has_value());
  EXPECT_TRUE(terminal(busy->execution_id));
}

// An idle daemon (no other start in flight, nothing running) authorizes on the loop: the
// authorizing transaction has committed and the launch has begun when start_async returns. A
// second start while the first is in flight goes through the authorizer thread again.
TEST_F(GatewayTest, AnIdleGatewayAuthorizesOnTheLoopAndABusyOneOffIt) {
  auto& m = gw_manager();
  add(spec("g1"));
  auto const first = async_start(request(sh("exit 3")), claim("g1"));
  EXPECT_EQ(count("claims"), 1);
  EXPECT_EQ(m.live_count(), 1U) << "the idle start was not launched at once";
  EXPECT_FALSE(first->has_value());  // answered from the loop, once the launch is durable
  auto const second = async_start(request(sh("exit 5")), claim("g1"));
  EXPECT_EQ(gateway_->inflight(), 2U);
  EXPECT_EQ(m.live_count(), 1U) << "a start with another in flight was launched at once";
  ASSERT_TRUE(drive([&] { return first->has_value() && second->has_value(); }, 10s));
  ASSERT_TRUE(first->value()) << first->value().error().message();
  ASSERT_TRUE(second->value()) << second->value().error().message();
  EXPECT_EQ(gateway_->inflight(), 0U);
  auto one = terminal(first->value()->execution_id);
  auto two = terminal(second->value()->execution_id);
  ASSERT_TRUE(one && two);
  EXPECT_EQ(one->exit.code, 3);
  EXPECT_EQ(two->exit.code, 5);
  EXPECT_EQ(count("claims"), 2);
}

TEST_F(GatewayTest, AsyncStartAnswersLikeStartAndARefusalHasNoEffect) {
  gw_manager();
  add(spec("g1"));
  auto const first = request(sh("exit 4"));
  auto const answer = async_start(first, claim("g1"));
  auto const& st = *answer;
  ASSERT_TRUE(drive([&] { return st.has_value(); }, 10s));
  ASSERT_TRUE(st->has_value()) << st->error().message();
  // The claim's fsync came before the answer.
  EXPECT_FALSE(reg_->durability_pending());
  auto rec = terminal((*st)->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 4);
  // The same action again: refused by the authorizing transaction, nothing written.
  auto const claims = count("claims");
  auto const replayed = async_start(first, claim("g1"));
  auto const& again = *replayed;
  ASSERT_TRUE(drive([&] { return again.has_value(); }, 10s));
  ASSERT_FALSE(again->has_value());
  EXPECT_EQ(again->error().code, Errc::auth_replay);
  EXPECT_EQ(count("claims"), claims);
  EXPECT_EQ(gateway_->inflight(), 0U);
  // An invalid plan is refused before anything is queued, before start_async returns.
  auto bad = request(sh("exit 0"));
  bad.plan.command.argv.clear();
  auto const invalid = async_start(std::move(bad), claim("g1"));
  ASSERT_TRUE(invalid->has_value());
  EXPECT_FALSE(invalid->value().has_value());
  EXPECT_EQ(gateway_->inflight(), 0U);
}

TEST_F(GatewayTest, DrainWaitsForAuthorizationsInFlightAndRefusesNewStarts) {
  gw_manager();
  add(spec("g1"));
  auto const answer = async_start(request(sh("exit 0")), claim("g1"));
  auto const& st = *answer;
  // {drained, the start had been answered by then}; shared with the callback for the same
  // reason as the answers.
  auto drained = std::make_shared<std::pair<bool, bool>>(false, false);
  gateway_->drain(10s, [drained, answer] { *drained = {true, answer->has_value()}; });
  EXPECT_FALSE(drained->first);
  auto const late = async_start(request(sh("exit 0")), claim("g1"));
  ASSERT_TRUE(late->has_value());
  ASSERT_FALSE(late->value().has_value());
  EXPECT_EQ(late->value().error().code, Errc::daemon_shutting_down);
  ASSERT_TRUE(drive([&] { return drained->first; }, 10s));
  EXPECT_TRUE(drained->second);
  ASSERT_TRUE(st->has_value()) << st->error().message();
  EXPECT_TRUE(terminal((*st)->execution_id).has_value());
  EXPECT_EQ(count("claims"), 1);
  // Nothing in flight: drained at once.
  bool again = false;
  gateway_->drain(10s, [&] { again = true; });
  EXPECT_TRUE(again);
}

TEST_F(GatewayTest, ExpiryBehavesLikeRevocation) {
  gw_manager();
  Grant g = spec("g1");
  g.expires_ns = now_ns() + 400'000'000;
  add(g);
  auto st = gw_start(sh("sleep 30"), claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  auto rec = terminal(st->execution_id, 10s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::lease_fence});
  auto late = gw_start(sh("exit 0"), claim("g1"));
  ASSERT_FALSE(late.has_value());
  EXPECT_EQ(late.error().code, Errc::auth_expired);
}

TEST_F(GatewayTest, QuiescenceBlocksOnALiveExecutionThenGivesEvidence) {
  gw_manager();
  add(spec("g1"));
  Caller admin = runner();
  admin.admin = true;
  auto st = gw_start(sh("sleep 30"), claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  auto q = gateway_->quiescence(admin, "s1", 1, std::nullopt);
  ASSERT_TRUE(q.has_value()) << q.error().message();
  EXPECT_FALSE(q->quiescent);
  ASSERT_EQ(q->blocking.size(), 1U);
  EXPECT_EQ(q->blocking[0].reason, "live");
  EXPECT_FALSE(q->evidence);
  // Another generation of the same session is not blocked by it.
  EXPECT_TRUE(gateway_->quiescence(admin, "s1", 2, std::nullopt)->quiescent);

  ASSERT_TRUE(manager_->cancel(st->execution_id, core::Trigger::user, "test").has_value());
  ASSERT_TRUE(terminal(st->execution_id));
  auto done = gateway_->quiescence(admin, "s1", 1, std::nullopt);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->quiescent);
  ASSERT_TRUE(done->evidence);
  EXPECT_EQ(done->evidence->at("executions").as_array().size(), 1U);
  EXPECT_TRUE(done->evidence->at("digest").as_string().starts_with("sha256:"));

  // A non-admin asks only about itself.
  auto other = gateway_->quiescence(runner(), "s1", 1, std::nullopt);
  ASSERT_FALSE(other.has_value());
  EXPECT_EQ(other.error().code, Errc::auth_denied);
  auto own = gateway_->quiescence(runner(), "s1", 1, "uid:" + std::to_string(::geteuid()));
  ASSERT_TRUE(own.has_value());
  EXPECT_TRUE(own->quiescent);
}

// A start the daemon has taken but not answered (its authorizing transaction may not even
// have committed) is one of the holder's executions: quiescence is blocked by it.
TEST_F(GatewayTest, QuiescenceIsBlockedByAStartInFlight) {
  gw_manager();
  add(spec("g1"));
  Caller admin = runner();
  admin.admin = true;
  auto const answer = async_start(request(sh("exit 0")), claim("g1"));
  ASSERT_FALSE(answer->has_value());
  auto q = gateway_->quiescence(admin, "s1", 1, std::nullopt);
  ASSERT_TRUE(q.has_value()) << q.error().message();
  EXPECT_FALSE(q->quiescent);
  ASSERT_EQ(q->blocking.size(), 1U);
  EXPECT_EQ(q->blocking[0].reason, "starting");
  EXPECT_TRUE(gateway_->quiescence(admin, "s1", 2, std::nullopt)->quiescent);
  ASSERT_TRUE(drive([&] { return answer->has_value(); }, 10s));
  ASSERT_TRUE(answer->value()) << answer->value().error().message();
  EXPECT_EQ(answer->value()->execution_id, q->blocking[0].execution_id);
  ASSERT_TRUE(terminal(answer->value()->execution_id));
  auto done = gateway_->quiescence(admin, "s1", 1, std::nullopt);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->quiescent);
}

TEST_F(GatewayTest, QuiescenceIsBlockedByAnUnconfirmedCleanup) {
  gw_manager(BoundaryPreference::marker);
  add(spec("g1"));
  Caller admin = runner();
  admin.admin = true;
  supervisor::testing::Collected c;
  // The root exits only once its child runs unmarked: a sweep that came earlier would catch
  // it still marked, kill it and rightly confirm the cleanup (this test was flaky so).
  auto st = gw_start(sh(supervisor::testing::unmarked_escapee_script()), claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  auto sub =
      manager_->subscribe(st->execution_id, std::uint64_t{1}, [&c](supervisor::Event const& e) {
        c.events.push_back(e);
        return true;
      });
  ASSERT_TRUE(sub.has_value());
  subscriptions_.push_back(*sub);
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  auto fds = pidfds_from(c.stream_text("stdout"));
  ASSERT_EQ(fds.size(), 1U);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::unconfirmed);
  auto q = gateway_->quiescence(admin, "s1", 1, std::nullopt);
  ASSERT_TRUE(q.has_value());
  EXPECT_FALSE(q->quiescent);
  ASSERT_EQ(q->blocking.size(), 1U);
  EXPECT_EQ(q->blocking[0].reason, "cleanup_unconfirmed");
  // Our own escapee, through the pidfd opened while it was ours.
  ASSERT_TRUE(fds[0].send_signal(SIGKILL));
  EXPECT_TRUE(drive([&] { return !fds[0].alive(); }, 5s));
  manager_->reap_orphans_now();
}

TEST_F(GatewayTest, NonAdminOnEveryAdminOperation) {
  gw_manager();
  add(spec("g1"));
  Caller const r = runner();
  auto g = gateway_->grant(r, spec("g2"));
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.error().code, Errc::auth_denied);
  auto rv = gateway_->revoke(r, "g1");
  ASSERT_FALSE(rv.has_value());
  EXPECT_EQ(rv.error().code, Errc::auth_denied);
  auto lease = gateway_->acquire_lease(r, "w1", "s1");
  ASSERT_TRUE(lease.has_value());
  auto brk = gateway_->release_lease(r, lease->id, true);
  ASSERT_FALSE(brk.has_value());
  EXPECT_EQ(brk.error().code, Errc::auth_denied);
  // A caller without a writable grant on the workspace cannot lease it.
  Caller stranger{::geteuid() + 7, ::getegid() + 7, {}, false};
  auto sl = gateway_->acquire_lease(stranger, "w9", "s1");
  ASSERT_FALSE(sl.has_value());
  EXPECT_EQ(sl.error().code, Errc::auth_denied);
  // list shows a non-admin only its own grants.
  auto mine = gateway_->list(stranger);
  ASSERT_TRUE(mine.has_value());
  EXPECT_TRUE(mine->empty());
  EXPECT_EQ(*store_->epoch(), 2U) << "refused admin calls changed nothing";
}

}  // namespace
}  // namespace custos::gateway

namespace custos::gateway {
namespace {

TEST_F(GatewayTest, RecoverySettlesBudgetsADeadDaemonLeftReserved) {
  gw_manager();
  Grant g = spec("g1");
  g.budget.wall_ms = 100'000;
  add(g);
  auto p = sh("exit 0");
  p.limits.wall_ms = 20'000;
  auto st = gw_start(p, claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  ASSERT_TRUE(terminal(st->execution_id));
  // As if the daemon died after the terminal record reached the registry but before the
  // settlement: the use is unsettled and its reservation still held.
  ASSERT_TRUE(db_->write([&](registry::sql::Db& db) -> Result<void> {
                   CUSTOS_TRYV(db.exec("UPDATE authority_uses SET settled = 0"));
                   return db.exec(
                       "UPDATE budgets SET wall_ms_reserved = 20000, wall_ms_used = 0 WHERE "
                       "grant_id = 'g1'");
                 })
                  .has_value());
  ExecutionGateway restarted(io_, *store_, GatewayOptions{reg_.get(), inner_.get()});
  auto n = restarted.settle_recovered();
  ASSERT_TRUE(n.has_value()) << n.error().message();
  EXPECT_EQ(*n, 1U);
  auto use = (*store_->get_grant("g1"))->second;
  EXPECT_EQ(use.wall_ms_reserved, 0U);
  EXPECT_LT(use.wall_ms_used, 20'000U);
  EXPECT_EQ(*restarted.settle_recovered(), 0U) << "settled once";
}

}  // namespace
}  // namespace custos::gateway

namespace custos::gateway {
namespace {

// A grant's run_as_uids works for the non-root principal it names: the gateway checks plan.user
// against the grant and says so in the permit, so the manager's own "a non-root caller runs only
// as itself" rule (for callers nobody checked) does not refuse it. A uid outside run_as_uids is
// still refused, typed, with no effect.
TEST_F(GatewayTest, ANonRootRunnerRunsAsAUidItsGrantAllows) {
  if (::geteuid() != 0) GTEST_SKIP() << "a daemon without privilege cannot switch uids";
  auto& m = gw_manager();
  std::uint32_t const runner_uid = 4242;
  Grant g = spec("g-runas");
  g.principal = Principal{PrincipalKind::uid, runner_uid};
  g.run_as_uids = {65534};
  add(g);
  Caller const caller{runner_uid, runner_uid, {}, false};

  auto p = plan({"/usr/bin/id", "-u"});
  p.user = core::UserSpec{65534, 65534, {}};
  auto req = request(p);
  auto st = start_and_wait(*gateway_, io_, caller, req, claim("g-runas"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  auto out = m.output(st->execution_id, core::Stream::stdout_stream, 0, 1024);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(std::string(out->data.begin(), out->data.end()), "65534\n");
  EXPECT_EQ(count("claims"), 1);

  // Not in run_as_uids: typed refusal, nothing consumed, nothing launched.
  auto budget_before = (*store_->get_grant("g-runas"))->second;
  auto q = plan({"/usr/bin/id", "-u"});
  q.user = core::UserSpec{65533, 65533, {}};
  auto refused = start_and_wait(*gateway_, io_, caller, request(q), claim("g-runas"));
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::auth_user);
  EXPECT_EQ(count("claims"), 1);
  EXPECT_EQ(m.list({}).size(), 1U);
  EXPECT_EQ((*store_->get_grant("g-runas"))->second, budget_before);
}

// What the manager would refuse before it creates anything is refused before the claim is
// consumed: the permit is minted only for a launch the manager will attempt.
TEST_F(GatewayTest, AManagerRefusalComesBeforeAnyConsumption) {
  auto& m = gw_manager();
  add(spec("g1"));
  auto const budget_before = (*store_->get_grant("g1"))->second;
  bool done = false;
  m.shutdown(supervisor::ShutdownPolicy::cancel, 1s, [&] { done = true; });
  ASSERT_TRUE(drive([&] { return done; }, 5s));
  auto r = gw_start(sh("exit 0"), claim("g1"));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::daemon_shutting_down);
  EXPECT_EQ(count("claims"), 0);
  EXPECT_EQ(count("authority_uses"), 0);
  EXPECT_EQ((*store_->get_grant("g1"))->second, budget_before);
}

// The authorizing transaction creates the record with the claim (no orphan claim, no second
// commit for the record), its group commit is durable before start() returns, and the budget
// settlement commits in the terminal record's transaction (queued ahead of it).
TEST_F(GatewayTest, TheRecordComesWithTheClaimAndTheSettlementWithTheTerminalRecord) {
  auto& m = gw_manager();
  Grant g = spec("g1");
  g.budget.wall_ms = 100'000;
  add(g);
  // It waits for the end of its input, so it is still running (its reservation held) when the
  // budget is read: an `exit 0` could already be terminal and settled by then.
  auto p = sh("read x; exit 0");
  p.limits.wall_ms = 20'000;
  auto st = gw_start(p, claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  EXPECT_FALSE(reg_->durability_pending()) << "start() returned before the claim's fsync";
  auto rec = reg_->get(st->execution_id);
  ASSERT_TRUE(rec.has_value()) << rec.error().message();
  EXPECT_TRUE(reg_->orphan_claims()->empty());
  EXPECT_EQ((*store_->get_grant("g1"))->second.wall_ms_reserved, 20'000U);

  auto const deferred_before = reg_->write_stats();
  ASSERT_TRUE(gateway_->input(st->execution_id, {}, true).has_value());
  ASSERT_TRUE(terminal(st->execution_id));
  auto const after = reg_->write_stats();
  EXPECT_GE(after.deferred - deferred_before.deferred, 1U) << "the settlement was queued";
  EXPECT_EQ(after.deferred_failed, deferred_before.deferred_failed);
  EXPECT_EQ(reg_->deferred_pending(), 0U) << "committed with the terminal record";
  auto view = m.get(st->execution_id);
  ASSERT_TRUE(view.has_value());
  EXPECT_FALSE(view->sink_error.has_value()) << *view->sink_error;
  auto const b = (*store_->get_grant("g1"))->second;
  EXPECT_EQ(b.wall_ms_reserved, 0U);
  EXPECT_LT(b.wall_ms_used, 20'000U);
  EXPECT_TRUE((*store_->get_use(st->execution_id))->settled);
  auto stored = reg_->get(st->execution_id);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->phase, core::Phase::terminal);
}

// A spawn failure after the authorizing transaction is no error of start(): the execution is
// terminal (spawn_failed), its claim stays consumed, its record is terminal, its budget is
// settled, and nothing is left for a fence.
TEST_F(GatewayTest, ASpawnFailureStaysConsumedAndIsSettledAtItsTerminalRecord) {
  gw_manager();
  Grant g = spec("g1");
  g.budget.wall_ms = 100'000;
  add(g);
  auto p = plan({"/bin/custos-gateway-test-no-such-program"});
  p.limits.wall_ms = 20'000;
  auto st = gw_start(p, claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  EXPECT_EQ(st->phase, core::Phase::terminal);
  EXPECT_EQ(st->pid, 0);
  EXPECT_FALSE(reg_->durability_pending()) << "the outcome preceded the claim's fsync";
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
  EXPECT_EQ(count("claims"), 1);
  auto stored = reg_->get(st->execution_id);
  ASSERT_TRUE(stored.has_value()) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::terminal);
  auto const b = (*store_->get_grant("g1"))->second;
  EXPECT_EQ(b.executions, 1U);
  EXPECT_EQ(b.wall_ms_reserved, 0U);
  EXPECT_TRUE((*store_->get_use(st->execution_id))->settled);
  Caller admin = runner();
  admin.admin = true;
  auto revoked = gateway_->revoke(admin, "g1");
  ASSERT_TRUE(revoked.has_value()) << revoked.error().message();
  EXPECT_TRUE(revoked->fence.fenced.empty());
}

// The execution id the gateway authorized is the one the manager launched (the permit carries
// it), and the authority use names it.
TEST_F(GatewayTest, TheLaunchedExecutionIsTheAuthorizedOne) {
  gw_manager();
  add(spec("g1"));
  auto st = gw_start(sh("exit 0"), claim("g1"));
  ASSERT_TRUE(st.has_value()) << st.error().message();
  auto use = store_->get_use(st->execution_id);
  ASSERT_TRUE(use.has_value() && use->has_value());
  EXPECT_EQ((*use)->execution_id, st->execution_id);
  auto rec = reg_->get(st->execution_id);
  ASSERT_TRUE(rec.has_value()) << rec.error().message();
  EXPECT_EQ(rec->plan_digest, st->plan_digest);
  ASSERT_TRUE(terminal(st->execution_id));
}

}  // namespace
}  // namespace custos::gateway

namespace custos::gateway {
namespace {

// The kernel's limit on run_as, tested with a daemon that really runs without privilege: a
// forked child drops to an ordinary uid and builds the daemon's chain (registry, its sink, the
// authority store, gateway, manager). A grant allowing run_as 65534 cannot be honoured there
// (setresuid needs CAP_SETUID), so the start is refused typed (auth.user) before the claim is
// consumed; running as its own uid still works.
TEST(GatewayWithoutPrivilege, AForeignPlanUserIsRefusedTypedBeforeConsumption) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create the unprivileged child";
  char tmpl[] = "/tmp/custos-gw-unpriv-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::filesystem::path const dir = tmpl;
  constexpr std::uint32_t kUid = 4243;
  ASSERT_EQ(::chown(dir.c_str(), kUid, kUid), 0);
  pid_t const pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kUid, kUid, kUid) != 0 ||
        ::setresuid(kUid, kUid, kUid) != 0) {
      ::_exit(90);
    }
    int rc = 0;
    {
      boost::asio::io_context io;
      auto reg = registry::Registry::open(dir / "registry");
      if (!reg) ::_exit(91);
      supervisor::RegistrySink inner(**reg, io);
      RegistryDatabase db(**reg);
      AuthorityStore store(db);
      ExecutionGateway gw(io, store, GatewayOptions{reg->get(), &inner});
      supervisor::ManagerConfig cfg;
      cfg.boundary = supervisor::BoundaryPreference::marker;
      cfg.state_dir = dir / "state";
      cfg.sink = &gw.sink();
      cfg.become_subreaper = false;
      supervisor::ExecutionManager m(io, std::move(cfg));
      gw.attach(m);
      std::filesystem::create_directories(dir / "ws");
      Grant g;
      g.id = "g-unpriv";
      g.principal = Principal{PrincipalKind::uid, kUid};
      g.operations = {OperationClass::exec_native};
      g.executables = {ExecutableRule{"/usr/bin", true}};
      g.workspaces = {WorkspaceRule{"w1", (dir / "ws").string(), core::WorkspaceAccess::read_only}};
      g.environment_ids = {"env1"};
      g.resource_ids = {"res1"};
      g.run_as_uids = {65534};
      if (!gw.grant(Caller{kUid, kUid, {}, true}, g)) ::_exit(92);
      auto make = [&](std::string action, std::optional<core::UserSpec> user) {
        supervisor::LaunchRequest r;
        r.identity.project_id = "p1";
        r.identity.session_id = "s1";
        r.identity.run_id = "r1";
        r.identity.attempt_id = "a1";
        r.identity.turn_id = "t1";
        r.identity.action_id = std::move(action);
        r.identity.process_id = "proc-1";
        r.identity.workspace_id = "w1";
        r.identity.resource_id = "res1";
        r.identity.environment_id = "env1";
        r.identity.generation = 1;
        r.plan.command.executable = "/usr/bin/id";
        r.plan.command.argv = {"/usr/bin/id", "-u"};
        r.plan.workspace.root = (dir / "ws").string();
        r.plan.user = std::move(user);
        return r;
      };
      AuthorityClaim c;
      c.epoch = *store.epoch();
      c.grant_id = "g-unpriv";
      Caller const runner{kUid, kUid, {}, false};
      auto refused =
          start_and_wait(gw, io, runner, make("act-foreign", core::UserSpec{65534, 65534, {}}), c);
      auto const grant = store.get_grant("g-unpriv");
      if (refused.has_value()) {
        rc = 10;
      } else if (refused.error().code != Errc::auth_user) {
        rc = 11;
      } else if (!grant || !*grant || (*grant)->second.executions != 0) {
        rc = 12;  // the budget moved: something was consumed
      } else if (!m.list({}).empty()) {
        rc = 13;
      } else {
        // Its own identity is no switch at all: that runs.
        auto own = start_and_wait(gw, io, runner, make("act-own", std::nullopt), c);
        if (!own) {
          rc = 14;
        } else {
          bool done = false;
          (void)m.wait(own->execution_id, std::chrono::seconds(20),
                       [&](Result<core::TerminalRecord> r) { done = r.has_value(); });
          auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(25);
          while (!done && std::chrono::steady_clock::now() < deadline) {
            io.restart();
            io.run_for(std::chrono::milliseconds(10));
          }
          if (!done) rc = 15;
        }
      }
    }
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace custos::gateway
