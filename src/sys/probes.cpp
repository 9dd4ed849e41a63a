// Host capability probes (see probes.hpp). Every probe tries the facility for real, in a way that
// leaves nothing behind: fds are closed, scratch cgroups removed, forked children reaped.
#include "custos/sys/probes.hpp"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <seccomp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <memory>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace custos::sys {
namespace {

// PIDFD_GET_INFO (Linux 6.13) is newer than the installed uapi headers; this is the first
// published layout (PIDFD_INFO_SIZE_VER0 = 64 bytes), which later kernels keep accepting.
struct PidfdInfoV0 {
  std::uint64_t mask;
  std::uint64_t cgroupid;
  std::uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  std::int32_t exit_code;
};
static_assert(sizeof(PidfdInfoV0) == 64);
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfoV0);
constexpr std::uint64_t kPidfdInfoPid = 1u << 0;

std::string errno_text(int err) {
  return std::string(::strerrordesc_np(err) != nullptr ? ::strerrordesc_np(err) : "unknown error") +
         " (errno " + std::to_string(err) + ")";
}

bool is_socket(std::string const& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::atomic<unsigned> g_probe_counter{0};

struct ChildOutcome {
  bool ran = false;
  int exit_code = -1;
  std::string detail;
};

// Runs `body` (async-signal-safe syscalls only: the child of a possibly multi-threaded process)
// in a forked child and returns its exit code. The child is ours, so its pid cannot be recycled
// before we reap it; the pidfd is still used to wait, as everywhere else.
template <class Body>
ChildOutcome run_in_child(Body body) {
  pid_t const pid = ::fork();
  if (pid < 0) return ChildOutcome{false, -1, "fork: " + errno_text(errno)};
  if (pid == 0) ::_exit(body());
  auto pidfd = Pidfd::open(pid);
  int status = 0;
  if (pidfd) {
    auto st = pidfd->wait();
    if (!st) return ChildOutcome{false, -1, "wait: " + st.error().message()};
    return ChildOutcome{true, st->code.value_or(-1), {}};
  }
  // pidfd_open missing: this is our own unreaped child, so waiting by pid is still exact.
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return ChildOutcome{true, WIFEXITED(status) ? WEXITSTATUS(status) : -1, {}};
}

// Exit codes of the namespace child: 0 direct, 1 through a new user namespace, 2 + errno failed.
int try_unshare(int flag) {
  if (::unshare(flag) == 0) return 0;
  int const err = errno;
  if (flag != CLONE_NEWUSER && (err == EPERM || err == EACCES) &&
      ::unshare(CLONE_NEWUSER | flag) == 0)
    return 1;
  return 2 + (err < 250 ? err : 250);
}

void add(HostCapabilities& caps, std::string const& name, bool available, std::string detail) {
  caps.checks.push_back(
      CapabilityCheck{name, available, std::move(detail), std::string(missing_meaning(name))});
}

void probe_pidfd(HostCapabilities& caps) {
  auto self = Pidfd::open(static_cast<std::int32_t>(::getpid()));
  caps.pidfd = static_cast<bool>(self);
  add(caps, "pidfd", caps.pidfd, self ? "pidfd_open(self) succeeded" : self.error().message());

  if (self) {
    PidfdInfoV0 info{};
    info.mask = kPidfdInfoPid;
    int const r = ::ioctl(self->fd().get(), kPidfdGetInfo, &info);
    caps.pidfd_get_info = r == 0 && info.pid == static_cast<std::uint32_t>(::getpid());
    add(caps, "pidfd_get_info", caps.pidfd_get_info,
        r == 0 ? "ioctl(PIDFD_GET_INFO) returned pid " + std::to_string(info.pid)
               : "ioctl(PIDFD_GET_INFO): " + errno_text(errno));
  } else {
    add(caps, "pidfd_get_info", false, "no pidfd to ask");
  }

  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    add(caps, "so_peerpidfd", false, "socketpair: " + errno_text(errno));
    return;
  }
  UniqueFd const a(sv[0]);
  UniqueFd const b(sv[1]);
  int peer = -1;
  socklen_t len = sizeof peer;
  int const r = ::getsockopt(a.get(), SOL_SOCKET, SO_PEERPIDFD, &peer, &len);
  UniqueFd const peer_fd(r == 0 ? peer : -1);
  caps.so_peerpidfd = r == 0 && peer_fd.valid();
  add(caps, "so_peerpidfd", caps.so_peerpidfd,
      caps.so_peerpidfd ? "getsockopt(SO_PEERPIDFD) on a socketpair returned a pidfd"
                        : "getsockopt(SO_PEERPIDFD): " + errno_text(errno));
}

// clone3(CLONE_PIDFD | CLONE_INTO_CGROUP) of a child that exits at once, into `cg`.
std::pair<bool, std::string> try_clone3_into(CgroupDir const& cg) {
  int pidfd = -1;
  clone_args args{};
  args.flags = CLONE_PIDFD | CLONE_INTO_CGROUP;
  args.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<std::uint64_t>(cg.fd().get());
  long const r = ::syscall(SYS_clone3, &args, sizeof args);
  if (r == 0) ::syscall(SYS_exit_group, 0);  // the child: nothing else runs here
  if (r < 0) return {false, "clone3(CLONE_INTO_CGROUP): " + errno_text(errno)};
  Pidfd child = Pidfd::adopt(UniqueFd(pidfd), static_cast<std::int32_t>(r));
  auto st = child.wait();
  if (!st) return {false, "wait for the clone3 child: " + st.error().message()};
  return {st->code == 0, "clone3 child created in " + cg.path() + " and reaped"};
}

// A fresh child cgroup of `parent_path` to test in, or nullopt with `why_not` said.
std::optional<CgroupDir> make_scratch_cgroup(std::string const& parent_path, std::string& why_not) {
  if (parent_path.empty()) {
    why_not = "own cgroup unknown";
    return std::nullopt;
  }
  auto parent = CgroupDir::open(parent_path);
  if (!parent) {
    why_not = parent.error().message();
    return std::nullopt;
  }
  std::string const name =
      "custos-probe-" + std::to_string(::getpid()) + "-" + std::to_string(g_probe_counter++);
  auto s = CgroupDir::create(*parent, name);
  if (!s) {
    why_not = s.error().message();
    return std::nullopt;
  }
  return std::move(*s);
}

void probe_cgroup(HostCapabilities& caps, ProbeOptions const& options) {
  auto mount = find_cgroup2_mount(options.mountinfo_path);
  auto own = own_cgroup(options.proc_cgroup_path);
  if (!mount) {
    add(caps, "cgroup", false, mount.error().message());
    add(caps, "cgroup_writable", false, "no cgroup2 mount");
    add(caps, "cgroup_controllers", false, "no cgroup2 mount");
    add(caps, "nsdelegate", false, "no cgroup2 mount");
    add(caps, "cgroup_kill", false, "no cgroup2 mount");
    add(caps, "clone3_into_cgroup", false, "no cgroup2 mount");
    return;
  }
  caps.cgroup.path = mount->path;
  caps.cgroup.nsdelegate = mount->nsdelegate;
  if (own) {
    caps.cgroup.own = *own;
    caps.cgroup.directory = *own == "/" ? mount->path : mount->path + *own;
  }
  add(caps, "cgroup", true,
      "cgroup2 at " + mount->path +
          (own ? ", daemon in " + *own : ", own cgroup unknown: " + own.error().message()));

  std::optional<CgroupDir> dir;
  if (caps.cgroup.directory) {
    if (auto d = CgroupDir::open(*caps.cgroup.directory)) dir = std::move(*d);
  }
  if (dir) {
    if (auto c = dir->controllers()) caps.cgroup.controllers = *c;
    caps.cgroup.kill = ::faccessat(dir->fd().get(), "cgroup.kill", F_OK, 0) == 0;
  }
  std::string list;
  for (auto const& c : caps.cgroup.controllers) list += (list.empty() ? "" : " ") + c;
  bool const limits =
      caps.cgroup.controllers.contains("memory") && caps.cgroup.controllers.contains("pids");
  add(caps, "cgroup_controllers", limits,
      list.empty() ? "no controllers enabled" : "controllers: " + list);
  add(caps, "nsdelegate", caps.cgroup.nsdelegate,
      caps.cgroup.nsdelegate ? "cgroup2 mounted with nsdelegate"
                             : "cgroup2 mounted without nsdelegate");

  // Writability and clone3 are tested in a scratch cgroup that is removed before returning.
  std::string parent_path =
      options.scratch_cgroup_parent.value_or(caps.cgroup.directory.value_or(""));
  std::string why_not;
  std::optional<CgroupDir> scratch = make_scratch_cgroup(parent_path, why_not);
  // The root cgroup has no cgroup.kill even where the kernel supports it: a child shows it.
  if (scratch && !caps.cgroup.kill)
    caps.cgroup.kill = ::faccessat(scratch->fd().get(), "cgroup.kill", F_OK, 0) == 0;
  add(caps, "cgroup_kill", caps.cgroup.kill,
      caps.cgroup.kill ? "cgroup.kill present"
                       : "no cgroup.kill file in the daemon's cgroup or a scratch child");
  caps.cgroup.writable = scratch.has_value();
  add(caps, "cgroup_writable", caps.cgroup.writable,
      scratch ? "created and removed a child cgroup of " + parent_path : why_not);
  if (scratch && options.try_clone3) {
    auto [okay, detail] = try_clone3_into(*scratch);
    caps.clone3_into_cgroup = okay;
    add(caps, "clone3_into_cgroup", okay, detail);
  } else {
    add(caps, "clone3_into_cgroup", false,
        scratch ? "not tried (try_clone3 = false)" : "no writable cgroup to try");
  }
  if (scratch) {
    (void)scratch->wait_empty(std::chrono::milliseconds(1000));
    (void)scratch->remove();
  }
}

void probe_process_controls(HostCapabilities& caps, ProbeOptions const& options) {
  int current = 0;
  caps.subreaper = ::prctl(PR_GET_CHILD_SUBREAPER, &current, 0, 0, 0) == 0;
  add(caps, "subreaper", caps.subreaper,
      caps.subreaper ? std::string("PR_GET_CHILD_SUBREAPER works (currently ") +
                           (current ? "set" : "not set") + ")"
                     : "prctl(PR_GET_CHILD_SUBREAPER): " + errno_text(errno));

  long const abi =
      ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  caps.landlock_abi = abi > 0 ? static_cast<int>(abi) : 0;
  add(caps, "landlock", abi > 0,
      abi > 0 ? "Landlock ABI " + std::to_string(abi)
              : "landlock_create_ruleset(VERSION): " + errno_text(errno));

  int const mode = ::prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
  int const mode_err = errno;
  caps.seccomp_api_level = static_cast<int>(::seccomp_api_get());
  // The sandbox's programs (seccomp.hpp) kill the whole process on a forbidden call: without
  // SECCOMP_RET_KILL_PROCESS they cannot be loaded.
  std::uint32_t const kill_process = SECCOMP_RET_KILL_PROCESS;
  bool const kill_ok = ::syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0U, &kill_process) == 0;
  int const kill_err = errno;
  caps.seccomp = mode >= 0 && caps.seccomp_api_level >= 1 && kill_ok;
  add(caps, "seccomp", caps.seccomp,
      mode < 0 ? "prctl(PR_GET_SECCOMP): " + errno_text(mode_err)
      : !kill_ok
          ? "seccomp(GET_ACTION_AVAIL, KILL_PROCESS): " + errno_text(kill_err)
          : "libseccomp API level " + std::to_string(caps.seccomp_api_level) + ", current mode " +
                std::to_string(mode) + ", SECCOMP_RET_KILL_PROCESS available");

  std::string userns_limit;
  if (auto root = open_dir_path("/")) {
    if (auto t = read_file_at(*root, "proc/sys/user/max_user_namespaces")) {
      while (!t->empty() && t->back() == '\n') t->pop_back();
      userns_limit = ", max_user_namespaces=" + *t;
    }
  }
  struct NsProbe {
    char const* name;
    int flag;
    bool HostCapabilities::*field;
  };
  for (NsProbe const ns :
       {NsProbe{"user_namespaces", CLONE_NEWUSER, &HostCapabilities::user_namespaces},
        NsProbe{"pid_namespaces", CLONE_NEWPID, &HostCapabilities::pid_namespaces},
        NsProbe{"net_namespaces", CLONE_NEWNET, &HostCapabilities::net_namespaces}}) {
    if (!options.try_namespaces) {
      add(caps, ns.name, false, "not tried (try_namespaces = false)");
      continue;
    }
    int const flag = ns.flag;
    ChildOutcome const r = run_in_child([flag] { return try_unshare(flag); });
    bool const okay = r.ran && (r.exit_code == 0 || r.exit_code == 1);
    caps.*ns.field = okay;
    std::string detail;
    if (!r.ran)
      detail = r.detail;
    else if (r.exit_code == 0)
      detail = "unshare succeeded in a child";
    else if (r.exit_code == 1)
      detail = "unshare succeeded together with a new user namespace";
    else
      detail = "unshare: " + errno_text(r.exit_code - 2);
    if (flag == CLONE_NEWUSER) detail += userns_limit;
    add(caps, ns.name, okay, detail);
  }
}

void probe_engines(HostCapabilities& caps, ProbeOptions const& options) {
  if (is_socket(options.docker_socket)) caps.engines.docker = options.docker_socket;
  add(caps, "docker", caps.engines.docker.has_value(),
      caps.engines.docker ? "socket " + *caps.engines.docker
                          : "no Unix socket at " + options.docker_socket);

  std::string const system_sock = options.run_root + "/podman/podman.sock";
  if (is_socket(system_sock)) caps.engines.podman.push_back(system_sock);
  std::string const users = options.run_root + "/user";
  if (std::unique_ptr<DIR, int (*)(DIR*)> const d(::opendir(users.c_str()), &::closedir); d) {
    std::vector<std::string> found;
    while (dirent const* e = ::readdir(d.get())) {
      if (e->d_name[0] == '.') continue;
      for (char const* rel : {"/podman/podman.sock", "/podman.sock"}) {
        std::string const p = users + "/" + e->d_name + rel;
        if (is_socket(p)) found.push_back(p);
      }
    }
    std::sort(found.begin(), found.end());
    caps.engines.podman.insert(caps.engines.podman.end(), found.begin(), found.end());
  }
  std::string list;
  for (auto const& p : caps.engines.podman) list += (list.empty() ? "" : ", ") + p;
  add(caps, "podman", !caps.engines.podman.empty(),
      list.empty() ? "no podman API socket under " + options.run_root : "sockets: " + list);
}

}  // namespace

std::string_view missing_meaning(std::string_view capability) noexcept {
  struct Row {
    std::string_view name;
    std::string_view meaning;
  };
  static constexpr Row kRows[] = {
      {"pidfd",
       "processes could only be named by pid, which the kernel recycles; custos cannot supervise "
       "safely"},
      {"pidfd_get_info",
       "exit status of a reaped non-child cannot be read; such exits are recorded as unobserved"},
      {"so_peerpidfd", "RPC callers are identified by SO_PEERCRED pid only, not pinned by a pidfd"},
      {"cgroup",
       "no cgroup v2 hierarchy: executions use the cooperative marker boundary and may end "
       "unconfirmed"},
      {"cgroup_controllers",
       "memory/pids/cpu limits cannot be kernel-enforced; those dimensions are only sampled"},
      {"nsdelegate",
       "a root execution can move itself out of its cgroup; only the final marker sweep can catch "
       "it"},
      {"cgroup_kill",
       "teardown cannot kill a cgroup in one step; a tree that forks during teardown may survive"},
      {"cgroup_writable",
       "no per-execution cgroups: marker boundary only, teardown is cooperative, not "
       "kernel-enforced"},
      {"clone3_into_cgroup",
       "a child cannot be born inside its execution cgroup; no kernel-enforced cgroup boundary"},
      {"subreaper",
       "orphaned descendants reparent to init and can no longer be reaped or attributed by the "
       "daemon"},
      {"landlock",
       "filesystem sandbox requirements are unsupported on this host and are refused at admission"},
      {"seccomp",
       "syscall filter requirements are unsupported on this host and are refused at admission"},
      {"user_namespaces",
       "uid-mapped sandboxes are unsupported on this host and are refused at admission"},
      {"pid_namespaces",
       "executions cannot get a private pid namespace; such requirements are refused"},
      {"net_namespaces",
       "network isolation requirements are unsupported on this host and are refused"},
      {"docker", "no Docker engine socket: the docker backend is unavailable"},
      {"podman", "no Podman API socket: the podman backend is unavailable"},
  };
  for (Row const& r : kRows) {
    if (r.name == capability) return r.meaning;
  }
  return {};
}

Result<HostCapabilities> probe_host(ProbeOptions const& options) {
  HostCapabilities caps;
  probe_pidfd(caps);
  probe_cgroup(caps, options);
  probe_process_controls(caps, options);
  probe_engines(caps, options);
  return caps;
}

boost::json::value to_json(HostCapabilities const& caps) {
  namespace json = boost::json;
  json::array controllers;
  for (auto const& c : caps.cgroup.controllers) controllers.emplace_back(c);
  json::object cgroup{
      {"path", caps.cgroup.path ? json::value(*caps.cgroup.path) : json::value(nullptr)},
      {"own", caps.cgroup.own ? json::value(*caps.cgroup.own) : json::value(nullptr)},
      {"writable", caps.cgroup.writable},
      {"controllers", std::move(controllers)},
      {"nsdelegate", caps.cgroup.nsdelegate},
      {"kill", caps.cgroup.kill}};
  json::array podman;
  for (auto const& p : caps.engines.podman) podman.emplace_back(p);
  json::object engines{
      {"docker", caps.engines.docker ? json::value(*caps.engines.docker) : json::value(nullptr)},
      {"podman", std::move(podman)}};
  json::array checks;
  for (auto const& c : caps.checks) {
    checks.emplace_back(json::object{{"name", c.name},
                                     {"available", c.available},
                                     {"detail", c.detail},
                                     {"missing_means", c.missing_means}});
  }
  return json::object{{"pidfd", caps.pidfd},
                      {"clone3_into_cgroup", caps.clone3_into_cgroup},
                      {"cgroup", std::move(cgroup)},
                      {"subreaper", caps.subreaper},
                      {"landlock_abi", caps.landlock_abi},
                      {"seccomp", caps.seccomp},
                      {"seccomp_api_level", caps.seccomp_api_level},
                      {"user_namespaces", caps.user_namespaces},
                      {"pid_namespaces", caps.pid_namespaces},
                      {"net_namespaces", caps.net_namespaces},
                      {"engines", std::move(engines)},
                      {"pidfd_get_info", caps.pidfd_get_info},
                      {"so_peerpidfd", caps.so_peerpidfd},
                      {"checks", std::move(checks)}};
}

}  // namespace custos::sys
