// The native backend's Linux enforcement of a checked sandbox plan (docs/sandbox.md, "Linux
// enforcement"): what this host can enforce (its descriptor rows) and, per launch, the prepared
// sandbox the staged spawn applies — the private filesystem view, Landlock, seccomp, the PID and
// network namespaces, no_new_privs, a non-root uid, the v1 pids cgroup, the delivered secrets.
// Private to the native backend.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "custos/backend/backend.hpp"
#include "custos/sandbox/types.hpp"
#include "custos/sys/landlock.hpp"
#include "custos/sys/mount_view.hpp"
#include "custos/sys/spawn.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::backend {

// What this host offers the sandbox, probed once per daemon.
struct SandboxHost {
  int landlock_abi = 0;
  bool mount_api = false;
  bool seccomp = false;
  bool namespaces = false;     // PID, network, mount, IPC and UTS namespaces can be created
  std::string pids_v1_parent;  // a writable v1 pids cgroup directory for per-execution children
  std::string pids_v1_why;     // why there is none (for the descriptor)
};
// `instance` names this daemon's own v1 pids cgroup directory below the shared one (stable across
// its restarts, distinct from every other daemon's): what a crashed predecessor left there is
// removed here.
[[nodiscard]] SandboxHost probe_sandbox_host(std::string const& instance);

// Adds the sandbox controls' rows to the native descriptor: hard where this host enforces them
// (`cgroup_boundary`: the execution has a cgroup, so no marker joins its environment).
void describe_sandbox(Descriptor& d, SandboxHost const& host, bool cgroup_boundary);

// The value of a secret from the daemon's store, by ref (empty function: no store).
using SecretReader = std::function<Result<std::string>(std::string_view ref)>;

// Everything a sandboxed launch holds until spawn_staged() has returned (the spawn borrows the
// descriptors), and the v1 pids cgroup for the execution's whole life.
struct PreparedSandbox {
  std::optional<sys::PrivateView> view;
  std::optional<sys::LandlockRuleset> landlock;
  sys::UniqueFd pids_procs;
  std::string pids_dir;  // the v1 pids cgroup to remove when the tree is gone; empty: none
  bool kills_on_process_creation = false;  // seccomp kills a fork (descendants: false)
  bool exact_environment = true;           // false: only a read-only workspace (the marker stays)
  std::vector<sys::UniqueFd> secret_fds;
  std::vector<std::string> env_secrets;  // "NAME=value" entries for the program's environment
  sys::SpawnSandbox spawn;               // without the borrowed parts spawn_sandbox() adds

  // What the staged spawn applies, borrowing this object's view and descriptors (which must
  // stay where they are until spawn_staged() returns).
  [[nodiscard]] sys::SpawnSandbox spawn_sandbox() const;
  // Closes what only the launch needed (the view's mounts, the ruleset, the secrets' memfds):
  // the child holds its own copies. The v1 pids cgroup stays until the execution closes.
  void release_launch() noexcept;
};

// Prepares `checked` for a launch of `plan` as `run_as`. Errors (the launch fails at step
// "sandbox", before any process exists): plan.invalid_value for a view this backend cannot build
// exactly (a narrower rule below a wider one that only Landlock could narrow, a rule below
// /proc), workspace.escape for a listed path behind a symlink, sandbox.secret_unknown when a
// secret left the store since the plan was authorized, sys.* for kernel failures.
[[nodiscard]] Result<PreparedSandbox> prepare_sandbox(sandbox::CheckedSandboxPlan const& checked,
                                                      PlanView const& plan, RunAs const& run_as,
                                                      std::string const& execution_id,
                                                      SandboxHost const& host,
                                                      SecretReader const& secrets);

// An unsandboxed launch whose workspace is read-only: only a mount namespace where the workspace
// (its whole tree) is read-only, the rest of the host's tree as it is. For the root "/" the
// process gets the host's whole tree read-only as its root. Errors: as sys::PrivateView's.
[[nodiscard]] Result<PreparedSandbox> read_only_workspace(PlanView const& plan);

// Removes an execution's v1 pids cgroup once its tree is gone (EBUSY while a process is left:
// nothing to do then). Also used by recovery for the executions of a previous daemon.
void remove_pids_cgroup(std::string const& dir) noexcept;
// The v1 pids cgroup an execution would have below `parent`.
[[nodiscard]] std::string pids_cgroup_dir(std::string const& parent,
                                          std::string const& execution_id);

// The directory file secrets appear in, inside the view ($CUSTOS_SECRETS_DIR).
inline constexpr std::string_view kSecretsDir = "/run/custos-secrets";

}  // namespace custos::backend
