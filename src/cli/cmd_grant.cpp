// custos grant add|list|show|revoke: authority.grant / authority.list / authority.revoke.
// `add` builds the grant spec of docs/authority.md from flags (or takes it whole with --spec).
#include <fmt/core.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <vector>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

struct GrantFlags {
  std::string spec_file;
  std::string id;
  std::string principal;
  std::string role;
  std::vector<std::string> ops;
  std::vector<std::string> exes;
  std::vector<std::string> prefixes;
  std::vector<std::string> workspaces;
  std::vector<std::string> env_ids;
  std::vector<std::string> resource_ids;
  std::vector<std::string> inherit;
  bool literal_env = false;
  std::vector<std::uint32_t> run_as;
  std::vector<std::string> ceilings;
  std::optional<std::uint64_t> budget_exec;
  std::optional<std::uint64_t> budget_cpu;
  std::optional<std::uint64_t> budget_wall;
  std::optional<std::uint64_t> ttl_s;
};

json::array strings(std::vector<std::string> const& v) {
  json::array a;
  for (auto const& s : v) a.emplace_back(s);
  return a;
}

// --workspace ID=ROOT[:writable|:read_only]
Result<json::object> workspace_of(std::string const& arg) {
  auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Error{Errc::plan_invalid_workspace, "--workspace ID=ROOT[:writable|:read_only]: " + arg};
  }
  std::string root = arg.substr(eq + 1);
  std::string access = "read_only";
  for (char const* suffix : {":writable", ":read_only"}) {
    std::string const sfx{suffix};
    if (root.size() > sfx.size() && root.compare(root.size() - sfx.size(), sfx.size(), sfx) == 0) {
      access = sfx.substr(1);
      root.resize(root.size() - sfx.size());
    }
  }
  return json::object{{"workspace_id", arg.substr(0, eq)}, {"root", root}, {"max_access", access}};
}

Result<json::object> spec_of(GrantFlags const& f) {
  if (!f.spec_file.empty()) {
    std::ifstream in(f.spec_file);
    if (!in) return Error{Errc::plan_invalid_json, "cannot read " + f.spec_file};
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    boost::system::error_code ec;
    json::value v = json::parse(text, ec);
    if (ec || !v.is_object())
      return Error{Errc::plan_invalid_json, f.spec_file + ": not a JSON object"};
    return v.get_object();
  }
  json::object o;
  if (!f.id.empty()) o["id"] = f.id;
  o["principal"] = f.principal;
  if (!f.role.empty()) o["role"] = f.role;
  o["operations"] = strings(f.ops.empty() ? std::vector<std::string>{"exec.native"} : f.ops);
  json::array exes;
  for (auto const& e : f.exes) exes.emplace_back(json::object{{"path", e}, {"prefix", false}});
  for (auto const& e : f.prefixes) exes.emplace_back(json::object{{"path", e}, {"prefix", true}});
  o["executables"] = std::move(exes);
  json::array wss;
  for (auto const& w : f.workspaces) wss.emplace_back(CUSTOS_TRY(workspace_of(w)));
  o["workspaces"] = std::move(wss);
  o["environment_ids"] = strings(f.env_ids);
  o["resource_ids"] = strings(f.resource_ids);
  o["inherit_env"] = strings(f.inherit);
  o["literal_env"] = f.literal_env;
  json::array uids;
  for (auto u : f.run_as) uids.emplace_back(u);
  o["run_as_uids"] = std::move(uids);
  json::object ceil;
  for (auto const& c : f.ceilings) {
    auto eq = c.find('=');
    if (eq == std::string::npos) return Error{Errc::plan_invalid_limit, "--ceiling NAME=N: " + c};
    try {
      ceil[c.substr(0, eq)] = static_cast<std::uint64_t>(std::stoull(c.substr(eq + 1)));
    } catch (std::exception const&) {
      return Error{Errc::plan_invalid_limit, "--ceiling NAME=N: " + c};
    }
  }
  o["ceilings"] = std::move(ceil);
  json::object budget;
  if (f.budget_exec) budget["executions"] = *f.budget_exec;
  if (f.budget_cpu) budget["cpu_ms"] = *f.budget_cpu;
  if (f.budget_wall) budget["wall_ms"] = *f.budget_wall;
  o["budget"] = std::move(budget);
  if (f.ttl_s) {
    auto const now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    o["expires_ns"] =
        static_cast<std::int64_t>(now + static_cast<std::int64_t>(*f.ttl_s) * 1'000'000'000);
  }
  return o;
}

std::string limit_text(json::value const* v) {
  if (v == nullptr || v->is_null()) return "-";
  return json::serialize(*v);
}

void print_grant_row(json::object const& g) {
  std::string ops;
  if (auto const* a = g.if_contains("operations"); a != nullptr && a->is_array()) {
    for (auto const& o : a->get_array()) {
      if (!ops.empty()) ops += ',';
      if (o.is_string()) ops += o.get_string();
    }
  }
  std::string state = "active";
  if (auto const* r = g.if_contains("revoked"); r != nullptr && r->is_bool() && r->get_bool())
    state = "revoked";
  std::string spent = "-";
  if (auto const* s = g.if_contains("spent"); s != nullptr && s->is_object()) {
    auto const* b = g.if_contains("budget");
    json::value const* lim =
        b != nullptr && b->is_object() ? b->get_object().if_contains("executions") : nullptr;
    spent = limit_text(s->get_object().if_contains("executions")) + "/" + limit_text(lim);
  }
  fmt::print("{:<20} {:>4} {:<12} {:<8} {:<8} {:<9} {}\n", str_field(g, "id"),
             limit_text(g.if_contains("revision")), str_field(g, "principal"), str_field(g, "role"),
             state, spent, ops);
}

void print_header() {
  fmt::print("{:<20} {:>4} {:<12} {:<8} {:<8} {:<9} {}\n", "GRANT", "REV", "PRINCIPAL", "ROLE",
             "STATE", "EXEC", "OPERATIONS");
}

// `custos grant add`: a grant from its flags, or whole from --spec.
void add_grant_add(CLI::App& grant, Globals& g) {
  auto f = std::make_shared<GrantFlags>();
  auto* add = grant.add_subcommand("add", "Create a grant (authority.grant)");
  add->add_option("--spec", f->spec_file, "The whole grant as a JSON file (docs/authority.md)");
  add->add_option("--id", f->id, "Grant id (default: chosen by the daemon)");
  add->add_option("--principal", f->principal, "uid:N or gid:N");
  add->add_option("--role", f->role, "runner (default) or observer");
  add->add_option(
      "--op", f->ops,
      "Operation class (exec.native default; exec.reference, exec.docker, exec.podman)");
  add->add_option("--exe", f->exes, "Allowed executable, exact absolute path (repeatable)");
  add->add_option("--exe-prefix", f->prefixes,
                  "Allowed directory: every executable below it (repeatable)");
  add->add_option("--workspace", f->workspaces, "ID=ROOT[:writable|:read_only] (repeatable)");
  add->add_option("--environment-id", f->env_ids, "Allowed environment id (repeatable)");
  add->add_option("--resource-id", f->resource_ids, "Allowed resource id (repeatable)");
  add->add_option("--inherit", f->inherit, "Env name the caller may inherit (repeatable)");
  add->add_flag("--literal-env", f->literal_env, "Allow literal NAME=VALUE entries");
  add->add_option("--run-as", f->run_as, "Another uid executions may run as (repeatable)");
  add->add_option("--ceiling", f->ceilings, "LIMIT=N ceiling, e.g. wall_ms=600000 (repeatable)");
  add->add_option("--budget-executions", f->budget_exec, "Total executions");
  add->add_option("--budget-cpu-ms", f->budget_cpu, "Total CPU milliseconds");
  add->add_option("--budget-wall-ms", f->budget_wall, "Total wall-clock milliseconds");
  add->add_option("--ttl", f->ttl_s, "Expires this many seconds from now");
  add->callback([&g, f] {
    auto spec = spec_of(*f);
    if (!spec) {
      g.exit_code = report(spec.error());
      return;
    }
    call_and_print(g, "authority.grant", std::move(*spec), [](json::object const& r) {
      fmt::print("grant {} created (authority epoch {})\n",
                 r.contains("grant") && r.at("grant").is_object()
                     ? str_field(r.at("grant").get_object(), "id")
                     : "?",
                 limit_text(r.if_contains("epoch")));
    });
  });
}

}  // namespace

void add_grant(CLI::App& app, Globals& g) {
  auto* grant = app.add_subcommand("grant", "Manage grants (admin)");
  grant->require_subcommand(1);

  add_grant_add(*grant, g);

  auto* list = grant->add_subcommand("list", "List grants (admins: all; others: their own)");
  list->callback([&g] {
    call_and_print(g, "authority.list", {}, [](json::object const& r) {
      print_header();
      if (auto const* a = r.if_contains("grants"); a != nullptr && a->is_array()) {
        for (auto const& item : a->get_array()) {
          if (item.is_object()) print_grant_row(item.get_object());
        }
      }
      fmt::print("authority epoch {}\n", limit_text(r.if_contains("epoch")));
    });
  });

  auto show_id = std::make_shared<std::string>();
  auto* show = grant->add_subcommand("show", "Show one grant in full");
  show->add_option("id", *show_id, "Grant id")->required();
  show->callback([&g, show_id] {
    call_and_print(
        g, "authority.list", {{"grant_id", *show_id}}, [&g, show_id](json::object const& r) {
          auto const* a = r.if_contains("grants");
          if (a == nullptr || !a->is_array() || a->get_array().empty()) {
            g.exit_code =
                report(Error{Errc::auth_unknown_grant, "grant " + *show_id + " does not exist"});
            return;
          }
          fmt::print("{}\n", pretty(a->get_array().front()));
        });
  });

  auto revoke_id = std::make_shared<std::string>();
  auto* revoke = grant->add_subcommand("revoke", "Revoke a grant; fences the executions using it");
  revoke->add_option("id", *revoke_id, "Grant id")->required();
  revoke->callback([&g, revoke_id] {
    call_and_print(
        g, "authority.revoke", {{"grant_id", *revoke_id}}, [revoke_id](json::object const& r) {
          std::size_t n = 0;
          if (auto const* a = r.if_contains("fenced"); a != nullptr && a->is_array())
            n = a->get_array().size();
          fmt::print("grant {} revoked; {} running execution(s) fenced (authority epoch {})\n",
                     *revoke_id, n, limit_text(r.if_contains("epoch")));
        });
  });
}

}  // namespace custos::cli
