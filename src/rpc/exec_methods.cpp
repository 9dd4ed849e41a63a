// The exec.* methods: parameter parsing and the mapping onto the ExecutionManager, admin-only
// here. exec.start is not among them (it needs the gateway's launch permit); the gateway's
// registration (gateway_methods.cpp) adds it and opens the others to the caller that started
// the execution (docs/authority.md).
#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <set>
#include <system_error>

#include "custos/core/base64.hpp"
#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/sandbox/compile.hpp"
#include "custos/sandbox/json.hpp"
#include "custos/supervisor/manager.hpp"

#include "exec_internal.hpp"

namespace custos::rpc {

namespace json = boost::json;
using supervisor::ExecutionManager;

namespace {

constexpr std::uint64_t kDefaultOutputSlice = std::uint64_t{64} * 1024;
constexpr std::uint64_t kMaxOutputSlice =
    std::uint64_t{1024} * 1024;  // keeps one response under the line limit

using detail::Params;

struct Parsed {
  core::ExecutionIdentity identity;
  core::ExecutionPlan plan;
  std::shared_ptr<sandbox::PlanSandbox const> sandbox;
};

// identity + plan (strict, every diagnostic at once), authority shape. No environment values
// are accepted: `inherit: true` entries take the daemon's own values (an `inherited_env` sent by
// a caller is an unknown parameter), so authority to inherit a name cannot inject a value.
// `subscribe` is checked as exec.start checks it and then ignored: a dry run streams nothing,
// and the flag is no part of the plan or its digest.
Result<Parsed> parse_launch(json::object const& p) {
  Params in(p, {"identity", "plan", "authority", "subscribe"}, detail::launch_param_codes());
  auto parts = detail::read_launch(in);
  if (auto const* a = core::FieldReader::given(p, "authority"); a != nullptr && !a->is_object()) {
    in.fields().add(Errc::plan_wrong_type, "/authority", "authority must be an object");
  }
  if (auto e = detail::finish_launch(std::move(in), parts)) return std::move(*e);
  return Parsed{std::move(parts.identity), std::move(parts.plan), std::move(parts.sandbox)};
}

// The durable record of an execution the manager does not hold, in the shape of exec.get:
// identity decoded from the stored canonical plan, accounting from the stored stream progress,
// the terminal record decoded from its stored canonical bytes.
Result<json::object> record_json(registry::ExecutionRecord const& rec) {
  auto request = CUSTOS_TRY(core::decode_execution(rec.plan_canonical));
  bool const pty = request.plan.io.mode == core::IoMode::pty;
  auto stream_json = [](core::StreamAccounting const& a) {
    return json::object{{"observed", a.observed},
                        {"retained", a.retained},
                        {"dropped", a.dropped},
                        {"complete", a.complete}};
  };
  json::object accounting;
  if (pty) {
    accounting["pty"] = stream_json(rec.out.accounting);
  } else {
    accounting["stdout"] = stream_json(rec.out.accounting);
    accounting["stderr"] = stream_json(rec.err.accounting);
  }
  json::object out{{"execution_id", rec.execution_id},
                   {"identity", core::to_json(request.identity)},
                   {"plan_digest", rec.plan_digest},
                   {"sandbox_digest", request.plan.sandbox_digest
                                          ? json::value(request.plan.sandbox_digest->to_string())
                                          : json::value(nullptr)},
                   {"phase", core::phase_wire(rec.phase)},
                   {"boundary", registry::boundary_kind_wire(rec.boundary.kind)},
                   {"session_id", rec.session_id},
                   {"action_id", rec.action_id},
                   {"process_id", rec.process_id},
                   {"backend", rec.backend},
                   {"accounting", std::move(accounting)},
                   {"source", "registry"}};
  if (rec.trigger)
    out["trigger"] = core::trigger_wire(*rec.trigger);
  else
    out["trigger"] = nullptr;
  if (rec.terminal) {
    auto t = CUSTOS_TRY(registry::decode_terminal(*rec.terminal));
    out["terminal"] = CUSTOS_TRY(core::to_json(t));
  }
  out["publication"] = detail::publication_json(rec, pty);
  return out;
}

// Errors: exec.not_found when the registry has no such record either; registry.corrupt_record
// for a quarantined record (passed through typed, with the quarantine reason).
Result<json::object> record_view(registry::Registry* reg, std::string const& id) {
  if (reg == nullptr) return Error{Errc::exec_not_found, "no execution " + id};
  auto rec = reg->get(id);
  if (!rec) {
    if (rec.error().code == Errc::registry_not_found)
      return Error{Errc::exec_not_found, "no execution " + id};
    return rec.error();
  }
  return record_json(*rec);
}

// next_cursor values are plain decimal u64 strings. std::stoull would accept "-1" (wrapping to
// 2^64-1), leading blanks and a "+", and throw on garbage; here only 1..20 ASCII digits that fit
// in 64 bits are accepted.
std::optional<std::uint64_t> parse_cursor(std::string_view text) {
  std::uint64_t value = 0;
  auto const* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  if (text.empty() || text.front() < '0' || text.front() > '9' || ec != std::errc{} || ptr != end) {
    return std::nullopt;
  }
  return value;
}

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto const b = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (b < 0x80) {
      ++i;
      continue;
    }
    if ((b & 0xE0U) == 0xC0U) {
      len = 2;
      cp = b & 0x1FU;
    } else if ((b & 0xF0U) == 0xE0U) {
      len = 3;
      cp = b & 0x0FU;
    } else if ((b & 0xF8U) == 0xF0U) {
      len = 4;
      cp = b & 0x07U;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      auto const c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0U) != 0x80U) return false;
      cp = (cp << 6U) | (c & 0x3FU);
    }
    constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// A cancel reason is kept to 1024 bytes, cut at a code point boundary so that the stored and
// reported reason stays valid UTF-8; a reason that is not UTF-8 at all is refused (nullopt).
std::optional<std::string> bounded_reason(std::string_view text) {
  constexpr std::size_t kMaxReason = 1024;
  if (!valid_utf8(text)) return std::nullopt;
  if (text.size() <= kMaxReason) return std::string{text};
  std::size_t cut = kMaxReason;
  // Back off over continuation bytes (10xxxxxx) to the start of the split code point.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0U) == 0x80U) --cut;
  return std::string{text.substr(0, cut)};
}

// exec.list's params: the filters (for the manager's and the registry's listing), the page size
// and the cursor.
struct ListQuery {
  supervisor::ListFilter filter;
  registry::ListFilter rfilter;
  std::uint64_t page = 100;
  std::uint64_t offset = 0;
};

Result<ListQuery> read_list_query(json::object const& p) {
  Params in(p, {"phase", "session_id", "limit", "cursor"});
  ListQuery q;
  if (auto const* ph = core::FieldReader::given(p, "phase")) {
    core::Phase phase{};
    if (in.fields().name(*ph, Params::at("phase"), core::phase_from_wire, phase)) {
      q.filter.phase = phase;
      q.rfilter.phase = phase;
    }
  }
  q.filter.session_id = in.optional_string("session_id");
  q.rfilter.session_id = q.filter.session_id;
  q.page = in.optional_u64("limit", 1000).value_or(100);
  // The cursor is the number of executions already returned: first the ones this daemon
  // supervises (newest first), then the registry's records it does not hold (terminal
  // ones and those a previous daemon left), in id order. next_cursor values are strings.
  if (auto const cursor = in.optional_string("cursor")) {
    if (auto parsed = parse_cursor(*cursor)) {
      q.offset = *parsed;
    } else {
      in.bad("cursor", "not an unsigned decimal 64-bit integer (a next_cursor value)");
    }
  }
  if (auto e = std::move(in).error()) return std::move(*e);
  return q;
}

}  // namespace

namespace detail {

json::object check_answer(ExecutionManager const& m, core::ExecutionPlan const& plan,
                          std::string plan_digest, sandbox::CheckedSandboxPlan const* sandbox,
                          backend::Admission const& a) {
  json::array missing;
  for (auto const& name : a.missing) missing.emplace_back(name);
  json::object admission{
      {"admitted", a.admitted},
      {"missing", std::move(missing)},
      {"default_boundary", m.config().cgroup_subtree.empty() ? "marker" : "cgroup"}};
  json::object out{{"plan_digest", std::move(plan_digest)},
                   {"sandbox_digest", nullptr},
                   {"backend", core::to_string(plan.backend.kind)},
                   {"admission", std::move(admission)}};
  if (plan.sandbox_digest) out["sandbox_digest"] = plan.sandbox_digest->to_string();
  // The checked sandbox plan itself: every domain at its effective value and the controls it
  // needs (what admission compared, what a backend enforces).
  if (sandbox != nullptr) out["sandbox"] = sandbox::to_json(*sandbox);
  return out;
}

}  // namespace detail

// The method table: one registration per RPC method, each handler reading its params, making one
// call and answering; kept in one place so the methods and their access read as the API does.
// NOLINTNEXTLINE(readability-function-size): a table of short handlers, see above
void register_exec_methods(Dispatcher& d, ExecutionManager& m, registry::Registry* reg) {
  // Without a gateway (its registration replaces this one): no grant, so no contract and no
  // secret store; the caller's uid still decides run_as_root.
  d.add("exec.check", Access::admin,
        [&m](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          auto parsed = parse_launch(p);
          if (!parsed) return reply(parsed.error());
          auto digest = core::plan_digest(parsed->identity, parsed->plan);
          if (!digest) return reply(digest.error());
          if (auto ws = m.check_workspace(parsed->plan); !ws) return reply(ws.error());
          sandbox::CompileInput c;
          c.plan = &parsed->plan;
          c.requirements = parsed->sandbox ? &parsed->sandbox->requirements : nullptr;
          c.caller_uid = s->peer().uid;
          if (auto compiled = sandbox::compile(c); !compiled) return reply(compiled.error());
          // The backend's own admission and the sandbox's, exactly what exec.start would
          // decide: no effect.
          auto const* checked = parsed->sandbox ? &parsed->sandbox->checked : nullptr;
          reply(json::value(detail::check_answer(m, parsed->plan, digest->to_string(), checked,
                                                 m.admission(parsed->plan, checked))));
        });

  // exec.start is registered by register_gateway_methods only: a launch needs the permit that
  // only the gateway mints (supervisor/launch_permit.hpp).

  d.add("exec.get", Access::admin,
        [&m, reg](std::shared_ptr<Session> const&, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id"});
          auto const id = in.required_string("execution_id");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto v = m.get(id);
          if (v) {
            auto out = v->to_json();
            bool const pty = v->output.count(core::Stream::pty) > 0;
            // Publication follows the terminal record: the registry has its progress. Before
            // it, every stream is pending. A record the registry cannot read (quarantined)
            // leaves the member out: the held view still answers.
            registry::ExecutionRecord pending;
            pending.out.accounting =
                v->output[pty ? core::Stream::pty : core::Stream::stdout_stream];
            pending.err.accounting = v->output[core::Stream::stderr_stream];
            Result<registry::ExecutionRecord> rec = pending;
            if (v->terminal && reg != nullptr) rec = reg->get(id);
            if (rec) out["publication"] = detail::publication_json(*rec, pty);
            return reply(json::value(std::move(out)));
          }
          if (v.error().code != Errc::exec_not_found) return reply(v.error());
          auto r = record_view(reg, id);
          if (!r) return reply(r.error());
          reply(json::value(std::move(*r)));
        });

  d.add("exec.list", Access::admin,
        [&m, reg](std::shared_ptr<Session> const&, json::object const& p, Reply reply) {
          detail::list_executions(m, reg, p, nullptr, std::move(reply));
        });

  d.add("exec.wait", Access::admin,
        [&m, reg](std::shared_ptr<Session> const& s, json::object const& p, Reply reply) {
          Params in(p, {"execution_id", "timeout_ms"});
          auto const id = in.required_string("execution_id");
          auto const t = in.optional_u64("timeout_ms", 7ULL * 24 * 3600 * 1000);
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          std::optional<std::chrono::milliseconds> timeout;
          if (t) timeout = std::chrono::milliseconds{static_cast<std::int64_t>(*t)};
          if (auto held = m.get(id); !held && held.error().code == Errc::exec_not_found) {
            // Not the manager's: a terminal record in the registry answers at once; a record
            // without one cannot be waited for by this daemon (recovery gave every such record a
            // terminal, or the manager adopted it; only one whose adoption failed is left).
            auto r = record_view(reg, id);
            if (!r) return reply(r.error());
            if (auto* rec_terminal = r->if_contains("terminal"))
              return reply(std::move(*rec_terminal));
            return reply(Error{Errc::exec_not_running, id + " is not supervised by this daemon"});
          }
          // The manager keeps this waiter until the execution ends or the timeout fires, which
          // can be days. When the connection closes first, the wait is withdrawn from the
          // manager (unwait) and everything it held for the client (the reply chain: the
          // connection's completion and, inside a batch, the batch's collected replies) is freed
          // at once, so abandoned waits do not accumulate.
          auto slot = std::make_shared<std::optional<Reply>>(std::move(reply));
          auto hook = std::make_shared<std::uint64_t>(0);
          auto handle = std::make_shared<supervisor::WaitHandle>();
          *hook = s->add_close_hook([slot, handle, &m] {
            slot->reset();
            m.unwait(*handle);
          });
          if (*hook == 0) return;  // already closed: nobody to answer
          std::weak_ptr<Session> weak = s;
          // The answer is always posted, never run inside wait(): the handle is stored first.
          *handle = m.wait(id, timeout, [slot, hook, weak](Result<core::TerminalRecord> r) {
            if (!slot->has_value()) return;  // the client went away
            auto answer = std::move(**slot);
            slot->reset();
            if (auto session = weak.lock()) session->remove_close_hook(*hook);
            if (!r) return answer(r.error());
            auto j = core::to_json(*r);
            if (!j) return answer(j.error());
            answer(std::move(*j));
          });
        });

  d.add("exec.cancel", Access::admin,
        [&m](std::shared_ptr<Session> const&, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id", "reason", "force"});
          auto const id = in.required_string("execution_id");
          bool const force = in.optional_bool("force");
          std::string reason = "exec.cancel";
          if (auto const given = in.optional_string("reason")) {
            if (auto cut = bounded_reason(*given)) {
              reason = std::move(*cut);
            } else {
              in.bad("reason", "not valid UTF-8");
            }
          }
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto r = m.cancel(id, core::Trigger::user, std::move(reason), force);
          if (!r) return reply(r.error());
          json::value trigger = nullptr;
          if (r->trigger) trigger = json::string{core::trigger_wire(*r->trigger)};
          reply(json::value(json::object{
              {"accepted", r->accepted}, {"trigger", std::move(trigger)}, {"forced", r->forced}}));
        });

  d.add("exec.input", Access::admin,
        [&m](std::shared_ptr<Session> const&, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id", "data_b64", "eof"});
          auto const id = in.required_string("execution_id");
          bool const eof = in.optional_bool("eof");
          auto const data = detail::input_bytes(in);
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto r = m.input(id, data, eof);
          if (!r) return reply(r.error());
          reply(json::value(json::object{{"accepted_bytes", *r}}));
        });

  d.add("exec.resize", Access::admin,
        [&m](std::shared_ptr<Session> const&, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id", "rows", "cols"});
          auto const id = in.required_string("execution_id");
          std::uint16_t size[2] = {0, 0};
          for (int i = 0; i < 2; ++i) {
            std::string_view const key = i == 0 ? "rows" : "cols";
            if (core::FieldReader::given(p, key) == nullptr) {
              in.bad(key, "is required, 1..65535");
            } else if (auto n = in.optional_u64(key, 65535); n && *n == 0) {
              in.bad(key, "must be 1..65535");
            } else if (n) {
              size[i] = static_cast<std::uint16_t>(*n);
            }
          }
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto r = m.resize(id, size[0], size[1]);
          if (!r) return reply(r.error());
          reply(json::value(json::object{}));
        });

  d.add("exec.subscribe", Access::admin,
        [&m](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id", "from_seq"});
          auto const id = in.required_string("execution_id");
          auto const from = in.optional_u64("from_seq");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          if (auto exists = m.get(id); !exists) return reply(exists.error());
          auto sub = detail::EventSubscription::reserve(m, s);
          if (!sub) return reply(sub.error());
          // Replayed events are queued as they are replayed, before this answer (docs/api.md);
          // exec.start with `subscribe` is the call whose answer comes first.
          auto replay_from = (*sub)->attach(id, from, false);
          if (!replay_from) return reply(replay_from.error());
          reply(json::value(
              json::object{{"subscription", (*sub)->id()}, {"replay_from", *replay_from}}));
        });

  d.add("exec.unsubscribe", Access::admin,
        [](std::shared_ptr<Session> const& s, json::object const& p, Reply const& reply) {
          Params in(p, {"subscription"});
          auto const id = in.required_string("subscription");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          auto r = s->remove_subscription(id);
          if (!r) return reply(r.error());
          reply(json::value(json::object{}));
        });

  d.add("exec.output", Access::admin,
        [&m, reg](std::shared_ptr<Session> const&, json::object const& p, Reply const& reply) {
          Params in(p, {"execution_id", "stream", "offset", "max_bytes"});
          auto const id = in.required_string("execution_id");
          auto const stream_name = in.required_string("stream");
          auto const stream = core::stream_from_wire(stream_name);
          if (!stream && !stream_name.empty()) in.bad("stream", "must be stdout, stderr or pty");
          auto const offset = in.optional_u64("offset");
          auto const max = in.optional_u64("max_bytes");
          if (auto e = std::move(in).error()) return reply(std::move(*e));
          std::uint64_t const want = std::min(max.value_or(kDefaultOutputSlice), kMaxOutputSlice);
          // A live execution's spool is still being written: the manager serves it. A terminal
          // one's output is in the registry's hands (spool or artifact), whether the manager
          // still holds it or not.
          auto held = m.get(id);
          bool const live = held && !held->terminal;
          if (!live && reg != nullptr && (held || held.error().code == Errc::exec_not_found)) {
            auto stored = detail::stored_output(*reg, id, stream_name, offset.value_or(0), want);
            if (!stored) return reply(stored.error());
            return reply(json::value(std::move(*stored)));
          }
          auto r = m.output(id, *stream, offset.value_or(0), want);
          if (!r) return reply(r.error());
          reply(json::value(json::object{{"data_b64", core::base64_encode(r->data)},
                                         {"eof", r->eof},
                                         {"complete", r->complete}}));
        });
}

namespace detail {

void list_executions(ExecutionManager& m, registry::Registry* reg, json::object const& p,
                     std::set<std::string> const* only, Reply const& reply) {
  auto q = read_list_query(p);
  if (!q) return reply(q.error());
  auto& [filter, rfilter, page, offset] = *q;
  // One more than the page shows whether a next page exists. Saturating: a cursor near
  // 2^64 must not wrap to a small window.
  constexpr std::uint64_t kWindowCap = std::uint64_t{1} << 32;
  std::uint64_t const want = offset >= kWindowCap ? kWindowCap : offset + page + 1;
  // Restricted to `only`: the manager lists everything it holds (bounded by its terminal
  // history) and the ids outside `only` are dropped before the window is cut.
  filter.limit =
      only != nullptr ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(want);
  auto live = m.list(filter);
  if (only != nullptr) {
    std::erase_if(live, [&](auto const& v) { return only->count(v.execution_id) == 0; });
    if (live.size() > want) live.resize(static_cast<std::size_t>(want));
  }
  std::vector<json::object> all;
  all.reserve(live.size());
  std::set<std::string> held;
  for (auto const& v : live) {
    held.insert(v.execution_id);
    all.push_back(v.to_json());
  }
  if (reg != nullptr && only != nullptr) {
    // The caller's own ids in id order (a std::set), each read by its key.
    for (auto const& id : *only) {
      if (all.size() >= want) break;
      if (held.count(id) != 0) continue;
      auto rec = reg->get(id);
      if (!rec) {
        if (rec.error().code == Errc::registry_not_found) continue;
        return reply(rec.error());
      }
      if (rfilter.phase && rec->phase != *rfilter.phase) continue;
      if (rfilter.session_id && rec->session_id != *rfilter.session_id) continue;
      auto j = record_json(*rec);
      if (!j) return reply(j.error());
      all.push_back(std::move(*j));
    }
  } else if (reg != nullptr && all.size() < want) {
    // Only the registry's records beyond the held ones are needed; the held ones may
    // appear among them too, so ask for that many more.
    rfilter.limit = static_cast<std::size_t>(want - all.size() + held.size());
    auto recs = reg->list(rfilter);
    if (!recs) return reply(recs.error());
    for (auto const& rec : *recs) {
      if (all.size() >= want) break;
      if (held.count(rec.execution_id) != 0) continue;
      auto j = record_json(rec);
      if (!j) return reply(j.error());
      all.push_back(std::move(*j));
    }
  }
  json::array out;
  for (std::uint64_t i = offset; i < all.size() && out.size() < page; ++i) {
    out.push_back(std::move(all[static_cast<std::size_t>(i)]));
  }
  json::value next = nullptr;
  if (offset < kWindowCap && all.size() > offset + page) next = std::to_string(offset + page);
  reply(
      json::value(json::object{{"executions", std::move(out)}, {"next_cursor", std::move(next)}}));
}

}  // namespace detail

}  // namespace custos::rpc
