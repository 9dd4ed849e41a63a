// Registry: open/lock/schema, group-committed writes, claims, records, quarantine.
#include "custos/registry/registry.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/registry/failpoint.hpp"

#include "schema.hpp"

namespace custos::registry {

namespace {

constexpr char const* kLockName = "registry.lock";
constexpr char const* kDbName = "registry.db";

Error io_error(std::string what, int err) {
  return Error{Errc::registry_open_failed, std::move(what) + ": " + std::strerror(err), err};
}

// The pid written into the lock file by the current holder, for the refusal message.
std::string read_holder(int fd) {
  char buf[32] = {};
  ssize_t const n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return {};
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Result<sys::UniqueFd> take_lock(std::filesystem::path const& dir) {
  auto const path = dir / kLockName;
  sys::UniqueFd fd{::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (!fd.valid()) return io_error("open " + path.string(), errno);
  // flock (not fcntl locks): owned by the open file description, so a second open of the same
  // state directory in this very process is refused too, and the lock dies with the holder.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    int const err = errno;
    if (err == EWOULDBLOCK) {
      std::string const holder = read_holder(fd.get());
      return Error{Errc::registry_locked,
                   "state directory " + dir.string() + " is in use by another custos daemon" +
                       (holder.empty() ? std::string{} : " (pid " + holder + ")") + "; lock file " +
                       path.string(),
                   err};
    }
    return io_error("flock " + path.string(), err);
  }
  std::string const me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    return io_error("write " + path.string(), errno);
  }
  return fd;
}

Result<int> read_version(sql::Db& db) {
  // A SQLite file without our meta table is someone else's database.
  auto has_meta = CUSTOS_TRY(
      db.query_int("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'"));
  if (!has_meta || *has_meta == 0) {
    return Error{Errc::registry_schema_unknown, "no meta table: not a custos registry"};
  }
  auto id = CUSTOS_TRY(db.query_text("SELECT value FROM meta WHERE key = 'schema_id'"));
  if (!id || *id != kSchemaId) {
    return Error{Errc::registry_schema_unknown, "schema id '" + id.value_or("<none>") +
                                                    "', expected '" + std::string{kSchemaId} + "'"};
  }
  auto ver = CUSTOS_TRY(db.query_text("SELECT value FROM meta WHERE key = 'schema_version'"));
  int v = 0;
  if (ver) {
    for (char c : *ver) {
      if (c < '0' || c > '9' || v > 100000) {
        v = 0;
        break;
      }
      v = v * 10 + (c - '0');
    }
  }
  if (v <= 0) {
    return Error{Errc::registry_schema_unknown,
                 "unreadable schema version '" + ver.value_or("<none>") + "'"};
  }
  if (v > kSchemaVersion) {
    return Error{Errc::registry_schema_newer,
                 "registry schema version " + std::to_string(v) +
                     " was written by a newer custos; this one understands up to " +
                     std::to_string(kSchemaVersion)};
  }
  return v;
}

}  // namespace

std::uint64_t current_pid_ns_ino() noexcept {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

Registry::Registry(std::filesystem::path state_dir, OpenOptions options, sys::UniqueFd lock_fd,
                   sql::Db db)
    : state_dir_(std::move(state_dir)),
      options_(options),
      lock_fd_(std::move(lock_fd)),
      db_(std::move(db)) {}

Registry::~Registry() = default;

std::filesystem::path Registry::db_path() const {
  return state_dir_ / kDbName;
}

Result<std::unique_ptr<Registry>> Registry::open(std::filesystem::path const& state_dir,
                                                 OpenOptions const& options) {
  if (options.create_if_missing) {
    if (::mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return io_error("mkdir " + state_dir.string(), errno);
    }
  }
  struct stat dst {};
  if (::stat(state_dir.c_str(), &dst) != 0) return io_error("stat " + state_dir.string(), errno);
  if (!S_ISDIR(dst.st_mode)) {
    return Error{Errc::registry_open_failed, state_dir.string() + " is not a directory"};
  }

  sys::UniqueFd lock = CUSTOS_TRY(take_lock(state_dir));

  auto const db_file = state_dir / kDbName;
  struct stat fst {};
  bool const exists = ::stat(db_file.c_str(), &fst) == 0;
  if (exists && fst.st_size == 0) {
    // SQLite would treat an empty file as a new database. A registry that existed and lost its
    // contents must not silently start over: its consumed claims would become usable again.
    return Error{Errc::registry_corrupt_database,
                 db_file.string() + " is empty; refusing to re-create a registry over it"};
  }
  if (!exists && !options.create_if_missing) {
    return Error{Errc::registry_open_failed, db_file.string() + " does not exist"};
  }

  sql::Db db = CUSTOS_TRY(sql::Db::open(db_file.string(), options.create_if_missing));
  // The flock already makes this the only process using the file, so SQLite's own per-
  // transaction fcntl locks and the shared-memory WAL index buy nothing: exclusive locking mode
  // takes the lock once and keeps the WAL index in heap memory (docs/durability.md).
  CUSTOS_TRYV(db.exec("PRAGMA locking_mode = EXCLUSIVE"));
  // Small pages for a new file: a phase write then appends ~2 KiB of WAL frames instead of
  // ~8 KiB, and the next fsync has that much less to flush. Ignored for an existing file.
  if (!exists) CUSTOS_TRYV(db.exec("PRAGMA page_size = 1024"));
  // WAL: readers never block the writer and a commit is an append (docs/durability.md).
  auto mode = CUSTOS_TRY(db.query_text("PRAGMA journal_mode = WAL"));
  if (!mode || *mode != "wal") {
    return Error{Errc::registry_open_failed,
                 "could not enable WAL (journal_mode " + mode.value_or("<none>") + ")"};
  }
  // The flock makes this the only connection, so waiting on SQLite's own locks never helps.
  CUSTOS_TRYV(db.exec("PRAGMA busy_timeout = 0"));
  // Checkpoint less often: most WAL frames are rewrites of the same few pages (a record moving
  // through its phases), so a larger window copies each page to the database once instead of
  // many times, and the checkpoint's fsync of the database file is paid more rarely.
  CUSTOS_TRYV(db.exec("PRAGMA wal_autocheckpoint = 8192"));
  CUSTOS_TRYV(db.exec("PRAGMA journal_size_limit = 16777216"));
  CUSTOS_TRYV(db.exec("PRAGMA synchronous = FULL"));
  if (options.integrity_check) {
    auto check = CUSTOS_TRY(db.query_text("PRAGMA quick_check(1)"));
    if (!check || *check != "ok") {
      return Error{Errc::registry_corrupt_database,
                   db_file.string() + ": integrity check failed: " + check.value_or("<none>")};
    }
  }

  auto tables = CUSTOS_TRY(db.query_int("SELECT count(*) FROM sqlite_master"));
  int version = 0;
  if (!exists || (tables && *tables == 0)) {
    // A new registry: created as v1, then migrated like any old one.
    if (auto r = db.exec(std::string{"BEGIN IMMEDIATE;"} + std::string{detail::schema_v1_ddl()} +
                         "COMMIT;");
        !r) {
      (void)db.exec("ROLLBACK");
      return Error{Errc::registry_migration_failed, "create v1 schema: " + r.error().message()};
    }
    version = 1;
  } else {
    version = CUSTOS_TRY(read_version(db));
  }
  int const opened = exists ? version : kSchemaVersion;
  CUSTOS_TRYV(detail::migrate(db, version));

  std::unique_ptr<Registry> reg{new Registry(state_dir, options, std::move(lock), std::move(db))};
  reg->opened_version_ = opened;
  reg->current_sync_ = Durability::full;
  (void)CUSTOS_TRY(reg->revalidate());
  return reg;
}

// ---- write path (group commit) ----------------------------------------------------------------

Result<void> Registry::set_synchronous(Durability d) {
  if (current_sync_ == d) return ok();
  CUSTOS_TRYV(db_.exec_cached(d == Durability::full ? "PRAGMA synchronous = FULL"
                                                    : "PRAGMA synchronous = NORMAL"));
  current_sync_ = d;
  return ok();
}

void Registry::run_batch(std::vector<Job*> const& batch) {
  std::lock_guard<std::mutex> g(db_mu_);
  // The batch commits with the strictest durability any of its jobs asked for: one fsync then
  // covers every job in it (and, WAL being ordered, every earlier NORMAL commit too).
  Durability d = Durability::normal;
  for (Job const* j : batch) {
    if (j->durability == Durability::full) d = Durability::full;
  }
  auto fail_all = [&](Error const& e) {
    for (Job* j : batch) j->result = e;
  };
  if (auto r = set_synchronous(d); !r) return fail_all(r.error());
  if (auto r = db_.exec_cached("BEGIN IMMEDIATE"); !r) return fail_all(r.error());
  if (batch.size() == 1) {
    // Alone in its transaction: a refused job simply rolls the transaction back.
    Job* j = batch.front();
    j->result = j->fn(db_);
    if (!j->result) {
      (void)db_.exec_cached("ROLLBACK");
      return;
    }
  } else {
    for (Job* j : batch) {
      // Each job runs inside its own savepoint, so one refused job does not undo the others.
      if (auto r = db_.exec_cached("SAVEPOINT job"); !r) {
        j->result = r.error();
        continue;
      }
      j->result = j->fn(db_);
      if (!j->result) (void)db_.exec_cached("ROLLBACK TO job");
      (void)db_.exec_cached("RELEASE job");
    }
  }
  if (auto r = db_.exec_cached("COMMIT"); !r) {
    (void)db_.exec_cached("ROLLBACK");
    for (Job* j : batch) {
      if (j->result) j->result = r.error();
    }
    return;
  }
  stats_.writes += batch.size();
  stats_.transactions += 1;
  if (d == Durability::full) stats_.full_commits += 1;
}

Result<void> Registry::write(Durability d, std::function<Result<void>(sql::Db&)> fn) {
  Job job;
  job.fn = std::move(fn);
  job.durability = d;
  std::unique_lock<std::mutex> lk(queue_mu_);
  queue_.push_back(&job);
  while (!job.done) {
    if (!leader_active_) {
      // Leader: take everything queued so far (bounded) into one transaction. Writers that
      // arrive while it commits queue up and the next leader takes them together.
      leader_active_ = true;
      std::vector<Job*> batch;
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      lk.unlock();
      run_batch(batch);
      lk.lock();
      for (Job* j : batch) j->done = true;
      leader_active_ = false;
      queue_cv_.notify_all();
    } else {
      queue_cv_.wait(lk);
    }
  }
  return std::move(job.result);
}

WriteStats Registry::write_stats() const {
  std::lock_guard<std::mutex> g(db_mu_);
  return stats_;
}

// ---- records: load / store --------------------------------------------------------------------

namespace {

Result<bool> is_quarantined(sql::Db& db, std::string_view id, std::string* reason) {
  sql::StmtLease s = CUSTOS_TRY(db.cached("SELECT reason FROM quarantine WHERE execution_id = ?"));
  CUSTOS_TRYV(s->bind(1, id));
  bool const row = CUSTOS_TRY(s->step());
  if (row && reason != nullptr) *reason = s->text(0);
  return row;
}

Result<std::optional<ExecutionRecord>> select_record(sql::Db& db, std::string_view id) {
  std::string sql = "SELECT ";
  sql += detail::record_columns();
  sql += " FROM executions WHERE execution_id = ?";
  sql::StmtLease s = CUSTOS_TRY(db.cached(sql));
  CUSTOS_TRYV(s->bind(1, id));
  bool const row = CUSTOS_TRY(s->step());
  if (!row) return std::optional<ExecutionRecord>{};
  ExecutionRecord rec = CUSTOS_TRY(detail::decode_row(*s));
  return std::optional<ExecutionRecord>{std::move(rec)};
}

// Loads a trusted record: present, not quarantined, and still valid.
Result<ExecutionRecord> load_trusted(sql::Db& db, std::string_view id) {
  std::string reason;
  if (CUSTOS_TRY(is_quarantined(db, id, &reason))) {
    return Error{Errc::registry_corrupt_record, std::string{id} + " is quarantined: " + reason};
  }
  auto rec = CUSTOS_TRY(select_record(db, id));
  if (!rec) return Error{Errc::registry_not_found, "no execution " + std::string{id}};
  CUSTOS_TRYV(validate_record(*rec, /*deep=*/false));
  return std::move(*rec);
}

}  // namespace

Result<ExecutionRecord> Registry::load_for_update(sql::Db& db, std::string_view execution_id) {
  return load_trusted(db, execution_id);
}

Result<void> Registry::store(sql::Db& db, ExecutionRecord& rec) {
  rec.updated_ns = detail::now_ns();
  bool const insert = rec.created_ns == 0;
  if (insert) rec.created_ns = rec.updated_ns;
  rec.checksum = record_checksum(rec);
  // Never write a record that would be quarantined at the next open (the plan bytes are
  // decoded once, when the record is created; later writes cannot change them).
  CUSTOS_TRYV(validate_record(rec, /*deep=*/insert));
  return detail::write_row(db, rec, insert);
}

Result<void> Registry::modify(Durability d, std::string_view execution_id,
                              std::function<Result<void>(ExecutionRecord&)> change) {
  std::string const id{execution_id};
  return write(d, [this, &id, &change](sql::Db& db) -> Result<void> {
    ExecutionRecord rec = CUSTOS_TRY(load_for_update(db, id));
    CUSTOS_TRYV(change(rec));
    return store(db, rec);
  });
}

// ---- claims -----------------------------------------------------------------------------------

Result<void> Registry::consume_claim(std::string_view action_id, std::string_view process_id,
                                     std::string_view execution_id) {
  return consume_claim_with(action_id, process_id, execution_id,
                            [](sql::Db&) -> Result<void> { return ok(); });
}

Result<void> Registry::consume_claim_with(std::string_view action_id, std::string_view process_id,
                                          std::string_view execution_id,
                                          std::function<Result<void>(sql::Db&)> also) {
  if (action_id.empty() || process_id.empty() || execution_id.empty()) {
    return Error{Errc::plan_invalid_id, "claim needs action, process and execution ids"};
  }
  std::string const a{action_id}, p{process_id}, e{execution_id};
  // One job: `also` and the claim share its savepoint, so a refusal by either undoes both.
  if (auto wr =
          write(Durability::full,
                [&](sql::Db& db) -> Result<void> {
                  if (auto r = also(db); !r) return r;
                  sql::StmtLease q = CUSTOS_TRY(db.cached(
                      "SELECT execution_id FROM claims WHERE action_id = ? AND process_id = ?"));
                  CUSTOS_TRYV(q->bind(1, std::string_view{a}));
                  CUSTOS_TRYV(q->bind(2, std::string_view{p}));
                  if (CUSTOS_TRY(q->step())) {
                    return Error{Errc::registry_claim_consumed,
                                 "action " + a + " / process " + p +
                                     " was already consumed by execution " + q->text(0)};
                  }
                  sql::StmtLease ins =
                      CUSTOS_TRY(db.cached("INSERT INTO claims (action_id, process_id, "
                                           "execution_id, consumed_ns) VALUES (?,?,?,?)"));
                  CUSTOS_TRYV(ins->bind(1, std::string_view{a}));
                  CUSTOS_TRYV(ins->bind(2, std::string_view{p}));
                  CUSTOS_TRYV(ins->bind(3, std::string_view{e}));
                  CUSTOS_TRYV(ins->bind(4, detail::now_ns()));
                  return ins->run();
                });
      !wr)
    return std::move(wr).error();
  failpoint("after_claim");
  return ok();
}

Result<void> Registry::transact(Durability d, std::function<Result<void>(sql::Db&)> fn) {
  return write(d, std::move(fn));
}

Result<void> Registry::read(std::function<Result<void>(sql::Db&)> fn) {
  std::lock_guard<std::mutex> g(db_mu_);
  return fn(db_);
}

Result<std::optional<Claim>> Registry::find_claim(std::string_view action_id,
                                                  std::string_view process_id) {
  std::lock_guard<std::mutex> g(db_mu_);
  sql::Stmt q = CUSTOS_TRY(db_.prepare(
      "SELECT execution_id, consumed_ns FROM claims WHERE action_id = ? AND process_id = ?"));
  CUSTOS_TRYV(q.bind(1, action_id));
  CUSTOS_TRYV(q.bind(2, process_id));
  if (!CUSTOS_TRY(q.step())) return std::optional<Claim>{};
  return std::optional<Claim>{
      Claim{std::string{action_id}, std::string{process_id}, q.text(0), q.int64(1)}};
}

Result<std::vector<Claim>> Registry::orphan_claims() {
  std::lock_guard<std::mutex> g(db_mu_);
  sql::Stmt q = CUSTOS_TRY(db_.prepare(
      "SELECT c.action_id, c.process_id, c.execution_id, c.consumed_ns FROM claims c "
      "WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.execution_id = c.execution_id) "
      "ORDER BY c.consumed_ns, c.action_id, c.process_id"));
  std::vector<Claim> out;
  while (CUSTOS_TRY(q.step())) out.push_back(Claim{q.text(0), q.text(1), q.text(2), q.int64(3)});
  return out;
}

// ---- records: writes --------------------------------------------------------------------------

Result<void> Registry::create_execution(NewExecution const& ex) {
  if (ex.plan_digest != sha256_tagged(ex.plan_canonical)) {
    return Error{Errc::auth_digest_mismatch,
                 ex.execution_id + ": plan digest does not match the canonical plan bytes"};
  }
  return write(options_.ownership_durability, [this, &ex](sql::Db& db) -> Result<void> {
    {
      sql::StmtLease q = CUSTOS_TRY(
          db.cached("SELECT execution_id FROM claims WHERE action_id = ? AND process_id = ?"));
      CUSTOS_TRYV(q->bind(1, std::string_view{ex.action_id}));
      CUSTOS_TRYV(q->bind(2, std::string_view{ex.process_id}));
      if (!CUSTOS_TRY(q->step())) {
        return Error{Errc::registry_not_found, "no consumed claim for action " + ex.action_id +
                                                   " / process " + ex.process_id};
      }
      if (q->text(0) != ex.execution_id) {
        return Error{Errc::registry_claim_consumed,
                     "the claim of action " + ex.action_id + " belongs to execution " + q->text(0)};
      }
    }
    if (auto existing = CUSTOS_TRY(select_record(db, ex.execution_id)); existing) {
      return Error{Errc::registry_corrupt_record, "execution " + ex.execution_id + " exists"};
    }
    ExecutionRecord rec;
    rec.execution_id = ex.execution_id;
    rec.action_id = ex.action_id;
    rec.process_id = ex.process_id;
    rec.session_id = ex.session_id;
    rec.plan_canonical = ex.plan_canonical;
    rec.plan_digest = ex.plan_digest;
    rec.backend = ex.backend;
    rec.phase = core::Phase::authorized;
    return store(db, rec);
  });
}

Result<void> Registry::record_authorized(NewExecution const& ex) {
  CUSTOS_TRYV(consume_claim(ex.action_id, ex.process_id, ex.execution_id));
  return create_execution(ex);
}

namespace {
Error illegal_step(ExecutionRecord const& rec, std::string what) {
  return Error{Errc::registry_illegal_phase,
               rec.execution_id + " (phase " + std::string{core::phase_wire(rec.phase)} +
                   ", ownership " + std::string{ownership_state_wire(rec.ownership.state)} +
                   "): " + std::move(what)};
}

Result<void> step_phase(ExecutionRecord& rec, core::Phase to,
                        core::RecoveryPath via = core::RecoveryPath::observed) {
  if (!core::is_legal_progression(rec.phase, to, via)) {
    return illegal_step(rec, "illegal progression to " + std::string{core::phase_wire(to)});
  }
  rec.phase = to;
  return ok();
}
}  // namespace

Result<void> Registry::record_staged(std::string_view execution_id, Ownership const& staged,
                                     BoundaryInfo const& boundary) {
  if (staged.state != OwnershipState::staged) {
    return Error{Errc::registry_illegal_phase, "record_staged needs an ownership in state staged"};
  }
  if (auto wr = modify(options_.ownership_durability, execution_id,
                       [&](ExecutionRecord& rec) -> Result<void> {
                         if (rec.ownership.state == OwnershipState::legacy_unverified) {
                           return Error{Errc::registry_legacy_unverified,
                                        rec.execution_id + ": legacy ownership is never replaced"};
                         }
                         if (rec.ownership.state != OwnershipState::unassigned) {
                           return illegal_step(rec, "ownership already assigned");
                         }
                         if (rec.phase == core::Phase::authorized) {
                           CUSTOS_TRYV(step_phase(rec, core::Phase::starting));
                         } else if (rec.phase != core::Phase::starting) {
                           return illegal_step(rec, "staging outside the starting phase");
                         }
                         rec.ownership = staged;
                         rec.boundary = boundary;
                         return ok();
                       });
      !wr)
    return std::move(wr).error();
  failpoint("after_staged");
  return ok();
}

Result<void> Registry::record_committed(std::string_view execution_id) {
  if (auto wr = modify(options_.ownership_durability, execution_id,
                       [&](ExecutionRecord& rec) -> Result<void> {
                         if (rec.ownership.state == OwnershipState::legacy_unverified) {
                           return Error{
                               Errc::registry_legacy_unverified,
                               rec.execution_id + ": legacy ownership cannot be committed"};
                         }
                         if (rec.ownership.state != OwnershipState::staged ||
                             rec.phase != core::Phase::starting) {
                           return illegal_step(rec, "commit needs staged ownership while starting");
                         }
                         rec.ownership.state = OwnershipState::committed;
                         return ok();
                       });
      !wr)
    return std::move(wr).error();
  failpoint("after_committed");
  return ok();
}

Result<void> Registry::record_phase(std::string_view execution_id, core::Phase phase) {
  if (phase == core::Phase::terminal) {
    return Error{Errc::registry_illegal_phase, "terminal is written by record_terminal only"};
  }
  if (auto wr = modify(options_.ownership_durability, execution_id,
                       [&](ExecutionRecord& rec) -> Result<void> {
                         if (phase == core::Phase::running &&
                             rec.ownership.state != OwnershipState::committed) {
                           return illegal_step(rec, "running needs committed pidfs ownership");
                         }
                         return step_phase(rec, phase);
                       });
      !wr)
    return std::move(wr).error();
  if (phase == core::Phase::running) failpoint("while_running");
  if (phase == core::Phase::stopping) failpoint("while_stopping");
  return ok();
}

Result<void> Registry::record_trigger(std::string_view execution_id, core::Trigger trigger) {
  return modify(
      options_.ownership_durability, execution_id, [&](ExecutionRecord& rec) -> Result<void> {
        if (rec.phase == core::Phase::terminal) {
          return illegal_step(rec, "trigger after the terminal record");
        }
        if (rec.trigger && *rec.trigger != trigger) {
          return illegal_step(rec, "a different trigger was accepted first (" +
                                       std::string{core::trigger_wire(*rec.trigger)} + ")");
        }
        rec.trigger = trigger;
        return ok();
      });
}

Result<void> Registry::record_output(std::string_view execution_id, int stream_index,
                                     core::StreamAccounting const& accounting) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  CUSTOS_TRYV(accounting.check());
  return modify(options_.ownership_durability, execution_id,
                [&](ExecutionRecord& rec) -> Result<void> {
                  if (rec.phase == core::Phase::terminal) {
                    return illegal_step(rec, "accounting after the terminal record");
                  }
                  auto& s = stream_index == 0 ? rec.out : rec.err;
                  if (accounting.observed < s.accounting.observed) {
                    return Error{Errc::accounting_invariant,
                                 rec.execution_id + ": observed bytes went backwards"};
                  }
                  s.accounting = accounting;
                  return ok();
                });
}

Result<void> Registry::record_publication(std::string_view execution_id, int stream_index,
                                          std::uint64_t published_bytes, bool done) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  // Publication happens after the terminal record and never rewrites it: only the progress
  // columns change.
  return modify(options_.ownership_durability, execution_id,
                [&](ExecutionRecord& rec) -> Result<void> {
                  auto& s = stream_index == 0 ? rec.out : rec.err;
                  if (published_bytes < s.published_bytes || (s.publication_done && !done)) {
                    return Error{Errc::accounting_invariant,
                                 rec.execution_id + ": publication progress went backwards"};
                  }
                  s.published_bytes = published_bytes;
                  s.publication_done = done;
                  return ok();
                });
}

Result<void> Registry::record_terminal(std::string_view execution_id, TerminalBlob const& t,
                                       core::RecoveryPath via) {
  failpoint("before_terminal");
  if (t.digest != sha256_tagged(t.bytes)) {
    return Error{Errc::registry_corrupt_record,
                 std::string{execution_id} + ": terminal digest does not match its bytes"};
  }
  return modify(options_.terminal_durability, execution_id,
                [&](ExecutionRecord& rec) -> Result<void> {
                  if (rec.phase == core::Phase::terminal) {
                    return illegal_step(rec, "a terminal record exists; exactly one is allowed");
                  }
                  CUSTOS_TRYV(step_phase(rec, core::Phase::terminal, via));
                  rec.terminal = t;
                  return ok();
                });
}

Result<void> Registry::record_recovered(std::string_view execution_id,
                                        std::vector<core::Phase> const& steps,
                                        TerminalBlob const& t, core::RecoveryPath via) {
  if (t.digest != sha256_tagged(t.bytes)) {
    return Error{Errc::registry_corrupt_record,
                 std::string{execution_id} + ": terminal digest does not match its bytes"};
  }
  return modify(
      options_.terminal_durability, execution_id, [&](ExecutionRecord& rec) -> Result<void> {
        for (core::Phase const p : steps) {
          if (p == core::Phase::terminal) return illegal_step(rec, "terminal in steps");
          if (p == core::Phase::running && rec.ownership.state != OwnershipState::committed) {
            return illegal_step(rec, "running needs committed pidfs ownership");
          }
          CUSTOS_TRYV(step_phase(rec, p));
        }
        if (rec.phase == core::Phase::terminal) {
          return illegal_step(rec, "a terminal record exists; exactly one is allowed");
        }
        CUSTOS_TRYV(step_phase(rec, core::Phase::terminal, via));
        rec.terminal = t;
        return ok();
      });
}

// ---- reads ------------------------------------------------------------------------------------

Result<ExecutionRecord> Registry::get(std::string_view execution_id) {
  std::lock_guard<std::mutex> g(db_mu_);
  return load_trusted(db_, execution_id);
}

Result<std::vector<ExecutionRecord>> Registry::list(ListFilter const& filter) {
  std::lock_guard<std::mutex> g(db_mu_);
  std::string sql = "SELECT ";
  sql += detail::record_columns();
  sql +=
      " FROM executions e WHERE execution_id > ?1 AND (?2 IS NULL OR phase = ?2) AND "
      "(?3 IS NULL OR session_id = ?3) AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE "
      "q.execution_id = e.execution_id) ORDER BY execution_id LIMIT ?4";
  sql::Stmt s = CUSTOS_TRY(db_.prepare(sql));
  CUSTOS_TRYV(s.bind(1, std::string_view{filter.after_id}));
  CUSTOS_TRYV(s.bind(2, filter.phase
                            ? std::optional<std::string_view>{core::phase_wire(*filter.phase)}
                            : std::nullopt));
  CUSTOS_TRYV(s.bind(
      3, filter.session_id ? std::optional<std::string_view>{*filter.session_id} : std::nullopt));
  CUSTOS_TRYV(s.bind(4, static_cast<std::int64_t>(filter.limit)));
  std::vector<ExecutionRecord> out;
  while (CUSTOS_TRY(s.step())) {
    // A row that fails here changed after open's validation; it is skipped from listings (get()
    // reports it) and quarantined at the next revalidate().
    auto rec = detail::decode_row(s);
    if (!rec || !validate_record(*rec, /*deep=*/false)) continue;
    out.push_back(std::move(*rec));
  }
  return out;
}

Result<std::vector<ExecutionRecord>> Registry::non_terminal() {
  // Selected by SQL, so a registry with many finished executions does not load them all.
  std::lock_guard<std::mutex> g(db_mu_);
  std::string sql = "SELECT ";
  sql += detail::record_columns();
  sql +=
      " FROM executions e WHERE phase <> 'terminal' AND NOT EXISTS (SELECT 1 FROM quarantine q "
      "WHERE q.execution_id = e.execution_id) ORDER BY execution_id";
  sql::Stmt s = CUSTOS_TRY(db_.prepare(sql));
  std::vector<ExecutionRecord> out;
  while (CUSTOS_TRY(s.step())) {
    auto rec = detail::decode_row(s);
    if (!rec || !validate_record(*rec, /*deep=*/false)) continue;  // see list()
    out.push_back(std::move(*rec));
  }
  return out;
}

Result<std::size_t> Registry::count_terminal() {
  std::lock_guard<std::mutex> g(db_mu_);
  auto n = CUSTOS_TRY(db_.query_int("SELECT count(*) FROM executions WHERE phase = 'terminal'"));
  return static_cast<std::size_t>(n.value_or(0));
}

Result<std::vector<QuarantinedRecord>> Registry::quarantined() {
  std::lock_guard<std::mutex> g(db_mu_);
  sql::Stmt s = CUSTOS_TRY(db_.prepare(
      "SELECT execution_id, code, reason, detected_ns FROM quarantine ORDER BY execution_id"));
  std::vector<QuarantinedRecord> out;
  while (CUSTOS_TRY(s.step())) {
    out.push_back(QuarantinedRecord{s.text(0), s.text(1), s.text(2), s.int64(3)});
  }
  return out;
}

Result<std::size_t> Registry::revalidate() {
  std::size_t added = 0;
  if (auto wr = write(
          Durability::full,
          [&](sql::Db& db) -> Result<void> {
            std::string sql = "SELECT ";
            sql += detail::record_columns();
            sql +=
                " FROM executions e WHERE NOT EXISTS (SELECT 1 FROM quarantine q WHERE "
                "q.execution_id = "
                "e.execution_id)";
            std::vector<std::pair<std::string, Error>> bad;
            {
              sql::Stmt s = CUSTOS_TRY(db.prepare(sql));
              while (CUSTOS_TRY(s.step())) {
                auto rec = detail::decode_row(s);
                if (!rec) {
                  bad.emplace_back(s.text(0), rec.error());
                  continue;
                }
                if (auto v = validate_record(*rec); !v)
                  bad.emplace_back(rec->execution_id, v.error());
              }
            }
            for (auto const& [id, err] : bad) {
              sql::Stmt ins = CUSTOS_TRY(db.prepare(
                  "INSERT OR IGNORE INTO quarantine (execution_id, code, reason, detected_ns) "
                  "VALUES (?,?,?,?)"));
              CUSTOS_TRYV(ins.bind(1, std::string_view{id}));
              CUSTOS_TRYV(ins.bind(2, err.wire()));
              CUSTOS_TRYV(ins.bind(3, std::string_view{err.context}));
              CUSTOS_TRYV(ins.bind(4, detail::now_ns()));
              CUSTOS_TRYV(ins.run());
              ++added;
            }
            return ok();
          });
      !wr)
    return std::move(wr).error();
  return added;
}

}  // namespace custos::registry
