// custos lease acquire|list|release: the workspace mutation leases (lease.* methods).
#include <fmt/core.h>

#include <memory>
#include <unistd.h>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

std::string num(json::object const& o, std::string_view key) {
  auto const* v = o.if_contains(key);
  return v == nullptr || v->is_null() ? "-" : json::serialize(*v);
}

json::object const& lease_of(json::object const& r) {
  static json::object const empty;
  auto const* l = r.if_contains("lease");
  return l != nullptr && l->is_object() ? l->get_object() : empty;
}

}  // namespace

void add_lease(CLI::App& app, Globals& g) {
  auto* lease = app.add_subcommand("lease", "Workspace mutation leases");
  lease->require_subcommand(1);

  auto ws = std::make_shared<std::string>();
  auto session = std::make_shared<std::string>();
  auto* acquire = lease->add_subcommand("acquire", "Acquire the writable lease of a workspace");
  acquire->add_option("workspace_id", *ws, "Workspace id")->required();
  acquire->add_option("--session", *session,
                      "Holder session id (default: cli-<uid>, as custos run)");
  acquire->callback([&g, ws, session] {
    std::string const s = session->empty() ? "cli-" + std::to_string(::getuid()) : *session;
    call_and_print(
        g, "lease.acquire", {{"workspace_id", *ws}, {"holder_session", s}},
        [](json::object const& r) {
          auto const& l = lease_of(r);
          fmt::print(
              "lease {} on workspace {} for session {} at lease epoch {} (authority epoch {})\n",
              str_field(l, "lease_id"), str_field(l, "workspace_id"),
              str_field(l, "holder_session"), num(l, "epoch"), num(r, "authority_epoch"));
        });
  });

  auto all = std::make_shared<bool>(false);
  auto* list = lease->add_subcommand("list", "List leases (active ones unless --all)");
  list->add_flag("--all", *all, "Include released and broken leases");
  list->callback([&g, all] {
    call_and_print(g, "lease.list", {{"active_only", !*all}}, [](json::object const& r) {
      fmt::print("{:<20} {:<16} {:<20} {:>5} {:<8} {}\n", "LEASE", "WORKSPACE", "SESSION", "EPOCH",
                 "STATE", "HOLDER");
      if (auto const* a = r.if_contains("leases"); a != nullptr && a->is_array()) {
        for (auto const& item : a->get_array()) {
          if (!item.is_object()) continue;
          auto const& l = item.get_object();
          bool const active =
              l.contains("active") && l.at("active").is_bool() && l.at("active").get_bool();
          fmt::print("{:<20} {:<16} {:<20} {:>5} {:<8} {}\n", str_field(l, "lease_id"),
                     str_field(l, "workspace_id"), str_field(l, "holder_session"), num(l, "epoch"),
                     active ? "active" : "ended", str_field(l, "holder"));
        }
      }
    });
  });

  auto id = std::make_shared<std::string>();
  auto brk = std::make_shared<bool>(false);
  auto* release =
      lease->add_subcommand("release", "Release a lease (its holder) or --break it (admin)");
  release->add_option("lease_id", *id, "Lease id")->required();
  release->add_flag("--break", *brk, "Break another holder's lease (admin)");
  release->callback([&g, id, brk] {
    call_and_print(g, "lease.release", {{"lease_id", *id}, {"break", *brk}},
                   [id, brk](json::object const& r) {
                     std::size_t n = 0;
                     if (auto const* a = r.if_contains("fenced"); a != nullptr && a->is_array())
                       n = a->get_array().size();
                     fmt::print("lease {} {}; {} running execution(s) fenced\n", *id,
                                *brk ? "broken" : "released", n);
                   });
  });
}

}  // namespace custos::cli
