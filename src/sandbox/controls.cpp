// The control table and what a policy needs of it (controls.hpp).
#include "custos/sandbox/controls.hpp"

#include <algorithm>

namespace custos::sandbox {

std::vector<ControlInfo> const& sandbox_controls() {
  static std::vector<ControlInfo> const kTable = {
      {control::environment_allow,
       "the program's environment holds exactly the plan's entries and the secrets delivered to "
       "env, nothing the backend adds"},
      {control::filesystem_landlock,
       "per-right access control where a mount cannot express a path's rights (execute vs "
       "read, create vs write vs remove, metadata alone)"},
      {control::filesystem_mount_namespace,
       "a private view of the filesystem holding only the listed paths: read-only without a "
       "create/write/remove right, without exec without the execute right"},
      {control::network_no_inbound, "no bind or listen on the host's network"},
      {control::network_none, "no network interface but a private loopback"},
      {control::network_tcp_connect, "TCP connect to the listed ports only, no other socket use"},
      {control::process_max_processes,
       "the whole tree bounded to max_processes (a pids controller or an equivalent bound)"},
      {control::process_no_descendants, "the root cannot create processes; threads are fine"},
      {control::process_no_new_privs, "no privilege gained through execve (setuid, file caps)"},
      {control::process_non_root, "the execution never runs as, or becomes, uid 0"},
      {control::process_pid_namespace, "nothing outside the tree can be seen or signalled"},
      {control::secrets_env, "a secret delivered into an environment variable"},
      {control::secrets_fd, "a secret delivered on an inherited descriptor"},
      {control::secrets_file, "a secret delivered as a file in the private $CUSTOS_SECRETS_DIR"},
  };
  return kTable;
}

std::string resource_control(core::ResourceDim dim) {
  return "resources." + std::string{core::resource_dim_wire(dim)};
}

std::vector<std::string> all_controls() {
  std::vector<std::string> out;
  for (auto const& c : sandbox_controls()) out.emplace_back(c.name);
  for (std::size_t i = 0; i < core::kResourceDimCount; ++i) {
    auto const dim = static_cast<core::ResourceDim>(i);
    if (dim != core::ResourceDim::concurrency) out.push_back(resource_control(dim));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool mount_expressible(RightSet rights) noexcept {
  constexpr RightSet kReadOnly{Right::discover, Right::metadata, Right::read};
  constexpr RightSet kReadWrite{Right::discover, Right::metadata, Right::read,
                                Right::create,   Right::write,    Right::remove};
  RightSet const without_exec = rights.minus(RightSet{Right::execute});
  return rights.empty() || without_exec == kReadOnly || without_exec == kReadWrite;
}

std::vector<std::string> required_controls(SandboxPolicy const& policy) {
  std::vector<std::string> out;
  auto need = [&out](std::string_view c) { out.emplace_back(c); };
  // Always: the default denial itself needs these.
  need(control::filesystem_mount_namespace);
  need(control::process_no_new_privs);
  need(control::environment_allow);
  need(control::network_no_inbound);
  if (std::any_of(policy.filesystem.begin(), policy.filesystem.end(),
                  [](PathRule const& r) { return !mount_expressible(r.rights); })) {
    need(control::filesystem_landlock);
  }
  if (policy.process.signal_scope == SignalScope::own_tree) need(control::process_pid_namespace);
  need(policy.process.descendants ? control::process_max_processes
                                  : control::process_no_descendants);
  if (!policy.process.run_as_root) need(control::process_non_root);
  if (policy.network.outbound == Outbound::none) need(control::network_none);
  if (policy.network.outbound == Outbound::tcp_connect) need(control::network_tcp_connect);
  for (auto const& s : policy.secrets) {
    switch (s.channel) {
      case SecretChannel::env:
        need(control::secrets_env);
        break;
      case SecretChannel::file:
        need(control::secrets_file);
        break;
      case SecretChannel::fd:
        need(control::secrets_fd);
        break;
    }
  }
  for (auto dim : policy.resources.enforce.members()) out.push_back(resource_control(dim));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace custos::sandbox
