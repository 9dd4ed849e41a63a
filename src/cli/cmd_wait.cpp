// custos wait ID: blocks until the execution is terminal and exits like `custos run` would.
// When the daemon closes the connection first (a handover answers a pending exec.wait with
// daemon.shutting_down, then closes), the wait is made again over a new connection (connects
// retried for up to kReconnectBudget), with what is left of --timeout.
#include <fmt/core.h>

#include <chrono>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

void add_wait(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("wait", "Wait for an execution's terminal result");
  auto id = std::make_shared<std::string>();
  auto timeout = std::make_shared<double>(0.0);
  sub->add_option("id", *id, "Execution id")->required();
  sub->add_option("--timeout", *timeout, "Give up after this many seconds (exec.wait_timeout)");
  sub->footer(reconnect_help());
  sub->callback([&g, id, timeout] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    using Clock = std::chrono::steady_clock;
    auto const deadline =
        Clock::now() + std::chrono::milliseconds{static_cast<std::int64_t>(*timeout * 1000.0)};
    auto r = [&]() -> Result<boost::json::value> {
      for (;;) {
        boost::json::object params{{"execution_id", *id}};
        if (*timeout > 0) {
          auto const left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          params["timeout_ms"] =
              static_cast<std::uint64_t>(std::max<std::int64_t>(left.count(), 1));
        }
        auto w = client->call("exec.wait", std::move(params));
        if (w || !connection_lost(w.error())) return w;
        auto fresh = CUSTOS_TRY(reconnect_daemon(g));
        *client = std::move(fresh);
      }
    }();
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    fmt::print("{}\n", g.json ? boost::json::serialize(*r) : pretty(*r));
    g.exit_code = exit_code_for(*r);
  });
}

}  // namespace custos::cli
