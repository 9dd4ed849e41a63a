// The daemon's configuration: every key of docs/configuration.md, with the embedded defaults
// that let `custos daemon` run with no configuration at all.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "custos/core/result.hpp"
#include "custos/supervisor/recovery.hpp"

namespace custos::daemon {

enum class LogTarget : std::uint8_t { automatic, journal, console, file };
enum class ShutdownMode : std::uint8_t { cancel, detach };
enum class BoundaryMode : std::uint8_t { automatic, cgroup, marker };

struct DaemonConfig {
  // Empty paths mean "choose the embedded default" (resolve()).
  std::filesystem::path state_dir;
  std::filesystem::path socket_path;
  unsigned socket_mode = 0660;
  // Group (name or number) whose members may call every method; empty: none.
  std::string admin_group;
  // Absolute cgroup v2 directory for per-execution cgroups; empty: <v2 mount>/<own cgroup>/custos.
  std::filesystem::path cgroup_subtree;
  BoundaryMode boundary = BoundaryMode::automatic;
  // The engine sockets docker / podman plans use when they name none.
  std::string docker_socket = "/var/run/docker.sock";
  std::string podman_socket = "/run/podman/podman.sock";
  ShutdownMode shutdown = ShutdownMode::cancel;
  // What start-up recovery does with executions a previous daemon left running and that are
  // provably still ours (pidfs identity): adopt them (supervised on, cancellable, deadline-bound,
  // one terminal record; their output is not kept), or adopt and cancel them at once (trigger
  // supervisor_shutdown, through the same teardown).
  supervisor::RestartPolicy restart_policy = supervisor::RestartPolicy::adopt;
  std::chrono::milliseconds shutdown_timeout{10000};
  std::string log_level = "info";
  LogTarget log_target = LogTarget::automatic;
  std::filesystem::path log_file;
  bool socket_activation = true;  // use sd_listen_fds() when systemd passes a socket
  // Under systemd: keep each execution's output descriptors in the service's descriptor store,
  // and re-attach them after a crash or restart (docs/operations.md, "Descriptor store").
  bool fd_store = true;
  // rpc limits
  std::size_t max_line_bytes = std::size_t{1} << 20;
  std::size_t max_connections = 256;
  std::size_t max_subscriptions = 64;
  std::size_t event_queue_bytes = std::size_t{1} << 20;
  std::size_t write_queue_bytes = std::size_t{8} << 20;
  std::size_t max_batch_entries = 128;  // entries per JSON-RPC batch; more → one -32600
  // Connections with nothing in flight, no subscription and no request for this long are
  // closed; zero disables it.
  std::chrono::milliseconds idle_timeout{60000};
  // Where the Prometheus metrics endpoint listens: "unix:/path", "127.0.0.1:PORT" or
  // "[::1]:PORT" (loopback only; PORT 0 picks a free one). Empty: no endpoint (docs/metrics.md).
  std::string metrics_listen;
  // Retained output (docs/durability.md, "Retention"): artifacts older than the age, then the
  // oldest while spools and artifacts exceed the bytes, are removed by the sweep that runs
  // every interval and on host.gc. Zero: no bound (age, bytes) or no periodic sweep (interval).
  std::chrono::seconds spool_retention_age{std::chrono::hours{24 * 7}};
  std::uint64_t spool_retention_bytes = std::uint64_t{4} << 30;
  std::chrono::seconds spool_sweep_interval{600};
};

// Fills the defaults: as root without --state-dir, /var/lib/custos and /run/custos/custos.sock;
// otherwise (not root, or a state dir given) the state dir defaults to <cwd>/.custos and the
// socket to <state dir>/custos.sock. Relative paths are made absolute against `cwd`.
// Errors: daemon.config_invalid (a relative cgroup subtree, a zero limit, ...).
// Where a non-root daemon keeps its state without --state-dir: $XDG_STATE_HOME, else
// $HOME/.local/state, else beside the working directory (never below it).
[[nodiscard]] std::filesystem::path local_state_home(std::filesystem::path const& cwd);

[[nodiscard]] Result<DaemonConfig> resolve(DaemonConfig config, std::uint32_t euid,
                                           std::filesystem::path const& cwd);

// The settings' names, as the flags take them and host.info reports them: "auto", "journal",
// "console" (or its alias "stderr"), "file"; "cancel", "detach"; "auto", "cgroup", "marker";
// "adopt", "cancel" (the config key restart-policy). config_name is the inverse.
[[nodiscard]] std::optional<LogTarget> parse_log_target(std::string_view s) noexcept;
[[nodiscard]] std::optional<ShutdownMode> parse_shutdown(std::string_view s) noexcept;
[[nodiscard]] std::optional<BoundaryMode> parse_boundary(std::string_view s) noexcept;
// "adopt" or "cancel" (the config key restart-policy); "keep_running", the name of a policy
// adoption replaced, is read as "adopt".
[[nodiscard]] std::optional<supervisor::RestartPolicy> parse_restart_policy(
    std::string_view s) noexcept;
[[nodiscard]] std::string_view config_name(LogTarget t) noexcept;
[[nodiscard]] std::string_view config_name(ShutdownMode m) noexcept;
[[nodiscard]] std::string_view config_name(BoundaryMode b) noexcept;
[[nodiscard]] std::string_view config_name(supervisor::RestartPolicy p) noexcept;

}  // namespace custos::daemon
