// Error reporting, exit-code mapping and JSON printing for the client subcommands.
#include "common.hpp"

#include <fmt/core.h>

#include <chrono>

#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

int report(Error const& e) {
  fmt::print(stderr, "custos: {}\n", e.message());
  for (auto const& d : e.diagnostics) {
    fmt::print(stderr, "  {} at {}: {}\n", errc_wire(d.code), d.pointer.empty() ? "/" : d.pointer,
               d.message);
  }
  for (auto const& m : e.missing) fmt::print(stderr, "  missing control: {}\n", m);
  switch (e.code) {
    case Errc::rpc_unavailable:
      return kExitUnreachable;
    case Errc::internal:
    case Errc::rpc_parse_error:
    case Errc::rpc_invalid_request:
    case Errc::rpc_method_not_found:
    case Errc::rpc_invalid_params:
      return kExitInternal;
    default:
      return kExitRefused;
  }
}

Result<RpcClient> connect_daemon(Globals const& g) {
  return RpcClient::connect(g.socket.empty() ? default_socket() : g.socket);
}

Result<RpcClient> reconnect_daemon(Globals const& g) {
  return RpcClient::connect_retrying(g.socket.empty() ? default_socket() : g.socket,
                                     kReconnectBudget);
}

std::string reconnect_help() {
  auto const budget = std::chrono::duration_cast<std::chrono::seconds>(kReconnectBudget);
  return fmt::format(
      "When the daemon closes the connection (a handover: SIGHUP, custos daemon --reexec) the "
      "command connects again, retrying for up to {} s while no daemon answers, and goes on: "
      "run and logs -f resume the execution's events after the last one they handled (events "
      "the daemon no longer has are said on stderr), wait asks again; the terminal result is "
      "reported once.",
      budget.count());
}

int exit_code_for(json::value const& terminal) {
  if (!terminal.is_object()) return kExitInternal;
  auto const& t = terminal.get_object();
  std::string const cls = str_field(t, "classification");
  if (cls == "exited" || cls == "signaled") {
    if (auto const* ex = t.if_contains("exit"); ex != nullptr && ex->is_object()) {
      auto const& e = ex->get_object();
      if (auto const* sig = e.if_contains("signal"); sig != nullptr && sig->is_int64()) {
        return 128 + static_cast<int>(sig->get_int64());
      }
      if (auto const* code = e.if_contains("code"); code != nullptr && code->is_int64()) {
        return static_cast<int>(code->get_int64() & 0xff);
      }
    }
    return kExitAbnormal;
  }
  if (cls == "spawn_failed") return kExitSpawnFailed;
  if (cls == "cancelled") return kExitCancelled;
  if (cls == "timed_out") return kExitTimedOut;
  return kExitAbnormal;
}

namespace {

void pretty_into(std::string& out, json::value const& v, int indent) {
  std::string const pad(static_cast<std::size_t>(indent) * 2, ' ');
  if (v.is_object()) {
    auto const& o = v.get_object();
    if (o.empty()) {
      out += "{}";
      return;
    }
    out += "{\n";
    bool first = true;
    for (auto const& kv : o) {
      if (!first) out += ",\n";
      first = false;
      out += pad + "  " + json::serialize(json::string{kv.key()}) + ": ";
      pretty_into(out, kv.value(), indent + 1);
    }
    out += "\n" + pad + "}";
  } else if (v.is_array()) {
    auto const& a = v.get_array();
    if (a.empty()) {
      out += "[]";
      return;
    }
    out += "[\n";
    bool first = true;
    for (auto const& item : a) {
      if (!first) out += ",\n";
      first = false;
      out += pad + "  ";
      pretty_into(out, item, indent + 1);
    }
    out += "\n" + pad + "]";
  } else {
    out += json::serialize(v);
  }
}

}  // namespace

std::string pretty(json::value const& v) {
  std::string out;
  pretty_into(out, v, 0);
  return out;
}

std::string str_field(json::object const& o, std::string_view key) {
  auto const* v = o.if_contains(key);
  if (v == nullptr || !v->is_string()) return {};
  return std::string{v->get_string()};
}

}  // namespace custos::cli
