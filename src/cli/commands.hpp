// The subcommands of the custos binary, one file each. Private to cli/.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace custos::cli {

// Options every client subcommand shares (`--socket` falls through from the root app).
struct Globals {
  std::string socket;  // --socket / $CUSTOS_SOCKET; empty: default_socket()
  bool json = false;   // --json: machine-readable output
  int exit_code = 0;   // set by the subcommand that ran
};

// Each add_* registers one subcommand whose callback stores its exit code in g.exit_code.
void add_daemon(CLI::App& app, Globals& g);
void add_run(CLI::App& app, Globals& g);
void add_ps(CLI::App& app, Globals& g);
void add_show(CLI::App& app, Globals& g);
void add_wait(CLI::App& app, Globals& g);
void add_cancel(CLI::App& app, Globals& g);
void add_logs(CLI::App& app, Globals& g);
void add_doctor(CLI::App& app, Globals& g);
void add_grant(CLI::App& app, Globals& g);       // grant add|list|show|revoke
void add_lease(CLI::App& app, Globals& g);       // lease acquire|list|release
void add_quiescence(CLI::App& app, Globals& g);  // holder.quiescence
void add_secret(CLI::App& app, Globals& g);      // secret set|list|delete
void add_gc(CLI::App& app, Globals& g);          // host.gc

// Hidden: `completion bash|zsh|fish` and `manpage custos|custos-daemon|custos.toml`, generated
// from `app` as it stands when they run (every other subcommand registered).
void add_generators(CLI::App& app, Globals& g);

// `custos daemon --reexec` (daemon_reexec.cpp): SIGHUP to the daemon serving `socket`, then
// waits up to `timeout` for a new image to serve it. Returns the exit code.
[[nodiscard]] int reexec_daemon(std::string const& socket, std::chrono::milliseconds timeout);

// A check admitting exactly `names`, plus `aliases` (accepted, never offered). CLI11 shows the
// names as the option's type, "{a,b}": that is where the completions and man pages read an
// option's choices from (shell_doc.hpp), as they do for CLI::IsMember.
[[nodiscard]] CLI::Validator one_of(std::vector<std::string> names,
                                    std::vector<std::string> aliases = {});

}  // namespace custos::cli
