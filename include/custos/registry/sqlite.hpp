// Thin RAII owners for a SQLite connection and a prepared statement (sqlite3 C API).
//
// Nothing here knows about custos records; it only turns SQLite result codes into custos errors
// and guarantees that every handle is finalized/closed exactly once. Kept public so tests can
// build old schema versions by hand and damage rows on purpose.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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
  // so the caller's buffers need not outlive the statement.
  [[nodiscard]] Result<void> bind(int index, std::int64_t value);
  [[nodiscard]] Result<void> bind(int index, std::string_view text);
  [[nodiscard]] Result<void> bind_blob(int index, std::span<std::uint8_t const> bytes);
  [[nodiscard]] Result<void> bind_null(int index);
  // Binds the value or NULL.
  [[nodiscard]] Result<void> bind(int index, std::optional<std::string_view> text);
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
  // Extended result codes are enabled so corruption is told apart from I/O errors.
  [[nodiscard]] static Result<Db> open(std::string const& path, bool create);

  // Runs one or more statements that return no rows.
  [[nodiscard]] Result<void> exec(std::string_view sql);
  [[nodiscard]] Result<Stmt> prepare(std::string_view sql);
  // The first column of the first row of a query, when there is one.
  [[nodiscard]] Result<std::optional<std::int64_t>> query_int(std::string_view sql);
  [[nodiscard]] Result<std::optional<std::string>> query_text(std::string_view sql);

  [[nodiscard]] sqlite3* handle() const noexcept { return db_; }
  [[nodiscard]] std::int64_t changes() const noexcept;
  [[nodiscard]] bool in_transaction() const noexcept;

 private:
  explicit Db(sqlite3* db) noexcept : db_(db) {}
  sqlite3* db_ = nullptr;
};

}  // namespace custos::registry::sql
