// Host capability probes: what this kernel and this process can actually do, detected by trying
// (never by kernel version). The daemon's backend descriptor, `host.info` and `custos doctor`
// are built from this; each check carries a one-line statement of what its absence means.
//
// The tree resource probes (sample_tree, walk_disk_usage) live in sampler.hpp, included here.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/sampler.hpp"

namespace custos::sys {

struct CgroupCapability {
  std::optional<std::string> path;       // cgroup2 mount point, nullopt when there is none
  std::optional<std::string> own;        // the daemon's cgroup (relative to the mount)
  std::optional<std::string> directory;  // absolute directory of the daemon's cgroup
  bool writable = false;                 // a child cgroup could be created (and removed) there
  std::set<std::string> controllers;     // cgroup.controllers of the daemon's cgroup
  bool nsdelegate = false;
  bool kill = false;  // cgroup.kill exists
};

struct EngineSockets {
  std::optional<std::string> docker;  // a Unix socket at the docker path
  std::vector<std::string> podman;    // every podman API socket found
};

// One line of `custos doctor`.
struct CapabilityCheck {
  std::string name;  // "pidfd", "clone3_into_cgroup", ...
  bool available = false;
  std::string detail;         // what was tried and what came back
  std::string missing_means;  // one line: the consequence when it is not available
};

struct HostCapabilities {
  bool pidfd = false;
  bool clone3_into_cgroup = false;
  CgroupCapability cgroup;
  bool subreaper = false;
  int landlock_abi = 0;  // 0: no Landlock
  bool seccomp = false;
  int seccomp_api_level = 0;  // libseccomp seccomp_api_get()
  bool user_namespaces = false;
  bool pid_namespaces = false;
  bool net_namespaces = false;
  EngineSockets engines;
  bool pidfd_get_info = false;
  bool so_peerpidfd = false;
  std::vector<CapabilityCheck> checks;  // in a fixed order, one per capability above
};

struct ProbeOptions {
  std::string mountinfo_path = "/proc/self/mountinfo";
  std::string proc_cgroup_path = "/proc/self/cgroup";
  // Where the clone3 / writability probe creates its short-lived scratch cgroup; nullopt means
  // the daemon's own cgroup directory. The scratch cgroup is removed before probe_host returns.
  std::optional<std::string> scratch_cgroup_parent;
  bool try_clone3 = true;      // really clone3 a child into the scratch cgroup
  bool try_namespaces = true;  // really unshare() in short-lived forked children
  std::string docker_socket = "/var/run/docker.sock";
  std::string run_root = "/run";  // podman: <run_root>/podman/podman.sock and
                                  // <run_root>/user/*/podman/podman.sock (and .../podman.sock)
};

// Runs every probe. Individual probe failures are reported as unavailable with their detail,
// never as an error; the function fails only on an internal error (e.g. fork impossible).
[[nodiscard]] Result<HostCapabilities> probe_host(ProbeOptions const& options = {});

// The one-line consequence of a capability being missing ("" for an unknown name).
[[nodiscard]] std::string_view missing_meaning(std::string_view capability) noexcept;

// The `capabilities` object of host.info (docs/api.md): pidfd, clone3_into_cgroup,
// cgroup {path, writable, controllers, nsdelegate, kill}, subreaper, landlock_abi, seccomp,
// user/pid/net_namespaces, engines {docker, podman}, pidfd_get_info, so_peerpidfd, and
// checks [{name, available, detail, missing_means}].
[[nodiscard]] boost::json::value to_json(HostCapabilities const& caps);

}  // namespace custos::sys
