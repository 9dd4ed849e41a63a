// Registry: loading and storing records, creating them, reads and quarantine.
#include <functional>
#include <set>
#include <vector>

#include "custos/registry/registry.hpp"

#include "registry_internal.hpp"
#include "schema.hpp"

namespace custos::registry {

// ---- records: load / store --------------------------------------------------------------------

namespace {

Result<bool> is_quarantined(sql::Db& db, std::string_view id, std::string* reason) {
  sql::StmtLease s = CUSTOS_TRY(db.cached("SELECT reason FROM quarantine WHERE execution_id = ?"));
  CUSTOS_TRYV(s->bind(1, id));
  bool const row = CUSTOS_TRY(s->step());
  if (row && reason != nullptr) *reason = s->text(0);
  return row;
}

// The records `where` selects (a condition on `executions e`, then its ORDER BY and LIMIT; `bind`
// binds its parameters), quarantined ones left out. A row that fails validation here changed
// after open's validation: it is skipped from listings (get() reports it) and quarantined at the
// next revalidate().
Result<std::vector<ExecutionRecord>> select_valid(
    sql::Db& db, std::string_view where, std::function<Result<void>(sql::Stmt&)> const& bind) {
  std::string sql = "SELECT ";
  sql += detail::record_columns();
  sql += " FROM executions e WHERE ";
  sql += where;
  sql::Stmt s = CUSTOS_TRY(db.prepare(sql));
  if (bind) CUSTOS_TRYV(bind(s));
  std::vector<ExecutionRecord> out;
  while (CUSTOS_TRY(s.step())) {
    auto rec = detail::decode_row(s);
    if (!rec || !validate_record(*rec, /*deep=*/false)) continue;
    out.push_back(std::move(*rec));
  }
  return out;
}

constexpr std::string_view kNotQuarantined =
    "NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.execution_id = e.execution_id)";

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

// Loads a trusted record: present, not quarantined, and still valid. `quarantined` is the
// registry's copy of the quarantine table's ids (the table changes only in revalidate(), under
// the same lock): a record not in it needs no query for its quarantine reason.
Result<ExecutionRecord> load_trusted(sql::Db& db, std::string_view id,
                                     std::set<std::string, std::less<>> const& quarantined) {
  std::string reason;
  if (quarantined.contains(id) && CUSTOS_TRY(is_quarantined(db, id, &reason))) {
    return Error{Errc::registry_corrupt_record, std::string{id} + " is quarantined: " + reason};
  }
  auto rec = CUSTOS_TRY(select_record(db, id));
  if (!rec) return Error{Errc::registry_not_found, "no execution " + std::string{id}};
  CUSTOS_TRYV(validate_record(*rec, /*deep=*/false));
  return std::move(*rec);
}

// A new record's plan digest is the digest of its canonical plan bytes (checked before any job
// is queued).
Result<void> check_plan_digest(NewExecution const& ex) {
  if (ex.plan_digest == sha256_tagged(ex.plan_canonical)) return ok();
  return Error{Errc::auth_digest_mismatch,
               ex.execution_id + ": plan digest does not match the canonical plan bytes"};
}

}  // namespace

Result<ExecutionRecord> Registry::load_for_update(sql::Db& db, std::string_view execution_id) {
  // The daemon holds the file exclusively (flock + locking_mode EXCLUSIVE): a record this
  // registry wrote or verified cannot have changed under it. Quarantine is checked first (the
  // set only grows, in revalidate()).
  if (!quarantined_ids_.contains(execution_id)) {
    // A version stored earlier in this very transaction (not yet committed, so not cached).
    for (auto it = cache_.staged.rbegin(); it != cache_.staged.rend(); ++it) {
      if (it->execution_id == execution_id) {
        ++stats_.cache_hits;
        return *it;
      }
    }
    if (auto it = cache_.entries.find(execution_id); it != cache_.entries.end()) {
      ++stats_.cache_hits;
      return it->second.rec;
    }
  }
  ++stats_.cache_misses;
  return load_trusted(db, execution_id, quarantined_ids_);
}

Result<void> Registry::store(sql::Db& db, ExecutionRecord& rec) {
  rec.updated_ns = detail::now_ns();
  bool const insert = rec.created_ns == 0;
  if (insert) rec.created_ns = rec.updated_ns;
  rec.checksum = record_checksum(rec);
  // Never write a record that would be quarantined at the next open (the plan bytes are
  // decoded once, when the record is created; later writes cannot change them). The checksum
  // was just computed from these bytes and the plan digest was verified when the record was
  // loaded (or, for a new one, by the caller), so only the content is re-checked here.
  CUSTOS_TRYV(validate_record_content(rec, /*deep=*/insert));
  return detail::write_row(db, rec, insert);
}

Result<void> Registry::modify(Durability d, WriteMode mode, std::string_view execution_id,
                              char const* what,
                              std::function<Result<void>(ExecutionRecord&)> change, bool atomic,
                              std::function<void(Result<void>)> done) {
  std::unique_lock<std::mutex> lk(queue_.mu);
  // Joins the record job of the same execution at the tail of the queue (not yet taken by a
  // leader, so still ours to extend): one load and one store for both.
  std::shared_ptr<Job> job;
  if (!queue_.jobs.empty() && !queue_.jobs.back()->changes.empty() &&
      queue_.jobs.back()->execution_id == execution_id) {
    job = queue_.jobs.back();
  } else {
    job = std::make_shared<Job>();
    job->execution_id = std::string{execution_id};
    queue_.jobs.push_back(job);
  }
  job->durability = detail::stricter(job->durability, d);
  // The change owns what it uses: a deferred one runs after this call has returned.
  job->changes.push_back(Change{std::move(change), mode == WriteMode::deferred, what, atomic, ok(),
                                mode == WriteMode::deferred ? std::move(done) : nullptr});
  std::size_t const mine = job->changes.size() - 1;
  if (mode == WriteMode::deferred) {
    ++job->deferred;
    ++queue_.deferred_queued;
    ++queue_.deferred_total;
    return ok();
  }
  drive(job, lk);
  return std::move(job->changes[mine].result);
}

// ---- records: creation ------------------------------------------------------------------------

Result<void> Registry::create_record_job(sql::Db& db, NewExecution const& ex, bool claim_checked) {
  if (!claim_checked) {
    sql::StmtLease q = CUSTOS_TRY(
        db.cached("SELECT execution_id FROM claims WHERE action_id = ? AND process_id = ?"));
    CUSTOS_TRYV(q->bind(1, std::string_view{ex.action_id}));
    CUSTOS_TRYV(q->bind(2, std::string_view{ex.process_id}));
    if (!CUSTOS_TRY(q->step())) {
      return Error{Errc::registry_not_found,
                   "no consumed claim for action " + ex.action_id + " / process " + ex.process_id};
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
  CUSTOS_TRYV(store(db, rec));
  cache_.staged.push_back(std::move(rec));
  return ok();
}

Result<void> Registry::create_execution(NewExecution const& ex, WriteMode mode) {
  CUSTOS_TRYV(check_plan_digest(ex));
  if (mode == WriteMode::deferred) {
    enqueue_deferred(options_.ownership_durability, ex.execution_id, "create_execution",
                     [this, ex](sql::Db& db) { return create_record_job(db, ex, false); });
    return ok();
  }
  return write(options_.ownership_durability,
               [this, &ex](sql::Db& db) { return create_record_job(db, ex, false); });
}

Result<void> Registry::record_authorized(NewExecution const& ex, Durability d) {
  return record_authorized_with(
      ex, [](sql::Db&) -> Result<void> { return ok(); }, d);
}

void Registry::record_authorized_async(NewExecution ex, Durability d,
                                       std::function<void(Result<void>)> done) {
  if (auto r = check_plan_digest(ex); !r) return done(std::move(r));
  if (auto r = detail::check_claim_ids(ex.action_id, ex.process_id, ex.execution_id); !r)
    return done(std::move(r));
  std::string id = ex.execution_id;
  auto shared = std::make_shared<NewExecution const>(std::move(ex));
  JobFn fn = claim_fn(
      shared->action_id, shared->process_id, id, [](sql::Db&) -> Result<void> { return ok(); },
      [this, shared](sql::Db& db) { return create_record_job(db, *shared, true); });
  enqueue_deferred(detail::claim_durability(d), std::move(id), "record_authorized", std::move(fn),
                   detail::after_commit({"after_claim"}, std::move(done)));
}

Result<void> Registry::record_authorized_with(NewExecution const& ex,
                                              std::function<Result<void>(sql::Db&)> before,
                                              Durability d) {
  CUSTOS_TRYV(check_plan_digest(ex));
  // The claim and its record in one job of a FULL transaction: one fsync instead of a FULL and
  // a NORMAL commit, and the record is as durable as the claim.
  return claim_job(
      ex.action_id, ex.process_id, ex.execution_id, std::move(before),
      // The claim was inserted for this very execution just before, in this job.
      [this, &ex](sql::Db& db) { return create_record_job(db, ex, true); },
      detail::claim_durability(d));
}

// ---- reads ------------------------------------------------------------------------------------

Result<ExecutionRecord> Registry::get(std::string_view execution_id) {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  return load_trusted(db_, execution_id, quarantined_ids_);
}

Result<std::vector<ExecutionRecord>> Registry::list(ListFilter const& filter) {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  std::string const where =
      "execution_id > ?1 AND (?2 IS NULL OR phase = ?2) AND (?3 IS NULL OR session_id = ?3) "
      "AND " +
      std::string{kNotQuarantined} + " ORDER BY execution_id LIMIT ?4";
  return select_valid(db_, where, [&filter](sql::Stmt& s) -> Result<void> {
    CUSTOS_TRYV(s.bind(1, std::string_view{filter.after_id}));
    CUSTOS_TRYV(s.bind(2, filter.phase
                              ? std::optional<std::string_view>{core::phase_wire(*filter.phase)}
                              : std::nullopt));
    CUSTOS_TRYV(s.bind(
        3, filter.session_id ? std::optional<std::string_view>{*filter.session_id} : std::nullopt));
    return s.bind(4, static_cast<std::int64_t>(filter.limit));
  });
}

Result<std::vector<ExecutionRecord>> Registry::non_terminal() {
  CUSTOS_TRYV(settle_deferred());
  // Selected by SQL, so a registry with many finished executions does not load them all.
  std::lock_guard<std::mutex> g(db_mu_);
  return select_valid(
      db_, "phase <> 'terminal' AND " + std::string{kNotQuarantined} + " ORDER BY execution_id",
      nullptr);
}

Result<std::vector<ExecutionRecord>> Registry::unpublished(std::string_view after_id,
                                                           std::size_t limit) {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  std::string const where =
      "phase = 'terminal' AND (out_pub_done = 0 OR err_pub_done = 0) AND execution_id > ?1 AND " +
      std::string{kNotQuarantined} + " ORDER BY execution_id LIMIT ?2";
  return select_valid(db_, where, [after_id, limit](sql::Stmt& s) -> Result<void> {
    CUSTOS_TRYV(s.bind(1, after_id));
    return s.bind(2, static_cast<std::int64_t>(limit));
  });
}

Result<std::size_t> Registry::count_terminal() {
  CUSTOS_TRYV(settle_deferred());
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
            // The ids the write path checks before it trusts a record (load_trusted).
            std::set<std::string, std::less<>> ids;
            sql::Stmt q = CUSTOS_TRY(db.prepare("SELECT execution_id FROM quarantine"));
            while (CUSTOS_TRY(q.step())) ids.insert(q.text(0));
            quarantined_ids_ = std::move(ids);
            return ok();
          });
      !wr)
    return std::move(wr).error();
  return added;
}

}  // namespace custos::registry
