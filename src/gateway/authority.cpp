// The authority model's value helpers and its strict JSON forms (the pure cross-check is in
// cross_check.cpp).
#include "custos/gateway/authority.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "custos/core/json_fields.hpp"
#include "custos/core/json_pointer.hpp"
#include "custos/core/wire_names.hpp"
#include "custos/sandbox/canonical.hpp"
#include "custos/sandbox/compile.hpp"
#include "custos/sandbox/json.hpp"

namespace custos::gateway {

namespace json = boost::json;

// ------------------------------------------------------------------------------ enums

namespace {

constexpr auto kRoleNames = core::wire_names<Role>({
    {Role::observer, "observer"},
    {Role::runner, "runner"},
    {Role::admin, "admin"},
});
static_assert(kRoleNames.complete(1));

constexpr auto kOperationNames = core::wire_names<OperationClass>({
    {OperationClass::exec_native, "exec.native"},
    {OperationClass::exec_reference, "exec.reference"},
    {OperationClass::exec_docker, "exec.docker"},
    {OperationClass::exec_podman, "exec.podman"},
});
static_assert(kOperationNames.complete(1));

}  // namespace

std::string_view role_wire(Role r) noexcept {
  return kRoleNames.wire(r);
}

std::optional<Role> role_from_wire(std::string_view w) noexcept {
  return kRoleNames.from_wire(w);
}

std::string_view operation_wire(OperationClass c) noexcept {
  return kOperationNames.wire(c);
}

std::optional<OperationClass> operation_from_wire(std::string_view w) noexcept {
  return kOperationNames.from_wire(w);
}

OperationClass operation_of(core::BackendKind k) noexcept {
  switch (k) {
    case core::BackendKind::native:
      return OperationClass::exec_native;
    case core::BackendKind::reference:
      return OperationClass::exec_reference;
    case core::BackendKind::docker:
      return OperationClass::exec_docker;
    case core::BackendKind::podman:
      return OperationClass::exec_podman;
  }
  return OperationClass::exec_native;
}

bool ContainerRule::allows(core::Backend const& backend) const noexcept {
  return backend.kind == engine && backend.container && *backend.container == name &&
         backend.socket == socket;
}

// ------------------------------------------------------------------------------ principals

std::string Principal::to_string() const {
  return std::string{kind == PrincipalKind::uid ? "uid:" : "gid:"} + std::to_string(id);
}

Result<Principal> Principal::parse(std::string_view text) {
  Principal p;
  if (text.starts_with("uid:")) {
    p.kind = PrincipalKind::uid;
  } else if (text.starts_with("gid:")) {
    p.kind = PrincipalKind::gid;
  } else {
    return Error{Errc::plan_invalid_value, "principal must be uid:N or gid:N"};
  }
  std::string_view const num = text.substr(4);
  std::uint32_t v = 0;
  auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  // (uid_t)-1 means "unchanged" to the kernel: it never names anybody.
  if (num.empty() || ec != std::errc{} || ptr != num.data() + num.size() || v == 0xFFFFFFFFU ||
      (num.size() > 1 && num[0] == '0')) {
    return Error{Errc::plan_invalid_value, "principal must be uid:N or gid:N"};
  }
  p.id = v;
  return p;
}

bool Caller::is(Principal const& p) const noexcept {
  if (p.kind == PrincipalKind::uid) return p.id == uid;
  return p.id == gid || std::find(groups.begin(), groups.end(), p.id) != groups.end();
}

bool ExecutableRule::allows(std::string_view executable) const noexcept {
  if (!prefix) return executable == path;
  if (path == "/") return executable.starts_with('/');
  // Whole components only: "/usr/bin" + "/" must be followed by at least one character.
  return executable.size() > path.size() + 1 && executable.starts_with(path) &&
         executable[path.size()] == '/';
}

bool is_valid_grant_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

// ------------------------------------------------------------------------------ JSON

namespace {

// One object of a grant or claim, at `base`, read with core's field reader: every diagnostic is
// collected, then the caller decides once (docs/architecture.md, Conventions). A null member is
// an absent one. Readers of nested objects share their parent's FieldReader.
class Reader {
 public:
  Reader(core::FieldReader& fields, std::string base) : f_(&fields), base_(std::move(base)) {}

  [[nodiscard]] std::string at(std::string_view key) const {
    return core::pointer_append(base_, key);
  }
  [[nodiscard]] std::string at(std::string_view key, std::size_t index) const {
    return core::pointer_append(at(key), index);
  }
  void bad(Errc c, std::string pointer, std::string msg) {
    f_->add(c, std::move(pointer), std::move(msg));
  }
  void only(json::object const& o, std::initializer_list<std::string_view> keys) {
    f_->only(o, base_, keys);
  }

  std::optional<std::string> str(json::object const& o, std::string_view key, bool required) {
    auto const* v = core::FieldReader::given(o, key);
    if (v == nullptr) {
      if (required) f_->missing(base_, key);
      return std::nullopt;
    }
    std::string s;
    if (!f_->string(*v, at(key), s)) return std::nullopt;
    return s;
  }

  std::optional<std::uint64_t> u64(json::object const& o, std::string_view key) {
    auto const* v = core::FieldReader::given(o, key);
    std::uint64_t n = 0;
    if (v == nullptr ||
        !f_->unsigned_int(*v, at(key), core::kMaxPlanNumber, Errc::plan_invalid_value, n)) {
      return std::nullopt;
    }
    return n;
  }

  bool boolean(json::object const& o, std::string_view key) {
    auto const* v = core::FieldReader::given(o, key);
    bool b = false;
    return v != nullptr && f_->boolean(*v, at(key), b) && b;
  }

  json::array const* array(json::object const& o, std::string_view key) {
    auto const* v = core::FieldReader::given(o, key);
    return v == nullptr ? nullptr : f_->array(*v, at(key));
  }

  // A set of short names: sorted, duplicates dropped.
  std::vector<std::string> strings(json::object const& o, std::string_view key) {
    std::vector<std::string> out;
    auto const* a = array(o, key);
    if (a == nullptr) return out;
    for (std::size_t i = 0; i < a->size(); ++i) {
      auto const& e = (*a)[i];
      if (!e.is_string() || e.get_string().empty() || e.get_string().size() > 255) {
        bad(Errc::plan_wrong_type, at(key, i), "must be a non-empty string of at most 255 bytes");
        continue;
      }
      out.emplace_back(e.get_string());
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

 private:
  core::FieldReader* f_;
  std::string base_;
};

json::value opt_u64(std::optional<std::uint64_t> v) {
  return v ? json::value(*v) : json::value(nullptr);
}

// id, principal, role, operations.
void read_grant_subject(Reader& r, json::object const& o, Grant& g) {
  if (auto id = r.str(o, "id", false)) {
    if (!is_valid_grant_id(*id)) {
      r.bad(Errc::plan_invalid_id, r.at("id"), "grant id: 1-64 of [A-Za-z0-9_.-]");
    }
    g.id = *id;
  }
  if (auto p = r.str(o, "principal", true)) {
    if (auto pr = Principal::parse(*p)) {
      g.principal = *pr;
    } else {
      r.bad(Errc::plan_invalid_value, r.at("principal"), pr.error().context);
    }
  }
  if (auto role = r.str(o, "role", false)) {
    auto rr = role_from_wire(*role);
    // Admin is a configured role (root, daemon uid, admin group), never something a grant
    // hands out: a grant that could mint admins would make every grant an admin grant.
    if (!rr || *rr == Role::admin) {
      r.bad(Errc::plan_invalid_value, r.at("role"), "runner or observer");
    } else {
      g.role = *rr;
    }
  }
  for (auto const& s : r.strings(o, "operations")) {
    if (auto c = operation_from_wire(s)) {
      g.operations.push_back(*c);
    } else {
      r.bad(Errc::plan_invalid_value, r.at("operations"), "unknown operation class " + s);
    }
  }
}

// Each entry a path, or {path, prefix}.
void read_executables(Reader& r, core::FieldReader& f, json::object const& o, Grant& g) {
  auto const* a = r.array(o, "executables");
  if (a == nullptr) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const k = r.at("executables", i);
    ExecutableRule rule;
    auto const& e = (*a)[i];
    if (e.is_string()) {
      rule.path = std::string{e.get_string()};
    } else if (e.is_object()) {
      Reader er{f, k};
      er.only(e.get_object(), {"path", "prefix"});
      rule.path = er.str(e.get_object(), "path", true).value_or("");
      rule.prefix = er.boolean(e.get_object(), "prefix");
    } else {
      r.bad(Errc::plan_wrong_type, k, "a path or {path, prefix}");
      continue;
    }
    if (!core::is_normalized_absolute_path(rule.path) && rule.path != "/") {
      r.bad(Errc::plan_invalid_executable, k, "an absolute normalized path");
      continue;
    }
    g.executables.push_back(std::move(rule));
  }
}

// Each entry {workspace_id, root, max_access}.
void read_workspaces(Reader& r, core::FieldReader& f, json::object const& o, Grant& g) {
  auto const* a = r.array(o, "workspaces");
  if (a == nullptr) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const k = r.at("workspaces", i);
    if (!(*a)[i].is_object()) {
      r.bad(Errc::plan_wrong_type, k, "{workspace_id, root, max_access}");
      continue;
    }
    auto const& wo = (*a)[i].get_object();
    Reader wr{f, k};
    wr.only(wo, {"workspace_id", "root", "max_access"});
    WorkspaceRule w;
    w.workspace_id = wr.str(wo, "workspace_id", true).value_or("");
    w.root = wr.str(wo, "root", true).value_or("");
    auto const acc = wr.str(wo, "max_access", false).value_or("read_only");
    if (auto wa = core::workspace_access_from(acc)) {
      w.max_access = *wa;
    } else {
      wr.bad(Errc::plan_invalid_workspace, wr.at("max_access"), "read_only or writable");
    }
    if (!w.root.empty() && !core::is_normalized_absolute_path(w.root) && w.root != "/") {
      wr.bad(Errc::plan_invalid_workspace, wr.at("root"), "an absolute normalized path");
    }
    g.workspaces.push_back(std::move(w));
  }
}

// Each entry {engine: docker|podman, name, socket?}.
void read_containers(Reader& r, core::FieldReader& f, json::object const& o, Grant& g) {
  auto const* a = r.array(o, "containers");
  if (a == nullptr) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const k = r.at("containers", i);
    if (!(*a)[i].is_object()) {
      r.bad(Errc::plan_wrong_type, k, "{engine, name, socket?}");
      continue;
    }
    auto const& co = (*a)[i].get_object();
    Reader cr{f, k};
    cr.only(co, {"engine", "name", "socket"});
    ContainerRule c;
    auto const engine = cr.str(co, "engine", true).value_or("");
    auto const kind = core::backend_kind_from(engine);
    if (!kind || (*kind != core::BackendKind::docker && *kind != core::BackendKind::podman)) {
      cr.bad(Errc::plan_invalid_value, cr.at("engine"), "docker or podman");
    } else {
      c.engine = *kind;
    }
    c.name = cr.str(co, "name", true).value_or("");
    if (!c.name.empty() && !core::is_valid_container_ref(c.name)) {
      cr.bad(Errc::plan_invalid_value, cr.at("name"), "a container name or id");
    }
    c.socket = cr.str(co, "socket", false);
    if (c.socket && !core::is_normalized_absolute_path(*c.socket)) {
      cr.bad(Errc::plan_invalid_value, cr.at("socket"), "an absolute normalized path");
    }
    g.containers.push_back(std::move(c));
  }
}

void read_run_as_uids(Reader& r, json::object const& o, Grant& g) {
  auto const* a = r.array(o, "run_as_uids");
  if (a == nullptr) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    auto const& e = (*a)[i];
    if (!(e.is_uint64() || (e.is_int64() && e.get_int64() >= 0))) {
      r.bad(Errc::plan_wrong_type, r.at("run_as_uids", i), "a uid");
      continue;
    }
    std::uint64_t const u =
        e.is_uint64() ? e.get_uint64() : static_cast<std::uint64_t>(e.get_int64());
    if (u >= 0xFFFFFFFFULL) {
      r.bad(Errc::plan_invalid_user, r.at("run_as_uids", i), "a uid");
      continue;
    }
    g.run_as_uids.push_back(static_cast<std::uint32_t>(u));
  }
  std::sort(g.run_as_uids.begin(), g.run_as_uids.end());
}

// ceilings: an object of limit name -> number; budget: {executions, cpu_ms, wall_ms}.
void read_ceilings_and_budget(Reader& r, core::FieldReader& f, json::object const& o, Grant& g) {
  if (auto const* c = core::FieldReader::given(o, "ceilings")) {
    if (!c->is_object()) {
      r.bad(Errc::plan_wrong_type, r.at("ceilings"), "an object of limit -> number");
    } else {
      Reader cr{f, r.at("ceilings")};
      auto members = core::limit_members(g.ceilings);
      for (auto const& kv : c->get_object()) {
        auto const* it =
            std::find(std::begin(core::kLimitNames), std::end(core::kLimitNames), kv.key());
        if (it == std::end(core::kLimitNames)) {
          cr.bad(Errc::plan_unknown_field, cr.at(kv.key()), "unknown limit");
          continue;
        }
        auto const idx = static_cast<std::size_t>(it - std::begin(core::kLimitNames));
        *members[idx] = cr.u64(c->get_object(), kv.key());
      }
    }
  }
  if (auto const* b = core::FieldReader::given(o, "budget")) {
    if (!b->is_object()) {
      r.bad(Errc::plan_wrong_type, r.at("budget"), "{executions, cpu_ms, wall_ms}");
    } else {
      Reader br{f, r.at("budget")};
      br.only(b->get_object(), {"executions", "cpu_ms", "wall_ms"});
      g.budget.executions = br.u64(b->get_object(), "executions");
      g.budget.cpu_ms = br.u64(b->get_object(), "cpu_ms");
      g.budget.wall_ms = br.u64(b->get_object(), "wall_ms");
    }
  }
}

}  // namespace

Result<Grant> grant_from_json(json::value const& v) {
  if (!v.is_object()) return Error{Errc::plan_wrong_type, "grant must be an object"};
  json::object const& o = v.get_object();
  core::FieldReader f;
  Reader r{f, ""};
  r.only(o, {"id", "principal", "role", "operations", "executables", "workspaces", "containers",
             "environment_ids", "resource_ids", "inherit_env", "literal_env", "run_as_uids",
             "ceilings", "budget", "sandbox", "expires_ns"});
  Grant g;
  read_grant_subject(r, o, g);
  read_executables(r, f, o, g);
  read_workspaces(r, f, o, g);
  read_containers(r, f, o, g);
  g.environment_ids = r.strings(o, "environment_ids");
  g.resource_ids = r.strings(o, "resource_ids");
  g.inherit_env = r.strings(o, "inherit_env");
  for (auto const& n : g.inherit_env) {
    if (!core::is_valid_env_name(n)) r.bad(Errc::plan_invalid_env_name, r.at("inherit_env"), n);
  }
  g.literal_env = r.boolean(o, "literal_env");
  read_run_as_uids(r, o, g);
  read_ceilings_and_budget(r, f, o, g);
  // The contract: the shape and rules of a plan's sandbox requirements (sandbox/json.hpp). A
  // null member is no contract.
  if (auto const* sb = core::FieldReader::given(o, "sandbox")) {
    sandbox::read_requirements(f, *sb, r.at("sandbox"), g.sandbox.emplace());
  }
  // Nanoseconds since the epoch exceed 2^53; this one value is an exact JSON integer.
  if (auto const* e = core::FieldReader::given(o, "expires_ns")) {
    if (e->is_int64() && e->get_int64() > 0) {
      g.expires_ns = e->get_int64();
    } else if (e->is_uint64() && e->get_uint64() <= static_cast<std::uint64_t>(INT64_MAX)) {
      g.expires_ns = static_cast<std::int64_t>(e->get_uint64());
    } else {
      r.bad(Errc::plan_invalid_value, r.at("expires_ns"),
            "a positive integer (ns since the epoch)");
    }
  }
  if (!f.ok()) return std::move(f).error();
  return g;
}

json::object grant_to_json(Grant const& g, BudgetUse const& use) {
  json::array ops;
  for (auto c : g.operations) ops.emplace_back(operation_wire(c));
  json::array exes;
  for (auto const& e : g.executables)
    exes.emplace_back(json::object{{"path", e.path}, {"prefix", e.prefix}});
  json::array wss;
  for (auto const& w : g.workspaces) {
    wss.emplace_back(json::object{{"workspace_id", w.workspace_id},
                                  {"root", w.root},
                                  {"max_access", core::to_string(w.max_access)}});
  }
  json::array containers;
  for (auto const& c : g.containers) {
    json::object co{{"engine", core::to_string(c.engine)}, {"name", c.name}};
    if (c.socket) co["socket"] = *c.socket;
    containers.emplace_back(std::move(co));
  }
  auto strs = [](std::vector<std::string> const& v) {
    json::array a;
    for (auto const& s : v) a.emplace_back(s);
    return a;
  };
  json::array uids;
  for (auto u : g.run_as_uids) uids.emplace_back(u);
  json::object ceil;
  auto members = core::limit_members(g.ceilings);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (*members[i]) ceil[core::kLimitNames[i]] = **members[i];
  }
  json::object out{
      {"id", g.id},
      {"revision", g.revision},
      {"principal", g.principal.to_string()},
      {"role", role_wire(g.role)},
      {"operations", std::move(ops)},
      {"executables", std::move(exes)},
      {"workspaces", std::move(wss)},
      {"containers", std::move(containers)},
      {"environment_ids", strs(g.environment_ids)},
      {"resource_ids", strs(g.resource_ids)},
      {"inherit_env", strs(g.inherit_env)},
      {"literal_env", g.literal_env},
      {"run_as_uids", std::move(uids)},
      {"ceilings", std::move(ceil)},
      {"budget", json::object{{"executions", opt_u64(g.budget.executions)},
                              {"cpu_ms", opt_u64(g.budget.cpu_ms)},
                              {"wall_ms", opt_u64(g.budget.wall_ms)}}},
      {"spent", json::object{{"executions", use.executions},
                             {"cpu_ms_used", use.cpu_ms_used},
                             {"wall_ms_used", use.wall_ms_used},
                             {"cpu_ms_reserved", use.cpu_ms_reserved},
                             {"wall_ms_reserved", use.wall_ms_reserved}}},
      {"expires_ns", g.expires_ns ? json::value(*g.expires_ns) : json::value(nullptr)},
      {"revoked", g.revoked},
      {"created_ns", g.created_ns},
  };
  // Printed as given (the stored spec round-trips); absent when the grant has no contract.
  if (g.sandbox) out["sandbox"] = sandbox::to_json(*g.sandbox);
  return out;
}

json::object lease_to_json(Lease const& l) {
  return json::object{{"lease_id", l.id},
                      {"workspace_id", l.workspace_id},
                      {"holder_session", l.holder_session},
                      {"epoch", l.epoch},
                      {"active", l.active},
                      {"holder", l.holder.to_string()},
                      {"acquired_ns", l.acquired_ns}};
}

Result<AuthorityClaim> authority_from_json(json::value const* v) {
  AuthorityClaim c;
  if (v == nullptr || v->is_null()) return c;
  if (!v->is_object()) return Error{Errc::plan_wrong_type, "/authority: must be an object"};
  json::object const& o = v->get_object();
  core::FieldReader f;
  Reader r{f, "/authority"};
  r.only(o, {"epoch", "grant_id", "grant_revision", "lease_id", "lease_epoch", "plan_digest"});
  c.epoch = r.u64(o, "epoch").value_or(0);
  c.grant_id = r.str(o, "grant_id", false);
  c.grant_revision = r.u64(o, "grant_revision");
  c.lease_id = r.str(o, "lease_id", false);
  c.lease_epoch = r.u64(o, "lease_epoch");
  c.plan_digest = r.str(o, "plan_digest", false);
  if (!f.ok()) return std::move(f).error();
  return c;
}

}  // namespace custos::gateway
