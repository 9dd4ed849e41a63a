// The plan rules. Each validate_* appends one diagnostic per problem, with the exact code and
// the JSON pointer of the offending member, and never stops at the first problem.
#include "custos/core/plan.hpp"

#include <algorithm>
#include <array>
#include <unordered_set>

#include "custos/core/json_pointer.hpp"
#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

bool has_nul(std::string_view s) noexcept {
  return s.find('\0') != std::string_view::npos;
}

void add(std::vector<Diagnostic>& out, Errc code, std::string ptr, std::string msg) {
  out.push_back(Diagnostic{code, std::move(ptr), std::move(msg)});
}

std::string num(std::uint64_t v) {
  return std::to_string(v);
}

// Checks one plan number against [lo, hi] and reports with `code` when outside.
void check_range(std::uint64_t v, std::uint64_t lo, std::uint64_t hi, Errc code,
                 std::string const& ptr, std::vector<Diagnostic>& out) {
  if (v < lo || v > hi)
    add(out, code, ptr, "must be in " + num(lo) + ".." + num(hi) + ", is " + num(v));
}

}  // namespace

// ------------------------------------------------------------------------------ predicates

bool is_normalized_absolute_path(std::string_view p) noexcept {
  if (p.empty() || p.front() != '/') return false;
  if (p == "/") return true;
  if (p.back() == '/') return false;
  // Every component between slashes must be non-empty and neither "." nor "..".
  std::size_t start = 1;
  while (start <= p.size()) {
    std::size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    auto const comp = p.substr(start, end - start);
    if (comp.empty() || comp == "." || comp == "..") return false;
    start = end + 1;
  }
  return true;
}

bool is_valid_env_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > kMaxEnvNameBytes) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); });
}

bool is_valid_container_ref(std::string_view c) noexcept {
  if (c.empty() || c.size() > kMaxContainerBytes) return false;
  auto alnum = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
  };
  if (!alnum(c.front())) return false;
  return std::all_of(c.begin(), c.end(),
                     [&](char ch) { return alnum(ch) || ch == '_' || ch == '.' || ch == '-'; });
}

std::optional<std::string> normalize_cwd(std::string_view cwd, std::string* why) {
  if (!cwd.empty() && cwd.front() == '/') {
    if (why != nullptr) *why = "must be relative to the workspace root";
    return std::nullopt;
  }
  std::string out;
  std::size_t start = 0;
  while (start <= cwd.size()) {
    std::size_t end = cwd.find('/', start);
    if (end == std::string_view::npos) end = cwd.size();
    auto const comp = cwd.substr(start, end - start);
    if (comp == "..") {
      if (why != nullptr) *why = "must not contain a \"..\" component";
      return std::nullopt;
    }
    if (!comp.empty() && comp != ".") {
      if (!out.empty()) out.push_back('/');
      out.append(comp);
    }
    start = end + 1;
  }
  if (out.empty()) out = ".";
  return out;
}

namespace {

// The graceful signals a plan may name (escalation.signal, the reference script's ignore).
struct NamedSignal {
  std::uint32_t number;
  std::string_view name;
};
constexpr std::array<NamedSignal, 6> kGracefulSignals{{
    {1, "SIGHUP"},
    {2, "SIGINT"},
    {3, "SIGQUIT"},
    {10, "SIGUSR1"},
    {12, "SIGUSR2"},
    {15, "SIGTERM"},
}};

}  // namespace

std::optional<std::uint32_t> signal_from_name(std::string_view name) noexcept {
  for (auto const& s : kGracefulSignals) {
    if (s.name == name) return s.number;
  }
  return std::nullopt;
}

std::optional<std::string_view> signal_name(std::uint32_t number) noexcept {
  for (auto const& s : kGracefulSignals) {
    if (s.number == number) return s.name;
  }
  return std::nullopt;
}

std::vector<Limit*> limit_members(Limits& l) {
  return {&l.wall_ms,    &l.cpu_ms,     &l.memory_bytes, &l.processes,
          &l.open_files, &l.disk_bytes, &l.output_bytes, &l.stdin_bytes};
}

std::vector<Limit const*> limit_members(Limits const& l) {
  return {&l.wall_ms,    &l.cpu_ms,     &l.memory_bytes, &l.processes,
          &l.open_files, &l.disk_bytes, &l.output_bytes, &l.stdin_bytes};
}

// ------------------------------------------------------------------------------ enums

namespace {

constexpr auto kWorkspaceAccessNames = wire_names<WorkspaceAccess>({
    {WorkspaceAccess::read_only, "read_only"},
    {WorkspaceAccess::writable, "writable"},
});
static_assert(kWorkspaceAccessNames.complete(1));

constexpr auto kIoModeNames = wire_names<IoMode>({
    {IoMode::pipes, "pipes"},
    {IoMode::pty, "pty"},
});
static_assert(kIoModeNames.complete(1));

constexpr auto kOnLimitNames = wire_names<OnLimit>({
    {OnLimit::truncate, "truncate"},
    {OnLimit::cancel, "cancel"},
});
static_assert(kOnLimitNames.complete(1));

constexpr auto kBackendKindNames = wire_names<BackendKind>({
    {BackendKind::native, "native"},
    {BackendKind::reference, "reference"},
    {BackendKind::docker, "docker"},
    {BackendKind::podman, "podman"},
});
static_assert(kBackendKindNames.complete(1));

constexpr auto kGatePolicyNames = wire_names<GatePolicy>({
    {GatePolicy::required, "required"},
    {GatePolicy::optional, "optional"},
});
static_assert(kGatePolicyNames.complete(1));

}  // namespace

std::string_view to_string(WorkspaceAccess a) noexcept {
  return kWorkspaceAccessNames.wire(a);
}
std::string_view to_string(IoMode m) noexcept {
  return kIoModeNames.wire(m);
}
std::string_view to_string(OnLimit o) noexcept {
  return kOnLimitNames.wire(o);
}
std::string_view to_string(BackendKind k) noexcept {
  return kBackendKindNames.wire(k);
}

std::string_view to_string(GatePolicy g) noexcept {
  return kGatePolicyNames.wire(g);
}
std::optional<GatePolicy> gate_policy_from(std::string_view s) noexcept {
  return kGatePolicyNames.from_wire(s);
}

std::optional<WorkspaceAccess> workspace_access_from(std::string_view s) noexcept {
  return kWorkspaceAccessNames.from_wire(s);
}
std::optional<IoMode> io_mode_from(std::string_view s) noexcept {
  return kIoModeNames.from_wire(s);
}
std::optional<OnLimit> on_limit_from(std::string_view s) noexcept {
  return kOnLimitNames.from_wire(s);
}
std::optional<BackendKind> backend_kind_from(std::string_view s) noexcept {
  return kBackendKindNames.from_wire(s);
}

// ------------------------------------------------------------------------------ sections

void validate_command(Command const& c, std::string const& ptr, std::vector<Diagnostic>& out) {
  std::string const exe = pointer_append(ptr, "executable");
  if (has_nul(c.executable)) {
    add(out, Errc::plan_nul_byte, exe, "contains a NUL byte");
  } else if (c.executable.size() > kMaxPathBytes) {
    add(out, Errc::plan_too_large, exe, "longer than " + num(kMaxPathBytes) + " bytes");
  } else if (!is_normalized_absolute_path(c.executable) || c.executable == "/") {
    add(out, Errc::plan_invalid_executable, exe,
        "must be an absolute, normalized path to a file (no //, /./, /../ or trailing /)");
  }
  std::string const argv = pointer_append(ptr, "argv");
  if (c.argv.empty()) {
    add(out, Errc::plan_empty_argv, argv, "must hold at least argv[0]");
    return;
  }
  if (c.argv.size() > kMaxArgvCount) {
    add(out, Errc::plan_too_large, argv, "more than " + num(kMaxArgvCount) + " elements");
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < c.argv.size(); ++i) {
    auto const& a = c.argv[i];
    total += a.size() + 1;
    if (has_nul(a)) {
      add(out, Errc::plan_nul_byte, pointer_append(argv, i), "contains a NUL byte");
    } else if (a.size() > kMaxArgBytes) {
      add(out, Errc::plan_too_large, pointer_append(argv, i),
          "longer than " + num(kMaxArgBytes) + " bytes");
    }
  }
  if (total > kMaxArgvTotalBytes) {
    add(out, Errc::plan_too_large, argv,
        "totals " + num(total) + " bytes, more than " + num(kMaxArgvTotalBytes));
  }
}

void validate_workspace(Workspace const& w, std::string const& ptr, std::vector<Diagnostic>& out) {
  std::string const root = pointer_append(ptr, "root");
  if (has_nul(w.root)) {
    add(out, Errc::plan_nul_byte, root, "contains a NUL byte");
  } else if (w.root.size() > kMaxPathBytes) {
    add(out, Errc::plan_too_large, root, "longer than " + num(kMaxPathBytes) + " bytes");
  } else if (!is_normalized_absolute_path(w.root)) {
    add(out, Errc::plan_invalid_workspace, root,
        "must be an absolute, normalized path (no //, /./, /../ or trailing /)");
  }
  if (w.access != WorkspaceAccess::read_only && w.access != WorkspaceAccess::writable) {
    add(out, Errc::plan_invalid_workspace, pointer_append(ptr, "access"),
        "must be read_only or writable");
  }
}

void validate_cwd(std::string const& cwd, std::string const& ptr, std::vector<Diagnostic>& out) {
  if (has_nul(cwd)) {
    add(out, Errc::plan_nul_byte, ptr, "contains a NUL byte");
    return;
  }
  if (cwd.size() > kMaxPathBytes) {
    add(out, Errc::plan_too_large, ptr, "longer than " + num(kMaxPathBytes) + " bytes");
    return;
  }
  std::string why;
  auto const norm = normalize_cwd(cwd, &why);
  if (!norm) {
    add(out, Errc::plan_invalid_cwd, ptr, why);
  } else if (*norm != cwd) {
    // A struct built in code (or decoded) must already be in normal form, so that one working
    // directory has exactly one encoding.
    add(out, Errc::plan_invalid_cwd, ptr, "is not normalized (expected \"" + *norm + "\")");
  }
}

void validate_env(std::vector<EnvEntry> const& env, std::string const& ptr,
                  std::vector<Diagnostic>& out) {
  if (env.size() > kMaxEnvCount) {
    add(out, Errc::plan_too_large, ptr, "more than " + num(kMaxEnvCount) + " entries");
  }
  std::unordered_set<std::string_view> seen;
  std::size_t total = 0;
  for (std::size_t i = 0; i < env.size(); ++i) {
    auto const& e = env[i];
    std::string const at = pointer_append(ptr, i);
    std::string const name_ptr = pointer_append(at, "name");
    total += e.name.size() + 2;
    if (has_nul(e.name)) {
      add(out, Errc::plan_nul_byte, name_ptr, "contains a NUL byte");
    } else if (e.name.size() > kMaxEnvNameBytes) {
      add(out, Errc::plan_too_large, name_ptr, "longer than " + num(kMaxEnvNameBytes) + " bytes");
    } else if (!is_valid_env_name(e.name)) {
      add(out, Errc::plan_invalid_env_name, name_ptr, "must match [A-Za-z_][A-Za-z0-9_]*");
    } else if (!seen.insert(e.name).second) {
      add(out, Errc::plan_duplicate_env, name_ptr, "\"" + e.name + "\" appears more than once");
    }
    if (e.value) {
      total += e.value->size();
      std::string const value_ptr = pointer_append(at, "value");
      if (has_nul(*e.value)) {
        add(out, Errc::plan_nul_byte, value_ptr, "contains a NUL byte");
      } else if (e.value->size() > kMaxEnvValueBytes) {
        add(out, Errc::plan_too_large, value_ptr,
            "longer than " + num(kMaxEnvValueBytes) + " bytes");
      }
    }
  }
  if (total > kMaxEnvTotalBytes) {
    add(out, Errc::plan_too_large, ptr,
        "totals " + num(total) + " bytes, more than " + num(kMaxEnvTotalBytes));
  }
}

void validate_io(IoPolicy const& io, std::string const& ptr, std::vector<Diagnostic>& out) {
  if (io.mode == IoMode::pipes) {
    if (io.rows != 0 || io.cols != 0 || io.resize) {
      add(out, Errc::plan_invalid_io, ptr, "rows, cols and resize apply to mode pty only");
    }
    return;
  }
  if (io.mode != IoMode::pty) {
    add(out, Errc::plan_invalid_io, pointer_append(ptr, "mode"), "must be pipes or pty");
    return;
  }
  check_range(io.rows, 1, kMaxPtyDimension, Errc::plan_invalid_io, pointer_append(ptr, "rows"),
              out);
  check_range(io.cols, 1, kMaxPtyDimension, Errc::plan_invalid_io, pointer_append(ptr, "cols"),
              out);
}

void validate_limits(Limits const& l, std::string const& ptr, std::vector<Diagnostic>& out) {
  auto const members = limit_members(l);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (*members[i]) {
      check_range(**members[i], 1, kMaxPlanNumber, Errc::plan_invalid_limit,
                  pointer_append(ptr, kLimitNames[i]), out);
    }
  }
}

void validate_output(OutputPolicy const& o, std::string const& ptr, std::vector<Diagnostic>& out) {
  auto const code = Errc::plan_invalid_output_policy;
  check_range(o.chunk_bytes, 1, kMaxChunkBytes, code, pointer_append(ptr, "chunk_bytes"), out);
  check_range(o.retained_bytes, 0, kMaxRetainedBytes, code, pointer_append(ptr, "retained_bytes"),
              out);
  check_range(o.spool_bytes, 0, kMaxPlanNumber, code, pointer_append(ptr, "spool_bytes"), out);
  check_range(o.max_events, 1, kMaxPlanNumber, code, pointer_append(ptr, "max_events"), out);
  if (o.on_limit != OnLimit::truncate && o.on_limit != OnLimit::cancel) {
    add(out, code, pointer_append(ptr, "on_limit"), "must be truncate or cancel");
  }
}

void validate_escalation(Escalation const& e, std::string const& ptr,
                         std::vector<Diagnostic>& out) {
  auto const code = Errc::plan_invalid_escalation;
  if (!signal_name(e.signal)) {
    add(out, code, pointer_append(ptr, "signal"),
        "must be one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2");
  }
  check_range(e.grace_ms, 0, kMaxEscalationMs, code, pointer_append(ptr, "grace_ms"), out);
  check_range(e.kill_after_ms, 1, kMaxEscalationMs, code, pointer_append(ptr, "kill_after_ms"),
              out);
}

void validate_user(UserSpec const& u, std::string const& ptr, std::vector<Diagnostic>& out) {
  auto const code = Errc::plan_invalid_user;
  constexpr std::uint32_t kMaxId = 4294967294U;
  check_range(u.uid, 0, kMaxId, code, pointer_append(ptr, "uid"), out);
  check_range(u.gid, 0, kMaxId, code, pointer_append(ptr, "gid"), out);
  std::string const groups = pointer_append(ptr, "groups");
  if (u.groups.size() > kMaxGroups) {
    add(out, Errc::plan_too_large, groups, "more than " + num(kMaxGroups) + " groups");
  }
  for (std::size_t i = 0; i < u.groups.size(); ++i) {
    check_range(u.groups[i], 0, kMaxId, code, pointer_append(groups, i), out);
    if (i > 0 && u.groups[i] <= u.groups[i - 1]) {
      add(out, code, pointer_append(groups, i),
          u.groups[i] == u.groups[i - 1] ? "duplicate group" : "groups must be in ascending order");
    }
  }
}

namespace {

// The script member: required for reference, refused for every other kind.
void validate_backend_script(Backend const& b, std::string const& ptr,
                             std::vector<Diagnostic>& out) {
  std::string const script = pointer_append(ptr, "script");
  if (b.kind == BackendKind::reference) {
    if (!b.script) {
      add(out, Errc::plan_missing_field, script, "the reference backend needs a script");
    } else {
      validate_script(*b.script, script, out);
    }
  } else if (b.script) {
    add(out, Errc::plan_invalid_backend, script, "only the reference backend runs a script");
  }
}

}  // namespace

void validate_backend(Backend const& b, std::string const& ptr, std::vector<Diagnostic>& out) {
  auto const code = Errc::plan_invalid_backend;
  std::string const container = pointer_append(ptr, "container");
  std::string const socket = pointer_append(ptr, "socket");
  bool const engine = b.kind == BackendKind::docker || b.kind == BackendKind::podman;
  if (!engine && b.kind != BackendKind::native && b.kind != BackendKind::reference) {
    add(out, code, pointer_append(ptr, "kind"), "must be native, reference, docker or podman");
    return;
  }
  if (!engine) {
    if (b.container) add(out, code, container, "only docker and podman backends name a container");
    if (b.socket) add(out, code, socket, "only docker and podman backends name a socket");
    if (b.gate != GatePolicy::required) {
      add(out, code, pointer_append(ptr, "gate"), "only docker and podman backends have a gate");
    }
    validate_backend_script(b, ptr, out);
    return;
  }
  if (!b.container) {
    add(out, Errc::plan_missing_field, container, "docker and podman backends need a container");
  } else if (has_nul(*b.container)) {
    add(out, Errc::plan_nul_byte, container, "contains a NUL byte");
  } else if (b.container->size() > kMaxContainerBytes) {
    add(out, Errc::plan_too_large, container, "longer than " + num(kMaxContainerBytes) + " bytes");
  } else if (!is_valid_container_ref(*b.container)) {
    add(out, code, container, "must be a container id or name ([A-Za-z0-9][A-Za-z0-9_.-]*)");
  }
  if (b.socket) {
    if (has_nul(*b.socket)) {
      add(out, Errc::plan_nul_byte, socket, "contains a NUL byte");
    } else if (b.socket->size() > kMaxSocketPathBytes) {
      add(out, Errc::plan_too_large, socket, "longer than " + num(kMaxSocketPathBytes) + " bytes");
    } else if (!is_normalized_absolute_path(*b.socket) || *b.socket == "/") {
      add(out, code, socket, "must be an absolute, normalized socket path");
    }
  }
  validate_backend_script(b, ptr, out);
}

std::vector<Diagnostic> validate_plan(ExecutionPlan const& plan, std::string_view pointer_base) {
  std::vector<Diagnostic> out;
  validate_command(plan.command, pointer_append(pointer_base, "command"), out);
  validate_workspace(plan.workspace, pointer_append(pointer_base, "workspace"), out);
  validate_cwd(plan.cwd, pointer_append(pointer_base, "cwd"), out);
  validate_env(plan.env, pointer_append(pointer_base, "env"), out);
  validate_io(plan.io, pointer_append(pointer_base, "io"), out);
  validate_limits(plan.limits, pointer_append(pointer_base, "limits"), out);
  validate_output(plan.output, pointer_append(pointer_base, "output"), out);
  validate_escalation(plan.escalation, pointer_append(pointer_base, "escalation"), out);
  if (plan.user) validate_user(*plan.user, pointer_append(pointer_base, "user"), out);
  validate_backend(plan.backend, pointer_append(pointer_base, "backend"), out);
  return out;
}

}  // namespace custos::core
