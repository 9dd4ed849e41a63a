// Registry: the group-commit write path (queue, batch leader, deferred writes) and the
// write-through record cache.
#include <cerrno>
#include <iterator>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/registry.hpp"

#include "registry_internal.hpp"

namespace custos::registry {

// ---- write path (group commit) ----------------------------------------------------------------

Result<void> Registry::set_synchronous(Durability d) {
  // A group commit is a NORMAL commit to SQLite; the flusher adds the fdatasync.
  if (d == Durability::group) d = Durability::normal;
  if (current_sync_ == d) return ok();
  CUSTOS_TRYV(db_.exec_cached(d == Durability::full ? "PRAGMA synchronous = FULL"
                                                    : "PRAGMA synchronous = NORMAL"));
  current_sync_ = d;
  return ok();
}

namespace {
template <class Batch>
std::uint64_t counted(Batch const& batch) {
  std::uint64_t n = 0;
  for (auto const& j : batch) n += !j->changes.empty() ? j->changes.size() : 1;
  return n;
}
}  // namespace

void Registry::run_batch(std::vector<std::shared_ptr<Job>> const& batch) {
  std::lock_guard<std::mutex> g(db_mu_);
  // The batch commits with the strictest durability any of its jobs asked for: one fsync then
  // covers every job in it (and, WAL being ordered, every earlier NORMAL commit too).
  Durability d = Durability::normal;
  for (auto const& j : batch) d = detail::stricter(d, j->durability);
  auto run = [this](Job& j) { return j.changes.empty() ? j.fn(db_) : apply_changes(db_, j); };
  // A job that failed as a whole (or whose transaction failed) fails every change in it.
  auto fail = [](Job& j, Error const& e) {
    j.result = e;
    for (Change& c : j.changes) {
      if (c.result) c.result = e;
    }
  };
  auto fail_all = [&](Error const& e) {
    for (auto const& j : batch) {
      fail(*j, e);
      j->transaction_failed = true;
    }
  };
  if (writes_refused_.load(std::memory_order_acquire)) {
    // An fdatasync of the WAL failed: the kernel may have dropped dirty pages of committed
    // transactions, so nothing written from now on could honestly be called durable.
    return fail_all(Error{Errc::registry_io,
                          "the registry refuses writes: an fdatasync of its WAL failed earlier "
                          "(restart the daemon; recovery re-reads what reached the disk)",
                          EIO});
  }
  staged_records_.clear();
  if (auto r = set_synchronous(d); !r) return fail_all(r.error());
  if (auto r = db_.exec_cached("BEGIN IMMEDIATE"); !r) return fail_all(r.error());
  if (batch.size() == 1) {
    // Alone in its transaction: a refused job simply rolls the transaction back.
    Job& j = *batch.front();
    j.result = run(j);
    if (!j.result) {
      (void)db_.exec_cached("ROLLBACK");
      fail(j, j.result.error());
      unstage_failed(0, j);
      stats_.writes += counted(batch);
      return;
    }
  } else {
    for (auto const& j : batch) {
      // Each job runs inside its own savepoint, so one refused job does not undo the others.
      if (auto r = db_.exec_cached("SAVEPOINT job"); !r) {
        fail(*j, r.error());
        continue;
      }
      std::size_t const mark = staged_records_.size();
      j->result = run(*j);
      if (!j->result) {
        (void)db_.exec_cached("ROLLBACK TO job");
        fail(*j, j->result.error());
        unstage_failed(mark, *j);
      }
      (void)db_.exec_cached("RELEASE job");
    }
  }
  if (auto r = db_.exec_cached("COMMIT"); !r) {
    (void)db_.exec_cached("ROLLBACK");
    fail_all(r.error());
    // The file is as it was before BEGIN: nothing staged may reach the cache, and the entries
    // of every record the batch touched are dropped (reloaded and verified next time).
    for (auto const& j : batch) unstage_failed(0, *j);
    staged_records_.clear();
    stats_.writes += counted(batch);
    return;
  }
  commit_staged();
  stats_.writes += counted(batch);
  stats_.transactions += 1;
  if (d == Durability::full) stats_.full_commits += 1;
  note_commit(d, batch);
}

// ---- write-through record cache -----------------------------------------------------------------

void Registry::cache_drop(std::string_view execution_id) {
  auto it = cache_.find(execution_id);
  if (it == cache_.end()) return;
  cache_order_.erase(it->second.order);
  cache_.erase(it);
}

void Registry::cache_put(ExecutionRecord rec) {
  // Only live executions: a terminal record is written at most once more (publication
  // progress), not worth the memory.
  if (rec.phase == core::Phase::terminal || options_.record_cache_entries == 0) {
    cache_drop(rec.execution_id);
    return;
  }
  if (auto it = cache_.find(rec.execution_id); it != cache_.end()) {
    it->second.rec = std::move(rec);
    cache_order_.splice(cache_order_.end(), cache_order_, it->second.order);
    return;
  }
  while (cache_.size() >= options_.record_cache_entries) {
    cache_.erase(cache_order_.front());
    cache_order_.pop_front();
  }
  cache_order_.push_back(rec.execution_id);
  std::string id = rec.execution_id;
  cache_.emplace(std::move(id), CacheEntry{std::move(rec), std::prev(cache_order_.end())});
}

void Registry::unstage_failed(std::size_t mark, Job const& job) {
  // The job's savepoint (or the transaction) was rolled back: what it staged never happened.
  // A job that wrote nothing (every change refused before any SQL) leaves the file as the cache
  // says; anything else drops the entries it may have touched.
  if (!job.refused_only) {
    for (std::size_t i = mark; i < staged_records_.size(); ++i) {
      cache_drop(staged_records_[i].execution_id);
    }
    if (!job.changes.empty()) cache_drop(job.execution_id);
  }
  if (mark < staged_records_.size()) {
    staged_records_.erase(staged_records_.begin() + static_cast<std::ptrdiff_t>(mark),
                          staged_records_.end());
  }
}

void Registry::commit_staged() {
  // In commit order: the last version of a record staged in this transaction wins.
  for (ExecutionRecord& rec : staged_records_) cache_put(std::move(rec));
  staged_records_.clear();
}

std::optional<ExecutionRecord> Registry::cached_record(std::string_view execution_id) const {
  std::lock_guard<std::mutex> g(db_mu_);
  auto it = cache_.find(execution_id);
  if (it == cache_.end()) return std::nullopt;
  return it->second.rec;
}

// ---- the write queue and its leader -----------------------------------------------------------

Result<void> Registry::apply_changes(sql::Db& db, Job& job) {
  ExecutionRecord rec = CUSTOS_TRY(load_for_update(db, job.execution_id));
  bool changed = false;
  if (job.changes.size() == 1) {
    Change& c = job.changes.front();
    c.result = c.fn(rec);
    changed = c.result.has_value();
  } else {
    for (Change& c : job.changes) {
      if (c.atomic) {
        // Checks everything before it changes anything: a refusal leaves the record as it was.
        c.result = c.fn(rec);
        changed = changed || c.result.has_value();
        continue;
      }
      // On a copy: a refused change leaves nothing of itself behind.
      ExecutionRecord trial = rec;
      c.result = c.fn(trial);
      if (c.result) {
        rec = std::move(trial);
        changed = true;
      }
    }
  }
  if (!changed) {
    // Every change was refused: nothing to store; the job's error is the first refusal.
    job.refused_only = true;
    return job.changes.front().result.error();
  }
  CUSTOS_TRYV(store(db, rec));
  staged_records_.push_back(std::move(rec));
  return ok();
}

void Registry::keep_deferred_errors(Job const& job) {
  // Nobody waits for a deferred write: keep its refusal for the execution's owner.
  auto keep = [this](std::string const& id, char const* what, Error e) {
    ++deferred_failed_;
    if (deferred_errors_.contains(id)) return;
    e.context = std::string{"deferred "} + what + ": " + e.context;
    deferred_errors_.emplace(id, std::move(e));
  };
  if (job.changes.empty()) {
    // A job with a completion tells its refusal there.
    if (job.deferred > 0 && !job.result && !job.on_done)
      keep(job.execution_id, job.what, job.result.error());
    return;
  }
  for (Change const& c : job.changes) {
    if (c.deferred && !c.done && !c.result) keep(job.execution_id, c.what, c.result.error());
  }
}

void Registry::drive(std::shared_ptr<Job> const& job, std::unique_lock<std::mutex>& lk) {
  while (!job->done) {
    if (!leader_active_) {
      lead(lk);
    } else {
      queue_cv_.wait(lk);
    }
  }
}

void Registry::lead(std::unique_lock<std::mutex>& lk) {
  // Leader: take everything queued so far (bounded) into one transaction. Writers that
  // arrive while it commits queue up and the next leader takes them together. Deferred
  // writes queued earlier ride along, ahead of the writes queued after them.
  leader_active_ = true;
  std::vector<std::shared_ptr<Job>> batch;
  while (!queue_.empty() && batch.size() < options_.max_batch) {
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
    deferred_queued_ -= batch.back()->deferred;
  }
  lk.unlock();
  run_batch(batch);
  lk.lock();
  std::vector<std::pair<std::function<void(Result<void>)>, Result<void>>> told;
  for (auto const& j : batch) {
    j->done = true;
    keep_deferred_errors(*j);
    if (j->on_done) told.emplace_back(std::move(j->on_done), j->result);
    for (Change& c : j->changes) {
      if (c.done) told.emplace_back(std::move(c.done), c.result);
    }
  }
  leader_active_ = false;
  queue_cv_.notify_all();
  if (!told.empty()) {
    // Outside the queue lock: a completion may queue the next write.
    lk.unlock();
    for (auto& [done, result] : told) done(std::move(result));
    lk.lock();
  }
}

Result<void> Registry::write(Durability d, JobFn fn, std::string group_id) {
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  job->durability = d;
  job->execution_id = std::move(group_id);
  std::unique_lock<std::mutex> lk(queue_mu_);
  queue_.push_back(job);
  drive(job, lk);
  return std::move(job->result);
}

void Registry::enqueue_deferred(Durability d, std::string execution_id, char const* what, JobFn fn,
                                std::function<void(Result<void>)> on_done) {
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  job->on_done = std::move(on_done);
  job->durability = d;
  job->deferred = 1;
  job->execution_id = std::move(execution_id);
  job->what = what;
  std::lock_guard<std::mutex> lk(queue_mu_);
  queue_.push_back(std::move(job));
  ++deferred_queued_;
  ++deferred_total_;
}

Result<void> Registry::flush() {
  std::unique_lock<std::mutex> lk(queue_mu_);
  if (deferred_queued_ == 0) return ok();
  lk.unlock();
  // A crash here loses every queued write: the deferred crash tests stop the daemon exactly
  // at this instant.
  failpoint("flush_with_writes_queued");
  lk.lock();
  if (deferred_queued_ == 0) return ok();  // another thread's write took them meanwhile
  // The queue is FIFO: once its last job is done, so is every deferred write queued before it.
  std::shared_ptr<Job> const last = queue_.back();
  drive(last, lk);
  // A deferred write's own refusal is kept per execution; only a failed transaction is ours.
  if (last->transaction_failed) return last->result;
  return ok();
}

bool Registry::try_flush() {
  std::unique_lock<std::mutex> lk(queue_mu_);
  if (leader_active_ || deferred_queued_ == 0) return false;
  lk.unlock();
  failpoint("flush_with_writes_queued");  // as flush(): a crash loses every queued write
  lk.lock();
  if (leader_active_ || deferred_queued_ == 0) return false;
  // One batch as the leader (none was active, so nothing to wait for). Writes beyond it are
  // left to the caller's fallback.
  lead(lk);
  return deferred_queued_ == 0;
}

Result<void> Registry::settle_deferred() {
  // Reads see every write the registry has accepted, deferred or not.
  if (deferred_pending() == 0) return ok();
  return flush();
}

std::size_t Registry::deferred_pending() const {
  std::lock_guard<std::mutex> lk(queue_mu_);
  return deferred_queued_;
}

std::optional<Error> Registry::take_deferred_error(std::string_view execution_id) {
  std::lock_guard<std::mutex> lk(queue_mu_);
  auto it = deferred_errors_.find(execution_id);
  if (it == deferred_errors_.end()) return std::nullopt;
  Error e = std::move(it->second);
  deferred_errors_.erase(it);
  return e;
}

WriteStats Registry::write_stats() const {
  WriteStats out;
  {
    std::lock_guard<std::mutex> g(db_mu_);
    out = stats_;
  }
  std::lock_guard<std::mutex> lk(queue_mu_);
  out.deferred = deferred_total_;
  out.deferred_failed = deferred_failed_;
  std::lock_guard<std::mutex> dg(dur_mu_);
  out.flushes = flushes_;
  out.durable_waits = durable_waits_;
  return out;
}

}  // namespace custos::registry
