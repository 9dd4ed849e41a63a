// JSON-RPC 2.0 message rules: request validation, batches, notifications, authorization.
#include "custos/rpc/dispatcher.hpp"

#include <exception>
#include <optional>

#include "custos/core/plan_json.hpp"

namespace custos::rpc {

namespace json = boost::json;

void Dispatcher::add(std::string name, Access access, Handler handler) {
  methods_.insert_or_assign(std::move(name), Entry{access, std::move(handler), {}, {}});
}

void Dispatcher::add_text(std::string name, Access access, TextHandler handler) {
  methods_.insert_or_assign(std::move(name), Entry{access, {}, std::move(handler), {}});
}

void Dispatcher::add_call(std::string name, Access access, CallHandler handler) {
  methods_.insert_or_assign(std::move(name), Entry{access, {}, {}, std::move(handler)});
}

std::vector<std::string> Dispatcher::method_names() const {
  std::vector<std::string> out;
  out.reserve(methods_.size());
  for (auto const& [name, entry] : methods_) out.push_back(name);
  return out;
}

bool Dispatcher::has(std::string_view name) const {
  return methods_.find(name) != methods_.end();
}

Handler const* Dispatcher::find(std::string_view name) const {
  auto it = methods_.find(name);
  return it == methods_.end() || !it->second.handler ? nullptr : &it->second.handler;
}

namespace {

bool valid_id(json::value const& id) {
  return id.is_string() || id.is_number() || id.is_null();
}

// The serialized response to one call; a notification owes nothing, whatever the outcome.
std::string response_text(DispatchStats& stats, json::value const& id, bool is_notification,
                          Result<json::value> const& r) {
  if (!r) ++stats.errors;
  if (is_notification) return {};
  if (r) return result_line(id, json::serialize(*r));
  return json::serialize(error_response(id, r.error()));
}

// Joins the completions of a batch: the response array is emitted when the last call finishes.
struct BatchState {
  // Each finished entry is kept serialized: far smaller than a json::value tree.
  std::vector<std::string> slots;
  std::size_t pending = 0;
  std::function<void(std::string)> emit;
};

// One request's envelope (JSON-RPC 2.0 §4): its id, method and params, or why it is invalid.
struct Envelope {
  json::value id;  // what to answer with: null when absent or itself invalid
  bool notification = false;
  std::string_view method;
  json::value const* params = nullptr;
  std::optional<Error> invalid;  // set: answer this error, with `id`
};

Envelope read_envelope(json::value const& msg) {
  Envelope env;
  if (!msg.is_object()) {
    env.invalid = Error{Errc::rpc_invalid_request, "a request must be an object"};
    return env;
  }
  auto const& obj = msg.get_object();
  auto const* id = obj.if_contains("id");
  env.notification = id == nullptr;
  if (id != nullptr && !valid_id(*id)) {
    env.invalid = Error{Errc::rpc_invalid_request, "id must be a string, a number or null"};
    return env;
  }
  if (id != nullptr) env.id = *id;
  auto const* version = obj.if_contains("jsonrpc");
  auto const* method = obj.if_contains("method");
  env.params = obj.if_contains("params");
  if (version == nullptr || !version->is_string() || version->get_string() != "2.0") {
    env.invalid = Error{Errc::rpc_invalid_request, "jsonrpc must be \"2.0\""};
  } else if (method == nullptr || !method->is_string()) {
    env.invalid = Error{Errc::rpc_invalid_request, "method must be a string"};
  } else if (env.params != nullptr && !env.params->is_object() && !env.params->is_array()) {
    env.invalid = Error{Errc::rpc_invalid_request, "params must be an object or an array"};
  } else {
    env.method = method->get_string();
  }
  return env;
}

// A call's completion. Completions run later, from the manager's callbacks on the loop thread:
// exactly one response (the first) is forwarded, and an exception while building or forwarding it
// (bad_alloc while serializing, a throwing continuation) becomes internal.error for this call
// instead of unwinding through io_context::run().
Reply once_reply(DispatchStats& stats, json::value reply_id, bool is_notification,
                 std::function<void(std::string)> done) {
  auto once = std::make_shared<bool>(false);
  return [once, done = std::move(done), reply_id = std::move(reply_id), is_notification,
          &stats](Result<json::value> const& r) {
    if (*once) return;
    *once = true;
    auto respond_later = [&](Result<json::value> const& res) {
      return response_text(stats, reply_id, is_notification, res);
    };
    std::string response;
    try {
      response = respond_later(r);
    } catch (std::exception const& ex) {
      response =
          respond_later(Error{Errc::internal, std::string{"completion failed: "} + ex.what()});
    } catch (...) {
      response = respond_later(Error{Errc::internal, "completion failed"});
    }
    try {
      done(std::move(response));
    } catch (std::exception const& ex) {
      // The continuation itself threw: it gets one more chance with an error, never a second
      // result (the first forwarding may have had side effects before it threw).
      done(respond_later(Error{Errc::internal, std::string{"completion failed: "} + ex.what()}));
    } catch (...) {
      done(respond_later(Error{Errc::internal, "completion failed"}));
    }
  };
}

}  // namespace

void Dispatcher::handle_one(std::shared_ptr<Session> const& session, json::value const& msg,
                            std::function<void(std::string)> done, bool in_batch) {
  auto const env = read_envelope(msg);
  if (env.invalid) {
    // An invalid request is answered even without an id (JSON-RPC 2.0 §5, id null).
    ++stats_.errors;
    done(json::serialize(error_response(env.id, *env.invalid)));
    return;
  }
  json::value const& reply_id = env.id;
  bool const is_notification = env.notification;
  json::value const* params = env.params;
  if (is_notification)
    ++stats_.notifications;
  else
    ++stats_.calls;

  auto respond = [this, &reply_id, is_notification](Result<json::value> const& r) {
    return response_text(stats_, reply_id, is_notification, r);
  };

  std::string_view const name = env.method;
  auto it = methods_.find(name);
  if (it == methods_.end()) {
    done(respond(Error{Errc::rpc_method_not_found, "no method named " + std::string{name}}));
    return;
  }
  if (it->second.access == Access::admin && !auth_.is_admin(session->peer())) {
    ++stats_.denied;
    done(respond(Error{Errc::auth_denied, std::string{name} + " needs an administrator (uid " +
                                              std::to_string(session->peer().uid) +
                                              " is not one)"}));
    return;
  }
  if (params != nullptr && params->is_array()) {
    // Every custos method takes named parameters (docs/api.md).
    done(respond(Error{Errc::rpc_invalid_params, "params must be an object (named parameters)"}));
    return;
  }
  json::object const empty;
  json::object const& p = params != nullptr ? params->get_object() : empty;

  if (it->second.text) {
    // Ready-made result text: no JSON tree is built, copied or encoded for the result.
    std::string response;
    try {
      auto text = it->second.text(session, p);
      if (!text) {
        response = respond(text.error());
      } else if (!is_notification) {
        response = result_line(reply_id, **text);
      }
    } catch (std::exception const& ex) {
      response = respond(Error{Errc::internal, std::string{"handler failed: "} + ex.what()});
    } catch (...) {
      response = respond(Error{Errc::internal, "handler failed"});
    }
    done(std::move(response));
    return;
  }

  // The handler may complete now or later; exactly one completion is forwarded.
  Reply reply = once_reply(stats_, reply_id, is_notification, std::move(done));
  try {
    if (it->second.call) {
      it->second.call(session, p, CallInfo{in_batch, is_notification}, reply);
    } else {
      it->second.handler(session, p, reply);
    }
  } catch (std::exception const& ex) {
    // The catch-all at the RPC boundary (docs/architecture.md, Conventions): a handler bug must
    // never crash the daemon.
    reply(Error{Errc::internal, std::string{"handler failed: "} + ex.what()});
  } catch (...) {
    reply(Error{Errc::internal, "handler failed"});
  }
}

void Dispatcher::handle_line(std::shared_ptr<Session> const& session, std::string_view line,
                             std::function<void(std::string)> emit) {
  handle_line(session, line, std::move(emit), [](std::size_t) {});
}

void Dispatcher::handle_line(std::shared_ptr<Session> const& session, std::string_view line,
                             std::function<void(std::string)> emit,
                             std::function<void(std::size_t)> const& admitted) {
  // The strict parser: a member name repeated within one object is refused with its pointer
  // (Boost.JSON alone keeps the last one, so a client and the daemon could read different
  // requests from the same bytes). docs/api.md: -32700 with data.diagnostics.
  auto parsed = core::parse_json_text(line);
  if (!parsed) {
    ++stats_.errors;
    std::string const& why = parsed.error().context;
    Error e{Errc::rpc_parse_error, "not valid JSON: " + why};
    constexpr std::string_view kDuplicate = "duplicate member ";
    if (why.rfind(kDuplicate, 0) == 0) {
      std::string pointer = why.substr(kDuplicate.size());
      e.diagnostics.push_back(
          Diagnostic{Errc::rpc_parse_error, pointer, "member name repeated within one object"});
    }
    emit(json::serialize(error_response(json::value{}, e)));
    return;
  }
  json::value msg = std::move(*parsed);
  if (!msg.is_array()) {
    admitted(1);
    handle_one(session, msg, std::move(emit), false);
    return;
  }
  auto& batch = msg.get_array();
  if (batch.empty()) {
    ++stats_.errors;
    emit(json::serialize(
        error_response(json::value{}, Error{Errc::rpc_invalid_request, "empty batch"})));
    return;
  }
  if (batch.size() > max_batch_entries_) {
    // Refused whole, before any entry runs: a single line must not be able to start thousands
    // of calls and assemble a reply hundreds of times its own size.
    ++stats_.errors;
    emit(json::serialize(error_response(
        json::value{}, Error{Errc::rpc_invalid_request,
                             "a batch holds at most " + std::to_string(max_batch_entries_) +
                                 " entries (this one " + std::to_string(batch.size()) + ")"})));
    return;
  }
  // Every entry counts against the connection's in-flight budget until the batch is answered.
  admitted(batch.size());
  auto state = std::make_shared<BatchState>();
  state->slots.resize(batch.size());
  state->pending = batch.size();
  state->emit = std::move(emit);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    handle_one(
        session, batch[i],
        [state, i](std::string response) {
          state->slots[i] = std::move(response);
          if (--state->pending != 0) return;
          std::string out;
          for (auto const& slot : state->slots) {
            if (slot.empty()) continue;
            out += out.empty() ? "[" : ",";
            out += slot;
          }
          state->slots.clear();
          // A batch of notifications only owes nothing (JSON-RPC 2.0 §6).
          if (!out.empty()) out += "]";
          state->emit(std::move(out));
        },
        true);
  }
}

}  // namespace custos::rpc
