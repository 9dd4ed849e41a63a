#include "custos/supervisor/types.hpp"

#include <chrono>

#include "custos/backend/plan_view.hpp"
#include "custos/core/base64.hpp"

namespace custos::supervisor {

boost::json::object Event::to_json() const {
  boost::json::object o;
  o["execution_id"] = execution_id;
  o["seq"] = seq;
  o["plan_digest"] = plan_digest;
  // Every event is bound to the sandbox it was observed under (docs/sandbox.md).
  if (sandbox_digest.empty()) {
    o["sandbox_digest"] = nullptr;
  } else {
    o["sandbox_digest"] = sandbox_digest;
  }
  o["kind"] = kind;
  for (auto const& [k, v] : fields) o[k] = v;
  if (kind == "output") o["data_b64"] = core::base64_encode(data);
  return o;
}

boost::json::object StartResult::to_json() const {
  boost::json::object o;
  o["execution_id"] = execution_id;
  o["plan_digest"] = plan_digest;
  if (sandbox_digest) {
    o["sandbox_digest"] = sandbox_digest->to_string();
  } else {
    o["sandbox_digest"] = nullptr;
  }
  o["phase"] = core::phase_wire(phase);
  o["boundary"] = core::boundary_wire(boundary);
  o["pid"] = pid;
  return o;
}

boost::json::object ExecutionView::to_json() const {
  boost::json::object o;
  o["execution_id"] = execution_id;
  o["identity"] = backend::identity_json(identity);
  o["plan_digest"] = plan_digest;
  if (sandbox_digest) {
    o["sandbox_digest"] = sandbox_digest->to_string();
  } else {
    o["sandbox_digest"] = nullptr;
  }
  o["phase"] = core::phase_wire(phase);
  o["boundary"] = core::boundary_wire(boundary);
  o["containment"] = kernel_enforced ? "kernel_enforced" : "escapable";
  o["pid"] = pid;
  o["executable"] = executable;
  o["backend"] = core::to_string(backend);
  o["started_at_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(started_at.time_since_epoch()).count();
  if (trigger)
    o["trigger"] = core::trigger_wire(*trigger);
  else
    o["trigger"] = nullptr;
  boost::json::object acc;
  for (auto const& [stream, a] : output) {
    boost::json::object s;
    s["observed"] = a.observed;
    s["retained"] = a.retained;
    s["dropped"] = a.dropped;
    s["complete"] = a.complete;
    acc[core::stream_wire(stream)] = std::move(s);
  }
  o["accounting"] = std::move(acc);
  o["events"] = events;
  if (terminal) {
    auto j = core::to_json(*terminal);
    if (j)
      o["terminal"] = std::move(*j);
    else
      o["terminal"] = nullptr;
  }
  if (usage && !terminal) {
    auto field = [](std::optional<std::uint64_t> v) {
      return v ? boost::json::value(*v) : boost::json::value(nullptr);
    };
    o["usage"] = boost::json::object{{"processes", field(usage->processes)},
                                     {"cpu_ms", field(usage->cpu_ms)},
                                     {"memory_bytes", field(usage->rss_bytes)}};
  }
  if (sink_error) o["sink_error"] = *sink_error;
  o["orphans_reaped"] = orphans_reaped;
  if (cleanup_detail) o["cleanup_detail"] = *cleanup_detail;
  return o;
}

}  // namespace custos::supervisor
