// The product rows, one function per area, each judged against a floor of bench/floors.cpp.
//
// The targets are those of issue 3 ("Benchmarks"). A row that cannot be measured returns
// unmeasured(...) with the reason: the table then shows the target and the floor with no value
// and `meets: false`, so a missing measurement can never read as a pass.
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
      {"sandbox", &sandbox_rows},
      {"containers", &container_rows},
      // 1,000 live executions handed over from one image of the daemon to the next.
      {"handover", &handover_rows},
      // Writes and fsyncs gigabytes like the output rows: beside them, at the end.
      {"artifacts", &artifact_rows},
      // Last: the output rows write gigabytes of spool that the page cache writes back for tens
      // of seconds afterwards. Run earlier, that writeback taxed every fsync of the registry and
      // rpc rows (a FULL commit measured 3.1 ms after them against 0.17 ms before), while their
      // floors had been measured on a quiet cache at the start.
      {"output", &output_rows},
  };
  return fns;
}

// supervisor_launch_rows, teardown_rows, output_rows, memory_rows: bench/rows_supervisor.cpp.

// registry_rows: bench/rows_registry.cpp.

}  // namespace custos::bench
