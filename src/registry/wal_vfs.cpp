// The WAL-coalescing VFS; see include/custos/registry/wal_vfs.hpp.
#include "custos/registry/wal_vfs.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <new>
#include <vector>

#include "custos/registry/failpoint.hpp"

namespace custos::registry::sql {

namespace {

constexpr int kFrameHeader = 24;           // wal.c: WAL_FRAME_HDRSIZE
constexpr int kMinPage = 512;              // the smallest SQLite page size
constexpr std::size_t kMaxHeld = 1 << 20;  // bytes held before they are written anyway
// The most one write hands to the default VFS: the unix VFS writes at most 128 KiB - 1 per
// pwrite (seekAndWriteFd masks the length with 0x1ffff) and reports a longer write as
// SQLITE_FULL.
constexpr std::size_t kMaxWrite = 64 << 10;

std::atomic<std::uint64_t> g_writes_in{0};
std::atomic<std::uint64_t> g_writes_out{0};
std::atomic<std::uint64_t> g_commits{0};

// The file SQLite sees. `base` must come first: SQLite reads pMethods from it. The wrapped
// file of the default VFS lives right after this struct, in the same allocation.
struct WalFile {
  sqlite3_file base;
  sqlite3_file* real;
  // Frame appends not written yet: bytes [held_off, held_off + held->size()) of the file.
  std::vector<unsigned char>* held;
  sqlite3_int64 held_off;
  // Where the page of the last held frame header goes (-1: no header waits for its page), and
  // whether that header ends a transaction (its commit field is not zero).
  sqlite3_int64 page_due;
  bool header_commits;
  int failed;  // the error of a failed write of held bytes: every later operation fails with it
};

constexpr std::size_t kWrapperSize = (sizeof(WalFile) + 7) & ~std::size_t{7};

sqlite3_vfs* g_base = nullptr;
sqlite3_vfs g_vfs{};
sqlite3_io_methods g_methods{};

WalFile* self(sqlite3_file* f) noexcept {
  return reinterpret_cast<WalFile*>(f);
}

std::uint32_t be32(void const* p) noexcept {
  auto const* b = static_cast<unsigned char const*>(p);
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         std::uint32_t{b[3]};
}

// Writes the held bytes, with one call per kMaxWrite of them. After a failure nothing more is
// written: SQLite may believe in frames the file does not have.
int write_held(WalFile* w) noexcept {
  if (w->failed != SQLITE_OK) return w->failed;
  w->page_due = -1;
  w->header_commits = false;
  std::size_t done = 0;
  // Test builds: the failpoint wal_write_fails makes the write fail as EIO would.
  int rc = failpoint_set("wal_write_fails") && !w->held->empty() ? SQLITE_IOERR_WRITE : SQLITE_OK;
  while (done < w->held->size() && rc == SQLITE_OK) {
    std::size_t const n = std::min(kMaxWrite, w->held->size() - done);
    rc = w->real->pMethods->xWrite(w->real, w->held->data() + done, static_cast<int>(n),
                                   w->held_off + static_cast<sqlite3_int64>(done));
    g_writes_out.fetch_add(1, std::memory_order_relaxed);
    done += n;
  }
  w->held->clear();
  if (rc != SQLITE_OK) w->failed = rc;
  return rc;
}

int append(WalFile* w, void const* data, int amt, sqlite3_int64 off) noexcept {
  try {
    if (w->held->empty()) w->held_off = off;
    auto const* p = static_cast<unsigned char const*>(data);
    w->held->insert(w->held->end(), p, p + amt);
    return SQLITE_OK;
  } catch (std::bad_alloc const&) {
    return SQLITE_IOERR_NOMEM;
  }
}

// ---- io methods (WAL files only) --------------------------------------------------------------

int wal_close(sqlite3_file* f) {
  WalFile* w = self(f);
  int const flushed = write_held(w);
  int const rc = w->real->pMethods->xClose(w->real);
  delete w->held;
  w->held = nullptr;
  return flushed != SQLITE_OK ? flushed : rc;
}

int wal_read(sqlite3_file* f, void* buf, int amt, sqlite3_int64 off) {
  WalFile* w = self(f);
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  return w->real->pMethods->xRead(w->real, buf, amt, off);
}

int wal_write(sqlite3_file* f, void const* data, int amt, sqlite3_int64 off) {
  WalFile* w = self(f);
  g_writes_in.fetch_add(1, std::memory_order_relaxed);
  if (w->failed != SQLITE_OK) return w->failed;
  sqlite3_int64 const held_end = w->held_off + static_cast<sqlite3_int64>(w->held->size());
  if (w->page_due >= 0 && off == w->page_due && amt >= kMinPage) {
    // The page of the held header: one frame complete.
    if (int const rc = append(w, data, amt, off); rc != SQLITE_OK) return rc;
    w->page_due = -1;
    if (w->header_commits) {
      // The commit frame: the transaction goes to the file now, before SQLite calls it
      // committed (and an error here is the commit's).
      g_commits.fetch_add(1, std::memory_order_relaxed);
      return write_held(w);
    }
    if (w->held->size() >= kMaxHeld) return write_held(w);
    return SQLITE_OK;
  }
  if (amt == kFrameHeader && w->page_due < 0 && (w->held->empty() || off == held_end)) {
    // A frame header appended after the held frames: hold it until its page comes.
    if (int const rc = append(w, data, amt, off); rc != SQLITE_OK) return rc;
    w->page_due = off + kFrameHeader;
    w->header_commits = be32(static_cast<unsigned char const*>(data) + 4) != 0;
    return SQLITE_OK;
  }
  // Not a frame append (the WAL header, a frame rewritten in place, a checksum rewrite): what
  // is held goes first, then this write as SQLite made it.
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  g_writes_out.fetch_add(1, std::memory_order_relaxed);
  return w->real->pMethods->xWrite(w->real, data, amt, off);
}

int wal_truncate(sqlite3_file* f, sqlite3_int64 size) {
  WalFile* w = self(f);
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  return w->real->pMethods->xTruncate(w->real, size);
}

int wal_sync(sqlite3_file* f, int flags) {
  WalFile* w = self(f);
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  return w->real->pMethods->xSync(w->real, flags);
}

int wal_file_size(sqlite3_file* f, sqlite3_int64* size) {
  WalFile* w = self(f);
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  return w->real->pMethods->xFileSize(w->real, size);
}

int wal_lock(sqlite3_file* f, int level) {
  WalFile* w = self(f);
  return w->real->pMethods->xLock(w->real, level);
}

int wal_unlock(sqlite3_file* f, int level) {
  WalFile* w = self(f);
  return w->real->pMethods->xUnlock(w->real, level);
}

int wal_check_reserved_lock(sqlite3_file* f, int* out) {
  WalFile* w = self(f);
  return w->real->pMethods->xCheckReservedLock(w->real, out);
}

int wal_file_control(sqlite3_file* f, int op, void* arg) {
  WalFile* w = self(f);
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  return w->real->pMethods->xFileControl(w->real, op, arg);
}

int wal_sector_size(sqlite3_file* f) {
  WalFile* w = self(f);
  return w->real->pMethods->xSectorSize(w->real);
}

int wal_device_characteristics(sqlite3_file* f) {
  WalFile* w = self(f);
  return w->real->pMethods->xDeviceCharacteristics(w->real);
}

int wal_shm_map(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
  WalFile* w = self(f);
  return w->real->pMethods->xShmMap(w->real, region, size, extend, out);
}

int wal_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
  WalFile* w = self(f);
  return w->real->pMethods->xShmLock(w->real, offset, n, flags);
}

void wal_shm_barrier(sqlite3_file* f) {
  WalFile* w = self(f);
  w->real->pMethods->xShmBarrier(w->real);
}

int wal_shm_unmap(sqlite3_file* f, int delete_flag) {
  WalFile* w = self(f);
  return w->real->pMethods->xShmUnmap(w->real, delete_flag);
}

int wal_fetch(sqlite3_file* f, sqlite3_int64 off, int amt, void** out) {
  WalFile* w = self(f);
  *out = nullptr;
  if (int const rc = write_held(w); rc != SQLITE_OK) return rc;
  return w->real->pMethods->xFetch(w->real, off, amt, out);
}

int wal_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  WalFile* w = self(f);
  return w->real->pMethods->xUnfetch(w->real, off, p);
}

// ---- the VFS ----------------------------------------------------------------------------------

int vfs_open(sqlite3_vfs*, char const* name, sqlite3_file* f, int flags, int* out_flags) {
  if ((flags & SQLITE_OPEN_WAL) == 0) {
    // Not a WAL: the default VFS's own file, in our (larger) slot.
    return g_base->xOpen(g_base, name, f, flags, out_flags);
  }
  WalFile* w = self(f);
  std::memset(w, 0, sizeof(WalFile));
  w->real = reinterpret_cast<sqlite3_file*>(reinterpret_cast<unsigned char*>(f) + kWrapperSize);
  w->held = new (std::nothrow) std::vector<unsigned char>();
  if (w->held == nullptr) return SQLITE_NOMEM;
  w->page_due = -1;
  int const rc = g_base->xOpen(g_base, name, w->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    // pMethods stays null: SQLite does not close a file whose open failed. The default VFS's
    // own cleanup of `real` is its business, as without this VFS.
    delete w->held;
    w->held = nullptr;
    return rc;
  }
  w->base.pMethods = &g_methods;
  return SQLITE_OK;
}

int vfs_delete(sqlite3_vfs*, char const* name, int sync_dir) {
  return g_base->xDelete(g_base, name, sync_dir);
}
int vfs_access(sqlite3_vfs*, char const* name, int flags, int* out) {
  return g_base->xAccess(g_base, name, flags, out);
}
int vfs_full_pathname(sqlite3_vfs*, char const* name, int n, char* out) {
  return g_base->xFullPathname(g_base, name, n, out);
}
void* vfs_dl_open(sqlite3_vfs*, char const* name) {
  return g_base->xDlOpen(g_base, name);
}
void vfs_dl_error(sqlite3_vfs*, int n, char* msg) {
  g_base->xDlError(g_base, n, msg);
}
void (*vfs_dl_sym(sqlite3_vfs*, void* handle, char const* sym))(void) {
  return g_base->xDlSym(g_base, handle, sym);
}
void vfs_dl_close(sqlite3_vfs*, void* handle) {
  g_base->xDlClose(g_base, handle);
}
int vfs_randomness(sqlite3_vfs*, int n, char* out) {
  return g_base->xRandomness(g_base, n, out);
}
int vfs_sleep(sqlite3_vfs*, int us) {
  return g_base->xSleep(g_base, us);
}
int vfs_current_time(sqlite3_vfs*, double* out) {
  return g_base->xCurrentTime(g_base, out);
}
int vfs_get_last_error(sqlite3_vfs*, int n, char* out) {
  return g_base->xGetLastError(g_base, n, out);
}
int vfs_current_time_int64(sqlite3_vfs*, sqlite3_int64* out) {
  return g_base->xCurrentTimeInt64(g_base, out);
}

char const* register_vfs() noexcept {
  g_base = sqlite3_vfs_find(nullptr);
  // Version 2 (xCurrentTimeInt64) and files with io methods version 3 (shm, mmap), as the unix
  // VFS has; anything else is used as it is.
  if (g_base == nullptr || g_base->iVersion < 2) return nullptr;
  g_methods.iVersion = 3;
  g_methods.xClose = wal_close;
  g_methods.xRead = wal_read;
  g_methods.xWrite = wal_write;
  g_methods.xTruncate = wal_truncate;
  g_methods.xSync = wal_sync;
  g_methods.xFileSize = wal_file_size;
  g_methods.xLock = wal_lock;
  g_methods.xUnlock = wal_unlock;
  g_methods.xCheckReservedLock = wal_check_reserved_lock;
  g_methods.xFileControl = wal_file_control;
  g_methods.xSectorSize = wal_sector_size;
  g_methods.xDeviceCharacteristics = wal_device_characteristics;
  g_methods.xShmMap = wal_shm_map;
  g_methods.xShmLock = wal_shm_lock;
  g_methods.xShmBarrier = wal_shm_barrier;
  g_methods.xShmUnmap = wal_shm_unmap;
  g_methods.xFetch = wal_fetch;
  g_methods.xUnfetch = wal_unfetch;

  g_vfs.iVersion = 2;
  g_vfs.szOsFile = static_cast<int>(kWrapperSize) + g_base->szOsFile;
  g_vfs.mxPathname = g_base->mxPathname;
  g_vfs.zName = "custos-wal";
  g_vfs.xOpen = vfs_open;
  g_vfs.xDelete = vfs_delete;
  g_vfs.xAccess = vfs_access;
  g_vfs.xFullPathname = vfs_full_pathname;
  g_vfs.xDlOpen = vfs_dl_open;
  g_vfs.xDlError = vfs_dl_error;
  g_vfs.xDlSym = vfs_dl_sym;
  g_vfs.xDlClose = vfs_dl_close;
  g_vfs.xRandomness = vfs_randomness;
  g_vfs.xSleep = vfs_sleep;
  g_vfs.xCurrentTime = vfs_current_time;
  g_vfs.xGetLastError = vfs_get_last_error;
  g_vfs.xCurrentTimeInt64 = vfs_current_time_int64;
  if (sqlite3_vfs_register(&g_vfs, 0) != SQLITE_OK) return nullptr;
  return g_vfs.zName;
}

}  // namespace

char const* wal_coalescing_vfs() noexcept {
  static char const* const name = register_vfs();
  return name;
}

int flush_wal(sqlite3* db) noexcept {
  if (db == nullptr) return SQLITE_OK;
  sqlite3_file* f = nullptr;
  if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &f) != SQLITE_OK ||
      f == nullptr || f->pMethods != &g_methods) {
    return SQLITE_OK;
  }
  return write_held(self(f));
}

WalWriteCounts wal_write_counts() noexcept {
  return WalWriteCounts{g_writes_in.load(std::memory_order_relaxed),
                        g_writes_out.load(std::memory_order_relaxed),
                        g_commits.load(std::memory_order_relaxed)};
}

}  // namespace custos::registry::sql
