// The marker boundary's scan, shared by marker_scan.cpp (the scan and its pass over /proc) and
// marker_sweep.cpp (the sweep that signals what the scan found). Internal to src/sys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::sys::detail {

// How reading one process's environ ended.
enum class EnvironState : std::uint8_t { marked, unmarked, gone, unreadable };

// Whether <proc_root>/<pid>/environ holds the whole entry `needle` (marker_needle), reading at
// most `max_bytes` of it.
EnvironState read_environ_state(std::string const& proc_root, std::int32_t pid,
                                std::string const& needle, std::size_t max_bytes);

// "\0CUSTOS_MARKER=<hex>\0": the marker's entry as a whole environ entry.
std::string marker_needle(Marker const& marker);

// Signalling by pid is only meaningful when the pids listed under proc_root are pids of our own
// namespace: the real /proc, or another procfs mount of the same namespace. A fake tree (tests)
// or a container's procfs is scanned but never signalled through.
bool proc_root_is_ours(std::string const& proc_root);

// The pid namespace to compare processes with: `given`, else our own under proc_root.
Result<std::uint64_t> expected_ns(std::optional<std::uint64_t> given, std::string const& proc_root);

// One marker being scanned for, as the passes see it.
struct ScanTarget {
  std::string needle;
  std::optional<std::uint64_t> not_before_ticks;
};

struct ScanParams {
  std::uint64_t ns_inode;
  std::string const& proc_root;
  std::size_t max_environ_bytes;
  ProcStartCache* cache;
};

// One pass over <proc_root> for the targets listed in `active` (indexes into `targets`);
// out[i] is filled for each active i. Every process is dated once (cache or stat), its
// namespace checked once, and its environ read once for all the targets it may belong to.
Result<void> scan_pass(std::vector<ScanTarget> const& targets,
                       std::vector<std::size_t> const& active, ScanParams const& sp,
                       std::vector<MarkerScanResult>& out);

}  // namespace custos::sys::detail
