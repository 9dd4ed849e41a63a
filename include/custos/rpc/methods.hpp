// Registration of the daemon's JSON-RPC methods into a Dispatcher.
#pragma once

#include <boost/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/rpc/dispatcher.hpp"

namespace custos::supervisor {
class ExecutionManager;
}
namespace custos::registry {
class Registry;
}

namespace custos::rpc {

// host.info: open to every local caller. `describe` builds the result (version, boot_id,
// capabilities, default_boundary) and is called per request so capabilities stay current.
void register_host_methods(Dispatcher& d, std::function<Result<boost::json::object>()> describe);

// rpc.methods: the names this daemon serves (sorted), open to every caller. Names starting with
// "rpc." are reserved by JSON-RPC 2.0 for such introspection and are not part of API.md.
void register_introspection(Dispatcher& d);

// exec.check, exec.start, exec.get, exec.list, exec.wait, exec.cancel, exec.input, exec.resize,
// exec.subscribe, exec.unsubscribe, exec.output (API.md), admin-only until the gateway issue.
// `manager` (and `registry`, may be null) must outlive every connection of the server (the
// daemon closes them first). exec.get and exec.wait fall back to the registry for executions
// the manager no longer holds (a previous daemon's, or evicted from its terminal history).
void register_exec_methods(Dispatcher& d, supervisor::ExecutionManager& manager,
                           registry::Registry* registry = nullptr);

// The methods of API.md that belong to later issues (authority.*, lease.*, holder.quiescence)
// are deliberately not registered: callers get -32601 method not found.
[[nodiscard]] std::vector<std::string> deferred_methods();

}  // namespace custos::rpc
