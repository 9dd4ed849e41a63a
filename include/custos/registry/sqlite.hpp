// Thin RAII owners for a SQLite connection and a prepared statement (sqlite3 C API).
//
// Nothing here knows about custos records; it only turns SQLite result codes into custos errors
// and guarantees that every handle is finalized/closed exactly once. Kept public so tests can
// build old schema versions by hand and damage rows on purpose.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "custos/core/result.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace custos::registry::sql {

// Maps a SQLite result code to a custos error:
//   SQLITE_NOTADB, SQLITE_CORRUPT  -> registry.corrupt_database
//   SQLITE_BUSY, SQLITE_LOCKED     -> registry.locked
//   anything else                  -> registry.io
// `db` (may be null) supplies sqlite3_errmsg for the context.
[[nodiscard]] Error sqlite_error(int rc, sqlite3* db, std::string_view what);

class Stmt {
 public:
  Stmt() noexcept = default;
  ~Stmt();
  Stmt(Stmt const&) = delete;
  Stmt& operator=(Stmt const&) = delete;
  Stmt(Stmt&& other) noexcept;
  Stmt& operator=(Stmt&& other) noexcept;

  // Parameters are 1-based, as in sqlite3_bind_*. Text and blobs are copied (SQLITE_TRANSIENT)
  // so the caller's buffers need not outlive the statement — unless `Bytes::borrowed` is
  // passed: SQLite then reads the caller's bytes where they are (SQLITE_STATIC), so they must
  // stay unchanged until the statement is reset (reset() also clears the bindings, so nothing
  // borrowed is read by a later execution). For the registry's row writes, which bind a whole
  // record they hold for the statement's one run.
  enum class Bytes { copied, borrowed };
  [[nodiscard]] Result<void> bind(int index, std::int64_t value);
  [[nodiscard]] Result<void> bind(int index, std::string_view text, Bytes how = Bytes::copied);
  [[nodiscard]] Result<void> bind_blob(int index, std::span<std::uint8_t const> bytes,
                                       Bytes how = Bytes::copied);
  [[nodiscard]] Result<void> bind_null(int index);
  // Binds the value or NULL.
  [[nodiscard]] Result<void> bind(int index, std::optional<std::string_view> text,
                                  Bytes how = Bytes::copied);
  [[nodiscard]] Result<void> bind(int index, std::optional<std::int64_t> value);

  // One step: true when a row is available, false when done.
  [[nodiscard]] Result<bool> step();
  // Steps to completion, for statements that return no rows.
  [[nodiscard]] Result<void> run();
  // Resets for re-execution and clears bindings.
  void reset() noexcept;

  [[nodiscard]] bool is_null(int col) const noexcept;
  [[nodiscard]] std::int64_t int64(int col) const noexcept;
  [[nodiscard]] std::string text(int col) const;
  [[nodiscard]] std::vector<std::uint8_t> blob(int col) const;
  [[nodiscard]] std::optional<std::string> opt_text(int col) const;
  [[nodiscard]] std::optional<std::int64_t> opt_int64(int col) const;
  // The declared storage class of the column value in the current row (SQLITE_INTEGER...).
  [[nodiscard]] int type(int col) const noexcept;

 private:
  friend class Db;
  Stmt(sqlite3_stmt* s, sqlite3* db) noexcept : stmt_(s), db_(db) {}
  sqlite3_stmt* stmt_ = nullptr;
  sqlite3* db_ = nullptr;
};

class Db;

// A cached statement borrowed for one use: reset (and its bindings cleared) when the lease ends,
// so the next user starts clean.
class StmtLease {
 public:
  explicit StmtLease(Stmt* s) noexcept : s_(s) {}
  ~StmtLease() {
    if (s_ != nullptr) s_->reset();
  }
  StmtLease(StmtLease const&) = delete;
  StmtLease& operator=(StmtLease const&) = delete;
  StmtLease(StmtLease&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  StmtLease& operator=(StmtLease&&) = delete;

  [[nodiscard]] Stmt* operator->() const noexcept { return s_; }
  [[nodiscard]] Stmt& operator*() const noexcept { return *s_; }

 private:
  Stmt* s_;
};

class Db {
 public:
  Db() noexcept = default;
  ~Db();
  Db(Db const&) = delete;
  Db& operator=(Db const&) = delete;
  Db(Db&& other) noexcept;
  Db& operator=(Db&& other) noexcept;

  // sqlite3_open_v2 with SQLITE_OPEN_READWRITE (| SQLITE_OPEN_CREATE when `create`) and
  // SQLITE_OPEN_NOMUTEX: custos serializes access to one connection itself.
  // Extended result codes are enabled so corruption is told apart from I/O errors. `vfs`: a
  // registered VFS by name (the registry: wal_coalescing_vfs()), or null for the default one.
  // With any VFS, a statement that leaves no transaction open returns only once everything the
  // WAL VFS may hold is written (flush_wal).
  [[nodiscard]] static Result<Db> open(std::string const& path, bool create,
                                       char const* vfs = nullptr);

  // Runs one or more statements that return no rows.
  [[nodiscard]] Result<void> exec(std::string_view sql);
  [[nodiscard]] Result<Stmt> prepare(std::string_view sql);
  // A statement prepared once per connection and reused (the hot write path would otherwise
  // spend most of its time in SQLite's parser). Not reentrant for the same SQL text: one lease
  // per statement at a time.
  [[nodiscard]] Result<StmtLease> cached(std::string_view sql);
  // Runs a cached statement that returns no rows (BEGIN, COMMIT, SAVEPOINT, PRAGMA x = y).
  [[nodiscard]] Result<void> exec_cached(std::string_view sql);
  // The first column of the first row of a query, when there is one.
  [[nodiscard]] Result<std::optional<std::int64_t>> query_int(std::string_view sql);
  [[nodiscard]] Result<std::optional<std::string>> query_text(std::string_view sql);

  [[nodiscard]] sqlite3* handle() const noexcept { return db_; }
  [[nodiscard]] std::int64_t changes() const noexcept;
  [[nodiscard]] bool in_transaction() const noexcept;

 private:
  explicit Db(sqlite3* db) noexcept : db_(db) {}
  void close() noexcept;
  // Declared before db_'s use in close(): statements are finalized before the connection.
  std::unique_ptr<std::unordered_map<std::string, Stmt>> cache_ =
      std::make_unique<std::unordered_map<std::string, Stmt>>();
  sqlite3* db_ = nullptr;
};

}  // namespace custos::registry::sql
