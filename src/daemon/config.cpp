// Embedded defaults and validation of the daemon configuration.
#include "custos/daemon/config.hpp"

#include <cstdlib>

#include "custos/core/wire_names.hpp"

namespace custos::daemon {

namespace fs = std::filesystem;

fs::path local_state_home(fs::path const& cwd) {
  // XDG's state home, else ~/.local/state; without a home, a directory beside (not below) the
  // working directory.
  if (char const* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return fs::path{xdg};
  }
  if (char const* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return fs::path{home} / ".local" / "state";
  }
  return cwd.parent_path() / ".custos-state";
}

Result<DaemonConfig> resolve(DaemonConfig c, std::uint32_t euid, fs::path const& cwd) {
  bool const state_given = !c.state_dir.empty();
  bool const local = euid != 0 && !state_given;
  if (!state_given) {
    // Root without a state dir is the packaged service; everyone else gets a directory of their
    // own so that a first run needs neither root nor configuration. Never below the working
    // directory: that is the workspace `custos run` uses by default, and a workspace holding
    // the state directory is refused (the registry lives outside every agent-visible one).
    c.state_dir = euid == 0 ? fs::path{"/var/lib/custos"} : local_state_home(cwd) / "custos";
  }
  if (c.state_dir.is_relative()) c.state_dir = cwd / c.state_dir;
  if (c.socket_path.empty()) {
    // The local default's socket is where clients started in the same directory look first.
    c.socket_path = local                         ? cwd / ".custos" / "custos.sock"
                    : (euid == 0 && !state_given) ? fs::path{"/run/custos/custos.sock"}
                                                  : c.state_dir / "custos.sock";
  }
  if (c.socket_path.is_relative()) c.socket_path = cwd / c.socket_path;
  if (c.log_file.is_relative() && !c.log_file.empty()) c.log_file = cwd / c.log_file;
  c.state_dir = c.state_dir.lexically_normal();
  c.socket_path = c.socket_path.lexically_normal();

  if (!c.cgroup_subtree.empty() && c.cgroup_subtree.is_relative()) {
    return Error{Errc::daemon_config_invalid, "cgroup-subtree must be an absolute path"};
  }
  // sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
  if (c.socket_path.native().size() >= 108) {
    return Error{Errc::daemon_config_invalid,
                 "socket path longer than 107 bytes: " + c.socket_path.native()};
  }
  if ((c.socket_mode & ~0777U) != 0) {
    return Error{Errc::daemon_config_invalid, "socket-mode must be a permission mode (e.g. 0660)"};
  }
  if (c.log_target == LogTarget::file && c.log_file.empty()) {
    return Error{Errc::daemon_config_invalid, "log-target file needs log-file"};
  }
  if (c.max_line_bytes < 1024 || c.max_connections == 0 || c.max_subscriptions == 0 ||
      c.event_queue_bytes == 0 || c.write_queue_bytes < c.max_line_bytes ||
      c.max_batch_entries == 0 || c.idle_timeout.count() < 0) {
    return Error{Errc::daemon_config_invalid,
                 "limits: max-line-bytes >= 1024, write-queue-bytes >= max-line-bytes, others > 0"};
  }
  return c;
}

namespace {

// The configuration's names (flags and host.info), one table per setting.
constexpr auto kLogTargetNames = core::wire_names<LogTarget>({
    {LogTarget::automatic, "auto"},
    {LogTarget::journal, "journal"},
    {LogTarget::console, "console"},
    {LogTarget::file, "file"},
});
static_assert(kLogTargetNames.complete());

constexpr auto kShutdownNames = core::wire_names<ShutdownMode>({
    {ShutdownMode::cancel, "cancel"},
    {ShutdownMode::detach, "detach"},
});
static_assert(kShutdownNames.complete());

constexpr auto kBoundaryNames = core::wire_names<BoundaryMode>({
    {BoundaryMode::automatic, "auto"},
    {BoundaryMode::cgroup, "cgroup"},
    {BoundaryMode::marker, "marker"},
});
static_assert(kBoundaryNames.complete());

}  // namespace

std::optional<LogTarget> parse_log_target(std::string_view s) noexcept {
  if (s == "stderr") return LogTarget::console;  // an accepted alias, never printed
  return kLogTargetNames.from_wire(s);
}

std::optional<ShutdownMode> parse_shutdown(std::string_view s) noexcept {
  return kShutdownNames.from_wire(s);
}

std::optional<BoundaryMode> parse_boundary(std::string_view s) noexcept {
  return kBoundaryNames.from_wire(s);
}

std::optional<supervisor::RestartPolicy> parse_restart_policy(std::string_view s) noexcept {
  // keep_running left recovered executions running and cancellable; adoption does that and
  // supervises them fully, so the old name keeps working.
  if (s == "keep_running") return supervisor::RestartPolicy::adopt;
  return supervisor::restart_policy_from_wire(s);
}

std::string_view config_name(LogTarget t) noexcept {
  return kLogTargetNames.wire(t);
}

std::string_view config_name(ShutdownMode m) noexcept {
  return kShutdownNames.wire(m);
}

std::string_view config_name(BoundaryMode b) noexcept {
  return kBoundaryNames.wire(b);
}

std::string_view config_name(supervisor::RestartPolicy p) noexcept {
  return supervisor::restart_policy_wire(p);
}

}  // namespace custos::daemon
