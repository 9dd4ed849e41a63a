// custos doctor: what this host can enforce. Asks the daemon (host.info) when one answers,
// otherwise probes locally from this process, and says which it did.
#include <fmt/core.h>

#include <unistd.h>

#include "custos/engine/sync.hpp"
#include "custos/sys/probes.hpp"

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

std::string yes_no(json::value const& v) {
  if (v.is_bool()) return v.get_bool() ? "yes" : "no";
  return json::serialize(v);
}

void print_table(json::object const& caps) {
  auto const* checks = caps.if_contains("checks");
  if (checks == nullptr || !checks->is_array()) {
    fmt::print("{}\n", json::serialize(caps));
    return;
  }
  std::size_t w = 10;
  for (auto const& c : checks->get_array()) {
    if (c.is_object()) w = std::max(w, str_field(c.get_object(), "name").size());
  }
  fmt::print("{:<{}}  {:<5}  {}\n", "capability", w, "ok", "detail / what missing means");
  for (auto const& c : checks->get_array()) {
    if (!c.is_object()) continue;
    auto const& o = c.get_object();
    bool const avail = o.if_contains("available") != nullptr && o.at("available").is_bool() &&
                       o.at("available").get_bool();
    fmt::print("{:<{}}  {:<5}  {}\n", str_field(o, "name"), w, avail ? "yes" : "NO",
               str_field(o, "detail"));
    if (!avail) fmt::print("{:<{}}         missing: {}\n", "", w, str_field(o, "missing_means"));
  }
  if (auto const* cg = caps.if_contains("cgroup"); cg != nullptr && cg->is_object()) {
    auto const& c = cg->get_object();
    fmt::print("\ncgroup v2: path {}, writable {}",
               c.contains("path") ? json::serialize(c.at("path")) : "-",
               c.contains("writable") ? yes_no(c.at("writable")) : "-");
    if (auto const* ctl = c.if_contains("controllers"); ctl != nullptr) {
      fmt::print(", controllers {}", json::serialize(*ctl));
    }
    fmt::print("\n");
  }
}

// Registry findings of the daemon's start-up recovery: records it will not act on by itself.
void print_registry(json::object const& reg) {
  auto list = [&](char const* key) -> json::array const* {
    auto const* v = reg.if_contains(key);
    return v != nullptr && v->is_array() ? &v->get_array() : nullptr;
  };
  auto const* q = list("quarantined");
  auto const* o = list("orphan_claims");
  auto const* k = list("adopted");
  auto const* l = list("leftover_cgroups");
  fmt::print(
      "\nregistry: {} quarantined record(s), {} orphan claim(s), {} adopted, {} leftover "
      "cgroup(s) of terminal executions cleaned at start\n",
      q != nullptr ? q->size() : 0, o != nullptr ? o->size() : 0, k != nullptr ? k->size() : 0,
      l != nullptr ? l->size() : 0);
  if (q != nullptr) {
    for (auto const& r : *q) {
      if (!r.is_object()) continue;
      auto const& x = r.get_object();
      fmt::print("  quarantined {}  {}  {}\n", str_field(x, "execution_id"), str_field(x, "code"),
                 str_field(x, "reason"));
    }
  }
  if (o != nullptr) {
    for (auto const& r : *o) {
      if (!r.is_object()) continue;
      auto const& x = r.get_object();
      fmt::print("  orphan claim action {} process {} (execution {})\n", str_field(x, "action_id"),
                 str_field(x, "process_id"), str_field(x, "execution_id"));
    }
  }
  if (k != nullptr) {
    for (auto const& r : *k) {
      if (r.is_string())
        fmt::print("  adopted after the restart (output not kept): {}\n", r.get_string().c_str());
    }
  }
  if (l != nullptr) {
    for (auto const& r : *l) {
      if (!r.is_object()) continue;
      auto const& x = r.get_object();
      // An unconfirmed one still holds processes that would not die: they need a look.
      fmt::print("  leftover cgroup of {}: {}{}{}\n", str_field(x, "execution_id"),
                 str_field(x, "cleanup") == "confirmed" ? "removed" : "NOT removed",
                 str_field(x, "detail").empty() ? "" : ", ", str_field(x, "detail"));
    }
  }
}

// The backends the daemon serves and, per control, how well this host enforces it.
void print_backends(json::array const& backends) {
  for (auto const& b : backends) {
    if (!b.is_object()) continue;
    auto const& o = b.get_object();
    fmt::print(
        "\nbackend {}{}\n", str_field(o, "kind"),
        o.contains("available") && o.at("available").is_bool() && !o.at("available").get_bool()
            ? "  (unavailable: " + str_field(o, "unavailable_reason") + ")"
            : std::string{});
    auto const* controls = o.if_contains("controls");
    if (controls == nullptr || !controls->is_array()) continue;
    for (auto const& c : controls->get_array()) {
      if (!c.is_object()) continue;
      auto const& co = c.get_object();
      fmt::print("  {:<24} {:<8} {}\n", str_field(co, "name"), str_field(co, "fidelity"),
                 str_field(co, "how"));
    }
  }
}

// Asks each engine host.info names, live: reachable, its version and the API version custos
// speaks to it. Adds those fields to each entry (for --json too).
void probe_engines(json::array& engines) {
  for (auto& e : engines) {
    if (!e.is_object()) continue;
    auto& o = e.get_object();
    auto const kind = str_field(o, "engine") == "podman" ? engine::EngineKind::podman
                                                         : engine::EngineKind::docker;
    engine::SyncClient client(engine::Endpoint{kind, str_field(o, "socket")});
    auto v = client.version(std::chrono::milliseconds{3000});
    o["reachable"] = v.has_value();
    if (v) {
      o["version"] = v->version;
      o["api_version"] = v->negotiated.str();
    } else {
      o["error"] = v.error().message();
    }
  }
}

void print_engines(json::array const& engines) {
  for (auto const& e : engines) {
    if (!e.is_object()) continue;
    auto const& o = e.get_object();
    bool const up =
        o.contains("reachable") && o.at("reachable").is_bool() && o.at("reachable").get_bool();
    fmt::print("\nengine {}  socket {}  {}\n", str_field(o, "engine"), str_field(o, "socket"),
               up ? "reachable, version " + str_field(o, "version") + " (API " +
                        str_field(o, "api_version") + ")"
                  : "NOT reachable: " + str_field(o, "error"));
    fmt::print("  an exec's boundary: {}\n", str_field(o, "boundary"));
  }
}

}  // namespace

void add_doctor(CLI::App& app, Globals& g) {
  auto* sub =
      app.add_subcommand("doctor", "Show host capabilities and what each missing one means");
  sub->callback([&g] {
    json::object info;
    std::string source;
    auto client = connect_daemon(g);
    if (client) {
      auto r = client->call("host.info", {});
      if (!r) {
        g.exit_code = report(r.error());
        return;
      }
      if (r->is_object()) info = r->get_object();
      source = "the daemon (host.info)";
    } else {
      auto caps = sys::probe_host();
      if (!caps) {
        g.exit_code = report(caps.error());
        return;
      }
      info["capabilities"] = sys::to_json(*caps);
      source = "a local probe as uid " + std::to_string(::geteuid()) +
               " (no daemon answered: " + client.error().context + ")";
    }
    if (auto* e = info.if_contains("engines"); e != nullptr && e->is_array())
      probe_engines(e->get_array());
    if (g.json) {
      info["source"] = source;
      fmt::print("{}\n", json::serialize(info));
      g.exit_code = kExitOk;
      return;
    }
    fmt::print("source: {}\n", source);
    if (info.contains("version")) {
      fmt::print("daemon {}  boot {}  default boundary {}\n\n", str_field(info, "version"),
                 str_field(info, "boot_id"), str_field(info, "default_boundary"));
    } else {
      fmt::print("\n");
    }
    auto const* caps = info.if_contains("capabilities");
    if (caps != nullptr && caps->is_object()) print_table(caps->get_object());
    if (auto const* reg = info.if_contains("registry"); reg != nullptr && reg->is_object())
      print_registry(reg->get_object());
    if (auto const* b = info.if_contains("backends"); b != nullptr && b->is_array())
      print_backends(b->get_array());
    if (auto const* e = info.if_contains("engines"); e != nullptr && e->is_array())
      print_engines(e->get_array());
    g.exit_code = kExitOk;
  });
}

}  // namespace custos::cli
