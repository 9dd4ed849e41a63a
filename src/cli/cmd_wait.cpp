// custos wait ID: blocks until the execution is terminal and exits like `custos run` would.
#include <fmt/core.h>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

void add_wait(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("wait", "Wait for an execution's terminal result");
  auto id = std::make_shared<std::string>();
  auto timeout = std::make_shared<double>(0.0);
  sub->add_option("id", *id, "Execution id")->required();
  sub->add_option("--timeout", *timeout, "Give up after this many seconds (exec.wait_timeout)");
  sub->callback([&g, id, timeout] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    boost::json::object params{{"execution_id", *id}};
    if (*timeout > 0) params["timeout_ms"] = static_cast<std::uint64_t>(*timeout * 1000.0);
    auto r = client->call("exec.wait", std::move(params));
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    fmt::print("{}\n", g.json ? boost::json::serialize(*r) : pretty(*r));
    g.exit_code = exit_code_for(*r);
  });
}

}  // namespace custos::cli
