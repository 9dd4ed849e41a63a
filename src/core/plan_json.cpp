// JSON structure → plan values. This file knows JSON shapes and defaults; the rules about the
// values themselves live in plan.cpp / identity.cpp and run on each section that parsed.
#include "custos/core/plan_json.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <limits>
#include <span>
#include <type_traits>

#include "custos/core/base64.hpp"
#include "custos/core/ids.hpp"
#include "custos/core/json_fields.hpp"
#include "custos/core/json_pointer.hpp"

namespace custos::core {
namespace json = boost::json;

namespace {

// Runs a section rule only when the section parsed without structural problems, so one mistake
// is reported once (a missing executable is plan.missing_field, not also invalid_executable).
template <class Rule>
void then_validate(FieldReader& w, std::size_t before, Rule&& rule) {
  if (w.count() == before) rule(w.diagnostics());
}

void parse_command(FieldReader& w, json::value const& v, std::string const& ptr, Command& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"executable", "argv"});
  if (auto const* exe = w.required(*o, ptr, "executable")) {
    (void)w.string(*exe, pointer_append(ptr, "executable"), out.executable);
  }
  if (auto const* argv = w.required(*o, ptr, "argv")) {
    std::string const aptr = pointer_append(ptr, "argv");
    if (auto const* a = w.array(*argv, aptr)) {
      out.argv.resize(a->size());
      for (std::size_t i = 0; i < a->size(); ++i) {
        (void)w.string((*a)[i], pointer_append(aptr, i), out.argv[i]);
      }
    }
  }
  then_validate(w, before, [&](auto& d) { validate_command(out, ptr, d); });
}

void parse_workspace(FieldReader& w, json::value const& v, std::string const& ptr, Workspace& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"root", "access"});
  if (auto const* root = w.required(*o, ptr, "root")) {
    (void)w.string(*root, pointer_append(ptr, "root"), out.root);
  }
  if (auto const* access = FieldReader::optional(*o, "access")) {
    std::string s;
    std::string const aptr = pointer_append(ptr, "access");
    if (w.string(*access, aptr, s)) {
      if (auto a = workspace_access_from(s)) {
        out.access = *a;
      } else {
        w.add(Errc::plan_invalid_workspace, aptr, "must be read_only or writable");
      }
    }
  }
  then_validate(w, before, [&](auto& d) { validate_workspace(out, ptr, d); });
}

void parse_cwd(FieldReader& w, json::value const& v, std::string const& ptr, std::string& out) {
  std::string raw;
  if (!w.string(v, ptr, raw)) return;
  std::size_t const before = w.count();
  if (raw.find('\0') != std::string::npos) {
    w.add(Errc::plan_nul_byte, ptr, "contains a NUL byte");
  } else if (raw.size() > kMaxPathBytes) {
    w.add(Errc::plan_too_large, ptr, "longer than " + std::to_string(kMaxPathBytes) + " bytes");
  } else {
    std::string why;
    if (auto norm = normalize_cwd(raw, &why)) {
      out = std::move(*norm);
    } else {
      w.add(Errc::plan_invalid_cwd, ptr, why);
    }
  }
  then_validate(w, before, [&](auto& d) { validate_cwd(out, ptr, d); });
}

void parse_env(FieldReader& w, json::value const& v, std::string const& ptr,
               std::vector<EnvEntry>& out) {
  auto const* a = w.array(v, ptr);
  if (a == nullptr) return;
  out.resize(a->size());
  std::vector<std::string> broken;  // pointers of entries that did not parse structurally
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::size_t const before = w.count();
    std::string const eptr = pointer_append(ptr, i);
    if (auto const* o = w.object((*a)[i], eptr)) {
      w.only(*o, eptr, {"name", "inherit", "value"});
      if (auto const* name = w.required(*o, eptr, "name")) {
        (void)w.string(*name, pointer_append(eptr, "name"), out[i].name);
      }
      bool inherit = false;
      bool has_inherit = false;
      if (auto const* inh = FieldReader::optional(*o, "inherit")) {
        has_inherit = w.boolean(*inh, pointer_append(eptr, "inherit"), inherit);
        if (has_inherit && !inherit) {
          w.add(Errc::plan_env_conflict, pointer_append(eptr, "inherit"),
                "must be true when present (a literal entry has a value and no inherit)");
        }
      }
      if (auto const* value = FieldReader::optional(*o, "value")) {
        std::string s;
        if (w.string(*value, pointer_append(eptr, "value"), s)) out[i].value = std::move(s);
        if (has_inherit && inherit) {
          w.add(Errc::plan_env_conflict, eptr,
                "has both inherit and value; an entry is one or the other");
        }
      } else if (!has_inherit) {
        w.add(Errc::plan_env_conflict, eptr, "needs either \"inherit\": true or a \"value\"");
      }
    }
    if (w.count() != before) broken.push_back(eptr + "/");
  }
  // The list rules (names, duplicates, totals) run over every entry; findings about an entry
  // that is already reported as malformed are dropped so each mistake is reported once.
  std::vector<Diagnostic> rules;
  validate_env(out, ptr, rules);
  for (auto& d : rules) {
    std::string const with_slash = d.pointer + "/";
    bool const in_broken = std::any_of(broken.begin(), broken.end(), [&](std::string const& b) {
      return with_slash.compare(0, b.size(), b) == 0;
    });
    if (!in_broken) w.diagnostics().push_back(std::move(d));
  }
}

void parse_io(FieldReader& w, json::value const& v, std::string const& ptr, IoPolicy& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"mode", "rows", "cols", "resize"});
  if (auto const* mode = w.required(*o, ptr, "mode")) {
    std::string s;
    std::string const mptr = pointer_append(ptr, "mode");
    if (w.string(*mode, mptr, s)) {
      if (auto m = io_mode_from(s)) {
        out.mode = *m;
      } else {
        w.add(Errc::plan_invalid_io, mptr, "must be pipes or pty");
        return;
      }
    }
  }
  if (w.count() != before) return;
  if (out.mode == IoMode::pipes) {
    for (std::string_view key : {"rows", "cols", "resize"}) {
      if (o->contains(key))
        w.add(Errc::plan_invalid_io, pointer_append(ptr, key), "applies to mode pty only");
    }
    return;
  }
  out.rows = kDefaultPtyRows;
  out.cols = kDefaultPtyCols;
  w.opt_number(*o, ptr, "rows", kMaxPtyDimension, Errc::plan_invalid_io, out.rows);
  w.opt_number(*o, ptr, "cols", kMaxPtyDimension, Errc::plan_invalid_io, out.cols);
  if (auto const* resize = FieldReader::optional(*o, "resize")) {
    (void)w.boolean(*resize, pointer_append(ptr, "resize"), out.resize);
  }
  then_validate(w, before, [&](auto& d) { validate_io(out, ptr, d); });
}

void parse_limits(FieldReader& w, json::value const& v, std::string const& ptr, Limits& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr,
         {kLimitNames[0], kLimitNames[1], kLimitNames[2], kLimitNames[3], kLimitNames[4],
          kLimitNames[5], kLimitNames[6], kLimitNames[7]});
  auto members = limit_members(out);
  for (std::size_t i = 0; i < members.size(); ++i) {
    auto const* lv = FieldReader::optional(*o, kLimitNames[i]);
    if (lv == nullptr) continue;
    std::string const lptr = pointer_append(ptr, kLimitNames[i]);
    if (auto const* s = lv->if_string()) {
      if (*s == "unlimited") {
        *members[i] = std::nullopt;
      } else {
        w.add(Errc::plan_invalid_limit, lptr, "must be a positive integer or \"unlimited\"");
      }
      continue;
    }
    std::uint64_t n = 0;
    if (w.unsigned_int(*lv, lptr, kMaxPlanNumber, Errc::plan_invalid_limit, n)) *members[i] = n;
  }
  then_validate(w, before, [&](auto& d) { validate_limits(out, ptr, d); });
}

void parse_output(FieldReader& w, json::value const& v, std::string const& ptr, OutputPolicy& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"chunk_bytes", "retained_bytes", "spool_bytes", "max_events", "on_limit"});
  auto const code = Errc::plan_invalid_output_policy;
  w.opt_number(*o, ptr, "chunk_bytes", kMaxPlanNumber, code, out.chunk_bytes);
  w.opt_number(*o, ptr, "retained_bytes", kMaxPlanNumber, code, out.retained_bytes);
  w.opt_number(*o, ptr, "spool_bytes", kMaxPlanNumber, code, out.spool_bytes);
  w.opt_number(*o, ptr, "max_events", kMaxPlanNumber, code, out.max_events);
  if (auto const* ol = FieldReader::optional(*o, "on_limit")) {
    std::string s;
    std::string const optr = pointer_append(ptr, "on_limit");
    if (w.string(*ol, optr, s)) {
      if (auto x = on_limit_from(s)) {
        out.on_limit = *x;
      } else {
        w.add(code, optr, "must be truncate or cancel");
      }
    }
  }
  then_validate(w, before, [&](auto& d) { validate_output(out, ptr, d); });
}

void parse_escalation(FieldReader& w, json::value const& v, std::string const& ptr,
                      Escalation& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"signal", "grace_ms", "kill_after_ms"});
  auto const code = Errc::plan_invalid_escalation;
  if (auto const* sig = FieldReader::optional(*o, "signal")) {
    std::string s;
    std::string const sptr = pointer_append(ptr, "signal");
    if (w.string(*sig, sptr, s)) {
      if (auto n = signal_from_name(s)) {
        out.signal = *n;
      } else {
        w.add(code, sptr, "must be one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2");
      }
    }
  }
  w.opt_number(*o, ptr, "grace_ms", kMaxPlanNumber, code, out.grace_ms);
  w.opt_number(*o, ptr, "kill_after_ms", kMaxPlanNumber, code, out.kill_after_ms);
  then_validate(w, before, [&](auto& d) { validate_escalation(out, ptr, d); });
}

void parse_user(FieldReader& w, json::value const& v, std::string const& ptr,
                std::optional<UserSpec>& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"uid", "gid", "groups"});
  UserSpec u;
  constexpr std::uint64_t kMaxId = 4294967294U;
  auto const code = Errc::plan_invalid_user;
  std::uint64_t n = 0;
  if (auto const* uid = w.required(*o, ptr, "uid")) {
    if (w.unsigned_int(*uid, pointer_append(ptr, "uid"), kMaxId, code, n))
      u.uid = static_cast<std::uint32_t>(n);
  }
  if (auto const* gid = w.required(*o, ptr, "gid")) {
    if (w.unsigned_int(*gid, pointer_append(ptr, "gid"), kMaxId, code, n))
      u.gid = static_cast<std::uint32_t>(n);
  }
  if (auto const* groups = FieldReader::optional(*o, "groups")) {
    std::string const gptr = pointer_append(ptr, "groups");
    if (auto const* a = w.array(*groups, gptr)) {
      if (a->size() > kMaxGroups) {
        w.add(Errc::plan_too_large, gptr, "more than " + std::to_string(kMaxGroups) + " groups");
      } else {
        for (std::size_t i = 0; i < a->size(); ++i) {
          if (w.unsigned_int((*a)[i], pointer_append(gptr, i), kMaxId, code, n)) {
            u.groups.push_back(static_cast<std::uint32_t>(n));
          }
        }
        // Supplementary groups are a set to the kernel: sort so that one set has one encoding.
        std::sort(u.groups.begin(), u.groups.end());
        if (std::adjacent_find(u.groups.begin(), u.groups.end()) != u.groups.end()) {
          w.add(code, gptr, "lists a group more than once");
        }
      }
    }
  }
  if (w.count() != before) return;
  validate_user(u, ptr, w.diagnostics());
  out = std::move(u);
}

// `plan.sandbox` is compiled by the sandbox layer (plan_json.hpp, SandboxMember); a reader that
// cannot compile it refuses it rather than run a restricted plan unrestricted.
void refuse_sandbox(FieldReader& w, std::string const& ptr) {
  w.add(Errc::sandbox_unsupported, ptr,
        "sandbox requirements are compiled by the sandbox layer (sandbox::parse_plan); this "
        "reader cannot compile them");
}

// A write step's members: the stream (the step key's value) and data_b64.
std::optional<ScriptStep> parse_write_step(FieldReader& w, json::object const& o,
                                           std::string const& ptr) {
  auto const code = Errc::plan_invalid_backend;
  std::string const kptr = pointer_append(ptr, "write");
  script::Write write;
  std::string stream;
  if (w.string(o.at("write"), kptr, stream)) {
    if (auto s = script_stream_from(stream)) {
      write.stream = *s;
    } else {
      w.add(code, kptr, "must be stdout or stderr");
    }
  }
  std::string const dptr = pointer_append(ptr, "data_b64");
  if (auto const* d = w.required(o, ptr, "data_b64")) {
    std::string text;
    if (w.string(*d, dptr, text)) {
      // Bounded before decoding: the text of more than the bound is refused unread.
      if (text.size() > (kMaxScriptWriteBytes + 2) / 3 * 4) {
        w.add(Errc::plan_too_large, dptr,
              "decodes to more than " + std::to_string(kMaxScriptWriteBytes) + " bytes");
      } else if (auto bytes = base64_decode(text)) {
        write.data = std::move(*bytes);
      } else {
        w.add(code, dptr, "must be padded base64 (RFC 4648)");
      }
    }
  }
  return write;
}

// A use step: an object of up to four resource values.
std::optional<ScriptStep> parse_use_step(FieldReader& w, json::value const& arg,
                                         std::string const& kptr) {
  auto const* u = w.object(arg, kptr);
  if (u == nullptr) return std::nullopt;
  w.only(*u, kptr,
         {kScriptUseNames[0], kScriptUseNames[1], kScriptUseNames[2], kScriptUseNames[3]});
  script::Use use;
  auto& [cpu, memory, disk, descriptors] = use;
  std::array<std::optional<std::uint64_t>*, 4> const members = {&cpu, &memory, &disk, &descriptors};
  for (std::size_t m = 0; m < members.size(); ++m) {
    std::uint64_t n = 0;
    if (auto const* mv = FieldReader::optional(*u, kScriptUseNames[m])) {
      if (w.unsigned_int(*mv, pointer_append(kptr, kScriptUseNames[m]), kMaxPlanNumber,
                         Errc::plan_invalid_backend, n)) {
        *members[m] = n;
      }
    }
  }
  return use;
}

// One script step: an object with exactly one step key (and, for write, data_b64). Returns
// nullopt after reporting when it does not parse structurally.
std::optional<ScriptStep> parse_script_step(FieldReader& w, json::value const& v,
                                            std::string const& ptr) {
  auto const code = Errc::plan_invalid_backend;
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return std::nullopt;
  std::size_t const before = w.count();
  w.only(
      *o, ptr,
      {kScriptStepKeys[0], kScriptStepKeys[1], kScriptStepKeys[2], kScriptStepKeys[3],
       kScriptStepKeys[4], kScriptStepKeys[5], kScriptStepKeys[6], kScriptStepKeys[7], "data_b64"});
  std::vector<std::string_view> keys;
  for (auto k : kScriptStepKeys) {
    if (o->contains(k)) keys.push_back(k);
  }
  if (keys.empty() && w.count() != before) return std::nullopt;  // an unknown key said it
  if (keys.size() != 1) {
    w.add(code, ptr,
          keys.empty() ? "names no step (write, sleep_ms, spawn, ignore, use, read_stdin, exit, "
                         "signal)"
                       : "names more than one step (" + std::string{keys[0]} + ", " +
                             std::string{keys[1]} + "); one step per object");
    return std::nullopt;
  }
  std::string_view const key = keys.front();
  std::string const kptr = pointer_append(ptr, key);
  json::value const& arg = o->at(key);
  if (key != "write" && o->contains("data_b64")) {
    w.add(code, pointer_append(ptr, "data_b64"), "belongs to a write step only");
  }
  std::uint64_t n = 0;
  auto number = [&](std::uint64_t max) { return w.unsigned_int(arg, kptr, max, code, n); };
  auto signal = [&](auto from_name, std::string_view expected) -> std::optional<std::uint32_t> {
    std::string name;
    if (!w.string(arg, kptr, name)) return std::nullopt;
    auto sig = from_name(name);
    if (!sig) w.add(code, kptr, "must be " + std::string{expected} + ", is " + name);
    return sig;
  };
  std::optional<ScriptStep> step;
  if (key == "write") {
    step = parse_write_step(w, *o, ptr);
  } else if (key == "sleep_ms") {
    if (number(kMaxPlanNumber)) step = script::Sleep{n};
  } else if (key == "spawn") {
    if (number(kMaxPlanNumber)) step = script::Spawn{n};
  } else if (key == "ignore") {
    constexpr std::string_view kGraceful =
        "one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2";
    if (auto sig = signal(signal_from_name, kGraceful)) {
      step = script::Ignore{*sig};
    }
  } else if (key == "use") {
    step = parse_use_step(w, arg, kptr);
  } else if (key == "read_stdin") {
    if (number(kMaxPlanNumber)) step = script::ReadStdin{n};
  } else if (key == "exit") {
    if (number(255)) step = script::Exit{static_cast<std::uint8_t>(n)};
  } else {
    if (auto sig = signal(terminating_signal_from_name, "a signal that ends a process")) {
      step = script::Signal{*sig};
    }
  }
  if (w.count() != before) return std::nullopt;
  return step;
}

void parse_script(FieldReader& w, json::value const& v, std::string const& ptr,
                  std::optional<ReferenceScript>& out) {
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  std::size_t const before = w.count();
  w.only(*o, ptr, {"steps"});
  ReferenceScript s;
  if (auto const* steps = w.required(*o, ptr, "steps")) {
    std::string const sptr = pointer_append(ptr, "steps");
    if (auto const* a = w.array(*steps, sptr)) {
      if (a->size() > kMaxScriptSteps) {
        w.add(Errc::plan_too_large, sptr,
              "more than " + std::to_string(kMaxScriptSteps) + " steps");
        return;
      }
      s.steps.reserve(a->size());
      for (std::size_t i = 0; i < a->size(); ++i) {
        if (auto step = parse_script_step(w, (*a)[i], pointer_append(sptr, i))) {
          s.steps.push_back(std::move(*step));
        }
      }
    }
  }
  // The script rules (bounds, the end step) run in validate_backend, and only over a script
  // that parsed whole: a step that did not parse would shift every later index and total.
  if (w.count() == before) out = std::move(s);
}

void parse_backend(FieldReader& w, json::value const& v, std::string const& ptr, Backend& out) {
  std::size_t const before = w.count();
  auto const* o = w.object(v, ptr);
  if (o == nullptr) return;
  w.only(*o, ptr, {"kind", "container", "socket", "script", "gate"});
  if (auto const* kind = w.required(*o, ptr, "kind")) {
    std::string s;
    std::string const kptr = pointer_append(ptr, "kind");
    if (w.string(*kind, kptr, s)) {
      if (auto k = backend_kind_from(s)) {
        out.kind = *k;
      } else {
        w.add(Errc::plan_invalid_backend, kptr, "must be native, reference, docker or podman");
      }
    }
  }
  for (auto [key, member] : {std::pair{std::string_view{"container"}, &out.container},
                             std::pair{std::string_view{"socket"}, &out.socket}}) {
    if (auto const* m = FieldReader::optional(*o, key)) {
      std::string s;
      if (w.string(*m, pointer_append(ptr, key), s)) *member = std::move(s);
    }
  }
  if (auto const* m = FieldReader::optional(*o, "gate")) {
    std::string s;
    std::string const gptr = pointer_append(ptr, "gate");
    if (w.string(*m, gptr, s)) {
      if (auto g = gate_policy_from(s)) {
        out.gate = *g;
      } else {
        w.add(Errc::plan_invalid_backend, gptr, "must be required or optional");
      }
    }
  }
  if (auto const* m = FieldReader::optional(*o, "script"); m != nullptr && w.count() == before) {
    if (out.kind == BackendKind::reference) {
      parse_script(w, *m, pointer_append(ptr, "script"), out.script);
    } else {
      // Misplaced: validate_backend reports it once, whatever is inside.
      out.script = ReferenceScript{};
    }
  }
  then_validate(w, before, [&](auto& d) { validate_backend(out, ptr, d); });
}

}  // namespace

Result<ExecutionIdentity> parse_identity(json::value const& v, std::string_view pointer_base) {
  FieldReader w;
  std::string const base{pointer_base};
  ExecutionIdentity id;
  auto const* o = w.object(v, base);
  if (o == nullptr) return std::move(w).error();
  w.only(*o, base,
         {kIdentityIdNames[0], kIdentityIdNames[1], kIdentityIdNames[2], kIdentityIdNames[3],
          kIdentityIdNames[4], kIdentityIdNames[5], kIdentityIdNames[6], kIdentityIdNames[7],
          kIdentityIdNames[8], kIdentityIdNames[9], "generation", "revision"});
  auto ids = identity_ids(id);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::string const ptr = pointer_append(base, kIdentityIdNames[i]);
    auto const* m = w.required(*o, base, kIdentityIdNames[i]);
    if (m == nullptr || !w.string(*m, ptr, *ids[i])) continue;
    if (ids[i]->find('\0') != std::string::npos) {
      w.add(Errc::plan_nul_byte, ptr, "contains a NUL byte");
    } else if (auto why = id_problem(*ids[i])) {
      w.add(Errc::plan_invalid_id, ptr, "id " + *why);
    }
  }
  for (auto [key, member] : {std::pair{std::string_view{"generation"}, &id.generation},
                             std::pair{std::string_view{"revision"}, &id.revision}}) {
    if (auto const* m = w.required(*o, base, key)) {
      (void)w.unsigned_int(*m, pointer_append(base, key), std::numeric_limits<std::uint64_t>::max(),
                           Errc::plan_invalid_value, *member);
    }
  }
  if (!w.ok()) return std::move(w).error();
  return id;
}

Result<ExecutionPlan> parse_plan(json::value const& v, std::string_view pointer_base,
                                 SandboxMember sandbox) {
  FieldReader w;
  std::string const base{pointer_base};
  ExecutionPlan plan;
  auto const* o = w.object(v, base);
  if (o == nullptr) return std::move(w).error();
  w.only(*o, base,
         {"command", "workspace", "cwd", "env", "io", "limits", "output", "escalation", "user",
          "sandbox", "backend"});
  auto at = [&](std::string_view key) { return pointer_append(base, key); };
  if (auto const* m = w.required(*o, base, "command"))
    parse_command(w, *m, at("command"), plan.command);
  if (auto const* m = w.required(*o, base, "workspace"))
    parse_workspace(w, *m, at("workspace"), plan.workspace);
  if (auto const* m = FieldReader::optional(*o, "cwd")) parse_cwd(w, *m, at("cwd"), plan.cwd);
  if (auto const* m = FieldReader::optional(*o, "env")) parse_env(w, *m, at("env"), plan.env);
  if (auto const* m = FieldReader::optional(*o, "io")) parse_io(w, *m, at("io"), plan.io);
  if (auto const* m = FieldReader::optional(*o, "limits"))
    parse_limits(w, *m, at("limits"), plan.limits);
  if (auto const* m = FieldReader::optional(*o, "output"))
    parse_output(w, *m, at("output"), plan.output);
  if (auto const* m = FieldReader::optional(*o, "escalation"))
    parse_escalation(w, *m, at("escalation"), plan.escalation);
  if (auto const* m = FieldReader::optional(*o, "user")) parse_user(w, *m, at("user"), plan.user);
  if (FieldReader::optional(*o, "sandbox") != nullptr && sandbox == SandboxMember::refuse) {
    refuse_sandbox(w, at("sandbox"));
  }
  if (auto const* m = FieldReader::optional(*o, "backend"))
    parse_backend(w, *m, at("backend"), plan.backend);
  if (!w.ok()) return std::move(w).error();
  return plan;
}

// ------------------------------------------------------------------------------ to_json

namespace {

json::value step_json(ScriptStep const& step) {
  return std::visit(
      [](auto const& st) -> json::value {
        using T = std::decay_t<decltype(st)>;
        if constexpr (std::is_same_v<T, script::Write>) {
          return json::object{{"write", to_string(st.stream)},
                              {"data_b64", base64_encode(std::span<std::uint8_t const>(st.data))}};
        } else if constexpr (std::is_same_v<T, script::Sleep>) {
          return json::object{{"sleep_ms", st.ms}};
        } else if constexpr (std::is_same_v<T, script::Spawn>) {
          return json::object{{"spawn", st.count}};
        } else if constexpr (std::is_same_v<T, script::Ignore>) {
          return json::object{{"ignore", signal_name(st.signal).value_or("SIGTERM")}};
        } else if constexpr (std::is_same_v<T, script::Use>) {
          auto const& [cpu, memory, disk, descriptors] = st;
          std::array<std::optional<std::uint64_t> const*, 4> const members = {&cpu, &memory, &disk,
                                                                              &descriptors};
          json::object use;
          for (std::size_t m = 0; m < members.size(); ++m) {
            if (*members[m]) use[kScriptUseNames[m]] = **members[m];
          }
          return json::object{{"use", std::move(use)}};
        } else if constexpr (std::is_same_v<T, script::ReadStdin>) {
          return json::object{{"read_stdin", st.bytes}};
        } else if constexpr (std::is_same_v<T, script::Exit>) {
          return json::object{{"exit", st.code}};
        } else {
          return json::object{{"signal", terminating_signal_name(st.signal).value_or("SIGKILL")}};
        }
      },
      step);
}

json::value script_json(ReferenceScript const& s) {
  json::array steps;
  steps.reserve(s.steps.size());
  for (auto const& step : s.steps) steps.push_back(step_json(step));
  return json::object{{"steps", std::move(steps)}};
}

}  // namespace

json::value to_json(ExecutionIdentity const& id) {
  json::object o;
  auto const ids = identity_ids(id);
  for (std::size_t i = 0; i < ids.size(); ++i) o[kIdentityIdNames[i]] = *ids[i];
  o["generation"] = id.generation;
  o["revision"] = id.revision;
  return o;
}

json::value to_json(ExecutionPlan const& p) {
  json::object o;
  json::array argv;
  for (auto const& a : p.command.argv) argv.emplace_back(a);
  o["command"] = json::object{{"executable", p.command.executable}, {"argv", std::move(argv)}};
  o["workspace"] =
      json::object{{"root", p.workspace.root}, {"access", to_string(p.workspace.access)}};
  o["cwd"] = p.cwd;
  json::array env;
  for (auto const& e : p.env) {
    if (e.inherits()) {
      env.emplace_back(json::object{{"name", e.name}, {"inherit", true}});
    } else {
      env.emplace_back(json::object{{"name", e.name}, {"value", *e.value}});
    }
  }
  o["env"] = std::move(env);
  if (p.io.mode == IoMode::pty) {
    o["io"] = json::object{
        {"mode", "pty"}, {"rows", p.io.rows}, {"cols", p.io.cols}, {"resize", p.io.resize}};
  } else {
    o["io"] = json::object{{"mode", "pipes"}};
  }
  json::object limits;
  auto const members = limit_members(p.limits);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (*members[i]) {
      limits[kLimitNames[i]] = **members[i];
    } else {
      limits[kLimitNames[i]] = "unlimited";
    }
  }
  o["limits"] = std::move(limits);
  o["output"] = json::object{{"chunk_bytes", p.output.chunk_bytes},
                             {"retained_bytes", p.output.retained_bytes},
                             {"spool_bytes", p.output.spool_bytes},
                             {"max_events", p.output.max_events},
                             {"on_limit", to_string(p.output.on_limit)}};
  o["escalation"] = json::object{{"signal", signal_name(p.escalation.signal).value_or("SIGTERM")},
                                 {"grace_ms", p.escalation.grace_ms},
                                 {"kill_after_ms", p.escalation.kill_after_ms}};
  if (p.user) {
    json::array groups;
    for (auto g : p.user->groups) groups.emplace_back(g);
    o["user"] =
        json::object{{"uid", p.user->uid}, {"gid", p.user->gid}, {"groups", std::move(groups)}};
  }
  json::object backend{{"kind", to_string(p.backend.kind)}};
  if (p.backend.container) backend["container"] = *p.backend.container;
  if (p.backend.socket) backend["socket"] = *p.backend.socket;
  if (p.backend.script) backend["script"] = script_json(*p.backend.script);
  if (p.backend.gate != GatePolicy::required) backend["gate"] = to_string(p.backend.gate);
  o["backend"] = std::move(backend);
  return o;
}

// parse_json_text is in json_text.cpp.

}  // namespace custos::core
