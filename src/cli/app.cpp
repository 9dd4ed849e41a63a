// The command-line front end: one CLI11 app, one subcommand per verb of docs/api.md, each in its
// own file (cmd_*.cpp). `--socket` and `--json` are accepted before or after the subcommand.
#include "custos/cli/app.hpp"

#include <CLI/CLI.hpp>

#include <string>

#include "custos/daemon/version.hpp"

#include "commands.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

struct CommandLine::State {
  Globals g;
  CLI::App app{
      "custos — owns every process it launches, from authorization to one terminal record"};
};

CommandLine::CommandLine() : s_(std::make_unique<State>()) {
  auto& app = s_->app;
  auto& g = s_->g;
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", std::string{"custos "} + std::string{daemon::kVersion});
  app.set_config("--config", "", "Configuration file (TOML; daemon keys under [daemon])");

  app.add_option("--socket", g.socket,
                 "Daemon socket (default: ./.custos/custos.sock if present, "
                 "else /run/custos/custos.sock)")
      ->envname("CUSTOS_SOCKET");
  app.add_flag("--json", g.json, "Machine-readable JSON output");

  add_daemon(app, g);
  add_run(app, g);
  add_ps(app, g);
  add_show(app, g);
  add_wait(app, g);
  add_cancel(app, g);
  add_logs(app, g);
  add_doctor(app, g);
  add_grant(app, g);
  add_lease(app, g);
  add_quiescence(app, g);
  add_secret(app, g);
  add_gc(app, g);
  add_generators(app, g);
}

CommandLine::~CommandLine() = default;

CLI::App& CommandLine::app() {
  return s_->app;
}

int CommandLine::run(int argc, char** argv) {
  auto& app = s_->app;
  try {
    app.parse(argc, argv);
  } catch (CLI::CallForHelp const& e) {
    return app.exit(e);
  } catch (CLI::CallForAllHelp const& e) {
    return app.exit(e);
  } catch (CLI::CallForVersion const& e) {
    return app.exit(e);
  } catch (CLI::RuntimeError const& e) {
    return e.get_exit_code();
  } catch (CLI::ParseError const& e) {
    (void)app.exit(e);
    return kExitUsage;
  }
  return s_->g.exit_code;
}

int run_main(int argc, char** argv) {
  return CommandLine{}.run(argc, argv);
}

}  // namespace custos::cli
