// custos daemon: flags and config file keys (docs/configuration.md) → daemon::run.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <unistd.h>

#include "custos/daemon/daemon.hpp"

#include "commands.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace {

struct DaemonFlags {
  daemon::DaemonConfig config;
  std::string state_dir, socket, cgroup_subtree, log_file;
  std::string socket_mode = "0660";
  std::string boundary = "auto";
  std::string shutdown = "cancel";
  std::string restart_policy = "adopt";
  std::string log_target = "auto";
  std::uint64_t shutdown_timeout_ms = 10000;
  std::uint64_t idle_timeout_ms = 60000;
  std::uint64_t spool_retention_age_s = std::uint64_t{7} * 24 * 3600;
  std::uint64_t spool_sweep_interval_s = 600;
  bool no_socket_activation = false;
  bool no_fd_store = false;
  bool check_config = false;
  bool reexec = false;
  std::uint64_t reexec_timeout_s = 120;
};

// The flags, checked, as the daemon's configuration. Throws CLI::ValidationError.
daemon::DaemonConfig config_of(DaemonFlags const& flags) {
  daemon::DaemonConfig cfg = flags.config;
  cfg.state_dir = flags.state_dir;
  cfg.socket_path = flags.socket;
  cfg.cgroup_subtree = flags.cgroup_subtree;
  cfg.log_file = flags.log_file;
  cfg.socket_activation = !flags.no_socket_activation;
  cfg.fd_store = !flags.no_fd_store;
  cfg.shutdown_timeout = std::chrono::milliseconds{flags.shutdown_timeout_ms};
  cfg.idle_timeout = std::chrono::milliseconds{flags.idle_timeout_ms};
  cfg.spool_retention_age = std::chrono::seconds{flags.spool_retention_age_s};
  cfg.spool_sweep_interval = std::chrono::seconds{flags.spool_sweep_interval_s};
  try {
    cfg.socket_mode = static_cast<unsigned>(std::stoul(flags.socket_mode, nullptr, 8));
  } catch (std::exception const&) {
    throw CLI::ValidationError("--socket-mode", "not an octal mode: " + flags.socket_mode);
  }
  auto boundary = daemon::parse_boundary(flags.boundary);
  auto shutdown = daemon::parse_shutdown(flags.shutdown);
  auto target = daemon::parse_log_target(flags.log_target);
  if (!boundary) throw CLI::ValidationError("--boundary", "auto, cgroup or marker");
  if (!shutdown) throw CLI::ValidationError("--shutdown", "cancel or detach");
  auto restart = daemon::parse_restart_policy(flags.restart_policy);
  if (!restart) throw CLI::ValidationError("--restart-policy", "adopt or cancel");
  cfg.restart_policy = *restart;
  if (!target) throw CLI::ValidationError("--log-target", "auto, journal, console or file");
  cfg.boundary = *boundary;
  cfg.shutdown = *shutdown;
  cfg.log_target = *target;
  return cfg;
}

// What `custos daemon` does with its flags: check the configuration, ask the running daemon for
// a handover, or run the daemon. Returns the exit code.
int daemon_command(DaemonFlags const& flags) {
  auto const cfg = config_of(flags);
  if (flags.check_config) return daemon::check(cfg) == 0 ? kExitOk : kExitDaemonFailed;
  if (flags.reexec) {
    // The socket this configuration's daemon serves, resolved as the daemon resolves it.
    auto resolved = daemon::resolve(cfg, ::geteuid(), std::filesystem::current_path());
    if (!resolved) {
      (void)std::fprintf(stderr, "custos daemon --reexec: %s\n",
                         resolved.error().message().c_str());
      return kExitUsage;
    }
    return reexec_daemon(resolved->socket_path.native(),
                         std::chrono::seconds{flags.reexec_timeout_s});
  }
  return daemon::run(cfg) == 0 ? kExitOk : kExitDaemonFailed;
}

}  // namespace

// One registration per daemon option, in the order of docs/configuration.md.
// NOLINTNEXTLINE(readability-function-size): a flat list of option registrations
void add_daemon(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<DaemonFlags>();
  auto& c = flags->config;
  auto* sub = app.add_subcommand("daemon",
                                 "Run the supervisor daemon (keys of --config go under [daemon])");
  sub->add_option("--state-dir", flags->state_dir,
                  "State directory (registry, spools, lock); default $XDG_STATE_HOME/custos (else "
                  "~/.local/state/custos), or /var/lib/custos as root");
  sub->add_option("--socket", flags->socket,
                  "Socket path; default <state-dir>/custos.sock when --state-dir is given, else "
                  "./.custos/custos.sock, or /run/custos/custos.sock as root");
  sub->add_option("--socket-mode", flags->socket_mode, "Socket permission mode (octal)")
      ->capture_default_str();
  sub->add_option("--admin-group", c.admin_group, "Group whose members may call every method");
  sub->add_option(
      "--cgroup-subtree", flags->cgroup_subtree,
      "cgroup v2 directory for per-execution cgroups; default <v2 mount>/<own cgroup>/custos");
  sub->add_option("--boundary", flags->boundary,
                  "auto: cgroup when the subtree is writable, else marker; cgroup: refuse to "
                  "start without one; marker: never use cgroups")
      ->check(one_of({"auto", "cgroup", "marker"}))
      ->capture_default_str();
  sub->add_option("--docker-socket", c.docker_socket,
                  "Docker Engine API socket for plans that name none")
      ->capture_default_str();
  sub->add_option("--podman-socket", c.podman_socket,
                  "Podman API socket (Docker-compatible) for plans that name none")
      ->capture_default_str();
  sub->add_option("--shutdown", flags->shutdown,
                  "On SIGTERM/SIGINT: cancel every live execution, or detach (leave them for "
                  "recovery by the next start)")
      ->check(one_of({"cancel", "detach"}))
      ->capture_default_str();
  sub->add_option("--restart-policy", flags->restart_policy,
                  "At start, executions a previous daemon left running that are provably its "
                  "own: adopt (supervise them on) or cancel")
      ->check(one_of({"adopt", "cancel"}, {"keep_running"}))
      ->capture_default_str();
  sub->add_option("--shutdown-timeout-ms", flags->shutdown_timeout_ms,
                  "Bound on waiting for cancelled executions at shutdown")
      ->capture_default_str();
  sub->add_option("--log-level", c.log_level, "Least severe level logged")
      ->check(one_of({"trace", "debug", "info", "warning", "error", "critical", "off"},
                     {"warn", "err"}))
      ->capture_default_str();
  sub->add_option("--log-target", flags->log_target,
                  "Where the log goes; auto: file when --log-file is set, else the journal under "
                  "systemd, else the console (stderr)")
      ->check(one_of({"auto", "journal", "console", "file"}))
      ->capture_default_str();
  sub->add_option("--log-file", flags->log_file, "Log file (reopened on SIGUSR1)");
  sub->add_flag("--no-socket-activation", flags->no_socket_activation,
                "Ignore sockets passed by systemd");
  sub->add_flag("--no-fd-store", flags->no_fd_store,
                "Under systemd, do not keep executions' output descriptors in the service's "
                "descriptor store");
  sub->add_option("--max-line-bytes", c.max_line_bytes, "Longest accepted JSON-RPC line")
      ->capture_default_str();
  sub->add_option("--max-connections", c.max_connections, "Concurrent client connections")
      ->capture_default_str();
  sub->add_option("--max-subscriptions", c.max_subscriptions, "Subscriptions per connection")
      ->capture_default_str();
  sub->add_option("--event-queue-bytes", c.event_queue_bytes,
                  "Per-connection queued bytes above which events are dropped (counted)")
      ->capture_default_str();
  sub->add_option("--write-queue-bytes", c.write_queue_bytes,
                  "Per-connection queued bytes above which the client's requests stop being read")
      ->capture_default_str();
  sub->add_option("--max-batch-entries", c.max_batch_entries,
                  "Entries per JSON-RPC batch; a larger batch gets one -32600 error")
      ->capture_default_str();
  sub->add_option("--idle-timeout-ms", flags->idle_timeout_ms,
                  "Close connections idle this long (nothing in flight, no subscription); 0: never")
      ->capture_default_str();
  sub->add_option("--metrics-listen", c.metrics_listen,
                  "Serve Prometheus metrics (GET /metrics) on unix:/path, 127.0.0.1:PORT or "
                  "[::1]:PORT; loopback only; default: none");
  sub->add_option("--spool-retention-age-s", flags->spool_retention_age_s,
                  "Remove published output older than this (seconds; 0: no age bound)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{100} * 365 * 24 * 3600));
  sub->add_option("--spool-retention-bytes", c.spool_retention_bytes,
                  "Remove the oldest published output while spools and artifacts exceed this "
                  "(0: no bound)")
      ->capture_default_str();
  sub->add_option("--spool-sweep-interval-s", flags->spool_sweep_interval_s,
                  "Run the retention sweep this often (seconds; 0: only on `custos gc`)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{365} * 24 * 3600));
  sub->add_flag("--check-config", flags->check_config,
                "Check the configuration (flags and --config) as the daemon would resolve it, "
                "then exit: 0 when accepted; nothing is started, created or locked")
      ->configurable(false);
  sub->add_flag("--reexec", flags->reexec,
                "Do not start a daemon: make the one serving this configuration's socket hand "
                "over to a new image of its binary (SIGHUP), and wait until that serves")
      ->configurable(false);
  sub->add_option("--reexec-timeout-s", flags->reexec_timeout_s,
                  "How long --reexec waits for the new image to serve")
      ->configurable(false)
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{3600}));
  sub->callback([flags, &g] { g.exit_code = daemon_command(*flags); });
}

}  // namespace custos::cli
