// The supervisor writing through the real SQLite registry: every launch step is durable in
// order, the one-use claim refuses a second launch, and the stored terminal record is the one
// the waiters got.
#include "custos/supervisor/registry_sink.hpp"

#include <chrono>
#include <thread>

#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

class RegistrySinkTest : public SupervisorTest {
 protected:
  void SetUp() override {
    SupervisorTest::SetUp();
    auto reg = registry::Registry::open(state_ / "registry");
    ASSERT_TRUE(reg) << reg.error().message();
    registry_ = std::move(*reg);
    sink_ = std::make_unique<RegistrySink>(*registry_);
  }
  void TearDown() override {
    SupervisorTest::TearDown();
    looped_.reset();
    sink_.reset();
    registry_.reset();
  }
  ExecutionManager& managed() {
    return manager(BoundaryPreference::automatic,
                   [this](ManagerConfig& c) { c.sink = sink_.get(); });
  }

  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<RegistrySink> sink_;
  std::unique_ptr<RegistrySink> looped_;  // the daemon's form: deferring, on this test's loop
};

TEST_F(RegistrySinkTest, LaunchAndCloseAreRecordedInOrder) {
  managed();
  auto req = request(sh("printf out; exit 5"));
  auto const action = req.identity.action_id;
  auto st = start_with_test_permit(*manager_, req);
  ASSERT_TRUE(st) << st.error().message();
  auto rec = terminal(st->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 5);

  auto stored = registry_->get(st->execution_id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::terminal);
  EXPECT_EQ(stored->plan_digest, st->plan_digest);
  EXPECT_EQ(stored->action_id, action);
  EXPECT_EQ(stored->ownership.state, registry::OwnershipState::committed);
  EXPECT_EQ(stored->ownership.pid, st->pid);
  EXPECT_EQ(stored->boundary.kind,
            have_cgroup() ? registry::BoundaryKind::cgroup : registry::BoundaryKind::marker);
  EXPECT_EQ(stored->boundary.marker_hex.size(), 32U);
  EXPECT_EQ(stored->out.accounting, (core::StreamAccounting{3, 3, 0, true}));
  ASSERT_TRUE(stored->terminal.has_value());
  auto decoded = registry::decode_terminal(*stored->terminal);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(*decoded, *rec);
  auto view = manager_->get(st->execution_id);
  ASSERT_TRUE(view);
  EXPECT_FALSE(view->sink_error.has_value()) << *view->sink_error;

  // The same (action, process) pair can never launch again.
  auto again = start_with_test_permit(*manager_, req);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Errc::registry_claim_consumed);
}

TEST_F(RegistrySinkTest, CancelledExecutionRecordsItsTrigger) {
  managed();
  auto st = start(plan({"/bin/sleep", "100"}));
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  auto stored = registry_->get(st.execution_id);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->trigger, core::Trigger::user);
  EXPECT_EQ(stored->phase, core::Phase::terminal);
  ASSERT_TRUE(stored->terminal);
  EXPECT_EQ(stored->terminal->classification, "cancelled");
}

TEST_F(RegistrySinkTest, SpawnFailureIsTerminalInTheRegistry) {
  managed();
  auto st = start(plan({"/nonexistent/nothing"}));
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
  auto stored = registry_->get(st.execution_id);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->phase, core::Phase::terminal);
  ASSERT_TRUE(stored->terminal);
  EXPECT_EQ(stored->terminal->classification, "spawn_failed");
}

// With a loop, writes that gate nothing are deferred and committed by the sink's own flush
// thread: nobody has to run the loop (and the loop does not pay the transaction).
TEST_F(RegistrySinkTest, DeferredWritesCommitWithoutTheLoop) {
  boost::asio::io_context never_run;
  RegistrySink deferring(*registry_, &never_run);
  auto req = request(sh("exit 0"));
  auto digest = core::plan_digest(req.identity, req.plan);
  ASSERT_TRUE(digest);
  std::string const id = "ex-00000000000000b1";
  ASSERT_TRUE(deferring.record_authorized(id, req.identity, req.plan, digest->to_string()));
  ASSERT_TRUE(deferring.make_durable(id));
  EXPECT_FALSE(registry_->durability_pending());
  ASSERT_TRUE(deferring.record_phase(id, core::Phase::starting));
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (registry_->deferred_pending() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(registry_->deferred_pending(), 0U);
  auto stored = registry_->get(id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::starting);
}

// The daemon's sink (on the loop) writes the terminal record without the loop waiting for the
// transaction; still, nobody hears of the result before the record is in the registry.
TEST_F(RegistrySinkTest, WaitersHearOfTheResultOnlyOnceTheTerminalRecordIsWritten) {
  looped_ = std::make_unique<RegistrySink>(*registry_, &io_);
  manager(BoundaryPreference::automatic, [this](ManagerConfig& c) { c.sink = looped_.get(); });
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    auto st = start_with_test_permit(*manager_, request(sh("exit " + std::to_string(i))));
    ASSERT_TRUE(st) << st.error().message();
    ids.push_back(st->execution_id);
  }
  int answered = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    manager_->wait(ids[i], std::nullopt, [&, i](Result<core::TerminalRecord> r) {
      ++answered;
      ASSERT_TRUE(r) << r.error().message();
      EXPECT_EQ(r->exit.code, static_cast<int>(i));
      auto stored = registry_->get(ids[i]);
      ASSERT_TRUE(stored) << stored.error().message();
      EXPECT_EQ(stored->phase, core::Phase::terminal) << ids[i];
      ASSERT_TRUE(stored->terminal.has_value());
      auto decoded = registry::decode_terminal(*stored->terminal);
      ASSERT_TRUE(decoded) << decoded.error().message();
      EXPECT_EQ(decoded->exit.code, static_cast<int>(i));
    });
  }
  ASSERT_TRUE(drive([&] { return answered == static_cast<int>(ids.size()); }, 20s));
  for (auto const& id : ids) {
    auto v = manager_->get(id);
    ASSERT_TRUE(v);
    EXPECT_EQ(v->phase, core::Phase::terminal);
    EXPECT_FALSE(v->sink_error.has_value()) << *v->sink_error;
  }
}

}  // namespace
}  // namespace custos::supervisor::testing
