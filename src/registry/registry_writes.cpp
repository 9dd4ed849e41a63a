// Registry: the group-commit write path (queue, batch leader, deferred writes) and the
// write-through record cache.
#include <cerrno>
#include <chrono>
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
  if (dur_.writes_refused.load(std::memory_order_acquire)) {
    // An fdatasync of the WAL failed: the kernel may have dropped dirty pages of committed
    // transactions, so nothing written from now on could honestly be called durable.
    return fail_all(Error{Errc::registry_io,
                          "the registry refuses writes: an fdatasync of its WAL failed earlier "
                          "(restart the daemon; recovery re-reads what reached the disk)",
                          EIO});
  }
  cache_.staged.clear();
  if (auto r = set_synchronous(d); !r) return fail_all(r.error());
  auto const began = std::chrono::steady_clock::now();
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
      std::size_t const mark = cache_.staged.size();
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
    cache_.staged.clear();
    stats_.writes += counted(batch);
    return;
  }
  commit_latency_.record(std::chrono::steady_clock::now() - began);
  commit_staged();
  stats_.writes += counted(batch);
  stats_.transactions += 1;
  if (d == Durability::full) stats_.full_commits += 1;
  note_commit(d, batch);
}

// ---- write-through record cache -----------------------------------------------------------------

void Registry::cache_drop(std::string_view execution_id) {
  auto it = cache_.entries.find(execution_id);
  if (it == cache_.entries.end()) return;
  cache_.order.erase(it->second.order);
  cache_.entries.erase(it);
}

void Registry::cache_put(ExecutionRecord rec) {
  // Only live executions: a terminal record is written at most once more (publication
  // progress), not worth the memory.
  if (rec.phase == core::Phase::terminal || options_.record_cache_entries == 0) {
    cache_drop(rec.execution_id);
    return;
  }
  if (auto it = cache_.entries.find(rec.execution_id); it != cache_.entries.end()) {
    it->second.rec = std::move(rec);
    cache_.order.splice(cache_.order.end(), cache_.order, it->second.order);
    return;
  }
  while (cache_.entries.size() >= options_.record_cache_entries) {
    cache_.entries.erase(cache_.order.front());
    cache_.order.pop_front();
  }
  cache_.order.push_back(rec.execution_id);
  std::string id = rec.execution_id;
  cache_.entries.emplace(std::move(id), CacheEntry{std::move(rec), std::prev(cache_.order.end())});
}

void Registry::unstage_failed(std::size_t mark, Job const& job) {
  // The job's savepoint (or the transaction) was rolled back: what it staged never happened.
  // A job that wrote nothing (every change refused before any SQL) leaves the file as the cache
  // says; anything else drops the entries it may have touched.
  if (!job.refused_only) {
    for (std::size_t i = mark; i < cache_.staged.size(); ++i) {
      cache_drop(cache_.staged[i].execution_id);
    }
    if (!job.changes.empty()) cache_drop(job.execution_id);
  }
  if (mark < cache_.staged.size()) {
    cache_.staged.erase(cache_.staged.begin() + static_cast<std::ptrdiff_t>(mark),
                        cache_.staged.end());
  }
}

void Registry::commit_staged() {
  // In commit order: the last version of a record staged in this transaction wins.
  for (ExecutionRecord& rec : cache_.staged) cache_put(std::move(rec));
  cache_.staged.clear();
}

std::optional<ExecutionRecord> Registry::cached_record(std::string_view execution_id) const {
  std::lock_guard<std::mutex> g(db_mu_);
  auto it = cache_.entries.find(execution_id);
  if (it == cache_.entries.end()) return std::nullopt;
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
  cache_.staged.push_back(std::move(rec));
  return ok();
}

void Registry::keep_deferred_errors(Job const& job) {
  // Nobody waits for a deferred write: keep its refusal for the execution's owner.
  auto keep = [this](std::string const& id, char const* what, Error e) {
    ++queue_.deferred_failed;
    if (queue_.deferred_errors.contains(id)) return;
    e.context = std::string{"deferred "} + what + ": " + e.context;
    queue_.deferred_errors.emplace(id, std::move(e));
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
    if (!queue_.leader_active) {
      lead(lk);
    } else {
      queue_.cv.wait(lk);
    }
  }
}

void Registry::lead(std::unique_lock<std::mutex>& lk) {
  // Leader: take everything queued so far (bounded) into one transaction. Writers that
  // arrive while it commits queue up and the next leader takes them together. Deferred
  // writes queued earlier ride along, ahead of the writes queued after them.
  queue_.leader_active = true;
  std::vector<std::shared_ptr<Job>> batch;
  while (!queue_.jobs.empty() && batch.size() < options_.max_batch) {
    batch.push_back(std::move(queue_.jobs.front()));
    queue_.jobs.pop_front();
    queue_.deferred_queued -= batch.back()->deferred;
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
  queue_.leader_active = false;
  queue_.cv.notify_all();
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
  std::unique_lock<std::mutex> lk(queue_.mu);
  queue_.jobs.push_back(job);
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
  std::lock_guard<std::mutex> lk(queue_.mu);
  queue_.jobs.push_back(std::move(job));
  ++queue_.deferred_queued;
  ++queue_.deferred_total;
}

Result<void> Registry::flush() {
  std::unique_lock<std::mutex> lk(queue_.mu);
  if (queue_.deferred_queued == 0) return ok();
  lk.unlock();
  // A crash here loses every queued write: the deferred crash tests stop the daemon exactly
  // at this instant.
  failpoint("flush_with_writes_queued");
  lk.lock();
  if (queue_.deferred_queued == 0) return ok();  // another thread's write took them meanwhile
  // The queue is FIFO: once its last job is done, so is every deferred write queued before it.
  std::shared_ptr<Job> const last = queue_.jobs.back();
  drive(last, lk);
  // A deferred write's own refusal is kept per execution; only a failed transaction is ours.
  if (last->transaction_failed) return last->result;
  return ok();
}

bool Registry::try_flush() {
  std::unique_lock<std::mutex> lk(queue_.mu);
  if (queue_.leader_active || queue_.deferred_queued == 0) return false;
  lk.unlock();
  failpoint("flush_with_writes_queued");  // as flush(): a crash loses every queued write
  lk.lock();
  if (queue_.leader_active || queue_.deferred_queued == 0) return false;
  // One batch as the leader (none was active, so nothing to wait for). Writes beyond it are
  // left to the caller's fallback.
  lead(lk);
  return queue_.deferred_queued == 0;
}

Result<void> Registry::settle_deferred() {
  // Reads see every write the registry has accepted, deferred or not.
  if (deferred_pending() == 0) return ok();
  return flush();
}

std::size_t Registry::deferred_pending() const {
  std::lock_guard<std::mutex> lk(queue_.mu);
  return queue_.deferred_queued;
}

std::optional<Error> Registry::take_deferred_error(std::string_view execution_id) {
  std::lock_guard<std::mutex> lk(queue_.mu);
  auto it = queue_.deferred_errors.find(execution_id);
  if (it == queue_.deferred_errors.end()) return std::nullopt;
  Error e = std::move(it->second);
  queue_.deferred_errors.erase(it);
  return e;
}

WriteStats Registry::write_stats() const {
  WriteStats out;
  {
    std::lock_guard<std::mutex> g(db_mu_);
    out = stats_;
  }
  std::lock_guard<std::mutex> lk(queue_.mu);
  out.deferred = queue_.deferred_total;
  out.deferred_failed = queue_.deferred_failed;
  std::lock_guard<std::mutex> dg(dur_.mu);
  out.flushes = dur_.flushes;
  out.durable_waits = dur_.durable_waits;
  return out;
}

}  // namespace custos::registry
