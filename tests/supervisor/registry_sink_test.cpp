// The supervisor writing through the real SQLite registry: every launch step is durable in
// order, the one-use claim refuses a second launch, and the stored terminal record is the one
// the waiters got.
#include "custos/supervisor/registry_sink.hpp"

#include <boost/asio/post.hpp>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"
#include "custos/sys/identity.hpp"

#include "harness.hpp"
#include "support/scoped_failpoint.hpp"

namespace custos::supervisor::testing {
namespace {

class RegistrySinkTest : public SupervisorTest {
 protected:
  void SetUp() override {
    SupervisorTest::SetUp();
    auto reg = registry::Registry::open(state_ / "registry");
    ASSERT_TRUE(reg) << reg.error().message();
    registry_ = std::move(*reg);
    sink_ = std::make_unique<RegistrySink>(*registry_, io_);
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

  // The claim and record of `id`, written through the registry itself (a test's set-up for the
  // sink's later writes), durable unless `durability` says group.
  Result<> seed_authorized(std::string const& id, LaunchRequest const& req,
                           std::string const& digest,
                           registry::Durability durability = registry::Durability::full) {
    auto ex = registry::make_new_execution(id, req.identity, req.plan, digest);
    if (!ex) return ex.error();
    return registry_->record_authorized(*ex, durability);
  }

  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<RegistrySink> sink_;
  std::unique_ptr<RegistrySink> looped_;  // the daemon's form: deferring, on this test's loop

  // A manager writing through looped_ (the daemon's sink).
  ExecutionManager& looped() {
    looped_ = std::make_unique<RegistrySink>(*registry_, io_);
    return manager(BoundaryPreference::automatic,
                   [this](ManagerConfig& c) { c.sink = looped_.get(); });
  }
  // The event-loop launch's answer. The completion holds it too: it may run after a failed
  // assertion ended the test body, while TearDown still drives the loop.
  using Answer = std::shared_ptr<std::optional<Result<StartResult>>>;
  Answer launch_async(LaunchRequest req) {
    auto a = std::make_shared<std::optional<Result<StartResult>>>();
    start_async_with_test_permit(*manager_, std::move(req),
                                 [a](Result<StartResult> r) { *a = std::move(r); });
    return a;
  }
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
  EXPECT_EQ(stored->boundary.kind, have_cgroup() ? core::Boundary::cgroup : core::Boundary::marker);
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
  RegistrySink deferring(*registry_, never_run);
  auto req = request(sh("exit 0"));
  auto digest = core::plan_digest(req.identity, req.plan);
  ASSERT_TRUE(digest);
  std::string const id = "ex-00000000000000b1";
  ASSERT_TRUE(seed_authorized(id, req, digest->to_string()));
  EXPECT_FALSE(registry_->durability_pending());
  auto const queued = std::chrono::steady_clock::now();
  ASSERT_TRUE(deferring.record_phase(id, core::Phase::starting));
  // Nobody waits for a phase: it stays queued for up to kLazyFlushBound, for an urgent write to
  // take it along, and is committed by then.
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  std::size_t const pending = registry_->deferred_pending();
  if (std::chrono::steady_clock::now() - queued < RegistrySink::kLazyFlushBound) {
    EXPECT_EQ(pending, 1U) << "a lazy write was committed at once";
  }
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (registry_->deferred_pending() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(registry_->deferred_pending(), 0U);
  auto stored = registry_->get(id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::starting);
}

// With one execution in flight (the daemon's probe: the manager's live count), the loop commits
// a write somebody waits for itself, when the registry is free: two cross-CPU hand-offs fewer.
// The completion still comes as a handler of the loop, never from inside the call.
TEST_F(RegistrySinkTest, AloneTheLoopCommitsTheWriteItWaitsForItself) {
  RegistrySink sink(*registry_, io_);
  bool solo = true;
  sink.set_solo_probe([&] { return solo; });
  auto req = request(sh("exit 0"));
  auto digest = core::plan_digest(req.identity, req.plan);
  ASSERT_TRUE(digest);
  std::string const id = "ex-00000000000000c1";
  ASSERT_TRUE(seed_authorized(id, req, digest->to_string()));
  auto boot = sys::read_boot_id();
  ASSERT_TRUE(boot) << boot.error().message();
  sys::PidfsIdentity const staged{*boot, 1, 4242, ::getpid(), 1};
  std::optional<Result<>> told;
  auto const before = registry_->write_stats();
  sink.record_staged_async(id, staged, {Boundary::marker, "", std::string(32, 'c')},
                           [&](Result<> r) { told = std::move(r); });
  // Committed before the call returned, on this thread; told only by the loop.
  EXPECT_EQ(registry_->deferred_pending(), 0U);
  EXPECT_EQ(registry_->write_stats().transactions - before.transactions, 1U);
  EXPECT_FALSE(told.has_value());
  ASSERT_TRUE(drive([&] { return told.has_value(); }, 5s));
  EXPECT_TRUE(told->has_value()) << told->error().message();
  auto stored = registry_->get(id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->ownership.state, registry::OwnershipState::staged);
}

// The claim's durability, awaited before the barrier release: when the flusher already synced
// it (the usual case: it ran while the child was created), the launch goes on at once, on the
// loop it is on, even while later group commits of other launches are pending; otherwise the
// flusher's completion comes through the loop.
TEST_F(RegistrySinkTest, TheClaimsDurabilityIsToldAtOnceWhenItIsAlreadyOnDisk) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  custos::testing::ScopedFailpoint const failpoint{"flusher_slow"};  // 50 ms before each fsync
  RegistrySink sink(*registry_, io_);
  auto req = request(sh("exit 0"));
  auto digest = core::plan_digest(req.identity, req.plan);
  ASSERT_TRUE(digest);
  auto authorize = [&](std::string const& id, std::string const& action) {
    auto r = req;
    r.identity.action_id = action;
    auto d = core::plan_digest(r.identity, r.plan);
    ASSERT_TRUE(d);
    ASSERT_TRUE(seed_authorized(id, r, d->to_string(), registry::Durability::group));
  };
  authorize("ex-00000000000000d1", "act-d1");
  ASSERT_TRUE(registry_->await_durable("ex-00000000000000d1"));
  authorize("ex-00000000000000d2", "act-d2");  // pending for ~50 ms
  ASSERT_TRUE(registry_->durability_pending());
  std::optional<Result<>> first;
  sink.when_durable("ex-00000000000000d1", [&](Result<> r) { first = std::move(r); });
  ASSERT_TRUE(first.has_value()) << "told through the loop, not at once";
  EXPECT_TRUE(first->has_value());
  std::optional<Result<>> second;
  sink.when_durable("ex-00000000000000d2", [&](Result<> r) { second = std::move(r); });
  EXPECT_FALSE(second.has_value());
  ASSERT_TRUE(drive([&] { return second.has_value(); }, 10s));
  EXPECT_TRUE(second->has_value());
  EXPECT_FALSE(registry_->durability_pending());
}

// Under load the commit thread is woken once per turn of the loop, not once per write: the
// urgent writes every handler of a turn queues become one transaction. Nothing is committed
// while the turn still runs; each write is told through the loop once it is in the WAL.
TEST_F(RegistrySinkTest, UnderLoadATurnsUrgentWritesAreOneTransaction) {
  RegistrySink sink(*registry_, io_);  // no solo probe: always under load
  auto boot = sys::read_boot_id();
  ASSERT_TRUE(boot) << boot.error().message();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto req = request(sh("exit 0"));
    auto digest = core::plan_digest(req.identity, req.plan);
    ASSERT_TRUE(digest);
    ids.push_back("ex-00000000000000d" + std::to_string(i));
    ASSERT_TRUE(seed_authorized(ids.back(), req, digest->to_string()));
  }
  std::vector<std::optional<Result<>>> told(ids.size());
  auto const before = registry_->write_stats();
  std::optional<std::size_t> pending_in_turn;
  std::optional<std::uint64_t> committed_in_turn;
  boost::asio::post(io_, [&] {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      sys::PidfsIdentity const staged{*boot, 1, 4242 + i, ::getpid(), 1};
      sink.record_staged_async(ids[i], staged, {Boundary::marker, "", std::string(32, 'd')},
                               [&told, i](Result<> r) { told[i] = std::move(r); });
    }
    // Still in the turn: a commit thread woken by the first write would have taken it by now.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pending_in_turn = registry_->deferred_pending();
    committed_in_turn = registry_->write_stats().transactions - before.transactions;
  });
  ASSERT_TRUE(drive(
      [&] {
        for (auto const& t : told) {
          if (!t) return false;
        }
        return true;
      },
      5s));
  ASSERT_TRUE(pending_in_turn && committed_in_turn);
  EXPECT_GE(*pending_in_turn, ids.size());
  EXPECT_EQ(*committed_in_turn, 0U) << "a write was committed before its turn of the loop ended";
  EXPECT_EQ(registry_->write_stats().transactions - before.transactions, 1U);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(told[i]->has_value()) << told[i]->error().message();
    auto stored = registry_->get(ids[i]);
    ASSERT_TRUE(stored) << stored.error().message();
    EXPECT_EQ(stored->ownership.state, registry::OwnershipState::staged);
  }
}

// The daemon's wiring end to end: one launch at a time through the looped sink with the
// manager's live count as the probe, every step recorded and the waiter told after the record.
TEST_F(RegistrySinkTest, AloneTheEventLoopLaunchIsRecordedAsUnderLoad) {
  looped();
  // Null while the manager is being destroyed (TearDown), when nothing is alone any more.
  looped_->set_solo_probe([this] { return manager_ && manager_->live_count() <= 1; });
  for (int i = 0; i < 3; ++i) {
    Answer a = launch_async(request(sh("exit " + std::to_string(i))));
    ASSERT_TRUE(drive([&] { return a->has_value(); }, 20s));
    ASSERT_TRUE(a->value()) << a->value().error().message();
    std::string const id = a->value()->execution_id;
    std::optional<Result<core::TerminalRecord>> waited;
    manager_->wait(id, std::nullopt, [&](Result<core::TerminalRecord> r) {
      // Told once the terminal record is in the registry.
      auto stored = registry_->get(id);
      EXPECT_TRUE(stored && stored->phase == core::Phase::terminal) << id;
      waited = std::move(r);
    });
    ASSERT_TRUE(drive([&] { return waited.has_value(); }, 20s));
    ASSERT_TRUE(waited->has_value()) << waited->error().message();
    EXPECT_EQ((*waited)->exit.code, i);
    auto stored = registry_->get(id);
    ASSERT_TRUE(stored) << stored.error().message();
    EXPECT_EQ(stored->ownership.state, registry::OwnershipState::committed);
    auto v = manager_->get(id);
    ASSERT_TRUE(v);
    EXPECT_FALSE(v->sink_error.has_value()) << *v->sink_error;
  }
  looped_->set_solo_probe(nullptr);
}

// The daemon's sink (on the loop) writes the terminal record without the loop waiting for the
// transaction; still, nobody hears of the result before the record is in the registry.
TEST_F(RegistrySinkTest, WaitersHearOfTheResultOnlyOnceTheTerminalRecordIsWritten) {
  looped();
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

// The event-loop launch (what the daemon uses): the staged record, the claim's durability and
// the child's verdict are awaited without holding the loop, and the answer is the same.
TEST_F(RegistrySinkTest, TheEventLoopLaunchAnswersAsTheBlockingOneDoes) {
  looped();
  Answer ok_run = launch_async(request(sh("printf hi; exit 6")));
  auto missing = request(sh("exit 0"));
  missing.plan.command.executable = "/nonexistent/custos-missing";
  Answer failed = launch_async(std::move(missing));
  // Nothing is answered before the loop ran (the claim's fsync and the verdict are awaited).
  EXPECT_FALSE(ok_run->has_value());
  ASSERT_TRUE(drive([&] { return ok_run->has_value() && failed->has_value(); }, 20s));

  ASSERT_TRUE(ok_run->value()) << ok_run->value().error().message();
  StartResult const& st = *ok_run->value();
  EXPECT_EQ(st.phase, core::Phase::running);
  EXPECT_GT(st.pid, 0);
  // Answered only once the claim and the staged ownership were on stable storage.
  auto stored = registry_->get(st.execution_id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->ownership.state, registry::OwnershipState::committed);
  EXPECT_EQ(stored->ownership.pid, st.pid);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 6);

  ASSERT_TRUE(failed->value()) << failed->value().error().message();
  StartResult const& sf = *failed->value();
  EXPECT_EQ(sf.phase, core::Phase::terminal);
  EXPECT_EQ(sf.pid, 0);
  auto frec = terminal(sf.execution_id);
  ASSERT_TRUE(frec);
  EXPECT_EQ(frec->classification, core::Classification::spawn_failed);
  ASSERT_TRUE(frec->spawn_error.has_value());
  EXPECT_EQ(frec->spawn_error->code, "execve");
  EXPECT_EQ(frec->spawn_error->sys_errno, ENOENT);
  auto fstored = registry_->get(sf.execution_id);
  ASSERT_TRUE(fstored);
  EXPECT_EQ(fstored->phase, core::Phase::terminal);
}

// Forwards to the daemon's RegistrySink and holds every record_committed_async completion until
// release() (and, with `hold_durable`, every when_durable completion until release_durable()):
// what the launch does while its committed write, or its claim's fsync, is still outstanding.
// With `fail`, the released completion says registry.io instead (the write itself succeeded).
class HeldCommitSink final : public OwnershipSink {
 public:
  explicit HeldCommitSink(RegistrySink& inner, bool hold_durable = false)
      : inner_(&inner), hold_durable_(hold_durable) {}
  void record_authorized_async(std::string const& id, core::ExecutionIdentity const& identity,
                               core::ExecutionPlan const& plan, std::string const& digest,
                               std::function<void(Result<>)> done) override {
    inner_->record_authorized_async(id, identity, plan, digest, std::move(done));
  }
  void record_staged_async(std::string const& id, sys::PidfsIdentity const& identity,
                           StagedBoundary const& b, std::function<void(Result<>)> done) override {
    inner_->record_staged_async(id, identity, b, std::move(done));
  }
  void when_durable(std::string const& id, std::function<void(Result<>)> done) override {
    if (!hold_durable_) return inner_->when_durable(id, std::move(done));
    inner_->when_durable(id, [this, done = std::move(done)](Result<> r) mutable {
      held_durable_.emplace_back(std::move(done), std::move(r));
    });
  }
  void record_committed_async(std::string const& id, std::function<void(Result<>)> done) override {
    inner_->record_committed_async(id, [this, done = std::move(done)](Result<> r) mutable {
      held_.emplace_back(std::move(done), std::move(r));
    });
  }
  Result<> record_phase(std::string const& id, core::Phase phase) override {
    return inner_->record_phase(id, phase);
  }
  Result<> record_trigger(std::string const& id, core::Trigger trigger) override {
    return inner_->record_trigger(id, trigger);
  }
  Result<> record_output(std::string const& id, StreamId stream,
                         core::StreamAccounting const& acc) override {
    return inner_->record_output(id, stream, acc);
  }
  void record_terminal_async(std::string const& id, core::TerminalRecord const& rec,
                             std::function<void(Result<>)> done) override {
    inner_->record_terminal_async(id, rec, std::move(done));
  }

  // Completions that came back from the registry and are held (the write is in the WAL).
  [[nodiscard]] std::size_t held() const { return held_.size(); }
  [[nodiscard]] std::size_t held_durable() const { return held_durable_.size(); }
  void release_durable(bool fail = false) {
    auto held = std::move(held_durable_);
    held_durable_.clear();
    for (auto& [done, r] : held) {
      done(fail ? Result<>{Error{Errc::registry_io, "test: the fsync failed"}} : std::move(r));
    }
  }
  void release(bool fail) {
    auto held = std::move(held_);
    held_.clear();
    for (auto& [done, r] : held) {
      done(fail ? Result<>{Error{Errc::registry_io, "test: the commit failed"}} : std::move(r));
    }
  }

 private:
  RegistrySink* inner_;
  bool hold_durable_;
  std::vector<std::pair<std::function<void(Result<>)>, Result<>>> held_;
  std::vector<std::pair<std::function<void(Result<>)>, Result<>>> held_durable_;
};

class HeldCommitTest : public RegistrySinkTest {
 protected:
  void TearDown() override {
    if (held_) {
      held_->release_durable();
      held_->release(false);
    }
    RegistrySinkTest::TearDown();
    held_.reset();
  }
  ExecutionManager& held_manager(bool hold_durable = false) {
    looped_ = std::make_unique<RegistrySink>(*registry_, io_);
    held_ = std::make_unique<HeldCommitSink>(*looped_, hold_durable);
    return manager(BoundaryPreference::automatic,
                   [this](ManagerConfig& c) { c.sink = held_.get(); });
  }
  std::unique_ptr<HeldCommitSink> held_;
};

// The event-loop launch answers its caller only once the committed slot (with phase running)
// is in the WAL: a crash before that is recovered as a launch whose commit was never recorded,
// and no caller may have been told it started.
TEST_F(HeldCommitTest, TheLaunchIsAnsweredOnlyOnceItsCommittedSlotIsWritten) {
  held_manager();
  auto const answer = launch_async(request(sh("sleep 30")));
  ASSERT_TRUE(drive([&] { return held_->held() == 1; }, 20s));
  // The target runs and its committed write is in the WAL, but its completion is held.
  drive([] { return false; }, 100ms);
  EXPECT_FALSE(answer->has_value()) << "answered before the committed write was known durable";
  auto listed = manager_->list({});
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].phase, core::Phase::running);
  auto stored = registry_->get(listed[0].execution_id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->ownership.state, registry::OwnershipState::committed);
  EXPECT_EQ(stored->phase, core::Phase::running);
  held_->release(false);
  ASSERT_TRUE(drive([&] { return answer->has_value(); }, 5s));
  ASSERT_TRUE(answer->value()) << answer->value().error().message();
  EXPECT_EQ(answer->value()->phase, core::Phase::running);
  EXPECT_GT(answer->value()->pid, 0);
  // `running` rode with the committed slot: no write of it was refused on the way.
  auto view = manager_->get(listed[0].execution_id);
  ASSERT_TRUE(view);
  EXPECT_FALSE(view->sink_error.has_value()) << *view->sink_error;
  auto c = manager_->cancel(listed[0].execution_id, core::Trigger::user, "done");
  ASSERT_TRUE(c);
  auto rec = terminal(listed[0].execution_id, 20s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
}

// A committed write that fails: the target already runs, so it is stopped (backend_failure),
// the caller is still answered, and the execution says why.
TEST_F(HeldCommitTest, AFailedCommittedWriteStopsTheTargetAndStillAnswers) {
  held_manager();
  auto const answer = launch_async(request(sh("sleep 30")));
  ASSERT_TRUE(drive([&] { return held_->held() == 1; }, 20s));
  held_->release(true);
  ASSERT_TRUE(drive([&] { return answer->has_value(); }, 5s));
  ASSERT_TRUE(answer->value()) << answer->value().error().message();
  std::string const id = answer->value()->execution_id;
  auto rec = terminal(id, 20s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::backend_failure});
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed);
  auto view = manager_->get(id);
  ASSERT_TRUE(view);
  ASSERT_TRUE(view->sink_error.has_value());
  EXPECT_NE(view->sink_error->find("record_committed"), std::string::npos) << *view->sink_error;
}

// The committed write's completion and the terminal record's may reach the loop in either
// order (batches committed by different threads); the caller of the launch still hears of the
// start before any waiter hears of the end.
TEST_F(HeldCommitTest, TheStartIsAnsweredBeforeTheEndIsPublished) {
  held_manager();
  std::vector<std::string> order;
  auto const answer = std::make_shared<std::optional<Result<StartResult>>>();
  start_async_with_test_permit(*manager_, request(sh("exit 3")),
                               [answer, &order](Result<StartResult> r) {
                                 order.push_back("answer");
                                 *answer = std::move(r);
                               });
  ASSERT_TRUE(drive([&] { return held_->held() == 1; }, 20s));
  auto listed = manager_->list({});
  ASSERT_EQ(listed.size(), 1U);
  std::string const id = listed[0].execution_id;
  auto wh = manager_->wait(id, 20s, [&order](Result<core::TerminalRecord> r) {
    order.push_back(r ? "terminal" : "wait failed");
  });
  (void)wh;
  // The target exits and its terminal record is written meanwhile; nobody may learn of it.
  ASSERT_TRUE(drive(
      [&] {
        auto stored = registry_->get(id);
        return stored && stored->phase == core::Phase::terminal;
      },
      20s));
  drive([] { return false; }, 100ms);
  EXPECT_TRUE(order.empty()) << order.front();
  held_->release(false);
  ASSERT_TRUE(drive([&] { return order.size() == 2; }, 5s));
  EXPECT_EQ(order, (std::vector<std::string>{"answer", "terminal"}));
}

// The claim's fsync fails: the event-loop launch ends spawn_failed and the target never ran —
// the go byte waits for the fsync, as in the blocking launch.
TEST_F(RegistrySinkTest, AFailedFsyncEndsTheEventLoopLaunchBeforeTheTargetRuns) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  // Read by the registry's flusher when it starts, at the first group commit (below).
  custos::testing::ScopedFailpoint const failpoint{"flusher_fsync_fails"};
  looped();
  auto const ran = workspace_ / "ran";
  auto touch = sh("touch " + ran.string());
  touch.workspace.access = core::WorkspaceAccess::writable;  // a read-only one is read-only
  auto const answer = launch_async(request(std::move(touch)));
  ASSERT_TRUE(drive([&] { return answer->has_value(); }, 20s));
  ASSERT_TRUE(answer->value()) << answer->value().error().message();
  StartResult const& st = *answer->value();
  EXPECT_EQ(st.phase, core::Phase::terminal);
  EXPECT_EQ(st.pid, 0);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
  ASSERT_TRUE(rec->spawn_error.has_value());
  // The fsync runs while the child is created: it may have failed before the staged write
  // (which the registry then refuses) or after it.
  EXPECT_TRUE(rec->spawn_error->code == "durability" || rec->spawn_error->code == "record_staged")
      << rec->spawn_error->code;
  drive([] { return false; }, 100ms);
  EXPECT_FALSE(std::filesystem::exists(ran)) << "the target ran before its claim was durable";
}

// A slow fsync (50 ms before each, failpoint flusher_slow): the target of an event-loop launch
// runs only after it, i.e. its claim and staged ownership are on stable storage first. The
// file it creates says when it ran.
TEST_F(RegistrySinkTest, TheEventLoopLaunchRunsTheTargetOnlyAfterTheFsync) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  custos::testing::ScopedFailpoint const failpoint{"flusher_slow"};
  looped();
  auto const ran = workspace_ / "ran";
  auto const submitted = std::filesystem::file_time_type::clock::now();
  auto touch = sh("touch " + ran.string());
  touch.workspace.access = core::WorkspaceAccess::writable;  // a read-only one is read-only
  auto const answer = launch_async(request(std::move(touch)));
  ASSERT_TRUE(drive([&] { return answer->has_value(); }, 20s));
  ASSERT_TRUE(answer->value()) << answer->value().error().message();
  auto rec = terminal(answer->value()->execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  ASSERT_TRUE(std::filesystem::exists(ran));
  auto const after = std::filesystem::last_write_time(ran) - submitted;
  // The flusher sleeps 50 ms before its fsync; the file's time is coarse (a few ms).
  EXPECT_GE(after, std::chrono::milliseconds(40))
      << "the target ran " << std::chrono::duration_cast<std::chrono::microseconds>(after).count()
      << " us after the launch, before its claim's fsync";
}

// A cancel that arrives while the launch is under way — its claim still being written
// (phase authorized, nothing created yet), or its child staged and awaiting its claim's fsync
// (held by the test) — is accepted and acts as soon as the target runs: the execution is
// stopped, not left running.
TEST_F(HeldCommitTest, ACancelDuringTheEventLoopLaunchStopsTheExecutionOnceItRuns) {
  held_manager(/*hold_durable=*/true);
  for (bool const staged : {false, true}) {
    SCOPED_TRACE(staged ? "cancelled while staged" : "cancelled while its claim is written");
    auto const answer = launch_async(request(sh("sleep 30")));
    ASSERT_FALSE(answer->has_value());
    auto launching = [&] {
      for (auto const& v : manager_->list({})) {
        if (!v.terminal) return std::optional<ExecutionView>{v};
      }
      return std::optional<ExecutionView>{};
    };
    if (staged) {
      ASSERT_TRUE(drive([&] { return held_->held_durable() == 1; }, 20s));
      ASSERT_TRUE(launching());
      EXPECT_EQ(launching()->phase, core::Phase::starting);
      EXPECT_GT(launching()->pid, 0);
    } else {
      ASSERT_TRUE(launching());
      EXPECT_EQ(launching()->phase, core::Phase::authorized);
      EXPECT_EQ(launching()->pid, 0);
    }
    ASSERT_FALSE(answer->has_value());
    std::string const id = launching()->execution_id;
    auto c = manager_->cancel(id, core::Trigger::user, "while launching");
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_TRUE(c->accepted);
    ASSERT_TRUE(drive(
        [&] {
          held_->release_durable();
          held_->release(false);
          return answer->has_value();
        },
        20s));
    ASSERT_TRUE(answer->value()) << answer->value().error().message();
    auto rec = terminal(id, 20s);
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->classification, core::Classification::cancelled);
    EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::user});
    EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed);
  }
}

// A cancel accepted while the launch waits for its claim's fsync, then the fsync fails: nothing
// of the target ran (spawn_error durability), and the accepted trigger decides the
// classification, as core's table says (the trigger before the spawn failure).
TEST_F(HeldCommitTest, ACancelBeforeAFailedLaunchDecidesItsClassification) {
  held_manager(/*hold_durable=*/true);
  auto const answer = launch_async(request(sh("touch ran; sleep 30")));
  ASSERT_TRUE(drive([&] { return held_->held_durable() == 1; }, 20s));
  auto const views = manager_->list({});
  ASSERT_EQ(views.size(), 1U);
  std::string const id = views.front().execution_id;
  auto c = manager_->cancel(id, core::Trigger::user, "while launching");
  ASSERT_TRUE(c && c->accepted);
  // The failed launch waits for its claim's durability again before it answers: held too.
  ASSERT_TRUE(drive(
      [&] {
        held_->release_durable(/*fail=*/true);
        return answer->has_value();
      },
      20s));
  ASSERT_TRUE(answer->value()) << answer->value().error().message();
  EXPECT_EQ(answer->value()->phase, core::Phase::terminal);
  auto rec = terminal(id, 20s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->trigger, std::optional<core::Trigger>{core::Trigger::user});
  ASSERT_TRUE(rec->spawn_error.has_value());
  EXPECT_EQ(rec->spawn_error->code, "durability");
  EXPECT_FALSE(std::filesystem::exists(workspace_ / "ran")) << "the target ran";
}

// The manager goes away while a launch awaits its claim's fsync (held): the staged child is
// killed (it is the launch's own until the verdict), nothing is told, nothing crashes.
TEST_F(HeldCommitTest, AManagerDestroyedDuringTheEventLoopLaunchLeavesNoProcess) {
  held_manager(/*hold_durable=*/true);
  auto const answer = launch_async(request(sh("sleep 30")));
  ASSERT_TRUE(drive([&] { return held_->held_durable() == 1; }, 20s));
  auto listed = manager_->list({});
  ASSERT_EQ(listed.size(), 1U);
  std::int32_t const pid = listed[0].pid;
  ASSERT_GT(pid, 0);
  manager_.reset();
  held_->release_durable();            // the completion finds nobody
  drive([] { return false; }, 200ms);  // nor do completions still posted
  EXPECT_FALSE(answer->has_value());
  EXPECT_FALSE(std::filesystem::exists("/proc/" + std::to_string(pid))) << "killed and reaped";
}

// The event-loop launch writes its claim off the loop: a claim consumed before is refused
// through the completion, and nothing is created for the refused launch (no execution, no
// child, no cgroup, no record).
TEST_F(RegistrySinkTest, TheEventLoopLaunchOfAConsumedClaimCreatesNothing) {
  looped();
  auto req = request(sh("exit 0"));
  auto const first = launch_async(req);
  ASSERT_TRUE(drive([&] { return first->has_value(); }, 20s));
  ASSERT_TRUE(first->value()) << first->value().error().message();
  ASSERT_TRUE(terminal(first->value()->execution_id));
  auto const cgroups_before = cgroup_path_.empty()
                                  ? 0
                                  : std::distance(std::filesystem::directory_iterator(cgroup_path_),
                                                  std::filesystem::directory_iterator{});
  auto const again = launch_async(req);
  // A wait registered while its claim is being written learns why the launch was refused.
  std::string refused_id;
  for (auto const& v : manager_->list({})) {
    if (v.phase == core::Phase::authorized) refused_id = v.execution_id;
  }
  ASSERT_FALSE(refused_id.empty());
  std::optional<Result<core::TerminalRecord>> waited;
  auto wh = manager_->wait(refused_id, 20s,
                           [&waited](Result<core::TerminalRecord> r) { waited = std::move(r); });
  (void)wh;
  ASSERT_TRUE(drive([&] { return again->has_value() && waited.has_value(); }, 20s));
  ASSERT_FALSE(again->value());
  EXPECT_EQ(again->value().error().code, Errc::registry_claim_consumed);
  ASSERT_FALSE(waited->has_value());
  EXPECT_EQ(waited->error().code, Errc::registry_claim_consumed);
  EXPECT_EQ(manager_->list({}).size(), 1U) << "the refused launch left an execution behind";
  if (!cgroup_path_.empty()) {
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(cgroup_path_),
                            std::filesystem::directory_iterator{}),
              cgroups_before);
  }
  auto records = registry_->list();
  ASSERT_TRUE(records);
  EXPECT_EQ(records->size(), 1U);
}

// The manager goes away while the claim is being written: nothing is created afterwards (no
// child, no cgroup) and nothing is told; the record it leaves is recovery's (authorized).
TEST_F(RegistrySinkTest, AManagerDestroyedWhileTheClaimIsWrittenCreatesNothing) {
  looped();
  auto const answer = launch_async(request(sh("sleep 30")));
  auto listed = manager_->list({});
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].phase, core::Phase::authorized);
  std::string const id = listed[0].execution_id;
  manager_.reset();
  drive([] { return false; }, 200ms);
  EXPECT_FALSE(answer->has_value());
  auto stored = registry_->get(id);
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->phase, core::Phase::authorized);
  EXPECT_EQ(stored->ownership.state, registry::OwnershipState::unassigned);
}

}  // namespace
}  // namespace custos::supervisor::testing
