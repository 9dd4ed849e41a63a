// custos cancel ID: offers the user trigger; prints whether it was the first accepted one.
#include <fmt/core.h>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

void add_cancel(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("cancel", "Cancel an execution");
  auto id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>("custos cancel");
  sub->add_option("id", *id, "Execution id")->required();
  sub->add_option("--reason", *reason, "Why (recorded)");
  sub->callback([&g, id, reason] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    auto r = client->call("exec.cancel", {{"execution_id", *id}, {"reason", *reason}});
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    g.exit_code = kExitOk;
    if (g.json || !r->is_object()) {
      fmt::print("{}\n", boost::json::serialize(*r));
      return;
    }
    auto const& o = r->get_object();
    bool const accepted =
        o.contains("accepted") && o.at("accepted").is_bool() && o.at("accepted").get_bool();
    std::string trigger = o.contains("trigger") ? boost::json::serialize(o.at("trigger")) : "null";
    fmt::print("{}: {} (first trigger: {})\n", *id, accepted ? "cancel accepted" : "not accepted",
               trigger);
  });
}

}  // namespace custos::cli
