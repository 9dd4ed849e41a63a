// custos show ID: one execution record (exec.get), pretty JSON (or compact with --json).
#include <fmt/core.h>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

void add_show(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("show", "Show one execution record");
  auto id = std::make_shared<std::string>();
  sub->add_option("id", *id, "Execution id")->required();
  sub->callback([&g, id] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    auto r = client->call("exec.get", {{"execution_id", *id}});
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    fmt::print("{}\n", g.json ? boost::json::serialize(*r) : pretty(*r));
    g.exit_code = kExitOk;
  });
}

}  // namespace custos::cli
