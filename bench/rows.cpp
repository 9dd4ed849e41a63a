// The product rows, one function per area, each judged against a floor of bench/floors.cpp.
//
// The targets are those of issue 3 ("Benchmarks"). A row that cannot be measured returns
// unmeasured(...) with the reason: the table then shows the target and the floor with no value
// and `meets: false`, so a missing measurement can never read as a pass.
#include "custos/registry/bench.hpp"

#include "bench.hpp"

namespace custos::bench {

std::vector<RowArea> const& product_row_fns() {
  static std::vector<RowArea> const fns = {
      {"launch", &supervisor_launch_rows},
      // Before the output rows: those leave a large free heap behind that would hide RSS growth.
      {"memory", &memory_rows},
      {"teardown", &teardown_rows},
      {"registry", &registry_rows},
      {"rpc", &rpc_rows},
      {"gateway", &gateway_rows},
      // Last: the output rows write gigabytes of spool that the page cache writes back for tens
      // of seconds afterwards. Run earlier, that writeback taxed every fsync of the registry and
      // rpc rows (a FULL commit measured 3.1 ms after them against 0.17 ms before), while their
      // floors had been measured on a quiet cache at the start.
      {"output", &output_rows},
  };
  return fns;
}

// supervisor_launch_rows, teardown_rows, output_rows, memory_rows: bench/rows_supervisor.cpp.

std::vector<Row> registry_rows(Env const& env, Floors const& /*f*/) {
  // registry::bench_durable_overhead measures its own FULL-commit floor in the same directory
  // and run right before the product figures, so the ratio compares like with like
  // (docs/durability.md "Benchmark row").
  std::size_t const n = env.quick ? 50 : 400;
  auto r = registry::bench_durable_overhead(env.work_dir, n, 16);
  Row seq{"registry: durable writes per execution, sequential (claim FULL + 7 NORMAL)",
          "us",
          std::nullopt,
          "one SQLite WAL synchronous=FULL commit (same run)",
          std::nullopt,
          1.5,
          Better::lower,
          ""};
  Row par{"registry: durable writes per execution, 16 concurrent launchers (group commit)",
          "us",
          std::nullopt,
          "one SQLite WAL synchronous=FULL commit (same run)",
          std::nullopt,
          std::nullopt,
          Better::lower,
          ""};
  if (!r) {
    seq.note = par.note = r.error().message();
    return {seq, par};
  }
  seq.value = r->sequential_us;
  seq.floor_value = r->full_commit_us;
  seq.note = std::to_string(r->executions) + " executions, median";
  par.value = r->concurrent_us;
  par.floor_value = r->full_commit_us;
  par.note = std::to_string(r->concurrent_transactions) + " transactions and " +
             std::to_string(r->concurrent_full_commits) + " fsyncs for " +
             std::to_string(r->concurrent_writes) + " writes";
  return {seq, par};
}

}  // namespace custos::bench
