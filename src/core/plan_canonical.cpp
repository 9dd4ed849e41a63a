// Canonical layouts of the identity and the plan (docs/canonical-encoding.md §Records).
//
// Every struct is destructured into exactly kFieldCount bindings before it is written: a member
// added to a struct without being added here stops this file from compiling, which is the
// cheapest guarantee that the digest covers every field.
#include "custos/core/plan_canonical.hpp"

#include <algorithm>
#include <type_traits>
#include <variant>

namespace custos::core {
namespace {

Error malformed(std::string what) {
  return Error{Errc::canonical_malformed, std::move(what)};
}

Error invalid_decoded(std::vector<Diagnostic> diags) {
  Error e = Error::from_diagnostics(std::move(diags));
  e.context = "decoded value breaks a plan rule (" + std::string{errc_wire(e.code)} + ": " +
              e.context + ")";
  e.code = Errc::canonical_malformed;
  return e;
}

// ------------------------------------------------------------------------------ writing

void write_identity_fields(CanonicalWriter& w, ExecutionIdentity const& id) {
  static_assert(ExecutionIdentity::kFieldCount == 12);
  auto const& [project, session, run, attempt, turn, action, process, workspace, resource,
               environment, generation, revision] = id;
  w.string(1, project).string(2, session).string(3, run).string(4, attempt).string(5, turn);
  w.string(6, action).string(7, process).string(8, workspace).string(9, resource);
  w.string(10, environment).u64(11, generation).u64(12, revision);
}

void write_command(CanonicalWriter& w, Command const& c) {
  static_assert(Command::kFieldCount == 2);
  auto const& [executable, argv] = c;
  w.begin_record(1, kind::command).string(1, executable).string_list(2, argv).end_record();
}

void write_workspace(CanonicalWriter& w, Workspace const& ws) {
  static_assert(Workspace::kFieldCount == 2);
  auto const& [root, access] = ws;
  w.begin_record(2, kind::workspace)
      .string(1, root)
      .u8(2, static_cast<std::uint8_t>(access))
      .end_record();
}

void write_env(CanonicalWriter& w, std::vector<EnvEntry> const& env) {
  static_assert(EnvEntry::kFieldCount == 2);
  w.begin_list(4, FieldType::record);
  for (auto const& e : env) {
    auto const& [name, value] = e;
    // Distinct record kinds, not a flag: an inherited entry and a literal one can never
    // encode to the same bytes, whatever the value.
    if (value) {
      w.begin_element_record(kind::env_literal)
          .string(1, name)
          .string(2, *value)
          .end_element_record();
    } else {
      w.begin_element_record(kind::env_inherit).string(1, name).end_element_record();
    }
  }
  w.end_list();
}

void write_io(CanonicalWriter& w, IoPolicy const& io) {
  static_assert(IoPolicy::kFieldCount == 4);
  auto const& [mode, rows, cols, resize] = io;
  if (mode == IoMode::pty) {
    w.begin_record(5, kind::io_pty).u32(1, rows).u32(2, cols).boolean(3, resize).end_record();
  } else {
    // rows/cols/resize are zero/false for pipes (validate_io), so nothing is lost.
    w.begin_record(5, kind::io_pipes).end_record();
  }
}

void write_limits(CanonicalWriter& w, Limits const& l) {
  static_assert(Limits::kFieldCount == 8);
  auto const& [wall, cpu, memory, processes, open_files, disk, output, stdin_bytes] = l;
  w.begin_record(6, kind::limits);
  Tag tag = 1;
  for (Limit const* v :
       {&wall, &cpu, &memory, &processes, &open_files, &disk, &output, &stdin_bytes}) {
    if (*v) w.u64(tag, **v);  // absent = unlimited
    ++tag;
  }
  w.end_record();
}

void write_output(CanonicalWriter& w, OutputPolicy const& o) {
  static_assert(OutputPolicy::kFieldCount == 5);
  auto const& [chunk, retained, spool, max_events, on_limit] = o;
  w.begin_record(7, kind::output_policy)
      .u64(1, chunk)
      .u64(2, retained)
      .u64(3, spool)
      .u64(4, max_events);
  w.u8(5, static_cast<std::uint8_t>(on_limit)).end_record();
}

void write_escalation(CanonicalWriter& w, Escalation const& e) {
  static_assert(Escalation::kFieldCount == 3);
  auto const& [signal, grace, kill_after] = e;
  w.begin_record(8, kind::escalation).u32(1, signal).u64(2, grace).u64(3, kill_after).end_record();
}

void write_user(CanonicalWriter& w, std::optional<UserSpec> const& u) {
  static_assert(UserSpec::kFieldCount == 3);
  if (!u) return;  // absent: run as the caller
  auto const& [uid, gid, groups] = *u;
  w.begin_record(9, kind::user).u32(1, uid).u32(2, gid).u32_list(3, groups).end_record();
}

void write_sandbox(CanonicalWriter& w, std::optional<Digest> const& sandbox_digest) {
  // Always written, so that "no sandbox" is an explicit, digested statement: an unsandboxed
  // plan has the bytes it had before sandboxes existed, a sandboxed one a record of another
  // kind holding its checked sandbox plan's digest (the checked plan is the sandbox layer's own
  // document; its digest binds all of it, and plan_digest covers that digest).
  if (!sandbox_digest) {
    w.begin_record(10, kind::sandbox_none).end_record();
    return;
  }
  w.begin_record(10, kind::sandbox_digest).bytes(1, sandbox_digest->bytes).end_record();
}

void write_step(CanonicalWriter& w, ScriptStep const& step) {
  static_assert(std::variant_size_v<ScriptStep> == 8);
  std::visit(
      [&w](auto const& st) {
        using T = std::decay_t<decltype(st)>;
        if constexpr (std::is_same_v<T, script::Write>) {
          static_assert(T::kFieldCount == 2);
          auto const& [stream, data] = st;
          w.begin_element_record(kind::step_write)
              .u8(1, static_cast<std::uint8_t>(stream))
              .bytes(2, data);
        } else if constexpr (std::is_same_v<T, script::Sleep>) {
          static_assert(T::kFieldCount == 1);
          auto const& [ms] = st;
          w.begin_element_record(kind::step_sleep).u64(1, ms);
        } else if constexpr (std::is_same_v<T, script::Spawn>) {
          static_assert(T::kFieldCount == 1);
          auto const& [count] = st;
          w.begin_element_record(kind::step_spawn).u64(1, count);
        } else if constexpr (std::is_same_v<T, script::Ignore>) {
          static_assert(T::kFieldCount == 1);
          auto const& [signal] = st;
          w.begin_element_record(kind::step_ignore).u32(1, signal);
        } else if constexpr (std::is_same_v<T, script::Use>) {
          static_assert(T::kFieldCount == 4);
          auto const& [cpu, memory, disk, descriptors] = st;
          w.begin_element_record(kind::step_use);
          Tag tag = 1;
          for (auto const* v : {&cpu, &memory, &disk, &descriptors}) {
            if (*v) w.u64(tag, **v);  // absent = not set by this step
            ++tag;
          }
        } else if constexpr (std::is_same_v<T, script::ReadStdin>) {
          static_assert(T::kFieldCount == 1);
          auto const& [bytes] = st;
          w.begin_element_record(kind::step_read_stdin).u64(1, bytes);
        } else if constexpr (std::is_same_v<T, script::Exit>) {
          static_assert(T::kFieldCount == 1);
          auto const& [code] = st;
          w.begin_element_record(kind::step_exit).u8(1, code);
        } else {
          static_assert(std::is_same_v<T, script::Signal> && T::kFieldCount == 1);
          auto const& [signal] = st;
          w.begin_element_record(kind::step_signal).u32(1, signal);
        }
        w.end_element_record();
      },
      step);
}

void write_backend(CanonicalWriter& w, Backend const& b) {
  static_assert(Backend::kFieldCount == 5);
  auto const& [kind_v, container, socket, script, gate] = b;
  w.begin_record(11, kind::backend).u8(1, static_cast<std::uint8_t>(kind_v));
  if (container) w.string(2, *container);
  if (socket) w.string(3, *socket);
  if (script) {
    // Absent for every other backend, so their bytes are what they were before the script.
    static_assert(ReferenceScript::kFieldCount == 1);
    w.begin_record(4, kind::reference_script).begin_list(1, FieldType::record);
    for (auto const& step : script->steps) write_step(w, step);
    w.end_list().end_record();
  }
  // Absent when required (the default), so a gated plan's bytes are what they were before.
  if (gate != GatePolicy::required) w.u8(5, static_cast<std::uint8_t>(gate));
  w.end_record();
}

void write_plan_fields(CanonicalWriter& w, ExecutionPlan const& p) {
  static_assert(ExecutionPlan::kFieldCount == 11);
  auto const& [command, workspace, cwd, env, io, limits, output, escalation, user, sandbox_digest,
               backend] = p;
  write_command(w, command);
  write_workspace(w, workspace);
  w.string(3, cwd);
  write_env(w, env);
  write_io(w, io);
  write_limits(w, limits);
  write_output(w, output);
  write_escalation(w, escalation);
  write_user(w, user);
  write_sandbox(w, sandbox_digest);
  write_backend(w, backend);
}

// ------------------------------------------------------------------------------ reading

Result<ExecutionIdentity> read_identity_fields(CanonicalReader& r) {
  ExecutionIdentity id;
  auto ids = identity_ids(id);
  Tag tag = 1;
  for (auto* s : ids) *s = CUSTOS_TRY(r.string(tag++));
  id.generation = CUSTOS_TRY(r.u64(11));
  id.revision = CUSTOS_TRY(r.u64(12));
  CUSTOS_TRYV(r.finish());
  return id;
}

template <class Enum>
Result<Enum> enum_from_u8(std::uint8_t v, std::uint8_t max, char const* what) {
  if (v < 1 || v > max)
    return malformed(std::string{what} + " value " + std::to_string(v) + " unknown");
  return static_cast<Enum>(v);
}

Result<ScriptStep> read_step(CanonicalReader& e) {
  ScriptStep step;
  switch (e.kind()) {
    case kind::step_write: {
      script::Write st;
      std::uint8_t const stream = CUSTOS_TRY(e.u8(1));
      st.stream = CUSTOS_TRY(enum_from_u8<ScriptStream>(stream, 2, "write stream"));
      st.data = CUSTOS_TRY(e.bytes(2));
      step = std::move(st);
      break;
    }
    case kind::step_sleep:
      step = script::Sleep{CUSTOS_TRY(e.u64(1))};
      break;
    case kind::step_spawn:
      step = script::Spawn{CUSTOS_TRY(e.u64(1))};
      break;
    case kind::step_ignore:
      step = script::Ignore{CUSTOS_TRY(e.u32(1))};
      break;
    case kind::step_use: {
      script::Use st;
      auto& [cpu, memory, disk, descriptors] = st;
      Tag tag = 1;
      for (auto* v : {&cpu, &memory, &disk, &descriptors}) *v = CUSTOS_TRY(e.optional_u64(tag++));
      step = st;
      break;
    }
    case kind::step_read_stdin:
      step = script::ReadStdin{CUSTOS_TRY(e.u64(1))};
      break;
    case kind::step_exit:
      step = script::Exit{CUSTOS_TRY(e.u8(1))};
      break;
    case kind::step_signal:
      step = script::Signal{CUSTOS_TRY(e.u32(1))};
      break;
    default:
      return malformed("script step of record kind " + std::to_string(e.kind()));
  }
  CUSTOS_TRYV(e.finish());
  return step;
}

Result<ReferenceScript> read_script(CanonicalReader& r, Tag tag) {
  auto s = CUSTOS_TRY(r.record(tag, kind::reference_script));
  ReferenceScript script;
  auto l = CUSTOS_TRY(s.list(1, FieldType::record));
  // The count is bounded before anything is reserved: a forged count costs nothing.
  if (l.size() > kMaxScriptSteps)
    return malformed("script of " + std::to_string(l.size()) + " steps");
  script.steps.reserve(l.size());
  while (!l.done()) {
    auto e = CUSTOS_TRY(l.next_record());
    script.steps.push_back(CUSTOS_TRY(read_step(e)));
  }
  CUSTOS_TRYV(l.finish());
  CUSTOS_TRYV(s.finish());
  return script;
}

// Field 4, the environment: literal and inherited entries, each its own record kind.
Result<void> read_env(CanonicalReader& r, ExecutionPlan& p) {
  auto l = CUSTOS_TRY(r.list(4, FieldType::record));
  p.env.reserve(l.size());
  while (!l.done()) {
    auto e = CUSTOS_TRY(l.next_record());
    EnvEntry entry;
    entry.name = CUSTOS_TRY(e.string(1));
    if (e.kind() == kind::env_literal) {
      entry.value = CUSTOS_TRY(e.string(2));
    } else if (e.kind() != kind::env_inherit) {
      return malformed("env entry of record kind " + std::to_string(e.kind()));
    }
    CUSTOS_TRYV(e.finish());
    p.env.push_back(std::move(entry));
  }
  CUSTOS_TRYV(l.finish());
  return ok();
}

// Field 5, the io policy: pipes, or a pty with its window size.
Result<void> read_io(CanonicalReader& r, ExecutionPlan& p) {
  auto io = CUSTOS_TRY(r.record_any(5));
  if (io.kind() == kind::io_pty) {
    p.io.mode = IoMode::pty;
    p.io.rows = CUSTOS_TRY(io.u32(1));
    p.io.cols = CUSTOS_TRY(io.u32(2));
    p.io.resize = CUSTOS_TRY(io.boolean(3));
  } else if (io.kind() != kind::io_pipes) {
    return malformed("io record of kind " + std::to_string(io.kind()));
  }
  CUSTOS_TRYV(io.finish());
  return ok();
}

Result<ExecutionPlan> read_plan_fields(CanonicalReader& r) {
  ExecutionPlan p;
  {
    auto c = CUSTOS_TRY(r.record(1, kind::command));
    p.command.executable = CUSTOS_TRY(c.string(1));
    p.command.argv = CUSTOS_TRY(c.string_list(2));
    CUSTOS_TRYV(c.finish());
  }
  {
    auto ws = CUSTOS_TRY(r.record(2, kind::workspace));
    p.workspace.root = CUSTOS_TRY(ws.string(1));
    std::uint8_t const access = CUSTOS_TRY(ws.u8(2));
    p.workspace.access = CUSTOS_TRY(enum_from_u8<WorkspaceAccess>(access, 2, "workspace access"));
    CUSTOS_TRYV(ws.finish());
  }
  p.cwd = CUSTOS_TRY(r.string(3));
  CUSTOS_TRYV(read_env(r, p));
  CUSTOS_TRYV(read_io(r, p));
  {
    auto l = CUSTOS_TRY(r.record(6, kind::limits));
    Tag tag = 1;
    for (Limit* v : limit_members(p.limits)) *v = CUSTOS_TRY(l.optional_u64(tag++));
    CUSTOS_TRYV(l.finish());
  }
  {
    auto o = CUSTOS_TRY(r.record(7, kind::output_policy));
    p.output.chunk_bytes = CUSTOS_TRY(o.u64(1));
    p.output.retained_bytes = CUSTOS_TRY(o.u64(2));
    p.output.spool_bytes = CUSTOS_TRY(o.u64(3));
    p.output.max_events = CUSTOS_TRY(o.u64(4));
    std::uint8_t const on_limit = CUSTOS_TRY(o.u8(5));
    p.output.on_limit = CUSTOS_TRY(enum_from_u8<OnLimit>(on_limit, 2, "on_limit"));
    CUSTOS_TRYV(o.finish());
  }
  {
    auto e = CUSTOS_TRY(r.record(8, kind::escalation));
    p.escalation.signal = CUSTOS_TRY(e.u32(1));
    p.escalation.grace_ms = CUSTOS_TRY(e.u64(2));
    p.escalation.kill_after_ms = CUSTOS_TRY(e.u64(3));
    CUSTOS_TRYV(e.finish());
  }
  if (r.has(9)) {
    auto u = CUSTOS_TRY(r.record(9, kind::user));
    UserSpec spec;
    spec.uid = CUSTOS_TRY(u.u32(1));
    spec.gid = CUSTOS_TRY(u.u32(2));
    spec.groups = CUSTOS_TRY(u.u32_list(3));
    CUSTOS_TRYV(u.finish());
    p.user = std::move(spec);
  }
  {
    auto s = CUSTOS_TRY(r.record_any(10));
    if (s.kind() == kind::sandbox_digest) {
      auto const bytes = CUSTOS_TRY(s.bytes(1));
      if (bytes.size() != Digest::kSize) {
        return malformed("sandbox digest of " + std::to_string(bytes.size()) + " bytes");
      }
      Digest d;
      std::copy(bytes.begin(), bytes.end(), d.bytes.begin());
      p.sandbox_digest = d;
    } else if (s.kind() != kind::sandbox_none) {
      return malformed("sandbox record of kind " + std::to_string(s.kind()));
    }
    CUSTOS_TRYV(s.finish());
  }
  {
    auto b = CUSTOS_TRY(r.record(11, kind::backend));
    std::uint8_t const backend_kind = CUSTOS_TRY(b.u8(1));
    p.backend.kind = CUSTOS_TRY(enum_from_u8<BackendKind>(backend_kind, 4, "backend kind"));
    p.backend.container = CUSTOS_TRY(b.optional_string(2));
    p.backend.socket = CUSTOS_TRY(b.optional_string(3));
    if (b.has(4)) p.backend.script = CUSTOS_TRY(read_script(b, 4));
    if (b.has(5)) {
      std::uint8_t const gate = CUSTOS_TRY(b.u8(5));
      p.backend.gate = CUSTOS_TRY(enum_from_u8<GatePolicy>(gate, 2, "gate policy"));
    }
    CUSTOS_TRYV(b.finish());
  }
  CUSTOS_TRYV(r.finish());
  return p;
}

Result<> check_identity(ExecutionIdentity const& id) {
  auto d = validate_identity(id);
  if (!d.empty()) return Error::from_diagnostics(std::move(d));
  return ok();
}

Result<> check_plan(ExecutionPlan const& p) {
  auto d = validate_plan(p);
  if (!d.empty()) return Error::from_diagnostics(std::move(d));
  return ok();
}

}  // namespace

void write_identity(CanonicalWriter& w, Tag tag, ExecutionIdentity const& id) {
  w.begin_record(tag, kind::identity);
  write_identity_fields(w, id);
  w.end_record();
}

void write_plan(CanonicalWriter& w, Tag tag, ExecutionPlan const& plan) {
  w.begin_record(tag, kind::plan);
  write_plan_fields(w, plan);
  w.end_record();
}

Result<ExecutionIdentity> read_identity(CanonicalReader& r, Tag tag) {
  auto rec = CUSTOS_TRY(r.record(tag, kind::identity));
  return read_identity_fields(rec);
}

Result<ExecutionPlan> read_plan(CanonicalReader& r, Tag tag) {
  auto rec = CUSTOS_TRY(r.record(tag, kind::plan));
  return read_plan_fields(rec);
}

Result<std::vector<std::uint8_t>> encode_identity(ExecutionIdentity const& id) {
  CUSTOS_TRYV(check_identity(id));
  CanonicalWriter w{kind::identity};
  write_identity_fields(w, id);
  return std::move(w).finish();
}

Result<std::vector<std::uint8_t>> encode_plan(ExecutionPlan const& plan) {
  CUSTOS_TRYV(check_plan(plan));
  CanonicalWriter w{kind::plan};
  write_plan_fields(w, plan);
  return std::move(w).finish();
}

Result<std::vector<std::uint8_t>> encode_execution(ExecutionIdentity const& id,
                                                   ExecutionPlan const& plan) {
  auto diags = validate_identity(id, "/identity");
  auto plan_diags = validate_plan(plan, "/plan");
  diags.insert(diags.end(), plan_diags.begin(), plan_diags.end());
  if (!diags.empty()) return Error::from_diagnostics(std::move(diags));
  CanonicalWriter w{kind::execution};
  write_identity(w, 1, id);
  write_plan(w, 2, plan);
  return std::move(w).finish();
}

Result<ExecutionIdentity> decode_identity(std::span<std::uint8_t const> doc) {
  auto r = CUSTOS_TRY(CanonicalReader::open(doc, kind::identity));
  auto id = CUSTOS_TRY(read_identity_fields(r));
  if (auto d = validate_identity(id); !d.empty()) return invalid_decoded(std::move(d));
  return id;
}

Result<ExecutionPlan> decode_plan(std::span<std::uint8_t const> doc) {
  auto r = CUSTOS_TRY(CanonicalReader::open(doc, kind::plan));
  auto plan = CUSTOS_TRY(read_plan_fields(r));
  if (auto d = validate_plan(plan); !d.empty()) return invalid_decoded(std::move(d));
  return plan;
}

Result<ExecutionRequest> decode_execution(std::span<std::uint8_t const> doc) {
  auto r = CUSTOS_TRY(CanonicalReader::open(doc, kind::execution));
  ExecutionRequest req;
  req.identity = CUSTOS_TRY(read_identity(r, 1));
  req.plan = CUSTOS_TRY(read_plan(r, 2));
  CUSTOS_TRYV(r.finish());
  auto diags = validate_identity(req.identity, "/identity");
  auto plan_diags = validate_plan(req.plan, "/plan");
  diags.insert(diags.end(), plan_diags.begin(), plan_diags.end());
  if (!diags.empty()) return invalid_decoded(std::move(diags));
  return req;
}

Result<Digest> plan_digest(ExecutionIdentity const& id, ExecutionPlan const& plan) {
  auto bytes = CUSTOS_TRY(encode_execution(id, plan));
  return sha256(bytes);
}

}  // namespace custos::core
