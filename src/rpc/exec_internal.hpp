// rpc-internal helpers shared by exec_methods.cpp (the manager-direct handlers) and
// gateway_methods.cpp (the same methods routed through the gateway), so each rule is written
// once. Not a public header: nothing outside src/rpc includes it.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/rpc/dispatcher.hpp"

namespace custos::registry {
class Registry;
}
namespace custos::supervisor {
class ExecutionManager;
}

namespace custos::rpc::detail {

// One exec.input call carries at most this many decoded bytes (a 512 KiB chunk stays well under
// the server's line limit once base64-encoded).
inline constexpr std::uint64_t kMaxInputChunk = 512 * 1024;

// exec.input's `data_b64`: absent or null = no bytes; otherwise padded base64 of at most
// kMaxInputChunk bytes. rpc.invalid_params for anything else.
[[nodiscard]] Result<std::vector<std::uint8_t>> input_bytes(boost::json::object const& params);

// exec.list (phase, session_id, limit, cursor): first the executions the manager holds (newest
// first), then the registry's records it does not hold, in id order. `only` (when non-null)
// restricts the listing to those execution ids (a non-admin's own executions); null lists all.
void list_executions(supervisor::ExecutionManager& manager, registry::Registry* registry,
                     boost::json::object const& params, std::set<std::string> const* only,
                     Reply reply);

}  // namespace custos::rpc::detail
