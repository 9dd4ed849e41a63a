// The daemon's Prometheus exposition (docs/metrics.md): read from counters that already exist
// (the manager's, the JSON-RPC server's, the registry's), built on the loop thread for each
// scrape. Private to daemon/.
#pragma once

#include <string>

namespace custos::registry {
class Registry;
}
namespace custos::rpc {
class Server;
}
namespace custos::supervisor {
class ExecutionManager;
class OutputPublisher;
}  // namespace custos::supervisor

namespace custos::daemon {

// What a scrape reads; a null source's metrics are left out.
struct MetricsSources {
  supervisor::ExecutionManager const* manager = nullptr;
  rpc::Server const* server = nullptr;
  registry::Registry const* registry = nullptr;
  supervisor::OutputPublisher const* publisher = nullptr;  // the output store's figures
};

// The text exposition format 0.0.4: every family with its HELP and TYPE lines.
[[nodiscard]] std::string render_metrics(MetricsSources const& sources);

}  // namespace custos::daemon
