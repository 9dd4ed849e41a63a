// Registry: group durability, the flusher thread (fdatasync of the WAL) and the durable waits.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/registry.hpp"

namespace custos::registry {

// ---- group durability: the flusher ------------------------------------------------------------

void Registry::note_commit(Durability d, std::vector<std::shared_ptr<Job>> const& batch) {
  if (d == Durability::normal) return;
  {
    std::lock_guard<std::mutex> g(dur_mu_);
    if (d == Durability::full) {
      // A FULL commit fsync'ed the WAL, and with it every frame appended before it; frames that
      // a checkpoint moved out of the WAL were synced by that checkpoint (docs/durability.md).
      durable_seq_ = commit_seq_;
    } else {
      ++commit_seq_;
      // Started by the first group commit only: a registry that never makes one has no thread.
      if (!flusher_.joinable()) flusher_ = std::thread([this] { flusher_main(); });
    }
    // Each claim committed here is durable once this commit is (a FULL one already is).
    for (auto const& j : batch) {
      if (j->durability == Durability::normal || j->execution_id.empty() || !j->result) continue;
      if (group_seq_.size() >= kGroupNotesMax) {
        // Notes nobody asked for (a launch that failed before its barrier): the durable ones
        // go; a dropped note only makes its execution wait as the registry-wide wait does.
        std::erase_if(group_seq_, [this](auto const& kv) { return kv.second <= durable_seq_; });
        if (group_seq_.size() >= kGroupNotesMax) break;
      }
      group_seq_.insert_or_assign(j->execution_id, commit_seq_);
    }
  }
  dur_cv_.notify_all();
}

namespace {
Error sync_error(std::string const& what, int err) {
  return Error{Errc::registry_io, what + ": " + std::strerror(err), err};
}

// fdatasync of the WAL through the flusher's own descriptor, reopened when SQLite replaced the
// file (a different device/inode at the path). With no WAL at the path (SQLite removed it after
// a checkpoint moved every frame into the database file) the database file is synced instead.
Result<void> sync_wal(std::string const& wal_path, std::string const& db_path, sys::UniqueFd& fd,
                      struct stat& fd_st) {
  struct stat st {};
  if (::stat(wal_path.c_str(), &st) != 0) {
    if (errno != ENOENT) return sync_error("stat " + wal_path, errno);
    sys::UniqueFd db{::open(db_path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!db.valid()) return sync_error("open " + db_path, errno);
    if (::fdatasync(db.get()) != 0) return sync_error("fdatasync " + db_path, errno);
    return ok();
  }
  if (!fd.valid() || st.st_dev != fd_st.st_dev || st.st_ino != fd_st.st_ino) {
    sys::UniqueFd fresh{::open(wal_path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!fresh.valid()) return sync_error("open " + wal_path, errno);
    if (::fstat(fresh.get(), &fd_st) != 0) return sync_error("fstat " + wal_path, errno);
    fd = std::move(fresh);
  }
  if (::fdatasync(fd.get()) != 0) return sync_error("fdatasync " + wal_path, errno);
  return ok();
}
}  // namespace

void Registry::flusher_main() {
  // Named for top -H, perf and the journal's thread field.
  ::pthread_setname_np(::pthread_self(), "custos-fsync");
  bool const fail = failpoint_set("flusher_fsync_fails");
  bool const slow = failpoint_set("flusher_slow");
  std::string const db_file = db_path().string();
  std::string const wal_file = db_file + "-wal";
  sys::UniqueFd wal;
  struct stat wal_st {};
  std::unique_lock<std::mutex> lk(dur_mu_);
  auto pending = [this] { return !dur_error_ && commit_seq_ > durable_seq_; };
  auto is_due = [this](auto const& w) { return dur_error_.has_value() || w.first <= durable_seq_; };
  auto deliverable = [&] {
    return std::any_of(durable_waiters_.begin(), durable_waiters_.end(), is_due);
  };
  // Runs the when_durable() completions that are due, without the lock (they may call back
  // into the registry). Every due one, wherever it is queued: a waiter for one execution's
  // claim may be queued after a waiter for a later commit.
  auto deliver = [&] {
    std::vector<std::function<void(Result<void>)>> due;
    for (auto it = durable_waiters_.begin(); it != durable_waiters_.end();) {
      if (!is_due(*it)) {
        ++it;
        continue;
      }
      due.push_back(std::move(it->second));
      it = durable_waiters_.erase(it);
    }
    if (due.empty()) return;
    std::optional<Error> const err = dur_error_;
    lk.unlock();
    for (auto& fn : due) fn(err ? Result<void>{*err} : Result<void>{ok()});
    lk.lock();
  };
  for (;;) {
    dur_cv_.wait(lk, [&] { return stop_flusher_ || pending() || deliverable(); });
    deliver();
    if (!pending()) {
      if (stop_flusher_) {
        // Nothing is pending, so every completion is due (or the registry failed): none is
        // left behind.
        deliver();
        return;
      }
      continue;
    }
    if (slow) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      lk.lock();
      if (!pending()) continue;  // a FULL commit covered it meanwhile
    }
    // Every group commit numbered up to `target` returned before this point: its frames were
    // written to the WAL, so the fdatasync below covers them. Later ones wait for the next.
    std::uint64_t const target = commit_seq_;
    ++flushes_;
    lk.unlock();
    Result<void> r = fail ? Result<void>{sync_error("fdatasync " + wal_file + " (failpoint)", EIO)}
                          : sync_wal(wal_file, db_file, wal, wal_st);
    lk.lock();
    if (r) {
      durable_seq_ = std::max(durable_seq_, target);
    } else {
      // Never retried: after a failed fsync the kernel may have dropped the dirty pages and a
      // second fsync would report success for data that is gone.
      dur_error_ = r.error();
      writes_refused_.store(true, std::memory_order_release);
    }
    dur_cv_.notify_all();
    deliver();
  }
}

void Registry::when_durable(std::function<void(Result<void>)> done) {
  std::unique_lock<std::mutex> lk(dur_mu_);
  wait_for(lk, commit_seq_, std::move(done));
}

std::uint64_t Registry::durable_target(std::string_view execution_id) const {
  auto it = group_seq_.find(execution_id);
  return it == group_seq_.end() ? commit_seq_ : it->second;
}

void Registry::when_durable(std::string_view execution_id, std::function<void(Result<void>)> done) {
  std::unique_lock<std::mutex> lk(dur_mu_);
  std::uint64_t const target = durable_target(execution_id);
  wait_for(lk, target, std::move(done));
}

void Registry::wait_for(std::unique_lock<std::mutex>& lk, std::uint64_t target,
                        std::function<void(Result<void>)> done) {
  if (dur_error_) {
    Error const e = *dur_error_;
    lk.unlock();
    done(e);
    return;
  }
  if (durable_seq_ >= target) {
    lk.unlock();
    done(ok());
    return;
  }
  // Pending means a group commit was made, so the flusher runs; it delivers this completion
  // after the flush (or FULL commit) that covers `target`. The numbers of waiters queued later
  // may be smaller (an older claim's wait): the flusher delivers every due one, in any order.
  durable_waiters_.emplace_back(target, std::move(done));
  lk.unlock();
  dur_cv_.notify_all();
}

std::optional<Result<void>> Registry::durable_now(std::string_view execution_id) {
  std::lock_guard<std::mutex> g(dur_mu_);
  if (dur_error_) return Result<void>{*dur_error_};
  if (durable_seq_ < durable_target(execution_id)) return std::nullopt;
  return Result<void>{ok()};
}

void Registry::forget_group_note(std::string_view execution_id) {
  // A terminal record ends the launch: nobody will ask for its claim's durability any more.
  std::lock_guard<std::mutex> g(dur_mu_);
  if (auto it = group_seq_.find(execution_id); it != group_seq_.end()) group_seq_.erase(it);
}

Result<void> Registry::await_durable(std::string_view execution_id) {
  std::unique_lock<std::mutex> lk(dur_mu_);
  return await_target(lk, durable_target(execution_id));
}

Result<void> Registry::await_durable() {
  std::unique_lock<std::mutex> lk(dur_mu_);
  return await_target(lk, commit_seq_);
}

Result<void> Registry::await_target(std::unique_lock<std::mutex>& lk, std::uint64_t target) {
  if (dur_error_) return *dur_error_;
  if (durable_seq_ >= target) return ok();
  ++durable_waits_;
  // The flusher runs (the first group commit started it) and flushes whenever a commit is not
  // yet covered; a flush already in progress that started before `target` is followed by one
  // more.
  dur_cv_.notify_all();
  dur_cv_.wait(lk, [&] { return dur_error_.has_value() || durable_seq_ >= target; });
  if (durable_seq_ >= target) return ok();
  return *dur_error_;
}

bool Registry::durability_pending() const {
  std::lock_guard<std::mutex> g(dur_mu_);
  return commit_seq_ > durable_seq_;
}

}  // namespace custos::registry
