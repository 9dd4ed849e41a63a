// The sandbox controls: the names of the enforcement mechanisms a checked sandbox plan needs,
// one table for every layer (compilation lists them, backend descriptors describe them,
// admission compares the two, sandbox.unsupported reports the missing ones, docs/sandbox.md
// explains them). A control is a promise a backend makes about the whole tree of an execution;
// a backend supports it on this host when its descriptor lists it with fidelity `hard`.
//
// Which controls a policy needs (required_controls):
//
//   filesystem.mount_namespace  always: a private view of the filesystem holding only the listed
//                               paths, read-only where no create/write/remove right is given,
//                               without exec where no execute right is given
//   filesystem.landlock         a path's rights are not one of the four sets a mount can express
//                               (read-only, read-only+execute, read-write, read-write+execute
//                               views, each with discover+metadata+read), e.g. execute without
//                               read, create without remove, metadata alone
//   process.no_new_privs        always: no privilege gained through execve (setuid, file caps)
//   process.pid_namespace       signal_scope own_tree: nothing outside the tree can be seen or
//                               signalled
//   process.no_descendants      descendants false: the root cannot create processes (threads
//                               are fine)
//   process.max_processes       descendants true: the whole tree is bounded to max_processes
//                               (a pids controller or an equivalent whole-tree bound)
//   process.non_root            run_as_root false: the execution never runs as, or becomes,
//                               uid 0
//   environment.allow           always: the program's environment holds exactly the plan's
//                               entries (and the secrets delivered to env), nothing the backend
//                               adds
//   network.no_inbound          always: no bind or listen on the host's network
//   network.none                outbound none: no interface but a private loopback
//   network.tcp_connect         outbound tcp_connect: TCP connect to the listed ports only, no
//                               other socket use
//   secrets.env / .file / .fd   a secret delivered by that channel
//   resources.<dimension>       a dimension in resources.enforce (its wire key: wall_ms, cpu_ms,
//                               memory_bytes, disk_bytes, output_bytes, descriptors, processes):
//                               the descriptor's existing control of that name, at fidelity hard
//
// The terminal domain needs no control: its io modes and resize are checked against the plan
// at compilation (the plan's io is what runs), and input: false is enforced by the supervisor
// for every backend (stdin closed at the start, exec.input refused).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "custos/sandbox/types.hpp"

namespace custos::sandbox {

namespace control {
inline constexpr std::string_view filesystem_mount_namespace = "filesystem.mount_namespace";
inline constexpr std::string_view filesystem_landlock = "filesystem.landlock";
inline constexpr std::string_view process_no_new_privs = "process.no_new_privs";
inline constexpr std::string_view process_pid_namespace = "process.pid_namespace";
inline constexpr std::string_view process_no_descendants = "process.no_descendants";
inline constexpr std::string_view process_max_processes = "process.max_processes";
inline constexpr std::string_view process_non_root = "process.non_root";
inline constexpr std::string_view environment_allow = "environment.allow";
inline constexpr std::string_view network_no_inbound = "network.no_inbound";
inline constexpr std::string_view network_none = "network.none";
inline constexpr std::string_view network_tcp_connect = "network.tcp_connect";
inline constexpr std::string_view secrets_env = "secrets.env";
inline constexpr std::string_view secrets_file = "secrets.file";
inline constexpr std::string_view secrets_fd = "secrets.fd";
}  // namespace control

// One row of the table: a control and what enforcing it means (the "how" a descriptor gives
// describes the mechanism on a host; this is the promise).
struct ControlInfo {
  std::string_view name;
  std::string_view promise;
};

// Every control that is not a resource dimension's, in name order. The resource controls are
// "resources.<wire key>" for each core::ResourceDim but concurrency (no plan limit bounds it).
[[nodiscard]] std::vector<ControlInfo> const& sandbox_controls();
// "resources.memory_bytes" for ResourceDim::memory.
[[nodiscard]] std::string resource_control(core::ResourceDim dim);
// Every control name a policy can need: sandbox_controls() and each resource control, sorted.
[[nodiscard]] std::vector<std::string> all_controls();

// Whether a mount alone can give a path exactly these rights: a read-only or read-write view
// (each with discover, metadata and read), with or without execute; or nothing at all (a
// hidden subtree).
[[nodiscard]] bool mount_expressible(RightSet rights) noexcept;

// The complete set of controls enforcing `policy` needs, sorted and unique.
[[nodiscard]] std::vector<std::string> required_controls(SandboxPolicy const& policy);

}  // namespace custos::sandbox
