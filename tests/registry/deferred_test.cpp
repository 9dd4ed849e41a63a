// Deferred writes (WriteMode::deferred): queued in order, committed with the next immediate
// write or flush() in one transaction, refusals kept per execution, lost on a crash (and then
// handled by recovery; tests/supervisor/recovery_crash_test.cpp crashes with writes queued).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "custos/registry/recovery.hpp"

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

// The phase as stored in the file, read through a second connection (the registry holds the
// file in exclusive locking mode, so only after it is closed) — or, while it is open, what a
// crash would leave: see ForkedCrashLosesOnlyTheQueuedWrites.
std::string stored_phase(TempDir const& t, std::string const& id) {
  auto db = sql::Db::open(t.db().string(), false);
  if (!db) return "<open: " + db.error().message() + ">";
  auto v = db->query_text("SELECT phase FROM executions WHERE execution_id = '" + id + "'");
  return v && *v ? **v : "<none>";
}

void staged_running(Registry& reg, std::string const& id) {
  CUSTOS_ASSERT_OK(reg.record_authorized(make_execution(id, "act-" + id)));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::starting, WriteMode::deferred));
  CUSTOS_ASSERT_OK(
      reg.record_staged(id, fake_staged(), {core::Boundary::marker, "", std::string(32, 'a')}));
  CUSTOS_ASSERT_OK(reg.record_committed(id, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::running));
}

TEST(RegistryDeferred, RideInTheNextImmediateTransactionAheadOfIt) {
  TempDir t;
  auto reg = open_ok(t);
  auto const before = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::starting, WriteMode::deferred));
  EXPECT_EQ(reg->deferred_pending(), 1u);
  // staged needs the phase starting or authorized; committed after it needs staged: both are
  // legal only because the queued writes run first, in order.
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(),
                                      {core::Boundary::marker, "", std::string(32, 'a')}));
  EXPECT_EQ(reg->deferred_pending(), 0u);
  CUSTOS_ASSERT_OK(reg->record_committed("ex-1", WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::running));
  auto const after = reg->write_stats();
  // claim+record, starting+staged, committed+running: three transactions for five writes.
  EXPECT_EQ(after.transactions - before.transactions, 3u);
  EXPECT_EQ(after.writes - before.writes, 5u);
  EXPECT_EQ(after.deferred - before.deferred, 2u);
  EXPECT_EQ(after.full_commits - before.full_commits, 1u);
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->phase, core::Phase::running);
  EXPECT_EQ(rec->ownership.state, OwnershipState::committed);
}

TEST(RegistryDeferred, ReadsSeeQueuedWritesAndFlushCommitsThemOnce) {
  TempDir t;
  auto reg = open_ok(t);
  staged_running(*reg, "ex-1");
  staged_running(*reg, "ex-2");
  auto const before = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::exited, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-2", core::Phase::exited, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_output("ex-2", 0, {5, 5, 0, true}, WriteMode::deferred));
  EXPECT_EQ(reg->deferred_pending(), 3u);
  EXPECT_EQ(reg->write_stats().transactions, before.transactions);  // nothing committed yet
  // A read settles the queue first: it sees what the registry accepted.
  auto rec = reg->get("ex-2");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->phase, core::Phase::exited);
  EXPECT_EQ(rec->out.accounting.observed, 5u);
  EXPECT_EQ(reg->deferred_pending(), 0u);
  auto const after = reg->write_stats();
  EXPECT_EQ(after.transactions - before.transactions, 1u);  // all three, both executions
  EXPECT_EQ(after.writes - before.writes, 3u);              // the flush marker is no write
  // Nothing queued: flush is free.
  CUSTOS_ASSERT_OK(reg->flush());
  EXPECT_EQ(reg->write_stats().transactions, after.transactions);
}

TEST(RegistryDeferred, RefusalIsKeptPerExecutionAndSparesItsNeighbours) {
  TempDir t;
  auto reg = open_ok(t);
  staged_running(*reg, "ex-1");
  staged_running(*reg, "ex-2");
  // Illegal for ex-1 (running -> closed skips exited); only the database can tell, at commit.
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::closed, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-2", core::Phase::exited, WriteMode::deferred));
  // What needs no database is refused at once, deferred or not.
  CUSTOS_EXPECT_ERRC(reg->record_output("ex-2", 0, {5, 1, 0, true}, WriteMode::deferred),
                     Errc::accounting_invariant);
  CUSTOS_ASSERT_OK(reg->flush());
  auto e1 = reg->take_deferred_error("ex-1");
  ASSERT_TRUE(e1);
  EXPECT_EQ(e1->code, Errc::registry_illegal_phase);
  EXPECT_NE(e1->context.find("deferred record_phase"), std::string::npos) << e1->context;
  EXPECT_FALSE(reg->take_deferred_error("ex-1"));  // taken once
  EXPECT_FALSE(reg->take_deferred_error("ex-2"));
  EXPECT_EQ(reg->get("ex-1")->phase, core::Phase::running);
  EXPECT_EQ(reg->get("ex-2")->phase, core::Phase::exited);
  EXPECT_EQ(reg->write_stats().deferred_failed, 1u);
}

TEST(RegistryDeferred, WritesOfOneRecordShareALoadButAreRefusedOneByOne) {
  TempDir t;
  auto reg = open_ok(t);
  staged_running(*reg, "ex-1");
  auto const before = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::exited, WriteMode::deferred));
  // Illegal after exited: skipped alone; the writes around it stay.
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::stopping, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_output("ex-1", 1, {3, 3, 0, true}, WriteMode::deferred));
  // An immediate write joins them and gets its own result.
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::running), Errc::registry_illegal_phase);
  auto const after = reg->write_stats();
  EXPECT_EQ(after.transactions - before.transactions, 1u);
  EXPECT_EQ(after.writes - before.writes, 4u);
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->phase, core::Phase::exited);
  EXPECT_EQ(rec->err.accounting.observed, 3u);
  auto e = reg->take_deferred_error("ex-1");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, Errc::registry_illegal_phase);
  EXPECT_EQ(reg->write_stats().deferred_failed, 1u);
}

TEST(RegistryDeferred, TerminalCommitsQueuedWritesFirstInItsTransaction) {
  TempDir t;
  auto reg = open_ok(t);
  staged_running(*reg, "ex-1");
  auto const before = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::exited, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::closed, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_output("ex-1", 0, {7, 7, 0, true}, WriteMode::deferred));
  // Legal only after exited and closed were applied: the queue runs ahead of the terminal.
  CUSTOS_ASSERT_OK(reg->record_terminal("ex-1", fake_terminal()));
  EXPECT_EQ(reg->write_stats().transactions - before.transactions, 1u);
  EXPECT_EQ(reg->deferred_pending(), 0u);
  reg.reset();
  EXPECT_EQ(stored_phase(t, "ex-1"), "terminal");
}

// record_terminal_async: nothing is written when it returns; the completion comes from the
// thread that commits (here the flush below), once the record is in the WAL, exactly once.
TEST(RegistryDeferred, AsyncTerminalIsToldOnceItsTransactionCommitted) {
  TempDir t;
  auto reg = open_ok(t);
  staged_running(*reg, "ex-1");
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::exited, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::closed, WriteMode::deferred));
  auto const before = reg->write_stats();
  int told = 0;
  std::optional<Result<void>> result;
  std::string phase_when_told;
  reg->record_terminal_async(
      "ex-1", fake_terminal(), core::RecoveryPath::observed, [&](Result<void> r) {
        ++told;
        result = std::move(r);
        // Committed and readable before anyone is told.
        auto rec = reg->get("ex-1");
        phase_when_told = rec ? std::string{core::phase_wire(rec->phase)} : "<none>";
      });
  EXPECT_EQ(told, 0);
  EXPECT_EQ(reg->deferred_pending(), 3u);
  EXPECT_EQ(reg->write_stats().transactions, before.transactions);
  CUSTOS_ASSERT_OK(reg->flush());
  ASSERT_EQ(told, 1);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->has_value()) << result->error().message();
  EXPECT_EQ(phase_when_told, "terminal");
  EXPECT_EQ(reg->write_stats().transactions - before.transactions, 1u);
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  EXPECT_TRUE(rec->terminal.has_value());
  // Its refusal goes to its completion, not to the execution's deferred errors.
  std::optional<Result<void>> second;
  reg->record_terminal_async("ex-1", fake_terminal(), core::RecoveryPath::observed,
                             [&](Result<void> r) { second = std::move(r); });
  CUSTOS_ASSERT_OK(reg->flush());
  ASSERT_TRUE(second.has_value());
  ASSERT_FALSE(second->has_value());
  EXPECT_EQ(second->error().code, Errc::registry_illegal_phase);
  EXPECT_FALSE(reg->take_deferred_error("ex-1").has_value());
  reg.reset();
  EXPECT_EQ(stored_phase(t, "ex-1"), "terminal");
}

// The event-loop launch's two ownership writes: queued, committed by whoever flushes, and
// told from the committing thread only once they are in the WAL (the barrier release and the
// start answer hang on these completions). Running needs the committed slot: one change, so a
// refusal leaves the record as it was.
TEST(RegistryDeferred, AsyncStagedAndRunningAreToldOnlyOnceInTheWal) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-2", "act-2")));
  auto const before = reg->write_stats();
  // (what, transactions committed since `before` when told)
  std::vector<std::pair<std::string, std::uint64_t>> told;
  std::vector<Result<void>> results;
  auto note = [&](std::string what) {
    return [&, what = std::move(what)](Result<void> r) {
      told.emplace_back(what, reg->write_stats().transactions - before.transactions);
      results.push_back(std::move(r));
    };
  };
  reg->record_staged_async("ex-1", fake_staged(),
                           {core::Boundary::marker, "", std::string(32, 'a')}, note("staged"));
  reg->record_running_async("ex-1", note("running"));
  // Not staged: refused at commit, as one change (the slot stays unassigned, phase authorized).
  reg->record_running_async("ex-2", note("refused"));
  EXPECT_TRUE(told.empty());
  EXPECT_EQ(reg->deferred_pending(), 3u);
  EXPECT_EQ(reg->write_stats().transactions, before.transactions);
  CUSTOS_ASSERT_OK(reg->flush());
  ASSERT_EQ(told.size(), 3u);
  // In the WAL when the callers learn: the transaction (one, shared) had committed.
  EXPECT_EQ(told[0], (std::pair<std::string, std::uint64_t>{"staged", 1}));
  EXPECT_EQ(told[1], (std::pair<std::string, std::uint64_t>{"running", 1}));
  EXPECT_EQ(told[2], (std::pair<std::string, std::uint64_t>{"refused", 1}));
  EXPECT_TRUE(results[0].has_value()) << results[0].error().message();
  EXPECT_TRUE(results[1].has_value()) << results[1].error().message();
  ASSERT_FALSE(results[2].has_value());
  EXPECT_EQ(results[2].error().code, Errc::registry_illegal_phase);
  EXPECT_EQ(reg->write_stats().transactions - before.transactions, 1u);
  auto one = reg->get("ex-1");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->ownership.state, OwnershipState::committed);
  EXPECT_EQ(one->phase, core::Phase::running);
  auto two = reg->get("ex-2");
  ASSERT_TRUE(two);
  EXPECT_EQ(two->ownership.state, OwnershipState::unassigned);
  EXPECT_EQ(two->phase, core::Phase::authorized);
  // Refusals go to their completion only, never to the execution's deferred errors.
  EXPECT_FALSE(reg->take_deferred_error("ex-2").has_value());
  // A slot that is not a staged one is refused before anything is queued.
  std::optional<Result<void>> bad;
  Ownership not_staged = fake_staged();
  not_staged.state = OwnershipState::committed;
  reg->record_staged_async("ex-2", not_staged, {core::Boundary::marker, "", std::string(32, 'a')},
                           [&](Result<void> r) { bad = std::move(r); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_FALSE(bad->has_value());
  EXPECT_EQ(reg->deferred_pending(), 0u);
  reg.reset();
  EXPECT_EQ(stored_phase(t, "ex-1"), "running");
  EXPECT_EQ(stored_phase(t, "ex-2"), "authorized");
}

// try_flush is flush() for a caller that must not block (the event loop): it commits the queue
// when no other writer is committing, and otherwise returns at once, leaving the queue to that
// writer or the next.
TEST(RegistryDeferred, TryFlushCommitsOnlyWhenNoOtherWriterIsCommitting) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  EXPECT_FALSE(reg->try_flush());  // nothing queued

  // Another thread's transaction is in progress (held inside its job): a deferred write queued
  // meanwhile is not committed by try_flush, which returns without waiting.
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false;
  bool release = false;
  std::thread writer([&] {
    auto r = reg->transact(Durability::normal, [&](sql::Db&) -> Result<void> {
      std::unique_lock<std::mutex> lk(mu);
      inside = true;
      cv.notify_all();
      cv.wait(lk, [&] { return release; });
      return ok();
    });
    EXPECT_TRUE(r.has_value());
  });
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return inside; });
  }
  std::optional<Result<void>> told;
  reg->record_staged_async("ex-1", fake_staged(),
                           {core::Boundary::marker, "", std::string(32, 'a')},
                           [&](Result<void> r) { told = std::move(r); });
  auto const t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(reg->try_flush());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "it waited";
  EXPECT_EQ(reg->deferred_pending(), 1u);
  EXPECT_FALSE(told.has_value());
  {
    std::lock_guard<std::mutex> lk(mu);
    release = true;
  }
  cv.notify_all();
  writer.join();

  // Free again: committed here, in one transaction, and told before it returns.
  auto const before = reg->write_stats();
  EXPECT_TRUE(reg->try_flush());
  EXPECT_EQ(reg->deferred_pending(), 0u);
  EXPECT_EQ(reg->write_stats().transactions - before.transactions, 1u);
  ASSERT_TRUE(told.has_value());
  EXPECT_TRUE(told->has_value()) << told->error().message();
}

TEST(RegistryDeferred, AsyncTerminalRidesInTheNextImmediateWriteAndABadDigestIsToldAtOnce) {
  TempDir t;
  auto reg = open_ok(t);
  staged_running(*reg, "ex-1");
  staged_running(*reg, "ex-2");
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::exited, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::closed, WriteMode::deferred));
  std::optional<Result<void>> told;
  reg->record_terminal_async("ex-1", fake_terminal(), core::RecoveryPath::observed,
                             [&](Result<void> r) { told = std::move(r); });
  EXPECT_FALSE(told.has_value());
  // Another execution's immediate write commits it, ahead of itself, and tells it.
  CUSTOS_ASSERT_OK(reg->record_phase("ex-2", core::Phase::stopping));
  ASSERT_TRUE(told.has_value());
  EXPECT_TRUE(told->has_value());
  EXPECT_EQ(reg->deferred_pending(), 0u);

  auto bad = fake_terminal();
  bad.digest = std::string(64, '0');
  std::optional<Result<void>> refused;
  reg->record_terminal_async("ex-2", bad, core::RecoveryPath::observed,
                             [&](Result<void> r) { refused = std::move(r); });
  ASSERT_TRUE(refused.has_value());  // before it returned: nothing was queued
  ASSERT_FALSE(refused->has_value());
  EXPECT_EQ(refused->error().code, Errc::registry_corrupt_record);
  EXPECT_EQ(reg->deferred_pending(), 0u);
}

TEST(RegistryDeferred, ClosingTheRegistryCommitsWhatIsQueued) {
  TempDir t;
  {
    auto reg = open_ok(t);
    staged_running(*reg, "ex-1");
    CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::exited, WriteMode::deferred));
  }
  EXPECT_EQ(stored_phase(t, "ex-1"), "exited");
}

TEST(RegistryDeferred, ForkedCrashLosesOnlyTheQueuedWrites) {
  TempDir t;
  {
    auto reg = open_ok(t);
    staged_running(*reg, "ex-1");
  }
  pid_t const child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto reg = Registry::open(t.state());
    if (!reg) ::_exit(2);
    if (!(*reg)->record_phase("ex-1", core::Phase::exited, WriteMode::deferred)) ::_exit(3);
    if ((*reg)->deferred_pending() != 1) ::_exit(4);
    ::_exit(0);  // like a crash: no destructor, no flush
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // The record is older than reality (running), never newer, never corrupt.
  EXPECT_EQ(stored_phase(t, "ex-1"), "running");
  auto reg = open_ok(t);
  EXPECT_TRUE(reg->quarantined()->empty());
  // Recovery finds it as the crash left it and ends it exactly once (the fabricated pid names no
  // process: the supervisor layer's identity rules find it gone, tests/supervisor/recovery_*).
  auto work = read_recovery_work(*reg);
  ASSERT_TRUE(work) << work.error().message();
  ASSERT_EQ(work->records.size(), 1u);
  EXPECT_EQ(work->records[0].phase, core::Phase::running);
  CUSTOS_ASSERT_OK(record_unobserved_end(*reg, work->records[0],
                                         core::RecoveryPath::absent_without_terminal,
                                         core::Cleanup::confirmed));
  EXPECT_EQ(reg->get("ex-1")->terminal->classification, "recovery_indeterminate");
  EXPECT_TRUE(read_recovery_work(*reg)->records.empty());
}

}  // namespace
}  // namespace custos::registry::test
