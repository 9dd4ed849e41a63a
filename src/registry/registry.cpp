// Registry: open (state directory lock, SQLite setup, schema version and migration), close.
#include "custos/registry/registry.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

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

// The connection settings of the registry's one connection (`exists`: the file was there
// before this open).
Result<void> configure_connection(sql::Db& db, bool exists) {
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
  // ~8 MiB of frames whatever the file's page size, inside the WAL presize_wal pre-sizes.
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
  return ok();
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
    std::lock_guard<std::mutex> g(dur_.mu);
    dur_.stop_flusher = true;
  }
  dur_.cv.notify_all();
  if (dur_.flusher.joinable()) dur_.flusher.join();
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
  CUSTOS_TRYV(configure_connection(db, exists));
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

}  // namespace custos::registry
