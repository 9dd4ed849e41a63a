// Registry: open, lock, schema identity, claims, phases, ownership, quarantine, group commit.
#include <gtest/gtest.h>

#include <atomic>
#include <fcntl.h>
#include <fstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

// Walks one execution through the whole observed life.
void full_life(Registry& reg, std::string const& id, std::string const& action) {
  CUSTOS_ASSERT_OK(reg.record_authorized(make_execution(id, action)));
  CUSTOS_ASSERT_OK(
      reg.record_staged(id, fake_staged(), {core::Boundary::marker, "", std::string(32, 'a')}));
  CUSTOS_ASSERT_OK(reg.record_committed(id));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::running));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::exited));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::closed));
  CUSTOS_ASSERT_OK(reg.record_terminal(id, fake_terminal()));
}

TEST(RegistryOpen, CreatesCurrentSchemaWithIdentity) {
  TempDir t;
  {
    auto reg = open_ok(t);
    ASSERT_TRUE(reg);
    EXPECT_EQ(reg->opened_version(), kSchemaVersion);
  }
  auto db = sql::Db::open(t.db().string(), false);
  ASSERT_TRUE(db);
  EXPECT_EQ(*db->query_text("SELECT value FROM meta WHERE key='schema_id'"),
            std::string{kSchemaId});
  EXPECT_EQ(*db->query_text("SELECT value FROM meta WHERE key='schema_version'"),
            std::to_string(kSchemaVersion));
  EXPECT_EQ(*db->query_text("PRAGMA journal_mode"), "wal");
}

TEST(RegistryOpen, ReopenKeepsRecords) {
  TempDir t;
  {
    auto reg = open_ok(t);
    full_life(*reg, "ex-1", "act-1");
  }
  auto reg = open_ok(t);
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  EXPECT_EQ(rec->ownership.state, OwnershipState::committed);
  ASSERT_TRUE(rec->terminal);
  EXPECT_EQ(*rec->terminal, fake_terminal());
  EXPECT_TRUE(reg->quarantined()->empty());
}

TEST(RegistryLock, SecondOpenerInSameProcessIsRefusedWithPid) {
  TempDir t;
  auto first = open_ok(t);
  auto second = Registry::open(t.state());
  CUSTOS_EXPECT_ERRC(second, Errc::registry_locked);
  EXPECT_NE(second.error().context.find("pid " + std::to_string(::getpid())), std::string::npos)
      << second.error().context;
  first.reset();
  EXPECT_TRUE(Registry::open(t.state()));
}

TEST(RegistryLock, SecondDaemonProcessIsRefusedNamingTheHolder) {
  TempDir t;
  int ready[2];
  int release[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(release, O_CLOEXEC), 0);
  pid_t const child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(release[1]);  // else the read below never sees EOF
    ::close(ready[0]);
    auto reg = Registry::open(t.state());
    char c = reg ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    (void)!::read(release[0], &c, 1);  // hold the registry until the parent is done
    ::_exit(reg ? 0 : 1);
  }
  ::close(ready[1]);
  ::close(release[0]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto second = Registry::open(t.state());
  CUSTOS_EXPECT_ERRC(second, Errc::registry_locked);
  EXPECT_NE(second.error().context.find("pid " + std::to_string(child)), std::string::npos)
      << second.error().context;
  ::close(release[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ::close(ready[0]);
  EXPECT_TRUE(Registry::open(t.state()));  // the lock died with its holder
}

TEST(RegistryOpen, GarbageFileIsCorruptDatabase) {
  TempDir t;
  std::filesystem::create_directories(t.state());
  std::ofstream(t.db()) << std::string(8192, 'x');
  CUSTOS_EXPECT_ERRC(Registry::open(t.state()), Errc::registry_corrupt_database);
}

TEST(RegistryOpen, EmptyFileIsRefusedNotRecreated) {
  TempDir t;
  std::filesystem::create_directories(t.state());
  std::ofstream(t.db()).flush();
  CUSTOS_EXPECT_ERRC(Registry::open(t.state()), Errc::registry_corrupt_database);
  EXPECT_EQ(std::filesystem::file_size(t.db()), 0u);  // untouched
}

TEST(RegistryOpen, TruncatedFileIsCorruptDatabase) {
  TempDir t;
  {
    auto reg = open_ok(t);
    // Enough records for many pages, so the cut loses real content.
    for (int i = 0; i < 300; ++i) {
      auto ex = make_execution("ex-" + std::to_string(i), "act-" + std::to_string(i), "proc-1",
                               "s1", 600);
      CUSTOS_ASSERT_OK(reg->record_authorized(ex));
    }
  }
  auto const size = std::filesystem::file_size(t.db());
  ASSERT_GT(size, 64u * 1024u);
  std::filesystem::resize_file(t.db(), size / 2 + 100);
  CUSTOS_EXPECT_ERRC(Registry::open(t.state()), Errc::registry_corrupt_database);
}

TEST(RegistryOpen, ForeignSqliteDatabaseIsSchemaUnknown) {
  TempDir t;
  std::filesystem::create_directories(t.state());
  {
    auto db = sql::Db::open(t.db().string(), true);
    ASSERT_TRUE(db);
    ASSERT_TRUE(db->exec("CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('hi');"));
  }
  CUSTOS_EXPECT_ERRC(Registry::open(t.state()), Errc::registry_schema_unknown);
}

TEST(RegistryOpen, WrongSchemaIdIsSchemaUnknown) {
  TempDir t;
  { auto reg = open_ok(t); }
  raw_exec(t.db(), "UPDATE meta SET value='someone-else' WHERE key='schema_id'");
  CUSTOS_EXPECT_ERRC(Registry::open(t.state()), Errc::registry_schema_unknown);
}

TEST(RegistryOpen, NewerSchemaVersionIsRefused) {
  TempDir t;
  { auto reg = open_ok(t); }
  raw_exec(t.db(), "UPDATE meta SET value='" + std::to_string(kSchemaVersion + 1) +
                       "' WHERE key='schema_version'");
  auto r = Registry::open(t.state());
  CUSTOS_EXPECT_ERRC(r, Errc::registry_schema_newer);
  // Refusal leaves the file as it was.
  auto db = sql::Db::open(t.db().string(), false);
  EXPECT_EQ(*db->query_text("SELECT value FROM meta WHERE key='schema_version'"),
            std::to_string(kSchemaVersion + 1));
}

TEST(RegistryOpen, MissingWithoutCreateIsOpenFailed) {
  TempDir t;
  OpenOptions o;
  o.create_if_missing = false;
  EXPECT_FALSE(Registry::open(t.state(), o));
}

// ---- claims -----------------------------------------------------------------------------------

TEST(RegistryClaims, ConsumedOnceForever) {
  TempDir t;
  {
    auto reg = open_ok(t);
    CUSTOS_ASSERT_OK(reg->consume_claim("act-1", "proc-1", "ex-1"));
    CUSTOS_EXPECT_ERRC(reg->consume_claim("act-1", "proc-1", "ex-2"),
                       Errc::registry_claim_consumed);
    CUSTOS_ASSERT_OK(reg->consume_claim("act-1", "proc-2", "ex-3"));  // another process id
    auto c = reg->find_claim("act-1", "proc-1");
    ASSERT_TRUE(c && *c);
    EXPECT_EQ((*c)->execution_id, "ex-1");
  }
  auto reg = open_ok(t);  // and after a reopen
  CUSTOS_EXPECT_ERRC(reg->consume_claim("act-1", "proc-1", "ex-9"), Errc::registry_claim_consumed);
}

TEST(RegistryClaims, ClaimIsFullSyncTransaction) {
  TempDir t;
  auto reg = open_ok(t);
  auto before = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->consume_claim("a", "p", "e"));
  auto after = reg->write_stats();
  EXPECT_EQ(after.full_commits, before.full_commits + 1);
}

TEST(RegistryClaims, ClaimWithoutRecordIsListedOrphanNeverDropped) {
  TempDir t;
  {
    auto reg = open_ok(t);
    CUSTOS_ASSERT_OK(reg->consume_claim("act-o", "proc-1", "ex-o"));
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-ok", "act-ok")));
  }
  auto reg = open_ok(t);
  auto orphans = reg->orphan_claims();
  ASSERT_TRUE(orphans);
  ASSERT_EQ(orphans->size(), 1u);
  EXPECT_EQ((*orphans)[0].execution_id, "ex-o");
  EXPECT_EQ((*orphans)[0].action_id, "act-o");
  CUSTOS_EXPECT_ERRC(reg->consume_claim("act-o", "proc-1", "ex-new"),
                     Errc::registry_claim_consumed);
  // Completing the record later turns the orphan into an ordinary claim.
  CUSTOS_ASSERT_OK(reg->create_execution(make_execution("ex-o", "act-o")));
  EXPECT_TRUE(reg->orphan_claims()->empty());
}

TEST(RegistryClaims, RecordNeedsItsOwnClaim) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_EXPECT_ERRC(reg->create_execution(make_execution("ex-1", "act-1")),
                     Errc::registry_not_found);
  CUSTOS_ASSERT_OK(reg->consume_claim("act-1", "proc-1", "ex-1"));
  CUSTOS_EXPECT_ERRC(reg->create_execution(make_execution("ex-2", "act-1")),
                     Errc::registry_claim_consumed);
  auto bad = make_execution("ex-1", "act-1");
  bad.plan_digest = sha256_tagged(std::vector<std::uint8_t>{1, 2, 3});
  CUSTOS_EXPECT_ERRC(reg->create_execution(bad), Errc::auth_digest_mismatch);
  CUSTOS_ASSERT_OK(reg->create_execution(make_execution("ex-1", "act-1")));
  CUSTOS_EXPECT_ERRC(reg->create_execution(make_execution("ex-1", "act-1")),
                     Errc::registry_corrupt_record);
}

// ---- phases and ownership ---------------------------------------------------------------------

TEST(RegistryPhases, ObservedLifeAndExactlyOneTerminal) {
  TempDir t;
  auto reg = open_ok(t);
  full_life(*reg, "ex-1", "act-1");
  CUSTOS_EXPECT_ERRC(reg->record_terminal("ex-1", fake_terminal("signaled")),
                     Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::running), Errc::registry_illegal_phase);
  EXPECT_EQ(reg->get("ex-1")->terminal->classification, "exited");
}

TEST(RegistryPhases, IllegalProgressionsAreRefused) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  // authorized -> running skips starting and has no committed ownership.
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::running), Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::closed), Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::terminal),
                     Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_committed("ex-1"), Errc::registry_illegal_phase);
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::starting));
  // running needs committed ownership, not staged.
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(), {}));
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::running), Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_staged("ex-1", fake_staged(), {}), Errc::registry_illegal_phase);
  CUSTOS_ASSERT_OK(reg->record_committed("ex-1"));
  CUSTOS_EXPECT_ERRC(reg->record_committed("ex-1"), Errc::registry_illegal_phase);
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::running));
  // closed needs exited; an observed terminal needs closed.
  CUSTOS_EXPECT_ERRC(reg->record_phase("ex-1", core::Phase::closed), Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_terminal("ex-1", fake_terminal()), Errc::registry_illegal_phase);
  // A recovery jump is legal from any non-terminal phase.
  CUSTOS_ASSERT_OK(reg->record_terminal("ex-1",
                                        fake_terminal("recovery_indeterminate", "indeterminate"),
                                        core::RecoveryPath::indeterminate));
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  // Refused writes left nothing behind: the record still validates.
  EXPECT_TRUE(validate_record(*rec));
}

TEST(RegistryPhases, SpawnFailureGoesStartingToTerminal) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-1", core::Phase::starting));
  CUSTOS_ASSERT_OK(reg->record_terminal("ex-1", fake_terminal("spawn_failed")));
}

TEST(RegistryPhases, StagedKeepsIdentityAndBoundary) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  BoundaryInfo const b{core::Boundary::cgroup, "/sys/fs/cgroup/unified/x/ex-1",
                       std::string(32, 'f')};
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(77, 555), b));
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->phase, core::Phase::starting);
  EXPECT_EQ(rec->ownership, fake_staged(77, 555));
  EXPECT_EQ(rec->boundary, b);
  Ownership wrong = fake_staged();
  wrong.state = OwnershipState::committed;
  CUSTOS_EXPECT_ERRC(reg->record_staged("ex-1", wrong, b), Errc::registry_illegal_phase);
}

TEST(RegistryPhases, TriggerFirstOneStaysAndAccountingIsChecked) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  CUSTOS_ASSERT_OK(reg->record_trigger("ex-1", core::Trigger::deadline));
  CUSTOS_ASSERT_OK(reg->record_trigger("ex-1", core::Trigger::deadline));
  CUSTOS_EXPECT_ERRC(reg->record_trigger("ex-1", core::Trigger::user),
                     Errc::registry_illegal_phase);
  core::StreamAccounting acc{100, 60, 40, false};
  CUSTOS_ASSERT_OK(reg->record_output("ex-1", 0, acc));
  core::StreamAccounting const lying{100, 60, 40, true};
  CUSTOS_EXPECT_ERRC(reg->record_output("ex-1", 1, lying), Errc::accounting_invariant);
  CUSTOS_ASSERT_OK(reg->record_publication("ex-1", 0, 30, false));
  CUSTOS_EXPECT_ERRC(reg->record_publication("ex-1", 0, 10, false), Errc::accounting_invariant);
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->trigger, core::Trigger::deadline);
  EXPECT_EQ(rec->out.accounting, acc);
  EXPECT_EQ(rec->out.published_bytes, 30u);
}

TEST(RegistryPhases, UnknownExecutionIsNotFound) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_EXPECT_ERRC(reg->get("nope"), Errc::registry_not_found);
  CUSTOS_EXPECT_ERRC(reg->record_phase("nope", core::Phase::starting), Errc::registry_not_found);
}

TEST(RegistryList, FiltersByPhaseAndSessionWithCursor) {
  TempDir t;
  auto reg = open_ok(t);
  for (int i = 0; i < 5; ++i) {
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(
        "ex-" + std::to_string(i), "act-" + std::to_string(i), "p", i % 2 ? "odd" : "even")));
  }
  full_life(*reg, "ex-9", "act-9");
  ListFilter f;
  f.session_id = "odd";
  EXPECT_EQ(reg->list(f)->size(), 2u);
  f = {};
  f.phase = core::Phase::terminal;
  EXPECT_EQ(reg->list(f)->size(), 1u);
  f = {};
  f.limit = 2;
  auto page = reg->list(f);
  ASSERT_EQ(page->size(), 2u);
  f.after_id = page->back().execution_id;
  EXPECT_EQ(reg->list(f)->front().execution_id, "ex-2");
  EXPECT_EQ(reg->non_terminal()->size(), 5u);
}

// ---- quarantine -------------------------------------------------------------------------------

class RegistryQuarantine : public ::testing::Test {
 protected:
  void SetUp() override {
    auto reg = open_ok(t_);
    ASSERT_TRUE(reg);
    full_life(*reg, "ex-good", "act-good");
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-bad", "act-bad")));
  }
  // Reopens and expects exactly ex-bad quarantined with `code`, ex-good intact.
  void expect_quarantined(Errc code) {
    auto reg = open_ok(t_);
    ASSERT_TRUE(reg);  // the open still succeeds
    auto q = reg->quarantined();
    ASSERT_TRUE(q);
    ASSERT_EQ(q->size(), 1u);
    EXPECT_EQ((*q)[0].execution_id, "ex-bad");
    EXPECT_EQ((*q)[0].code, errc_wire(code)) << (*q)[0].reason;
    EXPECT_FALSE((*q)[0].reason.empty());
    auto got = reg->get("ex-bad");
    CUSTOS_EXPECT_ERRC(got, Errc::registry_corrupt_record);
    EXPECT_NE(got.error().context.find("quarantined"), std::string::npos);
    CUSTOS_EXPECT_ERRC(reg->record_phase("ex-bad", core::Phase::starting),
                       Errc::registry_corrupt_record);
    EXPECT_TRUE(reg->get("ex-good"));
    EXPECT_EQ(reg->list()->size(), 1u);
    // The quarantined row itself is kept. (The registry holds its file exclusively: close it.)
    reg.reset();
    auto db = sql::Db::open(t_.db().string(), false);
    EXPECT_EQ(*db->query_int("SELECT count(*) FROM executions WHERE execution_id='ex-bad'"), 1);
  }
  TempDir t_;
};

TEST_F(RegistryQuarantine, CorruptBytes) {
  raw_exec(t_.db(),
           "UPDATE executions SET plan_canonical = X'00DEADBEEF' WHERE execution_id='ex-bad'");
  expect_quarantined(Errc::registry_corrupt_record);
}

TEST_F(RegistryQuarantine, WrongChecksum) {
  raw_exec(t_.db(), "UPDATE executions SET checksum = 'sha256:" + std::string(64, '0') +
                        "' WHERE execution_id='ex-bad'");
  expect_quarantined(Errc::registry_corrupt_record);
}

TEST_F(RegistryQuarantine, UnknownPhaseWord) {
  raw_exec(t_.db(), "UPDATE executions SET phase = 'sleeping' WHERE execution_id='ex-bad'");
  expect_quarantined(Errc::registry_corrupt_record);
}

TEST_F(RegistryQuarantine, IllegalPhaseWithValidChecksum) {
  // Someone who can compute the checksum still cannot store a phase the record cannot be in:
  // running with an unassigned ownership slot.
  ExecutionRecord rec;
  {
    auto reg = open_ok(t_);
    rec = *reg->get("ex-bad");
  }
  rec.phase = core::Phase::running;
  std::string const sum = record_checksum(rec);
  raw_exec(t_.db(), "UPDATE executions SET phase='running', checksum='" + sum +
                        "' WHERE execution_id='ex-bad'");
  expect_quarantined(Errc::registry_illegal_phase);
}

TEST_F(RegistryQuarantine, PlanBytesThatDoNotDecodeDespiteMatchingDigests) {
  // Digest and checksum recomputed over bytes that are not a canonical execution document:
  // only decoding the canonical bytes at open can tell.
  ExecutionRecord rec;
  {
    auto reg = open_ok(t_);
    rec = *reg->get("ex-bad");
  }
  rec.plan_canonical = {'C', 'S', 'T', 'S', 0, 1, 0, 3, 0, 0, 0, 0, 9};
  rec.plan_digest = sha256_tagged(rec.plan_canonical);
  std::string const sum = record_checksum(rec);
  raw_exec(t_.db(),
           "UPDATE executions SET plan_canonical=X'43535453000100030000000009', "
           "plan_digest='" +
               rec.plan_digest + "', checksum='" + sum + "' WHERE execution_id='ex-bad'");
  expect_quarantined(Errc::registry_corrupt_record);
}

TEST_F(RegistryQuarantine, StaysQuarantinedAfterAnotherReopen) {
  raw_exec(t_.db(), "UPDATE executions SET backend = 'tampered' WHERE execution_id='ex-bad'");
  { auto reg = open_ok(t_); }
  expect_quarantined(Errc::registry_corrupt_record);
}

// ---- group commit -----------------------------------------------------------------------------

TEST(RegistryGroupCommit, ConcurrentLaunchesShareTransactions) {
  TempDir t;
  auto reg = open_ok(t);
  constexpr int kThreads = 16;
  constexpr int kPerThread = 20;
  auto const before = reg->write_stats();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string const id = "ex-" + std::to_string(th) + "-" + std::to_string(i);
        auto ex = make_execution(id, "act-" + id);
        if (!reg->record_authorized(ex)) ++failures;
        if (!reg->record_staged(
                id, fake_staged(1000 + i, 1 + static_cast<std::uint64_t>(th * 100 + i)), {}))
          ++failures;
        if (!reg->record_committed(id)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto const after = reg->write_stats();
  std::uint64_t const writes = after.writes - before.writes;
  std::uint64_t const txns = after.transactions - before.transactions;
  // record_authorized is one write (claim + record in one job), then staged and committed.
  EXPECT_EQ(writes, static_cast<std::uint64_t>(kThreads * kPerThread * 3));
  // Batching must have happened: fewer transactions than writes, and fewer fsyncs than claims.
  EXPECT_LT(txns, writes);
  EXPECT_LT(after.full_commits - before.full_commits,
            static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(reg->non_terminal()->size(), static_cast<std::size_t>(kThreads * kPerThread));
}

TEST(RegistryGroupCommit, OneFailingJobDoesNotUndoItsBatchNeighbours) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->consume_claim("dup", "p", "ex-dup"));
  std::vector<std::thread> threads;
  std::atomic<int> ok_count{0}, consumed{0};
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      auto r = (th % 2 == 0)
                   ? reg->consume_claim("dup", "p", "ex-x" + std::to_string(th))
                   : reg->consume_claim("a" + std::to_string(th), "p", "e" + std::to_string(th));
      if (r)
        ++ok_count;
      else if (r.error().code == Errc::registry_claim_consumed)
        ++consumed;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok_count.load(), 4);
  EXPECT_EQ(consumed.load(), 4);
  for (int th = 1; th < 8; th += 2) {
    EXPECT_TRUE(*reg->find_claim("a" + std::to_string(th), "p"));
  }
}

}  // namespace
}  // namespace custos::registry::test
