// custos_bench: product figures measured beside their kernel floors in the same run.
//
// A floor is the cheapest way the kernel can do the thing at all (raw clone3 into a fresh cgroup,
// a raw pipe into a file, ...). A product row measures custos doing the same thing and reports
// value / floor against a target ratio, so the numbers stay meaningful on a noisy VM: absolute
// times move with the host, ratios measured in one run mostly do not.
//
// Adding a row (docs/benchmarks.md, "Adding a row"): write a RowFn in its own bench/rows_<x>.cpp,
// declare it below next to the others, and list it in product_row_fns() in bench/rows.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace custos::bench {

enum class Better : std::uint8_t { lower, higher };

// One line of the table and one element of the --json array.
struct Row {
  std::string name;                   // "launch+wait, sequential median"
  std::string unit;                   // "ms", "launches/s", "GiB/s", "us", "KiB"
  std::optional<double> value;        // empty: not measured in this build (see note)
  std::string floor_name;             // what the value is compared with
  std::optional<double> floor_value;  // empty: the floor could not be measured here
  std::optional<double> target;       // ratio target (value / floor); empty for floor-only rows
  Better better = Better::lower;      // direction of `value` (and so of the ratio)
  std::string note;                   // why a value is missing, or how it was measured

  // value / floor, when both exist and the floor is non-zero.
  [[nodiscard]] std::optional<double> ratio() const;
  // ratio <= target for `lower`, ratio >= target for `higher`; false when anything is missing.
  [[nodiscard]] bool meets() const;
};

// The kernel floors, measured once per run by measure_floors(). Empty when this host cannot
// measure one (for example no writable cgroup v2); rows then report the floor as missing.
struct Floors {
  std::optional<double> launch_seq_ms;  // clone3 VFORK|PIDFD|INTO_CGROUP + wait + rmdir, median
  std::optional<double>
      launch_concurrent_per_s;       // same, 16 concurrent launchers, launches per second
  std::optional<double> pipe_gib_s;  // 1 GiB through a pipe into a file
  std::optional<double> pty_gib_s;   // a PTY (raw mode) into a file
  std::optional<double>
      sqlite_full_commit_us;           // one WAL synchronous=FULL single-row commit, median
  std::optional<double> tree_kill_ms;  // cgroup.kill + wait-empty of a 1,000-process tree
  std::vector<Row> rows;               // the floors themselves, as informational rows
};

// What a row may use. Paths are absolute.
struct Env {
  std::string noop_path;    // static no-op program (exits 0 at once)
  std::string custos_path;  // the release `custos` binary built with this bench
  std::string self_path;    // this program, for the --helper-* modes rows launch (helpers.cpp)
  std::string work_dir;     // private scratch directory, removed at the end
  std::string cgroup_root;  // custos-bench-<pid> beneath the v2 mount; empty when unavailable
  bool quick = false;       // --quick: fewer iterations (smoke runs, not for the docs)
  std::chrono::steady_clock::time_point deadline;  // the whole run must finish before this
};

using RowFn = std::vector<Row> (*)(Env const& env, Floors const& floors);
struct RowArea {
  char const* name;  // for --only (e.g. "launch", "memory", "teardown", "output", "registry")
  RowFn fn;
};

// ---- the floors (bench/floors.cpp) --------------------------------------------------------
[[nodiscard]] Floors measure_floors(Env const& env);

// ---- product rows: one function per area, each taking the floors (bench/rows*.cpp) --------
std::vector<Row> supervisor_launch_rows(Env const& env, Floors const& floors);
std::vector<Row> teardown_rows(Env const& env, Floors const& floors);
std::vector<Row> output_rows(Env const& env, Floors const& floors);
std::vector<Row> memory_rows(Env const& env, Floors const& floors);
std::vector<Row> registry_rows(Env const& env, Floors const& floors);   // bench/rows_registry.cpp
std::vector<Row> rpc_rows(Env const& env, Floors const& floors);        // bench/rows_rpc.cpp
std::vector<Row> gateway_rows(Env const& env, Floors const& floors);    // bench/rows_gateway.cpp
std::vector<Row> sandbox_rows(Env const& env, Floors const& floors);    // bench/rows_sandbox.cpp
std::vector<Row> container_rows(Env const& env, Floors const& floors);  // rows_containers.cpp
std::vector<Row> artifact_rows(Env const& env, Floors const& floors);   // rows_artifacts.cpp
std::vector<Row> handover_rows(Env const& env, Floors const& floors);   // rows_handover.cpp

// Every product row function, in table order (bench/rows.cpp).
[[nodiscard]] std::vector<RowArea> const& product_row_fns();

// A row whose measurement is not wired in yet or cannot run here: the target and floor are
// shown, the value is empty and `meets` is false, so a missing figure never looks like a pass.
[[nodiscard]] Row unmeasured(std::string name, std::string unit, std::string floor_name,
                             std::optional<double> floor_value, double target, Better better,
                             std::string why);

// ---- programs the rows launch: custos_bench itself in a helper mode (bench/helpers.cpp) ----
//   --helper-write BYTES   writes BYTES to stdout in 64 KiB chunks, exits 0
//   --helper-tree N        becomes a tree of N processes (plain, setsid, double-forked setsid),
//                          prints "ready\n" once forked, then waits to be killed
//   --helper-sleep         waits to be killed
//   --helper-drip MS STOP  writes line n ("%010u drip\n", kDripLine bytes) to stdout every MS ms
//                          until the file STOP exists, then the number of lines to stderr
// Returns the exit code when argv asks for a helper, nothing otherwise.
[[nodiscard]] std::optional<int> run_helper(int argc, char** argv);
inline constexpr std::size_t kDripLine = 16;
// The tree shape of the floor and the helper: the calling process forks n - 1 descendants, a
// third plain children, a third setsid children, a third double-forked setsid grandchildren
// (the shapes killpg misses); each closes stdio and waits to be killed. Returns in the caller
// only; the descendants never return.
void fork_tree(int n);

// ---- helpers shared by floors and rows (bench/harness.cpp) --------------------------------
[[nodiscard]] double median(std::vector<double> v);
[[nodiscard]] double seconds_since(std::chrono::steady_clock::time_point t0);
// Writes back every dirty page of the work dir's filesystem and waits: called between areas
// (and between runs of I/O-heavy rows) so that one measurement's writeback is not billed to the
// next. Never called inside a timed interval.
void settle_page_cache(Env const& env);
// Runs `body` until it returns false, `max_iterations` is reached, or `budget` has elapsed.
void bounded_loop(std::size_t max_iterations, std::chrono::milliseconds budget,
                  std::function<bool()> const& body);

}  // namespace custos::bench
