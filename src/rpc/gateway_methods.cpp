// The gateway's methods (docs/api.md): authority.grant / revoke / list, lease.acquire / release /
// list, holder.quiescence, and exec.start / exec.input routed through the ExecutionGateway
// (docs/authority.md). Registered after register_exec_methods: the two exec names replace the
// manager-direct handlers, so no exec.start reaches the manager except through the gateway.
//
// Access is Access::any in the dispatcher for all of them: the gateway decides per call (stored
// admin principals, runner grants, holders), and answers auth.denied itself.
#include <algorithm>

#include "custos/core/plan_json.hpp"
#include "custos/gateway/gateway.hpp"
#include "custos/rpc/methods.hpp"

#include "exec_internal.hpp"

namespace custos::rpc {

namespace json = boost::json;

namespace {

using detail::Params;

Result<gateway::Caller> caller_of(Dispatcher const& d, gateway::ExecutionGateway& gw,
                                  std::shared_ptr<Session> const& s) {
  auto const& peer = s->peer();
  return gw.resolve_caller(peer.uid, peer.gid, peer.groups, d.auth().is_admin(peer));
}

json::array strings(std::vector<std::string> const& v) {
  json::array a;
  for (auto const& x : v) a.emplace_back(x);
  return a;
}

struct Launch {
  supervisor::LaunchRequest request;
  gateway::AuthorityClaim claim;
  bool subscribe = false;  // stream the execution's events after the answer (not in the plan)
};

// identity + plan (strict, every diagnostic at once) + authority + subscribe. No environment
// values: an `inherited_env` is an unknown parameter; `inherit: true` takes the daemon's own
// values.
Result<Launch> parse_launch(json::object const& p) {
  Params in(p, {"identity", "plan", "authority", "subscribe"}, detail::launch_param_codes());
  auto parts = detail::read_launch(in);
  Launch out;
  if (auto c = gateway::authority_from_json(p.if_contains("authority"))) {
    out.claim = std::move(*c);
  } else {
    in.fields().absorb(c.error(), "/authority");
  }
  if (auto e = detail::finish_launch(std::move(in), parts)) return std::move(*e);
  out.request.identity = std::move(parts.identity);
  out.request.plan = std::move(parts.plan);
  out.request.sandbox = std::move(parts.sandbox);
  out.subscribe = parts.subscribe;
  return out;
}

// Re-registers `name` (already registered by register_exec_methods) as open to the caller that
// started the execution, besides admins; the original handler then runs unchanged.
void owner_or_admin(Dispatcher& d, gateway::ExecutionGateway& gw, std::string const& name) {
  Handler const* orig = d.find(name);
  if (orig == nullptr) return;
  Handler inner = *orig;  // copied before add() replaces the entry it lives in
  d.add(name, Access::any,
        [&d, &gw, inner, name](std::shared_ptr<Session> const& s, json::object const& p,
                               Reply reply) {
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          if (!caller->admin) {
            auto const* id = p.if_contains("execution_id");
            if (id == nullptr || !id->is_string()) {
              return reply(Error{Errc::auth_denied,
                                 name + ": only admins, or the caller that started the execution"});
            }
            auto may = gw.may_access(*caller, std::string{id->get_string()});
            if (!may) return reply(may.error());
            if (!*may) {
              return reply(Error{Errc::auth_denied,
                                 name + ": only admins, or the caller that started the execution"});
            }
          }
          inner(s, p, std::move(reply));
        });
}

// exec.start with `subscribe: true` answers first and then streams the execution's events
// from seq 1 on the same connection. Refused (before any effect) where an answer cannot precede
// the events: inside a batch (the answer waits for the batch's other entries) and as a
// notification (no answer at all).
Result<void> may_subscribe(CallInfo const& call) {
  char const* why = nullptr;
  if (call.in_batch)
    why =
        "subscribe: true needs a request of its own, not a batch entry (the batch's answer "
        "would follow the execution's events)";
  else if (call.notification)
    why = "subscribe: true needs an id (a notification gets no answer to precede the events)";
  if (why == nullptr) return ok();
  Error e{Errc::rpc_invalid_params, why};
  e.diagnostics.push_back(Diagnostic{Errc::rpc_invalid_params, "/subscribe", why});
  return e;
}

// The answer to a start with `subscribe`: the events are attached first, holding their replay,
// so that the answer can say whether they follow (`subscription`, or null when they could not
// be attached); then the answer is queued, then the held replay, then live events (one loop
// thread: nothing of the execution can come in between). The replay starts at seq 1 unless the
// execution's event log had already evicted older events (`replay_from` says where it starts).
void answer_subscribed(std::shared_ptr<detail::EventSubscription> const& sub,
                       supervisor::StartResult const& started, Reply const& reply) {
  json::object result = started.to_json();
  Result<std::uint64_t> from =
      Error{Errc::rpc_subscription_not_found, "the connection gave the subscription up"};
  if (sub->active()) from = sub->attach(started.execution_id, 1, true);
  if (from) {
    result["subscription"] = sub->id();
    result["replay_from"] = *from;
  } else {
    result["subscription"] = nullptr;
  }
  reply(json::value(std::move(result)));
  sub->release_held();
}

}  // namespace

// The method table: one registration per RPC method, each handler reading its params, making one
// call and answering; kept in one place so the methods and their access read as the API does.
// NOLINTNEXTLINE(readability-function-size): a table of short handlers, see above
void register_gateway_methods(Dispatcher& d, gateway::ExecutionGateway& gw) {
  d.add_call("exec.start", Access::any,
             [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p,
                       CallInfo const& call, Reply const& reply) {
               auto caller = caller_of(d, gw, s);
               if (!caller) return reply(caller.error());
               // A caller with no authority at all learns nothing about its plan: without a grant
               // only admins may start (their implicit authority), whatever the plan says.
               auto const* a = p.if_contains("authority");
               bool const names_grant = a != nullptr && a->is_object() &&
                                        a->get_object().contains("grant_id") &&
                                        a->get_object().at("grant_id").is_string();
               if (!caller->admin && !names_grant) {
                 return reply(Error{Errc::auth_denied,
                                    "exec.start: no grant named; only admins start without one"});
               }
               auto launch = parse_launch(p);
               if (!launch) return reply(launch.error());
               std::shared_ptr<detail::EventSubscription> sub;
               if (launch->subscribe) {
                 if (auto may = may_subscribe(call); !may) return reply(may.error());
                 if (gw.manager() == nullptr)
                   return reply(Error{Errc::internal, "gateway has no execution manager"});
                 // The slot is taken before the start: once a process exists, its start can no
                 // longer be refused for want of one.
                 auto reserved = detail::EventSubscription::reserve(*gw.manager(), s);
                 if (!reserved) return reply(reserved.error());
                 sub = std::move(*reserved);
               }
               launch->request.caller = {s->peer().uid, s->peer().gid, s->peer().pid};
               gw.start_async(*caller, std::move(launch->request), launch->claim,
                              [reply, sub](Result<supervisor::StartResult> r) {
                                if (!r) {
                                  if (sub) sub->cancel();
                                  return reply(r.error());
                                }
                                if (sub) return answer_subscribed(sub, *r, reply);
                                reply(json::value(r->to_json()));
                              });
             });

  for (char const* name :
       {"exec.get", "exec.wait", "exec.cancel", "exec.resize", "exec.subscribe", "exec.output"}) {
    owner_or_admin(d, gw, name);
  }
  // A principal sees only its own executions (docs/api.md): admins list everything, every other
  // caller the executions it started through the gateway, with the same filters and cursor.
  if (Handler const* h = d.find("exec.list")) {
    Handler admin_list = *h;  // copied before add() replaces the entry it lives in
    d.add("exec.list", Access::any,
          [&d, &gw, admin_list](std::shared_ptr<Session> const& s, json::object const& p,
                                Reply reply) {
            auto caller = caller_of(d, gw, s);
            if (!caller) return reply(caller.error());
            if (caller->admin) return admin_list(s, p, std::move(reply));
            if (gw.manager() == nullptr)
              return reply(Error{Errc::internal, "gateway has no execution manager"});
            auto own = gw.executions_of(*caller);
            if (!own) return reply(own.error());
            detail::list_executions(*gw.manager(), gw.registry(), p, &*own, std::move(reply));
          });
  }
  // Subscriptions belong to one connection.
  if (Handler const* h = d.find("exec.unsubscribe")) {
    Handler copy = *h;
    d.add("exec.unsubscribe", Access::any, std::move(copy));
  }

  // exec.check has no effect at all: open to every caller, it answers what exec.start would
  // decide before the claim — the sandbox against the caller, the store and the named grant's
  // contract included (ExecutionGateway::check).
  d.add(
      "exec.check", Access::any,
      [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
        auto caller = caller_of(d, gw, s);
        if (!caller) return reply(caller.error());
        auto launch = parse_launch(p);
        if (!launch) return reply(launch.error());
        launch->request.caller = {s->peer().uid, s->peer().gid, s->peer().pid};
        auto answer = gw.check(*caller, launch->request, launch->claim);
        if (!answer) return reply(answer.error());
        if (gw.manager() == nullptr)
          return reply(Error{Errc::internal, "gateway has no execution manager"});
        reply(json::value(detail::check_answer(
            *gw.manager(), launch->request.plan, answer->plan_digest,
            answer->sandbox != nullptr ? &answer->sandbox->checked : nullptr, answer->admission)));
      });

  d.add("exec.input", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id", "data_b64", "eof"});
          auto const id = in.required_string("execution_id");
          bool const eof = in.optional_bool("eof");
          auto const data = detail::input_bytes(in);
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          // A runner feeds only the executions it started itself.
          auto may = gw.may_access(*caller, id);
          if (!may) return reply(may.error());
          if (!*may)
            return reply(
                Error{Errc::auth_denied, "exec.input: " + id + " was not started by this caller"});
          auto r = gw.input(id, data, eof);
          if (!r) return reply(r.error());
          reply(json::value(json::object{{"accepted_bytes", *r}}));
        });

  d.add("authority.grant", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          if (!caller->admin)
            return reply(Error{Errc::auth_denied, "authority.grant is for admins only"});
          auto spec = gateway::grant_from_json(json::value(p));
          if (!spec) return reply(spec.error());
          auto g = gw.grant(*caller, std::move(*spec));
          if (!g) return reply(g.error());
          auto epoch = gw.epoch();
          if (!epoch) return reply(epoch.error());
          reply(json::value(
              json::object{{"grant", gateway::grant_to_json(*g, {})}, {"epoch", *epoch}}));
        });

  d.add("authority.revoke", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"grant_id"});
          auto const id = in.required_string("grant_id");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          auto r = gw.revoke(*caller, id);
          if (!r) return reply(r.error());
          auto epoch = gw.epoch();
          if (!epoch) return reply(epoch.error());
          reply(json::value(json::object{{"grant", gateway::grant_to_json(r->grant, {})},
                                         {"fenced", strings(r->fence.fenced)},
                                         {"epoch", *epoch}}));
        });

  // Admins see every grant; other callers only their own (they need the epoch and their
  // grant's revision to start anything).
  d.add("authority.list", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"grant_id", "principal"});
          std::optional<std::string> const only_id = in.optional_string("grant_id");
          std::optional<gateway::Principal> only_principal;
          if (auto const text = in.optional_string("principal")) {
            if (auto pr = gateway::Principal::parse(*text)) {
              only_principal = *pr;
            } else {
              in.bad("principal", "must be uid:N or gid:N");
            }
          }
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          auto epoch = gw.epoch();
          if (!epoch) return reply(epoch.error());
          auto all = gw.list(*caller);
          if (!all) return reply(all.error());
          json::array out;
          for (auto const& [g, use] : *all) {
            if (only_id && g.id != *only_id) continue;
            if (only_principal && !(g.principal == *only_principal)) continue;
            out.emplace_back(gateway::grant_to_json(g, use));
          }
          reply(json::value(json::object{{"epoch", *epoch}, {"grants", std::move(out)}}));
        });

  d.add("lease.acquire", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"workspace_id", "holder_session"});
          auto const ws = in.required_string("workspace_id");
          auto const holder = in.required_string("holder_session");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          auto l = gw.acquire_lease(*caller, ws, holder);
          if (!l) return reply(l.error());
          auto epoch = gw.epoch();
          if (!epoch) return reply(epoch.error());
          reply(json::value(json::object{{"lease_id", l->id},
                                         {"epoch", l->epoch},
                                         {"lease", gateway::lease_to_json(*l)},
                                         {"authority_epoch", *epoch}}));
        });

  d.add("lease.release", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"lease_id", "break"});
          auto const id = in.required_string("lease_id");
          bool const brk = in.optional_bool("break");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          auto r = gw.release_lease(*caller, id, brk);
          if (!r) return reply(r.error());
          auto epoch = gw.epoch();
          if (!epoch) return reply(epoch.error());
          reply(json::value(json::object{{"lease_id", r->lease.id},
                                         {"epoch", r->lease.epoch},
                                         {"lease", gateway::lease_to_json(r->lease)},
                                         {"fenced", strings(r->fence.fenced)},
                                         {"authority_epoch", *epoch}}));
        });

  d.add("lease.list", Access::any,
        [&gw](std::shared_ptr<Session> const&, json::object const& p, Reply const& reply) {
          Params in(p, {"active_only"});
          bool const active_only = in.optional_bool("active_only", true);
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto ls = gw.list_leases(active_only);
          if (!ls) return reply(ls.error());
          json::array out;
          for (auto const& l : *ls) out.emplace_back(gateway::lease_to_json(l));
          reply(json::value(json::object{{"leases", std::move(out)}}));
        });

  d.add("holder.quiescence", Access::any,
        [&d, &gw](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"session_id", "generation", "actor"});
          auto const session = in.required_string("session_id");
          std::uint64_t const generation = in.required_u64("generation");
          std::optional<std::string> const actor = in.optional_string("actor");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto caller = caller_of(d, gw, s);
          if (!caller) return reply(caller.error());
          auto q = gw.quiescence(*caller, session, generation, actor);
          if (!q) return reply(q.error());
          reply(json::value(q->to_json()));
        });
}

}  // namespace custos::rpc
