// procfs: small-file access relative to a directory fd, and the marker boundary.
//
// The marker boundary is the cooperative fallback used when no writable cgroup exists (and the
// final sweep after every cgroup teardown): each execution carries a random 128-bit marker in its
// environment, and teardown scans `<proc>/*/environ` for it. What this can and cannot catch is
// written down in docs/boundaries.md; in short, a process that scrubs its environment, execs with
// a new one, or cannot be inspected escapes, which is why an unreadable process always makes the
// result unconfirmed and why a cgroup is preferred whenever one is writable.
//
// Everything takes a proc root path so tests can point it at a fake tree.
#pragma once

#include <array>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// ---- small files relative to a directory fd (procfs, cgroupfs) ----------------------------

// open(path, O_RDONLY|O_DIRECTORY|O_CLOEXEC). Errors: sys.error with the open errno.
[[nodiscard]] Result<UniqueFd> open_dir_path(std::string const& path);

// Reads the whole of `name` (relative to `dir`, no symlink following) up to `max_bytes`.
// A longer file is an error (sys.error, EFBIG) rather than a silent truncation.
// Errors: sys.error carrying the errno of openat/read (ENOENT, EACCES, ESRCH, ...).
[[nodiscard]] Result<std::string> read_file_at(UniqueFd const& dir, std::string const& name,
                                               std::size_t max_bytes = std::size_t{64} * 1024);

// Writes `data` to `name` (relative to `dir`) in one write(2), as cgroupfs expects.
// Errors: sys.error carrying the errno of openat/write.
[[nodiscard]] Result<void> write_file_at(UniqueFd const& dir, std::string const& name,
                                         std::string_view data);

// st_ino of `<proc_root>/<pid>/ns/pid` (pid may be "self"). Errors: procfs.failed with errno.
[[nodiscard]] Result<std::uint64_t> pid_namespace_inode(std::string const& pid,
                                                        std::string const& proc_root = "/proc");

// ---- mount table ---------------------------------------------------------------------------

// One line of a mountinfo table (proc_pid_mountinfo(5)), octal escapes (\040 ...) decoded.
struct MountInfoEntry {
  std::string root;  // root of the mount within its filesystem
  std::string mount_point;
  std::string mount_options;  // per-mount options ("rw,relatime")
  std::string fstype;
  std::string source;
  std::string super_options;  // per-superblock options ("rw,nsdelegate", "rw,hidepid=invisible")
};

// nullopt when the line does not have the mountinfo shape.
[[nodiscard]] std::optional<MountInfoEntry> parse_mountinfo_line(std::string_view line);
// Whether the comma-separated option list holds `name` or `name=<anything>`.
[[nodiscard]] bool mount_option_present(std::string_view options, std::string_view name);

// Whether the procfs mounted at `proc_root` (per `mountinfo`) hides processes from the caller
// entirely (hidepid=2/invisible or 4/ptraceable): then a scan cannot even see what it cannot
// read, so no sweep over it may be confirmed. hidepid=1 leaves entries visible but unreadable,
// which the sweep already counts.
[[nodiscard]] bool proc_hides_processes(std::string_view mountinfo, std::string const& proc_root);

// ---- the marker ---------------------------------------------------------------------------

struct Marker {
  std::array<std::uint8_t, 16> bits{};

  // 128 bits from getrandom(2). Errors: sys.error (getrandom failure; never blocks after boot).
  [[nodiscard]] static Result<Marker> generate();
  // Parses the 32 lowercase hex digits of env_value() (recovery re-creates a marker from the
  // record). Errors: procfs.failed when the text is not exactly 32 hex digits.
  [[nodiscard]] static Result<Marker> from_hex(std::string_view hex);

  [[nodiscard]] static constexpr std::string_view env_name() noexcept { return "CUSTOS_MARKER"; }
  [[nodiscard]] std::string env_value() const;  // 32 lowercase hex digits
  [[nodiscard]] std::string env_entry() const;  // "CUSTOS_MARKER=<hex>", ready for an envp

  friend bool operator==(Marker const&, Marker const&) = default;
};

// Whether the NUL-separated environment block `environ` holds exactly the entry
// "CUSTOS_MARKER=<hex>" (a whole entry, not a substring of another one).
[[nodiscard]] bool environ_has_marker(std::string_view environ, Marker const& marker);

struct MarkerScanOptions {
  // Only processes whose pid namespace has this inode are considered; nullopt means the
  // namespace of the scanning process (`<proc_root>/self/ns/pid`). Processes in other pid
  // namespaces are never signalled.
  std::optional<std::uint64_t> pid_ns_inode;
  std::string proc_root = "/proc";
  // Upper bound on the bytes read from one environ file (it is streamed in 16 KiB chunks). An
  // environment longer than this without the marker in its first part counts as unreadable:
  // the marker could sit past the bound.
  std::size_t max_environ_bytes = std::size_t{4} * 1024 * 1024;
  // Start time (clock ticks after boot, /proc/<pid>/stat field 22) of the execution's first
  // process. A process that started earlier cannot descend from it and is skipped before any
  // inspection — which matters because some processes (PID 1 of a container host, processes
  // holding capabilities the daemon lacks) are unreadable even to root and would otherwise make
  // every sweep unconfirmed. nullopt: inspect every process.
  std::optional<std::uint64_t> not_before_ticks;
};

struct MarkerScanResult {
  std::vector<std::int32_t> matched;     // pids whose environ held the marker at scan time
  std::vector<std::int32_t> unreadable;  // pids that could not be inspected (EACCES, EIO, ...)
  std::uint32_t scanned = 0;             // entries of <proc_root> that looked like pids
  std::uint32_t older = 0;               // skipped: started before not_before_ticks
};

// One pass over `<proc_root>/*`: no signals. A process that vanishes during the pass is gone,
// not unreadable. Errors: procfs.failed when the proc root itself cannot be listed or the
// expected namespace cannot be determined.
[[nodiscard]] Result<MarkerScanResult> marker_scan(Marker const& marker,
                                                   MarkerScanOptions const& options = {});

struct MarkerSweepOptions {
  int signal = SIGKILL;
  std::optional<std::uint64_t> pid_ns_inode;  // as MarkerScanOptions
  // Full scans at most. With a signal that does not end processes (SIGTERM to a tree that may
  // ignore it), use 1: repeating would only re-signal the same processes.
  std::uint32_t max_rounds = 16;
  // Pause after a round that signalled something, so the killed processes can exit (and drop
  // their environment) before the next scan looks again.
  std::chrono::milliseconds round_pause{5};
  std::string proc_root = "/proc";
  std::size_t max_environ_bytes = std::size_t{4} * 1024 * 1024;
  std::optional<std::uint64_t> not_before_ticks;  // as MarkerScanOptions; pass it whenever known
};

struct MarkerSweepResult {
  // True only when the final full scan found no marked process AND could read every process.
  bool confirmed = false;
  std::uint32_t signalled = 0;                // signals delivered, over all rounds
  std::uint32_t unreadable = 0;               // processes the final scan could not inspect
  std::uint32_t rounds = 0;                   // full scans performed
  std::uint32_t remaining = 0;                // marked processes still seen by the final scan
  std::vector<std::int32_t> unreadable_pids;  // the first few, for diagnostics
  bool proc_hides_processes = false;  // the proc mount hides processes (hidepid): never confirmed
};

// Scan, and for each match: pidfd_open, re-read the environ through /proc/<pid> (the pid may
// have been recycled between scan and open), check the pidfd is still alive (so the re-read was
// of that very process), and only then signal through the pidfd. Repeats until a full scan finds
// no match or max_rounds is reached. Any unreadable process makes the result unconfirmed, and
// so does a proc mount that hides processes (hidepid=invisible, read from /proc/self/mountinfo).
// The scanning process itself is never signalled. A proc root whose pids are not pids of the
// caller's own namespace (a fake tree, a container's procfs) is scanned but never signalled
// through: its matches stay in `remaining` and the result is unconfirmed.
// Errors: as marker_scan; pidfd.failed when signalling fails for a reason other than the
// process having exited (EPERM).
[[nodiscard]] Result<MarkerSweepResult> marker_sweep(Marker const& marker,
                                                     MarkerSweepOptions const& options = {});

}  // namespace custos::sys
