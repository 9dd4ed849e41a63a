// Helpers shared by the client subcommands. Private to cli/.
#pragma once

#include <boost/json.hpp>
#include <fmt/core.h>

#include <string>
#include <string_view>
#include <utility>

#include "custos/cli/client.hpp"
#include "custos/core/result.hpp"

#include "commands.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

// Prints "custos: <stable.code>: <detail>" on stderr (one line, plus one line per diagnostic)
// and returns the exit code for it: kExitUnreachable for rpc.unavailable, kExitInternal for
// protocol/internal errors, kExitRefused otherwise.
int report(Error const& e);

// Connects to g.socket or default_socket().
[[nodiscard]] Result<RpcClient> connect_daemon(Globals const& g);

// connect_daemon(), retried for up to kReconnectBudget while no daemon answers: after the daemon
// closed the connection (a handover), to go on with what was under way.
[[nodiscard]] Result<RpcClient> reconnect_daemon(Globals const& g);

// What run, logs -f and wait do when the daemon closes the connection (docs/cli.md,
// "Reconnecting"), for --help and the man page; it names kReconnectBudget.
[[nodiscard]] std::string reconnect_help();

// The exit code a terminal result maps to (docs/cli.md): the child's code, 128+signal,
// or one of kExitSpawnFailed / kExitCancelled / kExitTimedOut / kExitAbnormal.
[[nodiscard]] int exit_code_for(boost::json::value const& terminal);

// Pretty-prints JSON with two-space indentation.
[[nodiscard]] std::string pretty(boost::json::value const& v);

// A string field of an object, "" when absent or not a string.
[[nodiscard]] std::string str_field(boost::json::object const& o, std::string_view key);

// One RPC call: on error reports it and sets g.exit_code; on success prints the result as JSON
// with --json (or when it is not an object), else hands the object to `human` to format.
template <class F>
void call_and_print(Globals& g, std::string_view method, boost::json::object params, F human) {
  auto client = connect_daemon(g);
  if (!client) {
    g.exit_code = report(client.error());
    return;
  }
  auto r = client->call(method, std::move(params));
  if (!r) {
    g.exit_code = report(r.error());
    return;
  }
  g.exit_code = kExitOk;
  if (g.json || !r->is_object()) {
    fmt::print("{}\n", boost::json::serialize(*r));
    return;
  }
  human(r->get_object());
}

}  // namespace custos::cli
