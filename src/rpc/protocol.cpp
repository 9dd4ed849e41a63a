// Mapping between custos::Error and JSON-RPC error objects.
#include "custos/rpc/protocol.hpp"

#include <algorithm>

namespace custos::rpc {

namespace json = boost::json;

int application_code(Errc code) noexcept {
  auto const n = static_cast<int>(code);
  // One number per layer range (error.hpp): -32001 plan ... -32009 internal.
  int const layer = std::clamp(n / 1000, 1, 9);
  return -32000 - layer;
}

namespace {

int wire_number(Errc code) noexcept {
  switch (code) {
    case Errc::rpc_parse_error:
      return kParseError;
    case Errc::rpc_invalid_request:
    case Errc::rpc_line_too_long:
      return kInvalidRequest;
    case Errc::rpc_method_not_found:
      return kMethodNotFound;
    case Errc::rpc_invalid_params:
      return kInvalidParams;
    default:
      return application_code(code);
  }
}

}  // namespace

json::object error_object(Error const& e) {
  json::object detail;
  if (!e.context.empty()) detail["context"] = e.context;
  if (e.sys_errno != 0) detail["errno"] = e.sys_errno;
  if (!e.diagnostics.empty()) {
    json::array diags;
    for (auto const& d : e.diagnostics) {
      diags.push_back(json::object{
          {"code", errc_wire(d.code)}, {"pointer", d.pointer}, {"message", d.message}});
    }
    detail["diagnostics"] = std::move(diags);
  }
  if (!e.missing.empty()) {
    json::array missing;
    for (auto const& m : e.missing) missing.emplace_back(m);
    detail["missing"] = std::move(missing);
  }
  json::object data{
      {"code", e.wire()}, {"recovery", recovery_wire(e.recovery())}, {"detail", std::move(detail)}};
  std::string message = e.context.empty() ? std::string{e.wire()} : e.message();
  return json::object{
      {"code", wire_number(e.code)}, {"message", std::move(message)}, {"data", std::move(data)}};
}

json::object error_response(json::value const& id, Error const& e) {
  return json::object{{"jsonrpc", "2.0"}, {"id", id}, {"error", error_object(e)}};
}

json::object result_response(json::value const& id, json::value result) {
  return json::object{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json::object notification(std::string_view method, json::object params) {
  return json::object{{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
}

std::string result_line(json::value const& id, std::string_view result_json) {
  constexpr std::string_view kHead = R"({"jsonrpc":"2.0","id":)";
  constexpr std::string_view kMid = R"(,"result":)";
  std::string const id_text = json::serialize(id);
  std::string out;
  out.reserve(kHead.size() + id_text.size() + kMid.size() + result_json.size() + 1);
  out.append(kHead).append(id_text).append(kMid).append(result_json).push_back('}');
  return out;
}

Error error_from_object(json::object const& err) {
  Error e{Errc::internal};
  std::string message;
  if (auto const* m = err.if_contains("message"); m != nullptr && m->is_string()) {
    message = std::string{m->get_string()};
  }
  auto const* data = err.if_contains("data");
  if (data != nullptr && data->is_object()) {
    auto const& d = data->get_object();
    if (auto const* c = d.if_contains("code"); c != nullptr && c->is_string()) {
      std::string_view const wire = c->get_string();
      if (auto code = errc_from_wire(wire)) {
        e.code = *code;
      } else {
        message = std::string{wire} + ": " + message;
      }
    }
    if (auto const* det = d.if_contains("detail"); det != nullptr && det->is_object()) {
      auto const& dd = det->get_object();
      if (auto const* ctx = dd.if_contains("context"); ctx != nullptr && ctx->is_string()) {
        e.context = std::string{ctx->get_string()};
      }
      if (auto const* en = dd.if_contains("errno"); en != nullptr && en->is_int64()) {
        e.sys_errno = static_cast<int>(en->get_int64());
      }
      if (auto const* ds = dd.if_contains("diagnostics"); ds != nullptr && ds->is_array()) {
        for (auto const& item : ds->get_array()) {
          if (!item.is_object()) continue;
          auto const& o = item.get_object();
          Diagnostic diag{Errc::internal, {}, {}};
          if (auto const* dc = o.if_contains("code"); dc != nullptr && dc->is_string()) {
            diag.code = errc_from_wire(dc->get_string()).value_or(Errc::internal);
          }
          if (auto const* p = o.if_contains("pointer"); p != nullptr && p->is_string()) {
            diag.pointer = std::string{p->get_string()};
          }
          if (auto const* mm = o.if_contains("message"); mm != nullptr && mm->is_string()) {
            diag.message = std::string{mm->get_string()};
          }
          e.diagnostics.push_back(std::move(diag));
        }
      }
      if (auto const* ms = dd.if_contains("missing"); ms != nullptr && ms->is_array()) {
        for (auto const& m : ms->get_array()) {
          if (m.is_string()) e.missing.emplace_back(m.get_string());
        }
      }
    }
  } else if (auto const* n = err.if_contains("code"); n != nullptr && n->is_int64()) {
    switch (n->get_int64()) {
      case kParseError:
        e.code = Errc::rpc_parse_error;
        break;
      case kInvalidRequest:
        e.code = Errc::rpc_invalid_request;
        break;
      case kMethodNotFound:
        e.code = Errc::rpc_method_not_found;
        break;
      case kInvalidParams:
        e.code = Errc::rpc_invalid_params;
        break;
      default:
        break;
    }
  }
  if (e.context.empty()) e.context = std::move(message);
  return e;
}

bool AuthPolicy::is_admin(PeerCredentials const& peer) const noexcept {
  if (peer.uid == 0 || peer.uid == daemon_uid) return true;
  if (!admin_gid) return false;
  if (peer.gid == *admin_gid) return true;
  return std::find(peer.groups.begin(), peer.groups.end(), *admin_gid) != peer.groups.end();
}

}  // namespace custos::rpc
