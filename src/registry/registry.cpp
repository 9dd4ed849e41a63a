// Registry: open/lock/schema, group-committed writes, claims, records, quarantine.
#include "custos/registry/registry.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <set>
#include <sys/file.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/wal_vfs.hpp"

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

// The WAL size (in frame bytes, page headers aside) at which SQLite checkpoints it.
constexpr std::int64_t kWalCheckpointBytes = std::int64_t{8} << 20;

// Extends <db>-wal to `bytes` with written zeros (never touching what is already there: after
// a crash those are the frames the next open replays). SQLite's WAL then never grows in normal
// operation — it restarts from its beginning after each checkpoint, well inside this size — so
// a synchronous=FULL commit overwrites allocated blocks and fdatasync has no file size (inode)
// to write back before its cache flush: one device round trip less per FULL commit. Zeros
// written, not fallocate()d: unwritten extents would need their own metadata write at the first
// overwrite. To SQLite the zeros are like the stale frames a restarted WAL leaves behind: an
// invalid header or frame ends recovery (salt and checksum).
Result<void> presize_wal(std::filesystem::path const& db_file, std::uint64_t bytes) {
  if (bytes == 0) return ok();
  std::string const wal = db_file.string() + "-wal";
  sys::UniqueFd fd{::open(wal.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (!fd.valid()) return io_error("open " + wal, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error("stat " + wal, errno);
  auto off = static_cast<std::uint64_t>(st.st_size);
  if (off >= bytes) return ok();
  std::vector<char> const zeros(std::size_t{1} << 20, 0);
  while (off < bytes) {
    std::size_t const n =
        static_cast<std::size_t>(std::min<std::uint64_t>(zeros.size(), bytes - off));
    ssize_t const w = ::pwrite(fd.get(), zeros.data(), n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("write " + wal, errno);
    }
    off += static_cast<std::uint64_t>(w);
  }
  if (::fdatasync(fd.get()) != 0) return io_error("fdatasync " + wal, errno);
  return ok();
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

Registry::~Registry() {
  // A clean stop must not lose what was deferred: commit it (a failure has nobody to tell).
  (void)flush();
  // Then the flusher's last flush (it makes every pending group commit durable before it
  // exits), and it is joined: no thread outlives the registry.
  {
    std::lock_guard<std::mutex> g(dur_mu_);
    stop_flusher_ = true;
  }
  dur_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

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

  // The WAL-coalescing VFS (wal_vfs.hpp): one write per transaction instead of two per page.
  sql::Db db = CUSTOS_TRY(
      sql::Db::open(db_file.string(), options.create_if_missing, sql::wal_coalescing_vfs()));
  // The flock already makes this the only process using the file, so SQLite's own per-
  // transaction fcntl locks and the shared-memory WAL index buy nothing: exclusive locking mode
  // takes the lock once and keeps the WAL index in heap memory (docs/durability.md).
  CUSTOS_TRYV(db.exec("PRAGMA locking_mode = EXCLUSIVE"));
  // 4 KiB pages for a new file (SQLite's default; an existing file keeps its own): an execution
  // record (its canonical plan, digests, and at the end its terminal record: ~1.5-2 KiB) fits in
  // one page, so each phase write rewrites one page. With the 1 KiB pages used before, every
  // record spilled into an overflow chain that each write freed and re-allocated: ~4 WAL frames
  // (8 pwrites) per write instead of one (docs/durability.md).
  if (!exists) CUSTOS_TRYV(db.exec("PRAGMA page_size = 4096"));
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
  // ~8 MiB of frames whatever the file's page size, inside the pre-sized WAL below.
  auto const page_size = CUSTOS_TRY(db.query_int("PRAGMA page_size")).value_or(4096);
  CUSTOS_TRYV(
      db.exec("PRAGMA wal_autocheckpoint = " +
              std::to_string(kWalCheckpointBytes / std::max<std::int64_t>(page_size, 512))));
  CUSTOS_TRYV(db.exec("PRAGMA journal_size_limit = 16777216"));
  // Statement journals (what SQLite keeps to undo one statement or savepoint inside a
  // transaction: a batch's job, an UPDATE that may fail on a constraint) in memory. SQLite
  // spills one past 64 KiB to a temp file and, in exclusive locking mode, keeps using that file
  // for every later statement journal: in the daemon under load that was a 4-byte and a
  // page-sized pwrite for every page a statement touched that its transaction had already
  // changed, ~14 syscalls per launch. Nothing else of the registry uses temp storage but small
  // sorts.
  CUSTOS_TRYV(db.exec("PRAGMA temp_store = MEMORY"));
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
  // After the migration's frames: the zeros only ever go beyond the last valid frame.
  CUSTOS_TRYV(presize_wal(db_file, options.wal_presize_bytes));

  std::unique_ptr<Registry> reg{new Registry(state_dir, options, std::move(lock), std::move(db))};
  reg->opened_version_ = opened;
  reg->current_sync_ = Durability::full;
  (void)CUSTOS_TRY(reg->revalidate());
  return reg;
}

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
int strictness(Durability d) {
  switch (d) {
    case Durability::normal:
      return 0;
    case Durability::group:
      return 1;
    case Durability::full:
      return 2;
  }
  return 2;
}
Durability stricter(Durability a, Durability b) {
  return strictness(a) >= strictness(b) ? a : b;
}

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
  for (auto const& j : batch) d = stricter(d, j->durability);
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

std::optional<ExecutionRecord> Registry::cached_record(std::string_view execution_id) const {
  std::lock_guard<std::mutex> g(db_mu_);
  auto it = cache_.find(execution_id);
  if (it == cache_.end()) return std::nullopt;
  return it->second.rec;
}

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

}  // namespace

Result<ExecutionRecord> Registry::load_for_update(sql::Db& db, std::string_view execution_id) {
  // The daemon holds the file exclusively (flock + locking_mode EXCLUSIVE): a record this
  // registry wrote or verified cannot have changed under it. Quarantine is checked first (the
  // set only grows, in revalidate()).
  if (!quarantined_ids_.contains(execution_id)) {
    // A version stored earlier in this very transaction (not yet committed, so not cached).
    for (auto it = staged_records_.rbegin(); it != staged_records_.rend(); ++it) {
      if (it->execution_id == execution_id) {
        ++stats_.cache_hits;
        return *it;
      }
    }
    if (auto it = cache_.find(execution_id); it != cache_.end()) {
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
  std::unique_lock<std::mutex> lk(queue_mu_);
  // Joins the record job of the same execution at the tail of the queue (not yet taken by a
  // leader, so still ours to extend): one load and one store for both.
  std::shared_ptr<Job> job;
  if (!queue_.empty() && !queue_.back()->changes.empty() &&
      queue_.back()->execution_id == execution_id) {
    job = queue_.back();
  } else {
    job = std::make_shared<Job>();
    job->execution_id = std::string{execution_id};
    queue_.push_back(job);
  }
  job->durability = stricter(job->durability, d);
  // The change owns what it uses: a deferred one runs after this call has returned.
  job->changes.push_back(Change{std::move(change), mode == WriteMode::deferred, what, atomic, ok(),
                                mode == WriteMode::deferred ? std::move(done) : nullptr});
  std::size_t const mine = job->changes.size() - 1;
  if (mode == WriteMode::deferred) {
    ++job->deferred;
    ++deferred_queued_;
    ++deferred_total_;
    return ok();
  }
  drive(job, lk);
  return std::move(job->changes[mine].result);
}

// ---- claims -----------------------------------------------------------------------------------

namespace {
// The claim's durability: FULL, or group (FULL's fsync made by the flusher, awaited by the
// caller before anything acts on the claim). Never NORMAL: a consumed authorization must
// not come back after a power loss.
Durability claim_durability(Durability d) {
  return d == Durability::group ? Durability::group : Durability::full;
}

// A claim names its action, process and execution.
Result<void> check_claim_ids(std::string_view action_id, std::string_view process_id,
                             std::string_view execution_id) {
  if (!action_id.empty() && !process_id.empty() && !execution_id.empty()) return ok();
  return Error{Errc::plan_invalid_id, "claim needs action, process and execution ids"};
}

// A new record's plan digest is the digest of its canonical plan bytes (checked before any job
// is queued).
Result<void> check_plan_digest(NewExecution const& ex) {
  if (ex.plan_digest == sha256_tagged(ex.plan_canonical)) return ok();
  return Error{Errc::auth_digest_mismatch,
               ex.execution_id + ": plan digest does not match the canonical plan bytes"};
}

// An asynchronous write's completion, with the failpoints its synchronous form fires after
// its commit: a crash there leaves exactly what the immediate write leaves.
std::function<void(Result<void>)> after_commit(std::initializer_list<char const*> points,
                                               std::function<void(Result<void>)> done) {
  return [pts = std::vector<char const*>(points), done = std::move(done)](Result<void> r) {
    if (r) {
      for (char const* p : pts) failpoint(p);
    }
    done(std::move(r));
  };
}
}  // namespace

Result<void> Registry::consume_claim(std::string_view action_id, std::string_view process_id,
                                     std::string_view execution_id, Durability d) {
  return consume_claim_with(
      action_id, process_id, execution_id, [](sql::Db&) -> Result<void> { return ok(); }, d);
}

Result<void> Registry::consume_claim_with(std::string_view action_id, std::string_view process_id,
                                          std::string_view execution_id,
                                          std::function<Result<void>(sql::Db&)> also,
                                          Durability d) {
  return claim_job(
      action_id, process_id, execution_id, std::move(also),
      [](sql::Db&) -> Result<void> { return ok(); }, claim_durability(d));
}

Registry::JobFn Registry::claim_fn(std::string a, std::string p, std::string e, JobFn before,
                                   JobFn after) {
  // One job: `before`, the claim and `after` share its savepoint, so a refusal by any of them
  // undoes all three.
  return [a = std::move(a), p = std::move(p), e = std::move(e), before = std::move(before),
          after = std::move(after)](sql::Db& db) -> Result<void> {
    if (auto r = before(db); !r) return r;
    {
      // Scoped: `after` may lease the same cached statements.
      sql::StmtLease q = CUSTOS_TRY(
          db.cached("SELECT execution_id FROM claims WHERE action_id = ? AND process_id = ?"));
      CUSTOS_TRYV(q->bind(1, std::string_view{a}));
      CUSTOS_TRYV(q->bind(2, std::string_view{p}));
      if (CUSTOS_TRY(q->step())) {
        return Error{
            Errc::registry_claim_consumed,
            "action " + a + " / process " + p + " was already consumed by execution " + q->text(0)};
      }
      sql::StmtLease ins =
          CUSTOS_TRY(db.cached("INSERT INTO claims (action_id, process_id, execution_id, "
                               "consumed_ns) VALUES (?,?,?,?)"));
      CUSTOS_TRYV(ins->bind(1, std::string_view{a}));
      CUSTOS_TRYV(ins->bind(2, std::string_view{p}));
      CUSTOS_TRYV(ins->bind(3, std::string_view{e}));
      CUSTOS_TRYV(ins->bind(4, detail::now_ns()));
      CUSTOS_TRYV(ins->run());
    }
    return after(db);
  };
}

Result<void> Registry::claim_job(std::string_view action_id, std::string_view process_id,
                                 std::string_view execution_id, JobFn before, JobFn after,
                                 Durability d) {
  CUSTOS_TRYV(check_claim_ids(action_id, process_id, execution_id));
  if (auto wr = write(d,
                      claim_fn(std::string{action_id}, std::string{process_id},
                               std::string{execution_id}, std::move(before), std::move(after)),
                      std::string{execution_id});
      !wr)
    return std::move(wr).error();
  failpoint("after_claim");
  return ok();
}

Result<void> Registry::transact(Durability d, std::function<Result<void>(sql::Db&)> fn) {
  return write(d, std::move(fn));
}

void Registry::transact_deferred(std::string execution_id, char const* what,
                                 std::function<Result<void>(sql::Db&)> fn) {
  // NORMAL: it commits in the transaction of the immediate write that follows it, with that
  // write's durability.
  enqueue_deferred(Durability::normal, std::move(execution_id), what, std::move(fn));
}

Result<void> Registry::read(std::function<Result<void>(sql::Db&)> const& fn) {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  return fn(db_);
}

Result<std::optional<Claim>> Registry::find_claim(std::string_view action_id,
                                                  std::string_view process_id) {
  CUSTOS_TRYV(settle_deferred());
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
  CUSTOS_TRYV(settle_deferred());
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
  staged_records_.push_back(std::move(rec));
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
  if (auto r = check_claim_ids(ex.action_id, ex.process_id, ex.execution_id); !r)
    return done(std::move(r));
  std::string id = ex.execution_id;
  auto shared = std::make_shared<NewExecution const>(std::move(ex));
  JobFn fn = claim_fn(
      shared->action_id, shared->process_id, id, [](sql::Db&) -> Result<void> { return ok(); },
      [this, shared](sql::Db& db) { return create_record_job(db, *shared, true); });
  enqueue_deferred(claim_durability(d), std::move(id), "record_authorized", std::move(fn),
                   after_commit({"after_claim"}, std::move(done)));
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
      [this, &ex](sql::Db& db) { return create_record_job(db, ex, true); }, claim_durability(d));
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

namespace {
// Ownership unassigned -> staged (and the phase authorized -> starting when needed).
std::function<Result<void>(ExecutionRecord&)> staged_change(Ownership staged,
                                                            BoundaryInfo boundary) {
  return [staged = std::move(staged),
          boundary = std::move(boundary)](ExecutionRecord& rec) -> Result<void> {
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
  };
}

// Ownership staged -> committed (the phase stays starting).
Result<void> commit_ownership(ExecutionRecord& rec) {
  if (rec.ownership.state == OwnershipState::legacy_unverified) {
    return Error{Errc::registry_legacy_unverified,
                 rec.execution_id + ": legacy ownership cannot be committed"};
  }
  if (rec.ownership.state == OwnershipState::modelled && rec.phase == core::Phase::starting) {
    return ok();  // a model has no process slot to commit: it stays modelled
  }
  if (rec.ownership.state != OwnershipState::staged || rec.phase != core::Phase::starting) {
    return illegal_step(rec, "commit needs staged ownership while starting");
  }
  rec.ownership.state = OwnershipState::committed;
  return ok();
}

Result<void> staged_ownership_check(Ownership const& staged) {
  if (staged.state == OwnershipState::staged || staged.state == OwnershipState::modelled)
    return ok();
  return Error{Errc::registry_illegal_phase,
               "record_staged needs an ownership in state staged (or modelled)"};
}

}  // namespace

Result<void> Registry::record_staged(std::string_view execution_id, Ownership const& staged,
                                     BoundaryInfo const& boundary) {
  failpoint("before_staged");
  CUSTOS_TRYV(staged_ownership_check(staged));
  // Always immediate: the barrier is released only after this returned.
  if (auto wr = modify(options_.ownership_durability, WriteMode::now, execution_id, "record_staged",
                       staged_change(staged, boundary));
      !wr)
    return std::move(wr).error();
  failpoint("after_staged");
  return ok();
}

void Registry::record_staged_async(std::string execution_id, Ownership staged,
                                   BoundaryInfo boundary, std::function<void(Result<void>)> done) {
  failpoint("before_staged");
  if (auto checked = staged_ownership_check(staged); !checked) return done(std::move(checked));
  (void)modify(options_.ownership_durability, WriteMode::deferred, execution_id, "record_staged",
               staged_change(std::move(staged), std::move(boundary)), true,
               after_commit({"after_staged"}, std::move(done)));
}

Result<void> Registry::record_committed(std::string_view execution_id, WriteMode mode) {
  if (auto wr = modify(options_.ownership_durability, mode, execution_id, "record_committed",
                       commit_ownership);
      !wr)
    return std::move(wr).error();
  failpoint("after_committed");
  return ok();
}

void Registry::record_running_async(std::string execution_id,
                                    std::function<void(Result<void>)> done) {
  // One change: both steps or neither (running needs the committed slot).
  (void)modify(
      options_.ownership_durability, WriteMode::deferred, execution_id, "record_committed",
      [](ExecutionRecord& rec) -> Result<void> {
        CUSTOS_TRYV(commit_ownership(rec));
        return step_phase(rec, core::Phase::running);
      },
      true, after_commit({"after_committed", "while_running"}, std::move(done)));
}

Result<void> Registry::record_phase(std::string_view execution_id, core::Phase phase,
                                    WriteMode mode) {
  if (phase == core::Phase::terminal) {
    return Error{Errc::registry_illegal_phase, "terminal is written by record_terminal only"};
  }
  if (auto wr = modify(options_.ownership_durability, mode, execution_id, "record_phase",
                       [phase](ExecutionRecord& rec) -> Result<void> {
                         if (phase == core::Phase::running &&
                             rec.ownership.state != OwnershipState::committed &&
                             rec.ownership.state != OwnershipState::modelled) {
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

Result<void> Registry::record_trigger(std::string_view execution_id, core::Trigger trigger,
                                      WriteMode mode) {
  return modify(options_.ownership_durability, mode, execution_id, "record_trigger",
                [trigger](ExecutionRecord& rec) -> Result<void> {
                  if (rec.phase == core::Phase::terminal) {
                    return illegal_step(rec, "trigger after the terminal record");
                  }
                  if (rec.trigger && *rec.trigger != trigger) {
                    return illegal_step(rec, "a different trigger was accepted first (" +
                                                 std::string{core::trigger_wire(*rec.trigger)} +
                                                 ")");
                  }
                  rec.trigger = trigger;
                  return ok();
                });
}

Result<void> Registry::record_output(std::string_view execution_id, int stream_index,
                                     core::StreamAccounting const& accounting, WriteMode mode) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  CUSTOS_TRYV(accounting.check());
  return modify(options_.ownership_durability, mode, execution_id, "record_output",
                [stream_index, accounting](ExecutionRecord& rec) -> Result<void> {
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
                                          std::uint64_t published_bytes, bool done,
                                          WriteMode mode) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  // Publication happens after the terminal record and never rewrites it: only the progress
  // columns change.
  return modify(options_.ownership_durability, mode, execution_id, "record_publication",
                [stream_index, published_bytes, done](ExecutionRecord& rec) -> Result<void> {
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

namespace {
// A terminal blob whose digest does not match its bytes is refused before anything is queued.
Result<void> check_terminal_digest(std::string_view execution_id, TerminalBlob const& t) {
  if (t.digest == sha256_tagged(t.bytes)) return ok();
  return Error{Errc::registry_corrupt_record,
               std::string{execution_id} + ": terminal digest does not match its bytes"};
}

// The terminal write's change (owns its blob: a deferred change runs after its caller returned).
std::function<Result<void>(ExecutionRecord&)> terminal_change(TerminalBlob t,
                                                              core::RecoveryPath via) {
  return [t = std::move(t), via](ExecutionRecord& rec) -> Result<void> {
    if (rec.phase == core::Phase::terminal) {
      return illegal_step(rec, "a terminal record exists; exactly one is allowed");
    }
    CUSTOS_TRYV(step_phase(rec, core::Phase::terminal, via));
    rec.terminal = t;
    return ok();
  };
}
}  // namespace

Result<void> Registry::record_terminal(std::string_view execution_id, TerminalBlob const& t,
                                       core::RecoveryPath via) {
  failpoint("before_terminal");
  forget_group_note(execution_id);
  CUSTOS_TRYV(check_terminal_digest(execution_id, t));
  // Immediate: queued deferred writes are committed first, in this same transaction.
  return modify(options_.terminal_durability, WriteMode::now, execution_id, "record_terminal",
                terminal_change(t, via));
}

void Registry::record_terminal_async(std::string execution_id, TerminalBlob t,
                                     core::RecoveryPath via,
                                     std::function<void(Result<void>)> done) {
  failpoint("before_terminal");
  forget_group_note(execution_id);
  if (auto ok_digest = check_terminal_digest(execution_id, t); !ok_digest) {
    return done(std::move(ok_digest));
  }
  // Deferred, so nobody blocks on it; the change owns its blob (it runs after this returns).
  (void)modify(options_.terminal_durability, WriteMode::deferred, execution_id, "record_terminal",
               terminal_change(std::move(t), via), true, std::move(done));
}

Result<void> Registry::record_recovered(std::string_view execution_id,
                                        std::vector<core::Phase> const& steps,
                                        TerminalBlob const& t, core::RecoveryPath via) {
  CUSTOS_TRYV(check_terminal_digest(execution_id, t));
  return modify(
      options_.terminal_durability, WriteMode::now, execution_id, "record_recovered",
      [&steps, &t, via](ExecutionRecord& rec) -> Result<void> {
        for (core::Phase const p : steps) {
          if (p == core::Phase::terminal) return illegal_step(rec, "terminal in steps");
          if (p == core::Phase::running && rec.ownership.state != OwnershipState::committed &&
              rec.ownership.state != OwnershipState::modelled) {
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
      },
      /*atomic=*/false);
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
  CUSTOS_TRYV(settle_deferred());
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
