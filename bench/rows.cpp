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
      {"output", &output_rows},
      {"registry", &registry_rows},
  };
  return fns;
}

// supervisor_launch_rows, teardown_rows, output_rows, memory_rows: bench/rows_supervisor.cpp.

std::vector<Row> registry_rows(Env const& /*env*/, Floors const& /*f*/) {
  // The registry's rows (against sqlite_full_commit_us) are added by the registry's owner.
  return {};
}

}  // namespace custos::bench
