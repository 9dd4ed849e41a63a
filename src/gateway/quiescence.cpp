// ExecutionGateway::quiescence: whether a holder (session, generation) has anything left running
// or unresolved, with evidence bound to the exact set scanned.
#include <boost/json.hpp>

#include <set>

#include "custos/core/digest.hpp"
#include "custos/core/plan_canonical.hpp"
#include "custos/gateway/gateway.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"

#include "clock.hpp"

namespace custos::gateway {

namespace json = boost::json;

// ------------------------------------------------------------------------------ quiescence

json::object QuiescenceResult::to_json() const {
  json::array b;
  for (auto const& q : blocking) {
    b.emplace_back(json::object{{"execution_id", q.execution_id}, {"reason", q.reason}});
  }
  json::object o{{"quiescent", quiescent}};
  if (quiescent && evidence) {
    o["evidence"] = *evidence;
  } else {
    o["blocking"] = std::move(b);
  }
  return o;
}

namespace {

// The registry's executions of the holder's session at this generation. A record whose identity
// no longer decodes cannot be excluded: it counts.
Result<void> add_registry_ids(registry::Registry& reg, std::string const& session_id,
                              std::uint64_t generation, std::set<std::string>& ids) {
  registry::ListFilter f;
  f.session_id = session_id;
  f.limit = 1000;
  while (true) {
    auto page = CUSTOS_TRY(reg.list(f));
    for (auto const& rec : page) {
      auto req = core::decode_execution(rec.plan_canonical);
      if (!req || req->identity.generation == generation) ids.insert(rec.execution_id);
    }
    if (page.size() < f.limit) return ok();
    f.after_id = page.back().execution_id;
  }
}

// Why the registry's record of an execution the manager does not hold blocks quiescence, or
// nullptr when it is terminal with its tree confirmed empty.
char const* registry_verdict(registry::Registry& reg, std::string const& id, bool with_use) {
  auto rec = reg.get(id);
  if (!rec) {
    return rec.error().code == Errc::registry_not_found && with_use ? "orphan_claim" : "unresolved";
  }
  if (rec->phase != core::Phase::terminal || !rec->terminal) return "unresolved";
  auto t = registry::decode_terminal(*rec->terminal);
  if (!t) return "unresolved";
  if (t->tree.cleanup != core::Cleanup::confirmed) return "cleanup_unconfirmed";
  return nullptr;
}

// The evidence of a quiescent holder. Its digest binds the holder and the exact set scanned, so
// it cannot be replayed for another holder or a later set of executions.
Result<json::object> quiescence_evidence(std::string const& session_id, std::uint64_t generation,
                                         std::optional<std::string> const& actor,
                                         std::set<std::string> const& ids, bool scanned_registry) {
  std::string bound = "custos.quiescence.v1";
  bound += '\0' + session_id + '\0' + std::to_string(generation) + '\0' + actor.value_or("");
  json::array list;
  for (auto const& id : ids) {
    bound += '\0' + id;
    list.emplace_back(id);
  }
  auto d = core::sha256(std::span<std::uint8_t const>(
      reinterpret_cast<std::uint8_t const*>(bound.data()), bound.size()));
  if (!d) return d.error();
  return json::object{{"session_id", session_id},
                      {"generation", generation},
                      {"actor", actor ? json::value(*actor) : json::value(nullptr)},
                      {"executions", std::move(list)},
                      {"registry_scanned", scanned_registry},
                      {"scanned_at_ns", realtime_ns()},
                      {"digest", d->to_string()}};
}

}  // namespace

Result<QuiescenceResult> ExecutionGateway::quiescence(Caller const& caller,
                                                      std::string const& session_id,
                                                      std::uint64_t generation,
                                                      std::optional<std::string> const& actor) {
  std::string const self = Principal{PrincipalKind::uid, caller.uid}.to_string();
  if (!caller.admin && actor != self) {
    return Error{Errc::auth_denied, "holder.quiescence: non-admins ask with actor = " + self};
  }
  if (session_id.empty()) return Error{Errc::plan_invalid_id, "session_id is required"};

  // 1. Every execution of the holder: the gateway's authority uses and the registry's records.
  std::set<std::string> ids;
  std::set<std::string> with_use;
  for (auto const& u : CUSTOS_TRY(store_->uses_of_holder(session_id, generation))) {
    if (actor && u.actor != *actor) continue;
    ids.insert(u.execution_id);
    with_use.insert(u.execution_id);
  }
  bool const scanned_registry = options_.registry != nullptr;
  if (scanned_registry) {
    CUSTOS_TRYV(add_registry_ids(*options_.registry, session_id, generation, ids));
  }
  // Starts of the holder still in flight (start_async: authorizing or launching) are its
  // executions too, committed or not yet.
  for (auto const& [id, in] : inflight_) {
    if (in.session_id == session_id && in.generation == generation &&
        (!actor || in.actor == *actor)) {
      ids.insert(id);
    }
  }
  std::set<std::string> quarantined;
  if (scanned_registry) {
    for (auto const& q : CUSTOS_TRY(options_.registry->quarantined()))
      quarantined.insert(q.execution_id);
  }

  // 2. Each one must be terminal, with its tree confirmed empty and every support task joined.
  QuiescenceResult res;
  auto block = [&](std::string const& id, char const* why) {
    res.blocking.push_back(QuiescenceBlock{id, why});
  };
  for (auto const& id : ids) {
    if (inflight_.contains(id)) {
      block(id, "starting");
      continue;
    }
    if (quarantined.contains(id)) {
      block(id, "quarantined");
      continue;
    }
    if (manager_ != nullptr) {
      if (auto v = manager_->get(id)) {
        // The manager's terminal record is produced only after the readers reached EOF and
        // every support task was joined (docs/supervisor.md), so it stands for "joined".
        if (!v->terminal) {
          block(id, "live");
        } else if (v->terminal->tree.cleanup != core::Cleanup::confirmed) {
          block(id, "cleanup_unconfirmed");
        } else if (v->sink_error) {
          block(id, "record_error");
        }
        continue;
      }
    }
    if (!scanned_registry) {
      block(id, "unresolved");
      continue;
    }
    if (auto const* why = registry_verdict(*options_.registry, id, with_use.contains(id))) {
      block(id, why);
    }
  }
  res.quiescent = res.blocking.empty();
  if (res.quiescent) {
    res.evidence =
        CUSTOS_TRY(quiescence_evidence(session_id, generation, actor, ids, scanned_registry));
  }
  return res;
}

}  // namespace custos::gateway
