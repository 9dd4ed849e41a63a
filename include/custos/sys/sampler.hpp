// Resource sampling for an execution's process tree, and a bounded disk-usage walk.
//
// Every value comes with its fidelity, so the terminal record never presents a guess as a fact:
//   hard        the kernel enforces a limit on this dimension for the tree (memory.max, pids.max
//               set on its cgroup), and the value was read from the kernel's own counter;
//   sampled     measured at this moment (cgroup counter without an enforced limit, or a sum
//               over /proc) — between two samples the tree may have gone higher;
//   unavailable nothing could be measured; the value is 0 and must not be read as "zero".
#pragma once

#include <cstdint>
#include <string_view>
#include <sys/types.h>
#include <vector>

#include "custos/core/resources.hpp"
#include "custos/core/result.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// core's fidelity ("hard", "sampled", "unavailable": the terminal record's wire strings), so a
// measurement's fidelity reaches the record without a conversion.
using core::Fidelity;
using core::fidelity_wire;

struct Measured {
  std::uint64_t value = 0;
  Fidelity fidelity = Fidelity::unavailable;

  friend bool operator==(Measured const&, Measured const&) = default;
};

enum class SampleSource : std::uint8_t { cgroup, procfs };

struct TreeUsage {
  Measured cpu_ms;     // user+system CPU of the tree (cgroup: includes exited members)
  Measured rss_bytes;  // cgroup memory.current, else sum of resident pages (shared pages count
                       // once per process, so the procfs sum can exceed the true footprint)
  Measured processes;  // live processes in the tree
  Measured open_fds;   // sum of /proc/<pid>/fd entries over the tree's processes
  SampleSource source = SampleSource::procfs;  // where the process list came from
  std::uint32_t unreadable = 0;                // processes seen but not readable (EACCES)
};

struct SampleOptions {
  std::string proc_root = "/proc";
  // Bound on the processes examined: the cgroup's tree, or (with no cgroup) the fallback pids
  // extended by their descendants found through /proc/<pid>/task/<tid>/children.
  std::uint32_t max_processes = 4096;
};

// Samples the tree. With a cgroup: cpu from cpu.stat, memory/pids from their counters when the
// controllers are enabled, the process list from cgroup.procs of the cgroup and its child
// cgroups (complete: setsid and reparented descendants included; at most max_processes), and
// everything else summed over it from /proc. Without a cgroup: the fallback pids plus their
// living descendants, summed from /proc/<pid>/stat, statm and fd/;
// reparented orphans are invisible to this walk (the marker sweep still finds them).
// A process that exits during the sample is skipped. Errors: cgroup.failed when the cgroup's
// cgroup.procs cannot be read; procfs.failed when the proc root cannot be used.
[[nodiscard]] Result<TreeUsage> sample_tree(CgroupDir const* cgroup,
                                            std::vector<pid_t> const& fallback_pids,
                                            SampleOptions const& options = {});

struct DiskUsage {
  std::uint64_t bytes = 0;           // allocated bytes (st_blocks * 512), hard links once
  std::uint64_t apparent_bytes = 0;  // sum of st_size of regular files, hard links once
  std::uint64_t entries = 0;         // directory entries examined (files, dirs, links, ...)
  std::uint64_t unreadable = 0;      // directories that could not be opened or listed
  std::uint64_t other_device = 0;    // directories on another filesystem: counted, not entered
  bool truncated = false;            // stopped at max_entries or max_depth: bytes is a lower bound
};

// Walks the tree below `root` with openat(O_NOFOLLOW)/fstatat(AT_SYMLINK_NOFOLLOW): symlinks
// are counted as entries and never followed, directories on another device are not entered, and
// the walk stops after `max_entries` entries or `max_depth` levels (truncated = true).
// Errors: sys.error when `root` is not a readable directory.
[[nodiscard]] Result<DiskUsage> walk_disk_usage(UniqueFd const& root, std::uint64_t max_entries,
                                                std::uint32_t max_depth = 256);

}  // namespace custos::sys
