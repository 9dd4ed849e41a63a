// Registration of the daemon's JSON-RPC methods into a Dispatcher.
#pragma once

#include <boost/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/rpc/dispatcher.hpp"

namespace custos::supervisor {
class ExecutionManager;
class OutputPublisher;
struct CollectReport;
}  // namespace custos::supervisor
namespace custos::gateway {
class ExecutionGateway;
}
namespace custos::registry {
class Registry;
struct StoreFigures;
}  // namespace custos::registry
namespace custos::secrets {
class SecretStore;
}

namespace custos::rpc {

// host.info: open to every local caller. `describe` returns the result object (version,
// boot_id, capabilities, default_boundary, ...) already serialized; it is called per request.
// The daemon builds the text once at start-up (nothing in it changes while it runs), so a call
// costs a string splice instead of a copy and re-encoding of the whole capability tree.
void register_host_methods(Dispatcher& d,
                           std::function<Result<std::shared_ptr<std::string const>>()> describe);

// rpc.methods: the names this daemon serves (sorted), open to every caller. Names starting with
// "rpc." are reserved by JSON-RPC 2.0 for such introspection and are not part of docs/api.md.
void register_introspection(Dispatcher& d);

// exec.check, exec.get, exec.list, exec.wait, exec.cancel, exec.input, exec.resize,
// exec.subscribe, exec.unsubscribe, exec.output (docs/api.md), admin-only here. exec.start is not
// among them: a launch needs the gateway's permit (register_gateway_methods adds it).
// `manager` (and `registry`, may be null) must outlive every connection of the server (the
// daemon closes them first). exec.get and exec.wait fall back to the registry for executions
// the manager no longer holds (a previous daemon's, or evicted from its terminal history).
void register_exec_methods(Dispatcher& d, supervisor::ExecutionManager& manager,
                           registry::Registry* registry = nullptr);

// host.gc (admin): retries every unfinished publication and runs the retention sweep now
// (supervisor/publisher.hpp); answers gc_json of what it did. `manager` (its loop answers) and
// `publisher` must outlive the connections.
void register_output_methods(Dispatcher& d, supervisor::ExecutionManager& manager,
                             supervisor::OutputPublisher& publisher);
// host.gc's result, and the `output` figure of host.info (store_json): bytes and counts of the
// spools and artifacts under the state directory, and when they were measured.
[[nodiscard]] boost::json::object gc_json(supervisor::CollectReport const& report);
[[nodiscard]] boost::json::object store_json(registry::StoreFigures const& figures);

// authority.grant/revoke/list, lease.acquire/release/list, holder.quiescence, and exec.start /
// exec.input through the gateway (docs/authority.md). Call after register_exec_methods: it
// adds exec.start, replaces exec.input, opens exec.get/wait/cancel/resize/subscribe/output to
// the caller that started the execution (admins as before) and exec.list to every caller (its
// own executions; admins all). `gw` must outlive the connections.
void register_gateway_methods(Dispatcher& d, gateway::ExecutionGateway& gw);

// secret.set, secret.list, secret.delete (docs/api.md, "Secrets"): admins only, as decided by
// the gateway (configured admins and admin principals). `gw` and `store` must outlive the
// connections.
void register_secret_methods(Dispatcher& d, gateway::ExecutionGateway& gw,
                             secrets::SecretStore& store);

// Methods of docs/api.md this build does not serve yet (callers get -32601). Empty since the
// gateway issue registered authority.*, lease.* and holder.quiescence.
[[nodiscard]] std::vector<std::string> deferred_methods();

}  // namespace custos::rpc
