// `custos run`'s flags and the exec.start params they make: the plan (command resolved like a
// shell would, workspace and cwd, environment, io, backend, sandbox, limits), the identity and
// the authority (docs/cli.md, "custos run"). Private to cli/.
#pragma once

#include <boost/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <sys/ioctl.h>
#include <vector>

#include "custos/core/result.hpp"

#include "run_sandbox.hpp"

namespace custos::cli {

struct RunFlags {
  std::vector<std::string> command;
  std::string cwd;
  std::string workspace;
  std::vector<std::string> env;
  double timeout_s = 0;
  std::optional<double> grace_s;  // --grace: escalation.grace_ms (the plan's default otherwise)
  bool pty = false;
  bool progress = false;  // --progress: a live status line on a terminal
  bool clean_env = false;
  bool read_only = false;
  // Authority and identity (docs/authority.md). Defaults suit one user on one machine: no grant
  // (the admin's implicit authority), no lease, session cli-<uid>, ids "cli".
  std::string grant;
  std::string lease;
  std::string session;
  std::string project_id = "cli";
  std::string workspace_id = "cli";
  std::string resource_id = "cli";
  std::string environment_id = "cli";
  std::uint64_t generation = 0;
  // Inside a container (docs/containers.md): the engine and the container's name or id, and the
  // engine socket when not the daemon's configured one.
  std::string docker;
  std::string podman;
  std::string docker_socket;
  std::string podman_socket;
  bool ungated = false;  // --ungated: the plan's gate is optional
  SandboxFlags sandbox;  // --sandbox FILE.json, --sandbox-profile NAME
  bool check = false;    // --check: exec.check instead of exec.start
  [[nodiscard]] bool in_container() const { return !docker.empty() || !podman.empty(); }
};

// exec.start's params for `f` (without `subscribe`); `ws` is our terminal's size (--pty).
// Errors: plan.invalid_executable (not found, not executable, a relative path inside a
// container), plan.invalid_backend (--ungated without a container), what build_sandbox returns.
[[nodiscard]] Result<boost::json::object> build_params(RunFlags const& f,
                                                       std::optional<winsize> ws);

}  // namespace custos::cli
