// Group durability (Durability::group): the claim is in the WAL when the call returns and the
// registry's flusher thread makes it power-loss durable with an fdatasync of the WAL;
// await_durable() waits for that. Also transact_deferred (a plain job queued as a deferred
// write). Real SQLite files throughout; the fdatasyncs are counted by WriteStats::flushes.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <future>
#include <string>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/registry/failpoint.hpp"

#include "helpers.hpp"
#include "support/scoped_failpoint.hpp"

namespace custos::registry::test {
namespace {

// The flusher reads CUSTOS_FAILPOINT when it starts (at the registry's first group commit).
using custos::testing::ScopedFailpoint;

TEST(RegistryGroupDurability, VisibleAtOnceAndDurableAfterAwait) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  auto const before = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  // Committed (NORMAL) when the call returns: readable, and the claim is consumed.
  auto rec = reg->get("ex-1");
  CUSTOS_ASSERT_OK(rec);
  EXPECT_EQ(rec->phase, core::Phase::authorized);
  auto claim = reg->find_claim("act-1", "proc-1");
  CUSTOS_ASSERT_OK(claim);
  EXPECT_TRUE(claim->has_value());
  CUSTOS_EXPECT_ERRC(reg->record_authorized(make_execution("ex-2", "act-1"), Durability::group),
                     Errc::registry_claim_consumed);

  CUSTOS_ASSERT_OK(reg->await_durable());
  EXPECT_FALSE(reg->durability_pending());
  auto const after = reg->write_stats();
  EXPECT_GE(after.flushes - before.flushes, 1u);
  // No FULL commit was made for it: the flusher's fdatasync is the only sync.
  EXPECT_EQ(after.full_commits, before.full_commits);

  // Nothing pending: await returns at once, without an fdatasync (and without waiting).
  CUSTOS_ASSERT_OK(reg->await_durable());
  EXPECT_EQ(reg->write_stats().flushes, after.flushes);
  EXPECT_EQ(reg->write_stats().durable_waits, after.durable_waits);
}

TEST(RegistryGroupDurability, AwaitWithNothingPendingDoesNoFsync) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  EXPECT_FALSE(reg->durability_pending());
  CUSTOS_ASSERT_OK(reg->await_durable());
  // FULL and NORMAL commits leave nothing for the flusher either.
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(),
                                      {core::Boundary::marker, "", std::string(32, 'a')}));
  EXPECT_FALSE(reg->durability_pending());
  CUSTOS_ASSERT_OK(reg->await_durable());
  EXPECT_EQ(reg->write_stats().flushes, 0u);
}

TEST(RegistryGroupDurability, ManyGroupCommitsShareOneFdatasync) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};  // each flush waits 50 ms before it snapshots
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  constexpr int kCommits = 30;
  auto const full_before = reg->write_stats().full_commits;  // open's own FULL commits
  auto const t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCommits; ++i) {
    std::string const id = "ex-" + std::to_string(i);
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(id, "act-" + id), Durability::group));
  }
  auto const took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(reg->durability_pending());
  CUSTOS_ASSERT_OK(reg->await_durable());
  EXPECT_FALSE(reg->durability_pending());
  auto const s = reg->write_stats();
  EXPECT_EQ(s.durable_waits, 1u);  // the flusher was still in its 50 ms wait
  EXPECT_GE(s.flushes, 1u);
  // Every commit that returned before a flush started is covered by it: one flush per 50 ms
  // window at most (plus the one the last commits need).
  auto const windows = std::chrono::duration_cast<std::chrono::milliseconds>(took).count() / 50;
  EXPECT_LE(s.flushes, static_cast<std::uint64_t>(windows) + 2) << "commits took " << windows;
  EXPECT_LT(s.flushes, static_cast<std::uint64_t>(kCommits));
  EXPECT_EQ(s.full_commits, full_before);
}

TEST(RegistryGroupDurability, ConcurrentGroupCommitsShareFdatasyncs) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  constexpr int kThreads = 8;
  constexpr int kEach = 15;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kEach; ++i) {
        std::string const id = "ex-" + std::to_string(th) + "-" + std::to_string(i);
        if (!reg->record_authorized(make_execution(id, "act-" + id), Durability::group) ||
            !reg->await_durable()) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto const s = reg->write_stats();
  EXPECT_GE(s.flushes, 1u);
  EXPECT_LT(s.flushes, static_cast<std::uint64_t>(kThreads * kEach));
  EXPECT_FALSE(reg->durability_pending());
}

TEST(RegistryGroupDurability, AwaitAfterAFullCommitDoesNoExtraFsync) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  auto const full_before = reg->write_stats().full_commits;  // open's own FULL commits
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  EXPECT_TRUE(reg->durability_pending());
  // A FULL commit fsyncs the WAL, and with it the group commit's frames before it.
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-2", "act-2")));
  EXPECT_FALSE(reg->durability_pending());
  CUSTOS_ASSERT_OK(reg->await_durable());
  // The flusher, woken by the group commit, finds it covered when its 50 ms wait ends.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(reg->write_stats().flushes, 0u);
  EXPECT_EQ(reg->write_stats().full_commits, full_before + 1);
}

// A launch waits for the fsync of its own claim, not for the group commits other launches made
// after it: under load there nearly always is a newer one not yet synced.
TEST(RegistryGroupDurability, AnExecutionWaitsForItsOwnClaimOnly) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};  // each flush waits 50 ms first: B stays pending below
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-a", "act-a"), Durability::group));
  CUSTOS_ASSERT_OK(reg->await_durable("ex-a"));
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-b", "act-b"), Durability::group));
  ASSERT_TRUE(reg->durability_pending());
  // A's claim is durable although B's commit is not.
  auto const a_now = reg->durable_now("ex-a");
  ASSERT_TRUE(a_now.has_value());
  EXPECT_TRUE(a_now->has_value());
  EXPECT_FALSE(reg->durable_now("ex-b").has_value());
  // Its completion runs at once, on this thread.
  bool called = false;
  reg->when_durable("ex-a", [&](Result<void> r) {
    EXPECT_TRUE(r.has_value());
    called = true;
  });
  EXPECT_TRUE(called);
  // B's completion comes from the flusher, after the flush that covers it.
  std::promise<Result<void>> b_done;
  reg->when_durable("ex-b", [&](Result<void> r) { b_done.set_value(std::move(r)); });
  auto b = b_done.get_future();
  ASSERT_EQ(b.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(b.get().has_value());
  EXPECT_FALSE(reg->durability_pending());
  // An execution the registry noted nothing for waits for every group commit made so far.
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-c", "act-c"), Durability::group));
  EXPECT_FALSE(reg->durable_now("ex-unknown").has_value());
  EXPECT_TRUE(reg->durable_now("ex-a").has_value());
  CUSTOS_ASSERT_OK(reg->await_durable("ex-unknown"));
  EXPECT_TRUE(reg->durable_now("ex-c").has_value());
}

TEST(RegistryGroupDurability, CheckpointBetweenCommitAndAwait) {
  TempDir t;
  {
    auto reg = open_ok(t);
    ASSERT_TRUE(reg);
    for (int round = 0; round < 3; ++round) {
      std::string const id = "ex-" + std::to_string(round);
      CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(id, "act-" + id), Durability::group));
      // The checkpoint copies the frames into the database file (syncing the WAL and the file)
      // and truncates the WAL; the next commit restarts it from its beginning.
      CUSTOS_ASSERT_OK(reg->read(
          [](sql::Db& db) -> Result<void> { return db.exec("PRAGMA wal_checkpoint(TRUNCATE)"); }));
      CUSTOS_ASSERT_OK(reg->await_durable());
      EXPECT_FALSE(reg->durability_pending());
    }
    // A group commit into the restarted WAL, then the destructor's final flush.
    CUSTOS_ASSERT_OK(
        reg->record_authorized(make_execution("ex-last", "act-last"), Durability::group));
  }
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  for (std::string const id : {"ex-0", "ex-1", "ex-2", "ex-last"}) {
    auto rec = reg->get(id);
    CUSTOS_ASSERT_OK(rec);
    EXPECT_EQ(rec->phase, core::Phase::authorized);
  }
  auto q = reg->quarantined();
  CUSTOS_ASSERT_OK(q);
  EXPECT_TRUE(q->empty());
}

TEST(RegistryGroupDurability, DestructorFlushesPendingGroupCommits) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  EXPECT_TRUE(reg->durability_pending());
  // The flusher is joined after its final flush; no thread outlives the registry.
  reg.reset();
  auto again = open_ok(t);
  ASSERT_TRUE(again);
  CUSTOS_ASSERT_OK(again->get("ex-1"));
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

TEST(RegistryGroupDurability, GroupCommitsSurviveSigkillOfTheWriter) {
  TempDir t;
  // Creates the registry first, so the child only opens it.
  { ASSERT_TRUE(open_ok(t)); }
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  pid_t const child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    auto reg = Registry::open(t.state());
    if (!reg) ::_exit(3);
    for (int i = 0; i < 100000; ++i) {
      std::string const id = "ex-" + std::to_string(i);
      if (!(*reg)->record_authorized(make_execution(id, "act-" + id), Durability::group)) {
        ::_exit(4);
      }
      // Acknowledged only after the call returned: what a caller could have acted on.
      std::uint32_t const n = static_cast<std::uint32_t>(i);
      if (::write(fds[1], &n, sizeof n) != sizeof n) ::_exit(5);
    }
    ::_exit(6);
  }
  ::close(fds[1]);
  sys::UniqueFd const pidfd{pidfd_open(child)};
  ASSERT_TRUE(pidfd.valid());
  std::vector<std::uint32_t> acked;
  std::uint32_t n = 0;
  while (acked.size() < 25 && ::read(fds[0], &n, sizeof n) == sizeof n) acked.push_back(n);
  ASSERT_EQ(::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited " << WEXITSTATUS(status);
  // Acknowledgements written before the kill landed.
  while (::read(fds[0], &n, sizeof n) == sizeof n) acked.push_back(n);
  ::close(fds[0]);
  ASSERT_GE(acked.size(), 25u);

  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  for (std::uint32_t const i : acked) {
    std::string const id = "ex-" + std::to_string(i);
    auto rec = reg->get(id);
    CUSTOS_ASSERT_OK(rec);
    auto claim = reg->find_claim("act-" + id, "proc-1");
    CUSTOS_ASSERT_OK(claim);
    EXPECT_TRUE(claim->has_value()) << id;
  }
  // The claim and its record were one job: no orphan claim.
  auto orphans = reg->orphan_claims();
  CUSTOS_ASSERT_OK(orphans);
  EXPECT_TRUE(orphans->empty());
}

TEST(RegistryGroupDurability, FailedFdatasyncFailsAwaitAndRefusesLaterWrites) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_fsync_fails"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  CUSTOS_EXPECT_ERRC(reg->await_durable(), Errc::registry_io);
  // Never retried, never reported durable.
  CUSTOS_EXPECT_ERRC(reg->await_durable(), Errc::registry_io);
  EXPECT_TRUE(reg->durability_pending());
  EXPECT_EQ(reg->write_stats().flushes, 1u);
  // Every later write is refused, whatever its durability.
  CUSTOS_EXPECT_ERRC(reg->record_authorized(make_execution("ex-2", "act-2")), Errc::registry_io);
  CUSTOS_EXPECT_ERRC(
      reg->record_staged("ex-1", fake_staged(), {core::Boundary::marker, "", std::string(32, 'a')}),
      Errc::registry_io);
  CUSTOS_EXPECT_ERRC(reg->consume_claim("act-3", "proc-1", "ex-3", Durability::group),
                     Errc::registry_io);
  // Reads still answer (what was committed is still in the file).
  auto rec = reg->get("ex-1");
  CUSTOS_ASSERT_OK(rec);
  EXPECT_EQ(rec->phase, core::Phase::authorized);
  auto none = reg->get("ex-2");
  CUSTOS_EXPECT_ERRC(none, Errc::registry_not_found);
}

// ---- when_durable ------------------------------------------------------------------------

TEST(RegistryWhenDurable, CalledAtOnceWhenNothingIsPending) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  bool called = false;
  reg->when_durable([&](Result<void> r) {
    EXPECT_TRUE(r);
    called = true;
  });
  EXPECT_TRUE(called);
  EXPECT_EQ(reg->write_stats().flushes, 0u);
}

TEST(RegistryWhenDurable, CompletesOnTheFlusherAfterTheFdatasync) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  std::promise<std::pair<bool, std::thread::id>> done;
  auto fut = done.get_future();
  reg->when_durable([&](Result<void> r) {
    // Due only once the flush covered the commit: nothing pending any more.
    done.set_value({r.has_value() && !reg->durability_pending(), std::this_thread::get_id()});
  });
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto const [good, thread] = fut.get();
  EXPECT_TRUE(good);
  EXPECT_NE(thread, std::this_thread::get_id());  // not called at once: on the flusher
  EXPECT_EQ(reg->write_stats().flushes, 1u);
}

TEST(RegistryWhenDurable, AFullCommitCompletesItWithoutAFlush) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  std::promise<bool> done;
  auto fut = done.get_future();
  reg->when_durable([&](Result<void> r) { done.set_value(r.has_value()); });
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-2", "act-2")));  // FULL
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(fut.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(reg->write_stats().flushes, 0u);
}

TEST(RegistryWhenDurable, AFailedFdatasyncCompletesWithRegistryIo) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_fsync_fails"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  std::promise<Errc> done;
  auto fut = done.get_future();
  reg->when_durable([&](Result<void> r) { done.set_value(r ? Errc{} : r.error().code); });
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(fut.get(), Errc::registry_io);
  // After the failure: at once, with the same error.
  bool failed_at_once = false;
  reg->when_durable(
      [&](Result<void> r) { failed_at_once = !r && r.error().code == Errc::registry_io; });
  EXPECT_TRUE(failed_at_once);
}

TEST(RegistryWhenDurable, TheDestructorDeliversWhatIsPending) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "needs a failpoint build";
  TempDir t;
  ScopedFailpoint fp{"flusher_slow"};
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1"), Durability::group));
  bool called = false;
  reg->when_durable([&](Result<void> r) { called = r.has_value(); });
  reg.reset();  // joins the flusher after its last flush and deliveries
  EXPECT_TRUE(called);
}

// ---- transact_deferred ---------------------------------------------------------------------

Result<std::int64_t> settled_rows(Registry& reg) {
  std::int64_t n = 0;
  CUSTOS_TRYV(reg.read([&n](sql::Db& db) -> Result<void> {
    auto v = CUSTOS_TRY(db.query_int("SELECT count(*) FROM settle_test"));
    n = v.value_or(0);
    return ok();
  }));
  return n;
}

TEST(RegistryTransactDeferred, CommitsInTheNextImmediateWritesTransactionAheadOfIt) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->transact(Durability::normal, [](sql::Db& db) {
    return db.exec("CREATE TABLE settle_test (execution_id TEXT, phase TEXT)");
  }));
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  auto const before = reg->write_stats();
  // Reads the record's phase inside the transaction: ahead of the staged write (which moves it
  // to `starting`), it still sees `authorized`.
  reg->transact_deferred("ex-1", "settle", [](sql::Db& db) {
    return db.exec(
        "INSERT INTO settle_test SELECT execution_id, phase FROM executions WHERE execution_id "
        "= 'ex-1'");
  });
  EXPECT_EQ(reg->deferred_pending(), 1u);
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(),
                                      {core::Boundary::marker, "", std::string(32, 'a')}));
  EXPECT_EQ(reg->deferred_pending(), 0u);
  auto const after = reg->write_stats();
  EXPECT_EQ(after.transactions - before.transactions, 1u);
  EXPECT_EQ(after.deferred - before.deferred, 1u);
  auto n = settled_rows(*reg);
  CUSTOS_ASSERT_OK(n);
  EXPECT_EQ(*n, 1);
  std::optional<std::string> phase;
  CUSTOS_ASSERT_OK(reg->read([&phase](sql::Db& db) -> Result<void> {
    phase = CUSTOS_TRY(db.query_text("SELECT phase FROM settle_test"));
    return ok();
  }));
  EXPECT_EQ(phase, std::optional<std::string>{"authorized"});
  EXPECT_FALSE(reg->take_deferred_error("ex-1").has_value());
}

TEST(RegistryTransactDeferred, ARefusalIsKeptPerExecutionAndUndoesOnlyItself) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->transact(Durability::normal, [](sql::Db& db) {
    return db.exec("CREATE TABLE settle_test (execution_id TEXT, phase TEXT)");
  }));
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  reg->transact_deferred("ex-1", "settle", [](sql::Db& db) -> Result<void> {
    CUSTOS_TRYV(db.exec("INSERT INTO settle_test VALUES ('ex-1', 'partial')"));
    return Error{Errc::auth_budget_exhausted, "test refusal"};
  });
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(),
                                      {core::Boundary::marker, "", std::string(32, 'a')}));
  auto n = settled_rows(*reg);
  CUSTOS_ASSERT_OK(n);
  EXPECT_EQ(*n, 0);  // its savepoint was rolled back
  auto rec = reg->get("ex-1");
  CUSTOS_ASSERT_OK(rec);
  EXPECT_EQ(rec->ownership.state, OwnershipState::staged);
  auto err = reg->take_deferred_error("ex-1");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->code, Errc::auth_budget_exhausted);
  EXPECT_NE(err->context.find("settle"), std::string::npos) << err->context;
}

}  // namespace
}  // namespace custos::registry::test
