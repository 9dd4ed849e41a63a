// custos ps: executions as a table (id, phase, age, command, boundary).
#include <fmt/core.h>

#include <chrono>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

std::string age_of(json::object const& e) {
  auto const* at = e.if_contains("started_at_ms");
  if (at == nullptr) at = e.if_contains("started_at");
  if (at == nullptr || !at->is_number()) return "-";
  auto const started = at->to_number<double>();
  auto const now = static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
  auto const s = static_cast<long long>((now - started) / 1000.0);
  if (s < 0) return "0s";
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string command_of(json::object const& e) {
  std::string out;
  if (auto const* argv = e.if_contains("argv"); argv != nullptr && argv->is_array()) {
    for (auto const& a : argv->get_array()) {
      if (!a.is_string()) continue;
      if (!out.empty()) out += ' ';
      out += a.get_string();
    }
  }
  if (out.empty()) out = str_field(e, "executable");
  if (out.size() > 60) out = out.substr(0, 57) + "...";
  return out.empty() ? "-" : out;
}

}  // namespace

void add_ps(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("ps", "List executions");
  auto phase = std::make_shared<std::string>();
  auto session = std::make_shared<std::string>();
  auto limit = std::make_shared<std::uint64_t>(100);
  sub->add_option("--phase", *phase, "Only executions in this phase");
  sub->add_option("--session", *session, "Only executions of this session id");
  sub->add_option("--limit", *limit, "At most this many")->capture_default_str();
  sub->callback([&g, phase, session, limit] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    json::object params{{"limit", *limit}};
    if (!phase->empty()) params["phase"] = *phase;
    if (!session->empty()) params["session_id"] = *session;
    auto r = client->call("exec.list", std::move(params));
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    g.exit_code = kExitOk;
    if (g.json) {
      fmt::print("{}\n", json::serialize(*r));
      return;
    }
    auto const* list = r->is_object() ? r->get_object().if_contains("executions") : nullptr;
    fmt::print("{:<24} {:<10} {:>5} {:<8} {}\n", "ID", "PHASE", "AGE", "BOUNDARY", "COMMAND");
    if (list == nullptr || !list->is_array()) return;
    for (auto const& item : list->get_array()) {
      if (!item.is_object()) continue;
      auto const& e = item.get_object();
      std::string phase_s = str_field(e, "phase");
      if (auto const* t = e.if_contains("terminal"); t != nullptr && t->is_object()) {
        auto cls = str_field(t->get_object(), "classification");
        if (!cls.empty()) phase_s = cls;
      }
      fmt::print("{:<24} {:<10} {:>5} {:<8} {}\n", str_field(e, "execution_id"), phase_s, age_of(e),
                 str_field(e, "boundary"), command_of(e));
    }
  });
}

}  // namespace custos::cli
