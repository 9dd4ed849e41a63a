// secret.set / secret.list / secret.delete (docs/api.md, "Secrets"): the secret store behind the
// admin check the gateway's methods use (configured admins and admin principals; everyone else
// auth.denied before the parameters are even read, so a non-admin learns nothing about the
// store, not even whether a name is valid). Listing is admin-only too: which names the store
// holds is exactly what sandbox.secret_unknown keeps from callers whose contract does not allow
// a ref.
//
// A value enters as `value_b64`, is decoded into a buffer zeroed after the store wrote it, and is
// never part of an answer or an error: errors name the secret only. The store's file I/O (an
// fsync of the file and of the directory per set or delete) runs on the loop: these are rare
// admin calls, and each is bounded by the value's size bound.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "custos/core/base64.hpp"
#include "custos/gateway/gateway.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/secrets/store.hpp"

#include "exec_internal.hpp"

namespace custos::rpc {

namespace json = boost::json;

namespace {

using detail::Params;

// The largest padded base64 text a value within the bound can have: anything longer is
// secret.too_large without decoding it.
constexpr std::size_t kMaxValueB64 = (secrets::kMaxSecretValueBytes + 2) / 3 * 4;

Result<void> admin_only(Dispatcher const& d, gateway::ExecutionGateway& gw,
                        std::shared_ptr<Session> const& s, std::string_view method) {
  auto const& peer = s->peer();
  auto caller = gw.resolve_caller(peer.uid, peer.gid, peer.groups, d.auth().is_admin(peer));
  if (!caller) return caller.error();
  if (!caller->admin) return Error{Errc::auth_denied, std::string(method) + " is for admins only"};
  return ok();
}

// The decoded value, zeroed when it goes out of scope.
struct DecodedValue {
  std::vector<std::uint8_t> bytes;
  DecodedValue() = default;
  DecodedValue(DecodedValue const&) = delete;
  DecodedValue& operator=(DecodedValue const&) = delete;
  ~DecodedValue() { secrets::wipe_bytes(bytes.data(), bytes.size()); }
};

}  // namespace

void register_secret_methods(Dispatcher& d, gateway::ExecutionGateway& gw,
                             secrets::SecretStore& store) {
  d.add("secret.set", Access::any,
        [&d, &gw, &store](std::shared_ptr<Session> const& s, json::object const& p,
                          Reply const& reply) {
          if (auto a = admin_only(d, gw, s, "secret.set"); !a) return reply(a.error());
          Params in(p, {"name", "value_b64"});
          auto const name = in.required_string("name");
          DecodedValue value;
          bool too_large = false;
          if (auto const* v = in.fields().required(p, "", "value_b64")) {
            if (!v->is_string()) {
              in.bad("value_b64", "must be a string (padded base64)");
            } else if (v->get_string().size() > kMaxValueB64) {
              too_large = true;
            } else if (auto decoded = core::base64_decode(v->get_string())) {
              value.bytes = std::move(*decoded);
            } else {
              in.bad("value_b64", "must be padded base64");
            }
          }
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          if (too_large) {
            return reply(Error{Errc::secret_too_large,
                               "secret " + name + ": more than " +
                                   std::to_string(secrets::kMaxSecretValueBytes) + " bytes"});
          }
          if (auto r = store.set(name, value.bytes); !r) return reply(r.error());
          reply(json::value(json::object{{"name", name}}));
        });

  d.add("secret.list", Access::any,
        [&d, &gw, &store](std::shared_ptr<Session> const& s, json::object const& p,
                          Reply const& reply) {
          if (auto a = admin_only(d, gw, s, "secret.list"); !a) return reply(a.error());
          Params in(p, {});
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto entries = store.list();
          if (!entries) return reply(entries.error());
          json::array out;
          for (auto const& e : *entries) {
            out.emplace_back(json::object{{"name", e.name},
                                          {"created_ns", e.created_ns},
                                          {"source", secrets::secret_source_wire(e.source)}});
          }
          reply(json::value(json::object{{"secrets", std::move(out)}}));
        });

  d.add("secret.delete", Access::any,
        [&d, &gw, &store](std::shared_ptr<Session> const& s, json::object const& p,
                          Reply const& reply) {
          if (auto a = admin_only(d, gw, s, "secret.delete"); !a) return reply(a.error());
          Params in(p, {"name"});
          auto const name = in.required_string("name");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          if (auto r = store.remove(name); !r) return reply(r.error());
          reply(json::value(json::object{{"name", name}}));
        });
}

}  // namespace custos::rpc
