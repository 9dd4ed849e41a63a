// custos quiescence SESSION --generation N [--actor uid:N]: holder.quiescence.
// Exit 0 when quiescent (evidence printed), 65 when blocked (the blocking executions listed).
#include <fmt/core.h>

#include <memory>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

void add_quiescence(CLI::App& app, Globals& g) {
  auto* sub =
      app.add_subcommand("quiescence", "Ask whether a holder has no live or unresolved execution");
  auto session = std::make_shared<std::string>();
  auto generation = std::make_shared<std::uint64_t>(0);
  auto actor = std::make_shared<std::string>();
  sub->add_option("session_id", *session, "Holder session id")->required();
  sub->add_option("--generation", *generation, "The holder's fenced generation")->required();
  sub->add_option("--actor", *actor,
                  "Only this actor's executions (uid:N); non-admins must give their own");
  sub->callback([&g, session, generation, actor] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    json::object params{{"session_id", *session}, {"generation", *generation}};
    if (!actor->empty()) params["actor"] = *actor;
    auto r = client->call("holder.quiescence", std::move(params));
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    bool const quiescent = r->is_object() && r->get_object().contains("quiescent") &&
                           r->get_object().at("quiescent").is_bool() &&
                           r->get_object().at("quiescent").get_bool();
    g.exit_code = quiescent ? kExitOk : kExitRefused;
    if (g.json || !r->is_object()) {
      fmt::print("{}\n", json::serialize(*r));
      return;
    }
    auto const& o = r->get_object();
    if (quiescent) {
      fmt::print("quiescent\n{}\n",
                 pretty(o.contains("evidence") ? o.at("evidence") : json::value{}));
      return;
    }
    fmt::print("not quiescent; blocking:\n{:<24} {}\n", "EXECUTION", "REASON");
    if (auto const* b = o.if_contains("blocking"); b != nullptr && b->is_array()) {
      for (auto const& item : b->get_array()) {
        if (!item.is_object()) continue;
        fmt::print("{:<24} {}\n", str_field(item.get_object(), "execution_id"),
                   str_field(item.get_object(), "reason"));
      }
    }
  });
}

}  // namespace custos::cli
