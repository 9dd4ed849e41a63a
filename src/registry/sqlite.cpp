// RAII wrappers over the sqlite3 C API; see include/custos/registry/sqlite.hpp.
#include "custos/registry/sqlite.hpp"

#include <sqlite3.h>

#include <utility>

#include "custos/registry/wal_vfs.hpp"

namespace custos::registry::sql {

Error sqlite_error(int rc, sqlite3* db, std::string_view what) {
  Errc code = Errc::registry_io;
  switch (rc & 0xff) {  // primary code; the extended bits only refine it
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      code = Errc::registry_corrupt_database;
      break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      code = Errc::registry_locked;
      break;
    default:
      break;
  }
  std::string ctx{what};
  ctx += ": ";
  ctx += (db != nullptr) ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  ctx += " (sqlite ";
  ctx += std::to_string(rc);
  ctx += ")";
  return Error{code, std::move(ctx)};
}

// ---- Stmt -------------------------------------------------------------------------------------

Stmt::~Stmt() {
  // sqlite3_finalize returns the error of the last step, which was already reported there.
  if (stmt_ != nullptr) (void)sqlite3_finalize(stmt_);
}

Stmt::Stmt(Stmt&& other) noexcept
    : stmt_(std::exchange(other.stmt_, nullptr)), db_(std::exchange(other.db_, nullptr)) {}

Stmt& Stmt::operator=(Stmt&& other) noexcept {
  if (this != &other) {
    if (stmt_ != nullptr) (void)sqlite3_finalize(stmt_);
    stmt_ = std::exchange(other.stmt_, nullptr);
    db_ = std::exchange(other.db_, nullptr);
  }
  return *this;
}

namespace {
Result<void> check_bind(int rc, sqlite3* db) {
  if (rc != SQLITE_OK) return sqlite_error(rc, db, "bind");
  return ok();
}
}  // namespace

Result<void> Stmt::bind(int index, std::int64_t value) {
  return check_bind(sqlite3_bind_int64(stmt_, index, value), db_);
}

namespace {
sqlite3_destructor_type lifetime(Stmt::Bytes how) noexcept {
  return how == Stmt::Bytes::borrowed ? SQLITE_STATIC : SQLITE_TRANSIENT;
}
}  // namespace

Result<void> Stmt::bind(int index, std::string_view text, Bytes how) {
  return check_bind(
      sqlite3_bind_text64(stmt_, index, text.data(), text.size(), lifetime(how), SQLITE_UTF8), db_);
}

Result<void> Stmt::bind_blob(int index, std::span<std::uint8_t const> bytes, Bytes how) {
  // A zero-length blob must still be a blob, not NULL: sqlite3_bind_blob64 with a null pointer
  // binds NULL, so point at a static byte instead.
  static std::uint8_t const kEmpty = 0;
  void const* data = bytes.empty() ? &kEmpty : bytes.data();
  return check_bind(sqlite3_bind_blob64(stmt_, index, data, bytes.size(), lifetime(how)), db_);
}

Result<void> Stmt::bind_null(int index) {
  return check_bind(sqlite3_bind_null(stmt_, index), db_);
}

Result<void> Stmt::bind(int index, std::optional<std::string_view> text, Bytes how) {
  if (!text) return bind_null(index);
  return bind(index, *text, how);
}

Result<void> Stmt::bind(int index, std::optional<std::int64_t> value) {
  if (!value) return bind_null(index);
  return bind(index, *value);
}

namespace {
// Once no transaction is open, nothing of a committed one may be held back by the WAL VFS (it
// writes a transaction at its commit frame; this also covers a commit it did not recognise).
Result<void> settle_wal(sqlite3* db) {
  if (sqlite3_get_autocommit(db) == 0) return ok();
  if (int const rc = flush_wal(db); rc != SQLITE_OK) {
    return sqlite_error(rc, nullptr, "writing the WAL after a commit");
  }
  return ok();
}
}  // namespace

Result<bool> Stmt::step() {
  int const rc = sqlite3_step(stmt_);
  // A row of a query commits nothing: settle once the statement is done (or failed).
  if (rc != SQLITE_ROW) CUSTOS_TRYV(settle_wal(db_));
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return sqlite_error(rc, db_, sqlite3_sql(stmt_) != nullptr ? sqlite3_sql(stmt_) : "step");
}

Result<void> Stmt::run() {
  for (;;) {
    bool const row = CUSTOS_TRY(step());
    if (!row) return ok();
  }
}

void Stmt::reset() noexcept {
  (void)sqlite3_reset(stmt_);
  (void)sqlite3_clear_bindings(stmt_);
}

bool Stmt::is_null(int col) const noexcept {
  return sqlite3_column_type(stmt_, col) == SQLITE_NULL;
}

std::int64_t Stmt::int64(int col) const noexcept {
  return sqlite3_column_int64(stmt_, col);
}

std::string Stmt::text(int col) const {
  auto const* p = sqlite3_column_text(stmt_, col);
  int const n = sqlite3_column_bytes(stmt_, col);
  if (p == nullptr || n <= 0) return {};
  return std::string(reinterpret_cast<char const*>(p), static_cast<std::size_t>(n));
}

std::vector<std::uint8_t> Stmt::blob(int col) const {
  auto const* p = static_cast<std::uint8_t const*>(sqlite3_column_blob(stmt_, col));
  int const n = sqlite3_column_bytes(stmt_, col);
  if (p == nullptr || n <= 0) return {};
  return std::vector<std::uint8_t>(p, p + n);
}

std::optional<std::string> Stmt::opt_text(int col) const {
  if (is_null(col)) return std::nullopt;
  return text(col);
}

std::optional<std::int64_t> Stmt::opt_int64(int col) const {
  if (is_null(col)) return std::nullopt;
  return int64(col);
}

int Stmt::type(int col) const noexcept {
  return sqlite3_column_type(stmt_, col);
}

// ---- Db ---------------------------------------------------------------------------------------

void Db::close() noexcept {
  if (cache_) cache_->clear();  // finalize cached statements first
  // sqlite3_close_v2 defers the close until the last statement is finalized, so a leaked Stmt
  // cannot make the close fail.
  if (db_ != nullptr) (void)sqlite3_close_v2(db_);
  db_ = nullptr;
}

Db::~Db() {
  close();
}

Db::Db(Db&& other) noexcept
    : cache_(
          std::exchange(other.cache_, std::make_unique<std::unordered_map<std::string, Stmt>>())),
      db_(std::exchange(other.db_, nullptr)) {}

Db& Db::operator=(Db&& other) noexcept {
  if (this != &other) {
    close();
    cache_ = std::exchange(other.cache_, std::make_unique<std::unordered_map<std::string, Stmt>>());
    db_ = std::exchange(other.db_, nullptr);
  }
  return *this;
}

Result<StmtLease> Db::cached(std::string_view sql) {
  std::string key{sql};
  auto it = cache_->find(key);
  if (it == cache_->end()) {
    Stmt s = CUSTOS_TRY(prepare(sql));
    it = cache_->emplace(std::move(key), std::move(s)).first;
  }
  return StmtLease{&it->second};
}

Result<void> Db::exec_cached(std::string_view sql) {
  StmtLease s = CUSTOS_TRY(cached(sql));
  return s->run();
}

Result<Db> Db::open(std::string const& path, bool create, char const* vfs) {
  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
  if (create) flags |= SQLITE_OPEN_CREATE;
  int const rc = sqlite3_open_v2(path.c_str(), &raw, flags, vfs);
  Db db{raw};  // owns the handle even on failure (sqlite3_open_v2 may allocate one)
  if (rc != SQLITE_OK) {
    Error e = sqlite_error(rc, raw, "open " + path);
    if (e.code == Errc::registry_io) e.code = Errc::registry_open_failed;
    return e;
  }
  (void)sqlite3_extended_result_codes(raw, 1);
  return db;
}

Result<void> Db::exec(std::string_view sql) {
  std::string const text{sql};
  char* msg = nullptr;
  int const rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &msg);
  if (msg != nullptr) sqlite3_free(msg);
  CUSTOS_TRYV(settle_wal(db_));
  if (rc != SQLITE_OK) return sqlite_error(rc, db_, sql.substr(0, 120));
  return ok();
}

Result<Stmt> Db::prepare(std::string_view sql) {
  sqlite3_stmt* raw = nullptr;
  int const rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &raw, nullptr);
  Stmt stmt{raw, db_};
  if (rc != SQLITE_OK) return sqlite_error(rc, db_, sql.substr(0, 120));
  return stmt;
}

Result<std::optional<std::int64_t>> Db::query_int(std::string_view sql) {
  Stmt s = CUSTOS_TRY(prepare(sql));
  bool const row = CUSTOS_TRY(s.step());
  if (!row) return std::optional<std::int64_t>{};
  return s.opt_int64(0);
}

Result<std::optional<std::string>> Db::query_text(std::string_view sql) {
  Stmt s = CUSTOS_TRY(prepare(sql));
  bool const row = CUSTOS_TRY(s.step());
  if (!row) return std::optional<std::string>{};
  return s.opt_text(0);
}

std::int64_t Db::changes() const noexcept {
  return sqlite3_changes64(db_);
}

bool Db::in_transaction() const noexcept {
  return sqlite3_get_autocommit(db_) == 0;
}

}  // namespace custos::registry::sql
