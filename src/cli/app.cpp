// The command-line front end: one CLI11 app, one subcommand per verb of API.md.
#include "custos/cli/app.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <string>

namespace custos::cli {
namespace {

// Exit code for a subcommand that a later issue implements (docs/cli.md).
constexpr int kExitUnavailable = 69;  // EX_UNAVAILABLE

void pending(CLI::App& app, std::string const& name, std::string const& help, int issue) {
  auto* sub = app.add_subcommand(name, help + " (lands with issue " + std::to_string(issue) + ")");
  sub->allow_extras();
  sub->callback([name, issue] {
    fmt::print(stderr, "custos {}: not available in this build yet (issue {})\n", name, issue);
    throw CLI::RuntimeError(kExitUnavailable);
  });
}

}  // namespace

int run_main(int argc, char** argv) {
  CLI::App app{"custos — owns every process it launches, from authorization to one terminal record"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string{"custos "} + "0.1.0");

  pending(app, "daemon", "Run the supervisor daemon", 5);
  pending(app, "run", "Run one command as an owned execution and stream its output", 5);
  pending(app, "ps", "List executions", 5);
  pending(app, "show", "Show one execution record", 5);
  pending(app, "wait", "Wait for an execution's terminal result", 5);
  pending(app, "cancel", "Cancel an execution", 5);
  pending(app, "logs", "Print an execution's output", 5);
  pending(app, "doctor", "Show host capabilities and what each missing one means", 5);
  pending(app, "grant", "Manage grants (admin)", 6);
  pending(app, "lease", "Manage workspace mutation leases", 6);
  pending(app, "quiescence", "Ask whether a holder has no live or unresolved execution", 6);

  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    return app.exit(e);
  }
  return 0;
}

}  // namespace custos::cli
