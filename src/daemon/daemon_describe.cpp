// What host.info says about this daemon: the static part (serialized once) and the live figures.
#include <algorithm>
#include <unistd.h>

#include "custos/daemon/version.hpp"
#include "custos/rpc/methods.hpp"

#include "daemon_impl.hpp"

namespace custos::daemon {

json::object Daemon::recovery_json(supervisor::RecoveryReport const& report) {
  json::array quarantined;
  for (auto const& q : report.quarantined) {
    quarantined.push_back(json::object{{"execution_id", q.execution_id},
                                       {"code", q.code},
                                       {"reason", q.reason},
                                       {"detected_ns", q.detected_ns}});
  }
  json::array orphans;
  for (auto const& c : report.orphan_claims) {
    orphans.push_back(json::object{{"action_id", c.action_id},
                                   {"process_id", c.process_id},
                                   {"execution_id", c.execution_id},
                                   {"consumed_ns", c.consumed_ns}});
  }
  json::array adopted;
  for (auto const& e : report.executions) {
    if (e.adopted) adopted.emplace_back(e.execution_id);
  }
  json::array leftovers;
  for (auto const& l : report.leftover_cgroups) {
    leftovers.push_back(json::object{{"execution_id", l.execution_id},
                                     {"cleanup", core::cleanup_wire(l.cleanup)},
                                     {"detail", l.detail}});
  }
  return json::object{{"quarantined", std::move(quarantined)},
                      {"orphan_claims", std::move(orphans)},
                      {"adopted", std::move(adopted)},
                      {"leftover_cgroups", std::move(leftovers)}};
}

json::array Daemon::describe_engines() const {
  json::array engines;
  auto const served = manager_->backends();
  for (auto const& [kind, socket] : {std::pair{core::BackendKind::docker, config_.docker_socket},
                                     std::pair{core::BackendKind::podman, config_.podman_socket}}) {
    // The backend's descriptor already looked: available = a socket is there.
    auto const d = std::find_if(served.begin(), served.end(),
                                [k = kind](backend::Descriptor const& x) { return x.kind == k; });
    bool const present = d != served.end() && d->available;
    std::string boundary = "marker";
    if (config_.boundary != BoundaryMode::marker) {
      boundary = subtree_ ? "cgroup (beneath the container's own cgroup, else beneath " +
                                subtree_->path() + ")"
                          : "cgroup beneath the container's own cgroup where it has one, "
                            "else marker";
    }
    engines.push_back(json::object{{"engine", core::to_string(kind)},
                                   {"socket", socket},
                                   {"socket_present", present},
                                   {"boundary", boundary}});
  }
  return engines;
}

Result<std::shared_ptr<std::string const>> Daemon::describe_host() {
  if (host_info_prefix_.empty()) {
    host_info_prefix_ = json::serialize(describe_static());
    host_info_prefix_.pop_back();  // the closing brace: the output member goes before it
  }
  auto output = rpc::store_json(publisher_->figures());
  auto const& policy = publisher_->retention();
  output["retention"] = json::object{{"age_s", policy.age.count()}, {"bytes", policy.bytes}};
  auto text = std::make_shared<std::string>(host_info_prefix_);
  *text += R"(,"output":)";
  *text += json::serialize(output);
  *text += R"(,"descriptor_store":)";
  *text += fd_store_ ? json::serialize(json::object{{"stored", fd_store_->stored()},
                                                    {"failures", fd_store_->failures()},
                                                    {"restored", restored_from_store_}})
                     : std::string{"null"};
  *text += R"(,"handover_refused":)";
  *text += json::serialize(handover_.refused);
  *text += '}';
  return std::shared_ptr<std::string const>(std::move(text));
}

json::object Daemon::describe_static() const {
  json::object out{{"version", kVersion},
                   {"boot_id", boot_id_},
                   {"default_boundary", subtree_ ? "cgroup" : "marker"},
                   {"pid", ::getpid()},
                   {"started_ns", handover_.started_ns}};
  if (handover_.from) {
    auto const& o = *handover_.from;
    out["handover"] = json::object{{"count", o.count},
                                   {"from_version", o.version},
                                   {"from_started_ns", o.started_ns},
                                   {"fallback", o.fallback},
                                   {"reason", o.reason}};
  } else {
    out["handover"] = nullptr;
  }
  if (caps_) {
    out["capabilities"] = sys::to_json(*caps_);
  } else {
    out["capabilities"] = json::object{};
  }
  if (subtree_) out["cgroup_subtree"] = subtree_->path();
  out["shutdown_policy"] = config_.shutdown == ShutdownMode::cancel ? "cancel" : "detach";
  out["restart_policy"] = supervisor::restart_policy_wire(config_.restart_policy);
  out["registry"] = recovery_view_;
  json::array backends;
  for (auto const& d : manager_->backends()) backends.push_back(backend::to_json(d));
  out["backends"] = std::move(backends);
  out["engines"] = describe_engines();
  return out;
}

}  // namespace custos::daemon
