// The product rows, one function per area, each judged against a floor of bench/floors.cpp.
//
// The targets are those of issue 3 ("Benchmarks"). A row function whose measurement is not
// wired in yet returns unmeasured(...) rows: the table then shows the target and the floor with
// no value and `meets: false`, so a missing measurement can never read as a pass. To wire one in,
// replace the body (or move it to bench/rows_<area>.cpp) and return rows with `value` set.
#include "bench.hpp"

namespace custos::bench {

std::vector<RowFn> const& product_row_fns() {
  static std::vector<RowFn> const fns = {
      &supervisor_launch_rows,
      &teardown_rows,
      &output_rows,
      &memory_rows,
      &registry_rows,
  };
  return fns;
}

namespace {
constexpr char const* kNotWired = "not measured yet: the supervisor path is not wired into custos_bench";
}  // namespace

std::vector<Row> supervisor_launch_rows(Env const& /*env*/, Floors const& f) {
  return {
      unmeasured("launch + wait of a static no-op through the supervisor (median)", "ms",
                 "clone3 into fresh cgroup + pidfd wait + rmdir", f.launch_seq_ms, 1.3, Better::lower, kNotWired),
      unmeasured("same, 16 concurrent executions", "launches/s", "clone3 floor, 16 concurrent launchers",
                 f.launch_concurrent_per_s, 0.8, Better::higher, kNotWired),
  };
}

std::vector<Row> teardown_rows(Env const& /*env*/, Floors const& f) {
  return {
      unmeasured("teardown of a 1,000-process tree with setsid/double-fork escapees (zero survivors)", "ms",
                 "bare cgroup.kill + wait-empty", f.tree_kill_ms, 1.2, Better::lower, kNotWired),
  };
}

std::vector<Row> output_rows(Env const& /*env*/, Floors const& f) {
  return {
      unmeasured("output: 1 GiB on stdout through the supervisor", "GiB/s", "raw pipe -> file", f.pipe_gib_s, 0.85,
                 Better::higher, kNotWired),
      unmeasured("output: PTY stream through the supervisor", "GiB/s", "raw PTY -> file", f.pty_gib_s, 0.9,
                 Better::higher, kNotWired),
  };
}

std::vector<Row> memory_rows(Env const& /*env*/, Floors const& /*f*/) {
  // No kernel floor exists for this one: the comparison is with the budget itself (32 KiB per
  // idle execution; a conmon costs ~2.5 MiB per container), so ratio <= 1.0 means within budget.
  return {
      unmeasured("daemon RSS growth per idle running execution (1,000 sleeping)", "KiB",
                 "budget per execution", 32.0, 1.0, Better::lower, kNotWired),
  };
}

std::vector<Row> registry_rows(Env const& /*env*/, Floors const& /*f*/) {
  // The registry's rows (against sqlite_full_commit_us) are added by the registry's owner.
  return {};
}

}  // namespace custos::bench
