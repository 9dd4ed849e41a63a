// The terminal record: consistency rules, strict JSON, canonical bytes and digest.
#include "custos/core/terminal.hpp"

#include <boost/json.hpp>

#include <array>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "custos/core/canonical.hpp"
#include "custos/core/digest.hpp"
#include "custos/core/json_fields.hpp"
#include "custos/core/json_pointer.hpp"
#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

namespace json = boost::json;

constexpr auto kBoundaryNames = wire_names<Boundary>({
    {Boundary::cgroup, "cgroup"},
    {Boundary::marker, "marker"},
    {Boundary::reference, "reference"},
});
static_assert(kBoundaryNames.complete());

constexpr auto kContainmentNames = wire_names<Containment>({
    {Containment::kernel_enforced, "kernel_enforced"},
    {Containment::escapable, "escapable"},
});
static_assert(kContainmentNames.complete());

// ---- canonical layout (docs/canonical-encoding.md, "Terminal record") ----------------------
// Record kinds in the lifecycle range 0x0100-0x01FF. Enumerations travel as their wire strings,
// which are API and never change, so a reordered C++ enum cannot silently change a digest.
constexpr RecordKind kKindTerminal = 0x0100;
constexpr RecordKind kKindExit = 0x0101;
constexpr RecordKind kKindEscalation = 0x0102;
constexpr RecordKind kKindStream = 0x0103;
constexpr RecordKind kKindResource = 0x0104;
constexpr RecordKind kKindTree = 0x0105;
constexpr RecordKind kKindSpawnError = 0x0106;

namespace tag {
constexpr Tag classification = 1, recovery = 2, exit = 3, trigger = 4, escalation = 5, output = 6,
              resources = 7, tree = 8, spawn_error = 9, observations = 10;
}  // namespace tag

Error malformed(std::string what) {
  return Error{Errc::canonical_malformed, std::move(what)};
}

template <class E>
Result<E> decode_enum(Result<std::string> s,
                      std::optional<E> (*from_wire)(std::string_view) noexcept,
                      std::string_view what) {
  if (!s) return s.error();
  auto e = from_wire(*s);
  if (!e.has_value()) return malformed("unknown " + std::string{what} + " \"" + *s + "\"");
  return *e;
}

// ---- JSON helpers ----------------------------------------------------------------------------

json::value opt_json(std::optional<std::uint64_t> v) {
  return v.has_value() ? json::value(*v) : json::value(nullptr);
}

json::value opt_json(std::optional<std::int32_t> v) {
  return v.has_value() ? json::value(static_cast<std::int64_t>(*v)) : json::value(nullptr);
}

// The members of `o` are exactly `keys`: every one present, no other.
void exactly(FieldReader& r, json::object const& o, std::string const& ptr,
             std::initializer_list<std::string_view> keys) {
  r.only(o, ptr, keys);
  for (auto k : keys) (void)r.required(o, ptr, k);
}

// The object at `ptr` with exactly `keys`, or nullptr after reporting why not.
json::object const* exact_object(FieldReader& r, json::value const& v, std::string const& ptr,
                                 std::initializer_list<std::string_view> keys) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return nullptr;
  std::size_t const before = r.count();
  exactly(r, *o, ptr, keys);
  return r.count() == before ? o : nullptr;
}

// A number or null (empty).
template <class T>
void nullable(FieldReader& r, json::value const& v, std::string const& ptr, std::optional<T>& out) {
  out.reset();
  if (v.is_null()) return;
  if constexpr (std::is_same_v<T, std::int32_t>) {
    std::int32_t n = 0;
    if (r.int32(v, ptr, n)) out = n;
  } else {
    std::uint64_t n = 0;
    if (r.unsigned_int(v, ptr, n)) out = n;
  }
}

void read_exit(FieldReader& r, json::value const& v, ExitStatus& out) {
  auto const* ex = exact_object(r, v, "/exit", {"code", "signal"});
  if (ex == nullptr) return;
  nullable(r, ex->at("code"), "/exit/code", out.code);
  nullable(r, ex->at("signal"), "/exit/signal", out.signal);
}

void read_escalation(FieldReader& r, json::value const& v, EscalationReport& out) {
  auto const* es = exact_object(r, v, "/escalation", {"graceful_sent", "forced"});
  if (es == nullptr) return;
  (void)r.boolean(es->at("graceful_sent"), "/escalation/graceful_sent", out.graceful_sent);
  (void)r.boolean(es->at("forced"), "/escalation/forced", out.forced);
}

void read_output(FieldReader& r, json::value const& v, TerminalRecord& rec) {
  auto const* out = r.object(v, "/output");
  if (out == nullptr) return;
  for (auto const& kv : *out) {
    std::string const ptr = pointer_append("/output", kv.key());
    auto const stream = stream_from_wire(kv.key());
    if (!stream.has_value()) {
      r.add(r.codes().unknown, ptr, "unknown stream");
      continue;
    }
    auto const* so =
        exact_object(r, kv.value(), ptr, {"observed", "retained", "dropped", "complete"});
    if (so == nullptr) continue;
    std::size_t const before = r.count();
    StreamAccounting acc;
    (void)r.unsigned_int(so->at("observed"), ptr + "/observed", acc.observed);
    (void)r.unsigned_int(so->at("retained"), ptr + "/retained", acc.retained);
    (void)r.unsigned_int(so->at("dropped"), ptr + "/dropped", acc.dropped);
    (void)r.boolean(so->at("complete"), ptr + "/complete", acc.complete);
    if (r.count() != before) continue;
    if (auto c = acc.check(); !c) {
      r.add(Errc::accounting_invariant, ptr, c.error().context);
    } else if (!rec.output.emplace(*stream, acc).second) {
      r.add(r.codes().invalid, ptr, "stream listed twice");
    }
  }
}

void read_resources(FieldReader& r, json::value const& v, ResourceReport& out) {
  auto const* res = r.object(v, "/resources");
  if (res == nullptr) return;
  for (auto const& kv : *res) {
    if (!resource_dim_from_wire(kv.key()).has_value()) {
      r.add(r.codes().unknown, pointer_append("/resources", kv.key()),
            "unknown resource dimension");
    }
  }
  for (std::size_t i = 0; i < kResourceDimCount; ++i) {
    auto const key = resource_dim_wire(static_cast<ResourceDim>(i));
    std::string const ptr = pointer_append("/resources", key);
    auto const* dv = FieldReader::optional(*res, key);
    if (dv == nullptr) {
      r.add(r.codes().missing, ptr, "every dimension is required");
      continue;
    }
    auto const* d = exact_object(r, *dv, ptr, {"value", "limit", "fidelity"});
    if (d == nullptr) continue;
    auto& obs = out.dims[i];
    nullable(r, d->at("value"), ptr + "/value", obs.value);
    nullable(r, d->at("limit"), ptr + "/limit", obs.limit);
    (void)r.name(d->at("fidelity"), ptr + "/fidelity", fidelity_from_wire, obs.fidelity);
  }
}

void read_tree(FieldReader& r, json::value const& v, TreeReport& out) {
  auto const* t = exact_object(r, v, "/tree", {"boundary", "cleanup", "containment"});
  if (t == nullptr) return;
  (void)r.name(t->at("boundary"), "/tree/boundary", boundary_from_wire, out.boundary);
  (void)r.name(t->at("cleanup"), "/tree/cleanup", cleanup_from_wire, out.cleanup);
  (void)r.name(t->at("containment"), "/tree/containment", containment_from_wire, out.containment);
}

void read_spawn_error(FieldReader& r, json::value const& v, std::optional<SpawnFailure>& out) {
  if (v.is_null()) return;
  auto const* s = exact_object(r, v, "/spawn_error", {"code", "errno", "detail"});
  if (s == nullptr) return;
  SpawnFailure f;
  std::size_t const before = r.count();
  (void)r.string(s->at("code"), "/spawn_error/code", f.code);
  (void)r.int32(s->at("errno"), "/spawn_error/errno", f.sys_errno);
  (void)r.string(s->at("detail"), "/spawn_error/detail", f.detail);
  if (r.count() == before) out = std::move(f);
}

void read_observations(FieldReader& r, json::value const& v, Observations& out) {
  auto const* m = r.object(v, "/observations");
  if (m == nullptr) return;
  for (auto const& [name, value] : *m) {
    std::string const ptr = pointer_append("/observations", name);
    if (name.empty() || name.find('=') != std::string_view::npos) {
      r.add(r.codes().invalid, ptr, "an observation name is non-empty, without '='");
      continue;
    }
    std::string text;
    if (r.string(value, ptr, text)) out.emplace(std::string{name}, std::move(text));
  }
}

}  // namespace

std::string_view boundary_wire(Boundary b) noexcept {
  return kBoundaryNames.wire(b);
}
std::optional<Boundary> boundary_from_wire(std::string_view wire) noexcept {
  return kBoundaryNames.from_wire(wire);
}
std::string_view containment_wire(Containment c) noexcept {
  return kContainmentNames.wire(c);
}
std::optional<Containment> containment_from_wire(std::string_view wire) noexcept {
  return kContainmentNames.from_wire(wire);
}

// ---- consistency ---------------------------------------------------------------------------

Result<> validate(TerminalRecord const& rec) {
  auto inconsistent = [](std::string what) {
    return Error{Errc::lifecycle_illegal_transition, std::move(what)};
  };
  if (!rec.exit.valid()) return inconsistent("invalid exit status");
  CUSTOS_TRYV(check(rec.output));
  for (auto const& [name, value] : rec.observations) {
    if (name.empty() || name.find('=') != std::string::npos)
      return inconsistent("an observation name is non-empty, without '='");
  }
  if (rec.recovery == RecoveryPath::already_terminal) {
    return inconsistent("already_terminal describes a recovery pass, not how a record was reached");
  }
  // The classification must be exactly what classify() gives for these facts; success and the
  // cleanup do not enter the classification, so `cleanup` is passed through as recorded.
  ClassifyInput in;
  in.exit = rec.exit;
  in.spawn_failed = rec.spawn_error.has_value();
  in.trigger = rec.trigger;
  in.cleanup = rec.tree.cleanup;
  in.sandbox_denied = rec.classification == Classification::sandbox_denied;
  in.recovery = rec.recovery;
  auto verdict = classify(in);
  if (!verdict) return inconsistent("no classification fits: " + verdict.error().context);
  if (verdict->classification != rec.classification) {
    return inconsistent("classification " + std::string{classification_wire(rec.classification)} +
                        " contradicts the facts, which give " +
                        std::string{classification_wire(verdict->classification)});
  }
  return ok();
}

Result<TerminalRecord> make_terminal_record(ClassifyInput const& in,
                                            std::optional<SpawnFailure> spawn_error) {
  if (in.spawn_failed != spawn_error.has_value()) {
    return Error{Errc::lifecycle_illegal_transition, "spawn_failed and spawn_error disagree"};
  }
  auto const verdict = CUSTOS_TRY(classify(in));
  TerminalRecord rec;
  rec.classification = verdict.classification;
  rec.recovery = in.recovery;
  rec.exit = in.exit;
  rec.trigger = in.trigger;
  rec.tree.cleanup = in.cleanup;
  rec.spawn_error = std::move(spawn_error);
  for (std::size_t i = 0; i < kResourceDimCount; ++i)
    rec.resources.dims[i].fidelity = Fidelity::unavailable;
  return rec;
}

// ---- canonical bytes -----------------------------------------------------------------------

Result<std::vector<std::uint8_t>> canonical_bytes(TerminalRecord const& rec) {
  CUSTOS_TRYV(validate(rec));
  CanonicalWriter w{kKindTerminal};
  w.string(tag::classification, classification_wire(rec.classification));
  w.string(tag::recovery, recovery_path_wire(rec.recovery));
  w.record(tag::exit, kKindExit, [&](CanonicalWriter& r) {
    if (rec.exit.code.has_value()) r.i64(1, *rec.exit.code);
    if (rec.exit.signal.has_value()) r.i64(2, *rec.exit.signal);
  });
  if (rec.trigger.has_value()) w.string(tag::trigger, trigger_wire(*rec.trigger));
  w.record(tag::escalation, kKindEscalation, [&](CanonicalWriter& r) {
    r.boolean(1, rec.escalation.graceful_sent).boolean(2, rec.escalation.forced);
  });
  // std::map iterates in Stream order, which makes the list order canonical.
  w.begin_list(tag::output, FieldType::record);
  for (auto const& [stream, acc] : rec.output) {
    w.begin_element_record(kKindStream);
    w.string(1, stream_wire(stream)).u64(2, acc.observed).u64(3, acc.retained).u64(4, acc.dropped);
    w.boolean(5, acc.complete);
    w.end_element_record();
  }
  w.end_list();
  w.begin_list(tag::resources, FieldType::record);
  for (std::size_t i = 0; i < kResourceDimCount; ++i) {
    auto const& d = rec.resources.dims[i];
    w.begin_element_record(kKindResource);
    w.string(1, resource_dim_wire(static_cast<ResourceDim>(i)));
    if (d.value.has_value()) w.u64(2, *d.value);
    if (d.limit.has_value()) w.u64(3, *d.limit);
    w.string(4, fidelity_wire(d.fidelity));
    w.end_element_record();
  }
  w.end_list();
  w.record(tag::tree, kKindTree, [&](CanonicalWriter& r) {
    r.string(1, boundary_wire(rec.tree.boundary))
        .string(2, cleanup_wire(rec.tree.cleanup))
        .string(3, containment_wire(rec.tree.containment));
  });
  if (rec.spawn_error.has_value()) {
    w.record(tag::spawn_error, kKindSpawnError, [&](CanonicalWriter& r) {
      r.string(1, rec.spawn_error->code)
          .i64(2, rec.spawn_error->sys_errno)
          .string(3, rec.spawn_error->detail);
    });
  }
  if (!rec.observations.empty()) {
    w.begin_list(tag::observations, FieldType::string);
    for (auto const& [name, value] : rec.observations) {
      std::string item = name;
      item += '=';
      item += value;
      w.element_string(item);
    }
    w.end_list();
  }
  return std::move(w).finish();
}

namespace {

Result<std::int32_t> i64_to_i32(Result<std::int64_t> v, std::string_view what) {
  if (!v) return v.error();
  if (*v < std::numeric_limits<std::int32_t>::min() ||
      *v > std::numeric_limits<std::int32_t>::max()) {
    return malformed(std::string{what} + " out of the 32-bit range");
  }
  return static_cast<std::int32_t>(*v);
}

// The output list: one record per stream, in strictly increasing stream order.
Result<void> decode_output(CanonicalReader& r, TerminalRecord& rec) {
  auto list = CUSTOS_TRY(r.list(tag::output, FieldType::record));
  std::optional<Stream> prev;
  while (!list.done()) {
    auto e = CUSTOS_TRY(list.next_record());
    if (e.kind() != kKindStream) return malformed("output element of the wrong kind");
    auto const stream = CUSTOS_TRY(decode_enum(e.string(1), &stream_from_wire, "stream"));
    // Strictly increasing stream order: no duplicates, and one byte string per record.
    if (prev.has_value() && *prev >= stream)
      return malformed("output streams out of order or repeated");
    prev = stream;
    StreamAccounting acc;
    acc.observed = CUSTOS_TRY(e.u64(2));
    acc.retained = CUSTOS_TRY(e.u64(3));
    acc.dropped = CUSTOS_TRY(e.u64(4));
    acc.complete = CUSTOS_TRY(e.boolean(5));
    CUSTOS_TRYV(e.finish());
    rec.output.emplace(stream, acc);
  }
  CUSTOS_TRYV(list.finish());
  return ok();
}

// The resources list: every dimension, in dimension order.
Result<void> decode_resources(CanonicalReader& r, TerminalRecord& rec) {
  auto list = CUSTOS_TRY(r.list(tag::resources, FieldType::record));
  if (list.size() != kResourceDimCount)
    return malformed("resources must list all eight dimensions");
  for (std::size_t i = 0; i < kResourceDimCount; ++i) {
    auto e = CUSTOS_TRY(list.next_record());
    if (e.kind() != kKindResource) return malformed("resource element of the wrong kind");
    auto const dim =
        CUSTOS_TRY(decode_enum(e.string(1), &resource_dim_from_wire, "resource dimension"));
    if (static_cast<std::size_t>(dim) != i) return malformed("resource dimensions out of order");
    auto& d = rec.resources.dims[i];
    d.value = CUSTOS_TRY(e.optional_u64(2));
    d.limit = CUSTOS_TRY(e.optional_u64(3));
    d.fidelity = CUSTOS_TRY(decode_enum(e.string(4), &fidelity_from_wire, "fidelity"));
    CUSTOS_TRYV(e.finish());
  }
  CUSTOS_TRYV(list.finish());
  return ok();
}

}  // namespace

Result<TerminalRecord> terminal_from_canonical(std::span<std::uint8_t const> bytes) {
  auto r = CUSTOS_TRY(CanonicalReader::open(bytes, kKindTerminal));
  TerminalRecord rec;
  rec.classification = CUSTOS_TRY(
      decode_enum(r.string(tag::classification), &classification_from_wire, "classification"));
  rec.recovery =
      CUSTOS_TRY(decode_enum(r.string(tag::recovery), &recovery_path_from_wire, "recovery"));
  {
    auto ex = CUSTOS_TRY(r.record(tag::exit, kKindExit));
    if (ex.has(1)) rec.exit.code = CUSTOS_TRY(i64_to_i32(ex.i64(1), "exit code"));
    if (ex.has(2)) rec.exit.signal = CUSTOS_TRY(i64_to_i32(ex.i64(2), "exit signal"));
    CUSTOS_TRYV(ex.finish());
  }
  if (r.has(tag::trigger)) {
    rec.trigger = CUSTOS_TRY(decode_enum(r.string(tag::trigger), &trigger_from_wire, "trigger"));
  }
  {
    auto es = CUSTOS_TRY(r.record(tag::escalation, kKindEscalation));
    rec.escalation.graceful_sent = CUSTOS_TRY(es.boolean(1));
    rec.escalation.forced = CUSTOS_TRY(es.boolean(2));
    CUSTOS_TRYV(es.finish());
  }
  CUSTOS_TRYV(decode_output(r, rec));
  CUSTOS_TRYV(decode_resources(r, rec));
  {
    auto t = CUSTOS_TRY(r.record(tag::tree, kKindTree));
    rec.tree.boundary = CUSTOS_TRY(decode_enum(t.string(1), &boundary_from_wire, "boundary"));
    rec.tree.cleanup = CUSTOS_TRY(decode_enum(t.string(2), &cleanup_from_wire, "cleanup"));
    rec.tree.containment =
        CUSTOS_TRY(decode_enum(t.string(3), &containment_from_wire, "containment"));
    CUSTOS_TRYV(t.finish());
  }
  if (r.has(tag::spawn_error)) {
    auto s = CUSTOS_TRY(r.record(tag::spawn_error, kKindSpawnError));
    SpawnFailure f;
    f.code = CUSTOS_TRY(s.string(1));
    f.sys_errno = CUSTOS_TRY(i64_to_i32(s.i64(2), "spawn errno"));
    f.detail = CUSTOS_TRY(s.string(3));
    CUSTOS_TRYV(s.finish());
    rec.spawn_error = std::move(f);
  }
  if (r.has(tag::observations)) {
    for (auto const& item : CUSTOS_TRY(r.string_list(tag::observations))) {
      auto const eq = item.find('=');
      if (eq == std::string::npos || eq == 0) return malformed("observation without a name");
      if (!rec.observations.emplace(item.substr(0, eq), item.substr(eq + 1)).second)
        return malformed("observation listed twice: " + item.substr(0, eq));
    }
    if (rec.observations.empty()) return malformed("an empty observation list is written absent");
  }
  CUSTOS_TRYV(r.finish());
  if (auto v = validate(rec); !v)
    return malformed("terminal record is inconsistent: " + v.error().message());
  return rec;
}

Result<std::string> terminal_digest(TerminalRecord const& rec) {
  auto const bytes = CUSTOS_TRY(canonical_bytes(rec));
  auto const digest = CUSTOS_TRY(sha256(bytes));
  return digest.to_string();
}

// ---- JSON ----------------------------------------------------------------------------------

Result<json::value> to_json(TerminalRecord const& rec) {
  auto const digest = CUSTOS_TRY(terminal_digest(rec));  // also validates
  json::object o;
  o["classification"] = classification_wire(rec.classification);
  o["recovery"] = recovery_path_wire(rec.recovery);
  o["exit"] =
      json::object{{"code", opt_json(rec.exit.code)}, {"signal", opt_json(rec.exit.signal)}};
  o["trigger"] =
      rec.trigger.has_value() ? json::value(trigger_wire(*rec.trigger)) : json::value(nullptr);
  o["escalation"] = json::object{{"graceful_sent", rec.escalation.graceful_sent},
                                 {"forced", rec.escalation.forced}};
  json::object out;
  for (auto const& [stream, acc] : rec.output) {
    out[stream_wire(stream)] = json::object{{"observed", acc.observed},
                                            {"retained", acc.retained},
                                            {"dropped", acc.dropped},
                                            {"complete", acc.complete}};
  }
  o["output"] = std::move(out);
  json::object res;
  for (std::size_t i = 0; i < kResourceDimCount; ++i) {
    auto const& d = rec.resources.dims[i];
    res[resource_dim_wire(static_cast<ResourceDim>(i))] =
        json::object{{"value", opt_json(d.value)},
                     {"limit", opt_json(d.limit)},
                     {"fidelity", fidelity_wire(d.fidelity)}};
  }
  o["resources"] = std::move(res);
  o["tree"] = json::object{{"boundary", boundary_wire(rec.tree.boundary)},
                           {"cleanup", cleanup_wire(rec.tree.cleanup)},
                           {"containment", containment_wire(rec.tree.containment)}};
  if (rec.spawn_error.has_value()) {
    o["spawn_error"] = json::object{{"code", rec.spawn_error->code},
                                    {"errno", rec.spawn_error->sys_errno},
                                    {"detail", rec.spawn_error->detail}};
  } else {
    o["spawn_error"] = nullptr;
  }
  if (!rec.observations.empty()) {
    json::object obs;
    for (auto const& [name, value] : rec.observations) obs[name] = value;
    o["observations"] = std::move(obs);
  }
  o["digest"] = digest;
  return json::value(std::move(o));
}

Result<TerminalRecord> terminal_from_json(json::value const& v) {
  FieldReader r;
  auto const* o = r.object(v, "");
  if (o == nullptr) return std::move(r).error();
  r.only(*o, "",
         {"classification", "recovery", "exit", "trigger", "escalation", "output", "resources",
          "tree", "spawn_error", "observations", "digest"});
  for (std::string_view key : {"classification", "recovery", "exit", "trigger", "escalation",
                               "output", "resources", "tree", "spawn_error"}) {
    (void)r.required(*o, "", key);
  }
  if (!r.ok()) return std::move(r).error();
  TerminalRecord rec;
  (void)r.name(o->at("classification"), "/classification", classification_from_wire,
               rec.classification);
  (void)r.name(o->at("recovery"), "/recovery", recovery_path_from_wire, rec.recovery);
  read_exit(r, o->at("exit"), rec.exit);
  if (!o->at("trigger").is_null()) {
    Trigger t{};
    if (r.name(o->at("trigger"), "/trigger", trigger_from_wire, t)) rec.trigger = t;
  }
  read_escalation(r, o->at("escalation"), rec.escalation);
  read_output(r, o->at("output"), rec);
  read_resources(r, o->at("resources"), rec.resources);
  read_tree(r, o->at("tree"), rec.tree);
  read_spawn_error(r, o->at("spawn_error"), rec.spawn_error);
  if (auto const* obs = FieldReader::optional(*o, "observations")) {
    read_observations(r, *obs, rec.observations);
  }
  if (!r.ok()) return std::move(r).error();
  if (auto c = validate(rec); !c) return c.error();
  if (auto const* d = FieldReader::optional(*o, "digest")) {
    std::string claimed;
    if (!r.string(*d, "/digest", claimed)) return std::move(r).error();
    auto const actual = CUSTOS_TRY(terminal_digest(rec));
    if (claimed != actual) {
      return Error{Errc::auth_digest_mismatch, "/digest: " + claimed + " != " + actual};
    }
  }
  return rec;
}

}  // namespace custos::core
