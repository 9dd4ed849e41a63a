// A SQLite VFS that writes each WAL transaction to the file with one write(2).
//
// SQLite appends a transaction to the WAL one frame at a time, and each frame with two writes:
// its 24-byte header, then the page (wal.c, walWriteOneFrame). The authorizing transaction of a
// launch touches ~11 pages: 22 pwrite calls, ~42 us on these VMs, where one write of the same
// bytes takes ~11 us. This VFS ("custos-wal") wraps the default one and, for WAL files only,
// holds frame appends in memory and writes them with one call when the commit frame's page
// arrives (the frame header's commit field is non-zero), still inside the xWrite SQLite makes
// for it. So when COMMIT returns, every frame of the transaction was written to the file, as
// without the VFS: a crash of the process cannot lose a committed transaction (the bytes are in
// the page cache), and an error of that write fails the commit in SQLite's own hands.
//
// Anything that is not a plain frame append (the WAL header, a frame rewritten in place, a
// header not followed by its page) first writes what is held and then goes to the file as
// SQLite made it; every other operation on the WAL file (read, sync, truncate, size, file
// control, mmap, close) writes what is held first. Other files are the default VFS's own.
//
// A failed write of held bytes outside the commit frame's xWrite (flush_wal, a read or sync that
// found bytes held) could leave SQLite believing in frames that are not in the file: after any
// failed write of held bytes, the WAL file refuses every later operation with that error, and
// the connection is unusable until it is reopened (the registry then reads what is on disk).
#pragma once

#include <cstdint>

struct sqlite3;

namespace custos::registry::sql {

// The name of the VFS, registered (not as the default) with the first call; nullptr when the
// default VFS cannot be wrapped (then callers open with the default VFS: every frame written as
// SQLite writes it).
[[nodiscard]] char const* wal_coalescing_vfs() noexcept;

// Writes whatever the connection's WAL holds (nothing after a commit, normally). SQLITE_OK, or
// the SQLite error code of the failed write. A connection not opened with the VFS: SQLITE_OK.
[[nodiscard]] int flush_wal(sqlite3* db) noexcept;

// Process-wide counts of the VFS's WAL writes, for tests and the bench.
struct WalWriteCounts {
  std::uint64_t writes_in = 0;   // xWrite calls SQLite made on WAL files
  std::uint64_t writes_out = 0;  // writes made on the files (held bytes and passed-through)
  std::uint64_t commits = 0;     // transactions written at their commit frame
};
[[nodiscard]] WalWriteCounts wal_write_counts() noexcept;

}  // namespace custos::registry::sql
