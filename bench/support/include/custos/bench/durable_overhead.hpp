// The registry's durable-writes model for scripts/bench (docs/benchmarks.md, docs/durability.md).
// Bench-only code: built into custos_bench_support (bench/CMakeLists.txt), which custos_bench and
// the bench's own test (tests/bench/) link; never part of a library the daemon links.
//
// Measures, in one run and in one directory (same filesystem, same disk cache state):
//   floor      one synchronous=FULL WAL commit of a one-row transaction on a plain SQLite file
//   sequential the durable work of one execution through the registry as RegistrySink does it:
//              claim + record (group durability), staged, await_durable (the claim's
//              fdatasync, before the barrier), committed + running + exited + closed +
//              terminal (NORMAL)
//   concurrent the same from `threads` threads at once (group commit shares the fsyncs)
// and reports both as multiples of the floor. Targets (issue 4): sequential <= 1.5 commits'
// worth per execution; concurrent per-execution cost well under the sequential one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "custos/core/result.hpp"

namespace custos::bench {

struct DurableOverheadResult {
  double full_commit_us = 0;     // floor: median of single FULL commits
  double sequential_us = 0;      // median per execution, one launcher
  double sequential_ratio = 0;   // sequential_us / full_commit_us (target <= 1.5)
  double sequential_cpu_us = 0;  // median CPU time of the writing thread per execution (the
                                 // loop's cost; the flusher's fdatasync is not on it)
  double concurrent_us = 0;      // wall time / executions with `threads` launchers
  double concurrent_ratio = 0;   // concurrent_us / full_commit_us
  std::size_t threads = 0;
  std::size_t executions = 0;                 // per phase (sequential and concurrent each)
  std::uint64_t concurrent_transactions = 0;  // transactions used by the concurrent phase
  std::uint64_t concurrent_full_commits = 0;  // of which synchronous=FULL (fsyncs)
  std::uint64_t concurrent_flushes = 0;       // the flusher's fdatasyncs (group durability)
  std::uint64_t concurrent_writes = 0;        // registry writes of the concurrent phase
  // One waited NORMAL transaction that changes an existing record, on the writing thread's CPU
  // clock (the sequential phase's `committed + running` and `exited ... terminal`), against
  // what SQLite itself spends on the same kind of write: after the registry is closed, the
  // same file, through the same WAL VFS and pragmas, `BEGIN IMMEDIATE` + an UPDATE of the
  // same row's changing columns + `COMMIT` (docs/durability.md "Benchmark rows").
  double running_txn_cpu_us = 0;   // median, committed + running
  double terminal_txn_cpu_us = 0;  // median, exited + closed + 2 accountings + terminal
  double sqlite_txn_cpu_us = 0;    // median, SQLite's own transaction (the floor)
};

// Runs the benchmark in a fresh subdirectory of `scratch_dir` (removed afterwards).
// `executions` per phase; `threads` concurrent launchers in the second phase.
// Errors: registry.* from the registry, registry.io for the floor database.
[[nodiscard]] Result<DurableOverheadResult> durable_overhead(
    std::filesystem::path const& scratch_dir, std::size_t executions = 400,
    std::size_t threads = 16);

}  // namespace custos::bench
