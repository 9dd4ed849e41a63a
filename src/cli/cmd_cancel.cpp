// custos cancel ID [--force]: offers the user trigger; prints whether it was the first accepted
// one, and with --force whether the rest of the grace was skipped (the tree killed now).
#include <fmt/core.h>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

void add_cancel(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("cancel", "Cancel an execution");
  auto id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>("custos cancel");
  auto force = std::make_shared<bool>(false);
  sub->add_option("id", *id, "Execution id")->required();
  sub->add_option("--reason", *reason, "Why (recorded)");
  sub->add_flag("--force", *force, "Skip what is left of the graceful stop: kill the tree now");
  sub->callback([&g, id, reason, force] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    boost::json::object params{{"execution_id", *id}, {"reason", *reason}};
    if (*force) params["force"] = true;
    auto r = client->call("exec.cancel", std::move(params));
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
    bool const forced =
        o.contains("forced") && o.at("forced").is_bool() && o.at("forced").get_bool();
    fmt::print("{}: {} (first trigger: {}){}\n", *id, accepted ? "cancel accepted" : "not accepted",
               trigger, forced ? ", grace skipped: killed now" : "");
  });
}

}  // namespace custos::cli
