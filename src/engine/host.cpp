// The host's view of a container's init: pidfd, pidfs identity, PID namespace and cgroup.
#include <cerrno>

#include "custos/engine/client.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::engine {

Result<ContainerProcess> read_container_process(std::int32_t pid, std::string_view id,
                                                HostPaths const& paths) {
  std::string const subject =
      "container " + std::string{id.substr(0, 12)} + " init pid " + std::to_string(pid);
  if (pid <= 0) {
    return Error{Errc::engine_container_not_running, subject + ": no init process"};
  }
  auto pidfd = sys::Pidfd::open(pid);
  if (!pidfd) {
    if (pidfd.error().sys_errno == ESRCH) {
      return Error{Errc::engine_container_not_running, subject + ": the process is gone"};
    }
    return std::move(pidfd).error();
  }
  ContainerProcess out;
  out.pid = pid;
  auto identity = sys::read_identity(*pidfd);
  if (!identity) {
    if (identity.error().code == Errc::identity_mismatch) {
      return Error{Errc::engine_container_not_running, subject + ": exited while being read"};
    }
    return std::move(identity).error();
  }
  out.identity = std::move(*identity);
  auto dir = sys::open_dir_path(paths.proc_root + "/" + std::to_string(pid));
  if (!dir) return std::move(dir).error();
  auto text = sys::read_file_at(*dir, "cgroup");
  if (!text) return std::move(text).error();
  if (auto rel = sys::parse_own_cgroup(*text)) {
    out.cgroup = std::move(*rel);
    if (auto mount = sys::find_cgroup2_mount(paths.mountinfo)) {
      out.cgroup_dir = mount->path + (out.cgroup == "/" ? std::string{} : out.cgroup);
    }
  }
  out.pid_namespace = CUSTOS_TRY(sys::pid_namespace_inode(std::to_string(pid), paths.proc_root));
  // Everything above was read by pid; a process that is still alive still holds that pid, so
  // it all belongs to the process behind the pidfd.
  if (!pidfd->alive()) {
    return Error{Errc::engine_container_not_running, subject + ": exited while being read"};
  }
  out.cgroup_own = cgroup_names_container(out.cgroup, id);
  return out;
}

}  // namespace custos::engine
