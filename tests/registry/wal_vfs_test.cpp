// The WAL-coalescing VFS: a transaction reaches the WAL file with one write (or a few bounded
// ones) at its commit frame, so another connection — and a process killed right after COMMIT —
// finds every committed frame in the file.
#include "custos/registry/wal_vfs.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <csignal>
#include <optional>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "custos/registry/failpoint.hpp"

#include "helpers.hpp"
#include "support/scoped_failpoint.hpp"

namespace custos::registry::test {
namespace {

// A raw connection (no custos wrapper: nothing but the VFS writes what it holds).
struct Conn {
  sqlite3* db = nullptr;
  Conn(std::string const& path, char const* vfs) {
    int const rc =
        sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs);
    EXPECT_EQ(rc, SQLITE_OK) << sqlite3_errmsg(db);
  }
  ~Conn() { sqlite3_close_v2(db); }
  Conn(Conn const&) = delete;
  Conn& operator=(Conn const&) = delete;
  int exec(std::string const& sql) const {
    return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  }
  // Inserts `bytes` of payload as one row (id), in one transaction.
  int insert(int id, std::size_t bytes) const {
    sqlite3_stmt* s = nullptr;
    int rc = sqlite3_prepare_v2(db, "INSERT INTO t (id, v) VALUES (?, ?)", -1, &s, nullptr);
    if (rc != SQLITE_OK) return rc;
    std::vector<unsigned char> payload(bytes, static_cast<unsigned char>('a' + id % 26));
    sqlite3_bind_int(s, 1, id);
    sqlite3_bind_blob64(s, 2, payload.data(), payload.size(), SQLITE_TRANSIENT);
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
  }
  // The row's payload length, or -1.
  std::int64_t length(int id) const {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT length(v) FROM t WHERE id = ?", -1, &s, nullptr) !=
        SQLITE_OK)
      return -1;
    sqlite3_bind_int(s, 1, id);
    std::int64_t n = -1;
    if (sqlite3_step(s) == SQLITE_ROW) n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
  }
};

std::string db_in(TempDir const& t) {
  return (t.path() / "vfs.db").string();
}

void make_table(Conn const& c) {
  ASSERT_EQ(c.exec("PRAGMA journal_mode = WAL"), SQLITE_OK);
  ASSERT_EQ(c.exec("PRAGMA synchronous = NORMAL"), SQLITE_OK);
  ASSERT_EQ(c.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)"), SQLITE_OK);
}

TEST(WalVfs, IsRegistered) {
  ASSERT_NE(sql::wal_coalescing_vfs(), nullptr);
  EXPECT_NE(sqlite3_vfs_find(sql::wal_coalescing_vfs()), nullptr);
  EXPECT_NE(sqlite3_vfs_find(nullptr), sqlite3_vfs_find(sql::wal_coalescing_vfs()))
      << "it must not become the process's default VFS";
}

// A transaction of ~6 pages: 12+ writes from SQLite, one to the file, and a second connection
// through the default VFS reads the row as soon as COMMIT returned.
TEST(WalVfs, ATransactionIsOneWriteAndInTheFileAtItsCommit) {
  TempDir t;
  Conn writer(db_in(t), sql::wal_coalescing_vfs());
  make_table(writer);
  auto const before = sql::wal_write_counts();
  ASSERT_EQ(writer.insert(1, 20000), SQLITE_OK);
  auto const after = sql::wal_write_counts();
  EXPECT_GE(after.writes_in - before.writes_in, 12U);
  EXPECT_EQ(after.writes_out - before.writes_out, 1U);
  EXPECT_EQ(after.commits - before.commits, 1U);
  Conn reader(db_in(t), nullptr);
  EXPECT_EQ(reader.length(1), 20000);
}

// Beyond what one write of the default VFS may carry (the unix VFS writes at most 128 KiB - 1
// per call): written in bounded pieces, all before COMMIT returns.
TEST(WalVfs, ALargeTransactionIsWrittenInBoundedPieces) {
  TempDir t;
  Conn writer(db_in(t), sql::wal_coalescing_vfs());
  make_table(writer);
  auto const before = sql::wal_write_counts();
  ASSERT_EQ(writer.insert(2, 3 << 20), SQLITE_OK) << sqlite3_errmsg(writer.db);
  auto const after = sql::wal_write_counts();
  auto const out = after.writes_out - before.writes_out;
  EXPECT_GT(out, 1U);
  EXPECT_LT(out, (after.writes_in - before.writes_in) / 8);
  Conn reader(db_in(t), nullptr);
  EXPECT_EQ(reader.length(2), 3 << 20);
  // And the writer goes on.
  ASSERT_EQ(writer.insert(3, 100), SQLITE_OK);
  EXPECT_EQ(reader.length(3), 100);
}

// Killed right after COMMIT returned, with the connection still open: nothing of the
// transaction was left in the process.
TEST(WalVfs, ACommitSurvivesSigkillRightAfterIt) {
  TempDir t;
  {
    Conn setup(db_in(t), nullptr);
    make_table(setup);
  }
  pid_t const child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Conn writer(db_in(t), sql::wal_coalescing_vfs());
    (void)writer.exec("PRAGMA locking_mode = EXCLUSIVE");
    (void)writer.exec("PRAGMA synchronous = NORMAL");
    if (writer.insert(4, 30000) != SQLITE_OK) ::_exit(3);
    ::raise(SIGKILL);
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited " << WEXITSTATUS(status);
  Conn reader(db_in(t), nullptr);
  EXPECT_EQ(reader.length(4), 30000);
}

// The registry opens its database through the VFS.
TEST(WalVfs, TheRegistryWritesThroughIt) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  auto const before = sql::wal_write_counts();
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-00000000000000e1", "a-e1")));
  auto const after = sql::wal_write_counts();
  EXPECT_GE(after.commits - before.commits, 1U);
  EXPECT_LT(after.writes_out - before.writes_out, after.writes_in - before.writes_in);
}

// A failed write of the WAL fails the commit (nothing of it is left: the registry reopens with
// the state before it) and everything after it, until the registry is reopened: SQLite must
// never go on with frames the file may not have.
TEST(WalVfs, AFailedWalWriteFailsTheCommitAndEveryWriteAfterIt) {
  if (!kFailpointsCompiled) GTEST_SKIP() << "failpoints are compiled into test builds only";
  TempDir t;
  {
    auto reg = open_ok(t);
    ASSERT_TRUE(reg);
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-00000000000000a1", "a-1")));
    {
      custos::testing::ScopedFailpoint fp{"wal_write_fails"};
      CUSTOS_EXPECT_ERRC(reg->record_authorized(make_execution("ex-00000000000000a2", "a-2")),
                         Errc::registry_io);
    }
    // The failpoint is gone; the WAL still refuses.
    CUSTOS_EXPECT_ERRC(reg->record_phase("ex-00000000000000a1", core::Phase::starting),
                       Errc::registry_io);
  }
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  auto first = reg->get("ex-00000000000000a1");
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_EQ(first->phase, core::Phase::authorized);
  CUSTOS_EXPECT_ERRC(reg->get("ex-00000000000000a2"), Errc::registry_not_found);
  // Its claim was never consumed: it can be now.
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-00000000000000a2", "a-2")));
}

// Statement journals (a savepoint's undo) in memory: in a temp file — SQLite spills one past
// 64 KiB, and in exclusive locking mode keeps using that file for every later statement journal
// of the connection — they were a 4-byte and a page-sized pwrite for every page a statement
// touched that the transaction had already changed (~14 per launch in the daemon under load).
TEST(WalVfs, TheRegistrysTemporaryStorageIsInMemory) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  std::optional<std::int64_t> store;
  CUSTOS_ASSERT_OK(reg->read([&](sql::Db& db) -> Result<void> {
    store = CUSTOS_TRY(db.query_int("PRAGMA temp_store"));
    return ok();
  }));
  EXPECT_EQ(store, std::optional<std::int64_t>{2}) << "2 is MEMORY";
}

}  // namespace
}  // namespace custos::registry::test
