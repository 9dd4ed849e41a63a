// The exposition text: one family after another, each with HELP and TYPE, from the counters the
// manager, the JSON-RPC server and the registry keep anyway. Nothing here counts a second time.
#include "metrics.hpp"

#include <fmt/format.h>

#include <iterator>
#include <string_view>
#include <sys/stat.h>

#include "custos/core/cancellation.hpp"
#include "custos/core/latency_histogram.hpp"
#include "custos/core/lifecycle.hpp"
#include "custos/registry/registry.hpp"
#include "custos/rpc/server.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/publisher.hpp"

namespace custos::daemon {

namespace {

class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                   type);
  }
  // `labels` is the text between the braces (label="value",...), or empty.
  template <class V>
  void sample(std::string_view name, V value, std::string_view labels = {}) {
    if (labels.empty()) {
      fmt::format_to(std::back_inserter(out_), "{} {}\n", name, value);
    } else {
      fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, value);
    }
  }
  [[nodiscard]] std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::uint64_t file_size(std::string const& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

void render_manager(Exposition& e, supervisor::ExecutionManager const& m) {
  auto const& stats = m.stats();
  e.family("custos_executions", "gauge", "Executions not yet terminal, by lifecycle phase.");
  auto const phases = m.live_by_phase();
  for (std::size_t i = 0; i < core::kPhaseCount; ++i) {
    auto const phase = static_cast<core::Phase>(i);
    if (phase == core::Phase::terminal) continue;
    e.sample("custos_executions", phases[i], fmt::format("phase=\"{}\"", core::phase_wire(phase)));
  }
  e.family("custos_executions_terminal_total", "counter",
           "Terminal records published since the daemon started, by classification.");
  for (std::size_t i = 0; i < core::kClassificationCount; ++i) {
    auto const c = static_cast<core::Classification>(i);
    e.sample("custos_executions_terminal_total", stats.terminal_by_classification[i],
             fmt::format("classification=\"{}\"", core::classification_wire(c)));
  }
  e.family("custos_launches_total", "counter",
           "Launches answered since the daemon started (spawn failures included, adopted "
           "executions not).");
  e.sample("custos_launches_total", stats.started);
  e.family("custos_cleanup_unconfirmed_total", "counter",
           "Terminal records since the daemon started whose process-tree cleanup is "
           "unconfirmed.");
  e.sample("custos_cleanup_unconfirmed_total", stats.cleanup_unconfirmed);
  e.family("custos_spool_bytes_total", "counter",
           "Output bytes written to spool files since the daemon started.");
  e.sample("custos_spool_bytes_total", stats.spool_bytes);
}

void render_server(Exposition& e, rpc::Server const& server) {
  auto const stats = server.stats();
  e.family("custos_rpc_connections", "gauge", "Open JSON-RPC client connections.");
  e.sample("custos_rpc_connections", stats.open);
  e.family("custos_events_dropped_total", "counter",
           "Events not sent to a subscriber because its connection's event queue was full.");
  e.sample("custos_events_dropped_total", stats.events_dropped);
}

void render_registry(Exposition& e, registry::Registry const& registry) {
  constexpr std::string_view name = "custos_registry_commit_seconds";
  e.family(name, "histogram",
           "Registry write transactions, BEGIN to the end of COMMIT (fsync included for "
           "synchronous=FULL).");
  auto const h = registry.commit_latency();
  auto const& bounds = core::LatencyHistogram::kBoundsNs;
  std::string const bucket = fmt::format("{}_bucket", name);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    e.sample(bucket, h.cumulative[i],
             fmt::format("le=\"{}\"", static_cast<double>(bounds[i]) / 1e9));
  }
  e.sample(bucket, h.cumulative.back(), "le=\"+Inf\"");
  e.sample(fmt::format("{}_sum", name), static_cast<double>(h.sum_ns) / 1e9);
  e.sample(fmt::format("{}_count", name), h.count);
  std::string const db = registry.db_path().native();
  e.family("custos_registry_size_bytes", "gauge",
           "Bytes of the registry's SQLite database file plus its write-ahead log.");
  e.sample("custos_registry_size_bytes", file_size(db) + file_size(db + "-wal"));
}

// The output store as the publisher last measured it (after its latest batch or sweep): the
// same figure as host.info's `output`, never a walk per scrape.
void render_store(Exposition& e, supervisor::OutputPublisher const& publisher) {
  auto const f = publisher.figures();
  e.family("custos_artifact_bytes", "gauge",
           "Bytes of published output in the content-addressed artifact store.");
  e.sample("custos_artifact_bytes", f.artifact_bytes);
  e.family("custos_artifacts", "gauge", "Artifacts in the store.");
  e.sample("custos_artifacts", f.artifacts);
  e.family("custos_spool_retained_bytes", "gauge",
           "Bytes of spool files kept under the state directory (live or not yet published).");
  e.sample("custos_spool_retained_bytes", f.spool_bytes);
}

}  // namespace

std::string render_metrics(MetricsSources const& sources) {
  Exposition e;
  if (sources.manager != nullptr) render_manager(e, *sources.manager);
  if (sources.server != nullptr) render_server(e, *sources.server);
  if (sources.registry != nullptr) render_registry(e, *sources.registry);
  if (sources.publisher != nullptr) render_store(e, *sources.publisher);
  return e.take();
}

}  // namespace custos::daemon
