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
    std::lock_guard<std::mutex> g(dur_.mu);
    if (d == Durability::full) {
      // A FULL commit fsync'ed the WAL, and with it every frame appended before it; frames that
      // a checkpoint moved out of the WAL were synced by that checkpoint (docs/durability.md).
      dur_.durable_seq = dur_.commit_seq;
    } else {
      ++dur_.commit_seq;
      // Started by the first group commit only: a registry that never makes one has no thread.
      if (!dur_.flusher.joinable()) dur_.flusher = std::thread([this] { flusher_main(); });
    }
    // Each claim committed here is durable once this commit is (a FULL one already is).
    for (auto const& j : batch) {
      if (j->durability == Durability::normal || j->execution_id.empty() || !j->result) continue;
      if (dur_.group_seq.size() >= kGroupNotesMax) {
        // Notes nobody asked for (a launch that failed before its barrier): the durable ones
        // go; a dropped note only makes its execution wait as the registry-wide wait does.
        std::erase_if(dur_.group_seq,
                      [this](auto const& kv) { return kv.second <= dur_.durable_seq; });
        if (dur_.group_seq.size() >= kGroupNotesMax) break;
      }
      dur_.group_seq.insert_or_assign(j->execution_id, dur_.commit_seq);
    }
  }
  dur_.cv.notify_all();
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
  std::unique_lock<std::mutex> lk(dur_.mu);
  auto pending = [this] { return !dur_.error && dur_.commit_seq > dur_.durable_seq; };
  auto is_due = [this](auto const& w) {
    return dur_.error.has_value() || w.first <= dur_.durable_seq;
  };
  auto deliverable = [&] { return std::any_of(dur_.waiters.begin(), dur_.waiters.end(), is_due); };
  // Runs the when_durable() completions that are due, without the lock (they may call back
  // into the registry). Every due one, wherever it is queued: a waiter for one execution's
  // claim may be queued after a waiter for a later commit.
  auto deliver = [&] {
    std::vector<std::function<void(Result<void>)>> due;
    for (auto it = dur_.waiters.begin(); it != dur_.waiters.end();) {
      if (!is_due(*it)) {
        ++it;
        continue;
      }
      due.push_back(std::move(it->second));
      it = dur_.waiters.erase(it);
    }
    if (due.empty()) return;
    std::optional<Error> const err = dur_.error;
    lk.unlock();
    for (auto& fn : due) fn(err ? Result<void>{*err} : Result<void>{ok()});
    lk.lock();
  };
  for (;;) {
    dur_.cv.wait(lk, [&] { return dur_.stop_flusher || pending() || deliverable(); });
    deliver();
    if (!pending()) {
      if (dur_.stop_flusher) {
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
    std::uint64_t const target = dur_.commit_seq;
    ++dur_.flushes;
    lk.unlock();
    Result<void> r = fail ? Result<void>{sync_error("fdatasync " + wal_file + " (failpoint)", EIO)}
                          : sync_wal(wal_file, db_file, wal, wal_st);
    lk.lock();
    if (r) {
      dur_.durable_seq = std::max(dur_.durable_seq, target);
    } else {
      // Never retried: after a failed fsync the kernel may have dropped the dirty pages and a
      // second fsync would report success for data that is gone.
      dur_.error = r.error();
      dur_.writes_refused.store(true, std::memory_order_release);
    }
    dur_.cv.notify_all();
    deliver();
  }
}

void Registry::when_durable(std::function<void(Result<void>)> done) {
  std::unique_lock<std::mutex> lk(dur_.mu);
  wait_for(lk, dur_.commit_seq, std::move(done));
}

std::uint64_t Registry::durable_target(std::string_view execution_id) const {
  auto it = dur_.group_seq.find(execution_id);
  return it == dur_.group_seq.end() ? dur_.commit_seq : it->second;
}

void Registry::when_durable(std::string_view execution_id, std::function<void(Result<void>)> done) {
  std::unique_lock<std::mutex> lk(dur_.mu);
  std::uint64_t const target = durable_target(execution_id);
  wait_for(lk, target, std::move(done));
}

void Registry::wait_for(std::unique_lock<std::mutex>& lk, std::uint64_t target,
                        std::function<void(Result<void>)> done) {
  if (dur_.error) {
    Error const e = *dur_.error;
    lk.unlock();
    done(e);
    return;
  }
  if (dur_.durable_seq >= target) {
    lk.unlock();
    done(ok());
    return;
  }
  // Pending means a group commit was made, so the flusher runs; it delivers this completion
  // after the flush (or FULL commit) that covers `target`. The numbers of waiters queued later
  // may be smaller (an older claim's wait): the flusher delivers every due one, in any order.
  dur_.waiters.emplace_back(target, std::move(done));
  lk.unlock();
  dur_.cv.notify_all();
}

std::optional<Result<void>> Registry::durable_now(std::string_view execution_id) {
  std::lock_guard<std::mutex> g(dur_.mu);
  if (dur_.error) return Result<void>{*dur_.error};
  if (dur_.durable_seq < durable_target(execution_id)) return std::nullopt;
  return Result<void>{ok()};
}

void Registry::forget_group_note(std::string_view execution_id) {
  // A terminal record ends the launch: nobody will ask for its claim's durability any more.
  std::lock_guard<std::mutex> g(dur_.mu);
  if (auto it = dur_.group_seq.find(execution_id); it != dur_.group_seq.end())
    dur_.group_seq.erase(it);
}

Result<void> Registry::await_durable(std::string_view execution_id) {
  std::unique_lock<std::mutex> lk(dur_.mu);
  return await_target(lk, durable_target(execution_id));
}

Result<void> Registry::await_durable() {
  std::unique_lock<std::mutex> lk(dur_.mu);
  return await_target(lk, dur_.commit_seq);
}

Result<void> Registry::await_target(std::unique_lock<std::mutex>& lk, std::uint64_t target) {
  if (dur_.error) return *dur_.error;
  if (dur_.durable_seq >= target) return ok();
  ++dur_.durable_waits;
  // The flusher runs (the first group commit started it) and flushes whenever a commit is not
  // yet covered; a flush already in progress that started before `target` is followed by one
  // more.
  dur_.cv.notify_all();
  dur_.cv.wait(lk, [&] { return dur_.error.has_value() || dur_.durable_seq >= target; });
  if (dur_.durable_seq >= target) return ok();
  return *dur_.error;
}

bool Registry::durability_pending() const {
  std::lock_guard<std::mutex> g(dur_.mu);
  return dur_.commit_seq > dur_.durable_seq;
}

}  // namespace custos::registry
