// JSON-RPC 2.0 vocabulary shared by the server, the method handlers and the CLI client:
// standard error codes, the mapping of custos::Error onto an error object, and the caller's
// kernel-reported identity.
#pragma once

#include <boost/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/error.hpp"

namespace custos::rpc {

// JSON-RPC 2.0 §5.1 reserved codes.
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;

// Application errors live in -32000..-32099. The number only names the layer the error came
// from (docs/api.md); clients branch on data.code, the stable string, never on the number.
[[nodiscard]] int application_code(Errc code) noexcept;

// The JSON-RPC error object for a custos::Error:
//   {code, message, data: {code: "<wire>", recovery: "<class>", detail: {...}}}
// Standard protocol failures (parse, invalid request/params, method not found) keep their
// reserved numbers but carry the same data shape so clients handle one form.
[[nodiscard]] boost::json::object error_object(Error const& e);

// {"jsonrpc":"2.0","id":id,"error":...} / {"jsonrpc":"2.0","id":id,"result":...}
[[nodiscard]] boost::json::object error_response(boost::json::value const& id, Error const& e);
[[nodiscard]] boost::json::object result_response(boost::json::value const& id,
                                                  boost::json::value result);
[[nodiscard]] boost::json::object notification(std::string_view method, boost::json::object params);

// The serialized response line (without '\n') for a result that is already JSON text:
// {"jsonrpc":"2.0","id":<id>,"result":<result_json>}, the same bytes as serializing
// result_response(id, parse(result_json)). `result_json` must be one valid JSON value.
[[nodiscard]] std::string result_line(boost::json::value const& id, std::string_view result_json);

// Rebuilds a custos::Error from a received error object (client side). Unknown wire codes map
// to Errc::internal with the original string kept in context.
[[nodiscard]] Error error_from_object(boost::json::object const& err);

// Who is calling, as the kernel reported it at accept time (SO_PEERCRED, SO_PEERPIDFD).
// Nothing a client writes in a message can change it.
struct PeerCredentials {
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::int32_t pid = 0;
  // Supplementary groups of the peer process, read from /proc/<pid>/status right after accept
  // and re-verified through the peer pidfd when one is available.
  std::vector<std::uint32_t> groups;
  bool has_pidfd = false;
};

// Which callers may use a method.
enum class Access : std::uint8_t {
  any,    // every local caller (host.info)
  admin,  // root, the daemon's own uid, members of the configured admin group
};

// The authorization rule in force until the gateway issue replaces it.
struct AuthPolicy {
  std::uint32_t daemon_uid = 0;
  std::optional<std::uint32_t> admin_gid;

  [[nodiscard]] bool is_admin(PeerCredentials const& peer) const noexcept;
};

}  // namespace custos::rpc
