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
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
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

// read_file_at for a small kernel file produced by a single show() (cgroup.events, cpu.stat,
// memory.current, /proc/<pid>/stat; not cgroup.procs or mountinfo, which are lists): the kernel
// copies such a file out as far as the reader's 4 KiB buffer allows, so a read that leaves room
// is the whole file, and the read(2) that would only return 0 is skipped. A read that fills the
// buffer continues like read_file_at. Same errors.
[[nodiscard]] Result<std::string> read_shown_file_at(UniqueFd const& dir, std::string const& name,
                                                     std::size_t max_bytes = std::size_t{64} *
                                                                             1024);

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

// Start times (and pid namespaces) of the processes a scan has already looked at, so that the
// next scan does not open /proc/<pid>/stat again for each of them: that open and the kernel's
// formatting of the stat line were most of the cost of a sweep (docs/benchmarks.md).
//
// An entry is keyed by (pid, inode number of the /proc/<pid> directory). procfs gives every
// instantiated pid directory a fresh inode number, so a pid that was recycled shows up with
// another number and misses the cache: its start time is read again and a process younger than
// the execution's root is always inspected. The number is the readdir record's d_ino on Linux
// 6.15 and later, which flush a dead process's /proc dentries before its pid number can be
// reused; on older kernels, where readdir could briefly report a dead process's dentry for its
// successor, it is taken with fstatat() on the pid's entry, whose lookup revalidates the dentry
// (procfs.cpp, readdir_inode_is_live). Inode numbers come from a 32-bit counter that can wrap, so
// an entry is trusted only while consecutive passes are at most `max_idle` apart and each saw it
// again: a wrap between two passes would take 2^32 inode allocations within that interval. Only a
// real procfs is cached (a fake tree in tests may reuse inode numbers at once).
//
// Not thread-safe: one scan at a time uses a cache (MarkerSweeper serialises its own).
class ProcStartCache {
 public:
  explicit ProcStartCache(std::chrono::milliseconds max_idle = std::chrono::seconds(10)) noexcept
      : max_idle_(max_idle) {}

  struct Stats {
    std::uint64_t hits = 0;        // start times answered from the cache
    std::uint64_t stat_reads = 0;  // /proc/<pid>/stat files read (misses)
    std::size_t entries = 0;
  };
  [[nodiscard]] Stats stats() const noexcept { return Stats{hits_, stat_reads_, entries_.size()}; }

  // Used by the scans (procfs.cpp) around and during one pass over a procfs.
  struct Entry {
    std::uint64_t dir_inode = 0;
    std::uint64_t start_ticks = 0;
    std::optional<std::uint64_t> ns_inode;
    std::uint64_t seen_pass = 0;
  };
  void begin_pass(std::chrono::steady_clock::time_point now);
  // The entry of (pid, dir_inode), or nullptr (an entry of the pid under another inode number is
  // dropped: that was another process).
  [[nodiscard]] Entry* find(std::int32_t pid, std::uint64_t dir_inode);
  Entry& store(std::int32_t pid, std::uint64_t dir_inode, std::uint64_t start_ticks);
  // Drops every entry the pass did not see (those processes are gone).
  void end_pass(std::chrono::steady_clock::time_point now);
  void count_hit() noexcept { ++hits_; }
  void count_stat_read() noexcept { ++stat_reads_; }

  // The directory the passes list: `proc_root` held open across passes and rewound for each
  // (a fresh opendir per pass cost an open, fstat, fstatfs, a 32 KiB buffer that went back to
  // the heap and a close). -1 when `proc_root` cannot be opened or is not a procfs: the scan
  // then opens it per pass, without the cache, as before. The listing itself is always read
  // fresh (getdents64 from offset 0), so it sees the processes that exist at that pass.
  [[nodiscard]] int proc_dir(std::string const& proc_root);
  [[nodiscard]] std::vector<char>& listing_buffer() noexcept { return listing_; }
  // Forgets the held directory (the mount table changed: /proc may now be another mount).
  void drop_proc_dir() noexcept;

 private:
  UniqueFd proc_dir_;
  std::string proc_dir_root_;
  std::vector<char> listing_;
  std::chrono::milliseconds max_idle_;
  std::unordered_map<std::int32_t, Entry> entries_;
  std::uint64_t pass_ = 0;
  std::optional<std::chrono::steady_clock::time_point> last_pass_;
  std::uint64_t hits_ = 0;
  std::uint64_t stat_reads_ = 0;
};

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
  // Start-time cache to use (and fill); nullptr reads every start time.
  ProcStartCache* cache = nullptr;
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
  ProcStartCache* cache = nullptr;                // as MarkerScanOptions
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

// One marker of a multi-marker sweep, with the start time of its execution's root.
struct MarkerSweepTarget {
  Marker marker;
  std::optional<std::uint64_t> not_before_ticks;
};

// marker_sweep for several markers at once, sharing every /proc pass: each process is listed,
// dated and read (environ) once per pass for all the markers it may belong to (those whose
// not_before_ticks it does not predate). Each marker's result is exactly what marker_sweep would
// report for it alone: its rounds end with the first pass that finds none of its processes,
// and any process that could not be read and may be one of its own makes it unconfirmed.
// options.not_before_ticks is ignored (each target has its own). Results are in target order.
// Errors: as marker_sweep (for all targets together).
[[nodiscard]] Result<std::vector<MarkerSweepResult>> marker_sweep_many(
    std::span<MarkerSweepTarget const> targets, MarkerSweepOptions const& options = {});

// Batches final sweeps: every request queued while a sweep runs is served by the next single
// marker_sweep_many, so teardowns that end at the same time share their /proc passes, and the
// start-time cache persists across sweeps. Thread-safe: enqueue from any thread; run_pending
// runs on one worker thread (the caller's), one run at a time.
class MarkerSweeper {
 public:
  struct Request {
    MarkerSweepTarget target;
    // Runs on the thread that calls run_pending, once, with this marker's result.
    std::function<void(Result<MarkerSweepResult>)> done;
  };

  // `options` apply to every sweep (signal, rounds, proc root ...); its cache field is ignored:
  // the sweeper uses its own.
  explicit MarkerSweeper(MarkerSweepOptions options = {});

  // Queues a request. Returns true when no run is scheduled: the caller must then arrange one
  // call of run_pending() on its worker (false: a run already scheduled will serve it).
  [[nodiscard]] bool enqueue(Request request);
  // Serves requests until the queue is empty, each batch with one marker_sweep_many.
  void run_pending();

  struct Stats {
    std::uint64_t sweeps = 0;    // marker_sweep_many calls
    std::uint64_t requests = 0;  // requests served
    ProcStartCache::Stats cache;
  };
  [[nodiscard]] Stats stats() const;

 private:
  // Whether the proc mount hides processes (hidepid), from /proc/self/mountinfo, re-read only
  // when poll() on that file reports a change of the mount table (POLLPRI: any mount, unmount
  // or remount in our namespace) instead of formatting the whole table on every sweep.
  [[nodiscard]] bool proc_hides_processes_now();

  MarkerSweepOptions options_;
  UniqueFd mountinfo_;         // only the thread inside run_pending() touches it
  std::optional<bool> hides_;  // likewise; nullopt: read the table at the next sweep
  mutable std::mutex mu_;
  std::vector<Request> queue_;  // guarded by mu_
  bool scheduled_ = false;      // guarded by mu_: a run_pending() is due or running
  Stats stats_;                 // guarded by mu_
  ProcStartCache cache_;        // only the thread inside run_pending() touches it
};

}  // namespace custos::sys
