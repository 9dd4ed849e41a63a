#include "native_sandbox.hpp"

#include <cerrno>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/sandbox/controls.hpp"
#include "custos/sys/seccomp.hpp"

namespace custos::backend {
namespace {

namespace ctl = sandbox::control;
using sandbox::Right;
using sandbox::RightSet;

bool writes(RightSet r) {
  return r.has(Right::create) || r.has(Right::write) || r.has(Right::remove);
}

// The Landlock accesses that stand for a set of rights (discover: list a directory; write: modify
// and truncate; create: every kind of entry but device nodes; remove: files and directories;
// moving an entry between directories needs both create and remove, as a rename does).
std::uint64_t landlock_access(RightSet r) {
  namespace fs = sys::landlock_fs;
  std::uint64_t a = 0;
  if (r.has(Right::discover)) a |= fs::read_dir;
  if (r.has(Right::read)) a |= fs::read_file;
  if (r.has(Right::execute)) a |= fs::execute;
  if (r.has(Right::write)) a |= fs::write_file | fs::truncate;
  if (r.has(Right::create)) {
    a |= fs::make_reg | fs::make_dir | fs::make_sym | fs::make_fifo | fs::make_sock;
  }
  if (r.has(Right::remove)) a |= fs::remove_file | fs::remove_dir;
  if (r.has(Right::create) && r.has(Right::remove)) a |= fs::refer;
  if (r.has(Right::read) || r.has(Right::write)) a |= fs::ioctl_dev;
  return a;
}

// Landlock only adds rights down a tree: a rule below another gets the union of both. So a
// rule that gives fewer rights than the one above it is exact only where the mount expresses
// the difference (read-only without create/write/remove, noexec without execute).
Result<void> check_narrowing(sandbox::SandboxPolicy const& policy) {
  for (std::size_t i = 0; i < policy.filesystem.size(); ++i) {
    auto const& rule = policy.filesystem[i];
    if (rule.rights.empty()) continue;  // hidden: an empty tmpfs, no rights at all
    sandbox::PathRule const* above = nullptr;
    for (std::size_t j = 0; j < i; ++j) {
      auto const& r = policy.filesystem[j];
      if (r.path != rule.path && sandbox::path_at_or_below(rule.path, r.path)) above = &r;
    }
    if (above == nullptr || above->rights.empty()) continue;
    RightSet extra = above->rights.minus(rule.rights);
    if (!writes(rule.rights)) extra = extra.minus({Right::create, Right::write, Right::remove});
    if (!rule.rights.has(Right::execute)) extra = extra.minus({Right::execute});
    if (!extra.empty()) {
      return Error(Errc::plan_invalid_value,
                   "the rights at " + rule.path + " narrow those of " + above->path +
                       " in a way only Landlock could, and Landlock only adds rights down a "
                       "tree: list the paths beside it instead",
                   EINVAL);
    }
  }
  return ok();
}

std::vector<sys::ViewPath> view_paths(sandbox::SandboxPolicy const& policy) {
  std::vector<sys::ViewPath> out;
  bool proc_listed = false;
  for (auto const& rule : policy.filesystem) {
    sys::ViewPath v;
    v.path = rule.path;
    v.kind = rule.rights.empty() ? sys::ViewPath::Kind::hidden : sys::ViewPath::Kind::visible;
    if (rule.path == "/proc") {
      proc_listed = true;
      if (!rule.rights.empty()) v.kind = sys::ViewPath::Kind::proc;
    }
    v.read_only = !writes(rule.rights);
    v.no_exec = !rule.rights.has(Right::execute);
    v.devices = sandbox::path_at_or_below(rule.path, "/dev");
    out.push_back(std::move(v));
  }
  // /proc visible through a rule above it ("/"): a fresh procfs of the PID namespace instead of
  // the host's, which would show every process of the host.
  if (!proc_listed) {
    RightSet const r = policy.rights_at("/proc");
    if (!r.empty()) {
      sys::ViewPath v;
      v.path = "/proc";
      v.kind = sys::ViewPath::Kind::proc;
      v.read_only = !writes(r);
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::string join_cwd(std::string const& root, std::string const& cwd) {
  if (cwd.empty()) return root;
  if (root == "/") return "/" + cwd;
  return root + "/" + cwd;
}

Result<sys::UniqueFd> sealed_memfd(std::string const& bytes) {
  sys::UniqueFd fd(::memfd_create("custos-secret", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Error(Errc::sys_error, "memfd_create for a secret", errno);
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t const n = ::write(fd.get(), bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error(Errc::sys_error, "writing a secret's memfd", errno);
    off += static_cast<std::size_t>(n);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) !=
      0) {
    return Error(Errc::sys_error, "sealing a secret's memfd", errno);
  }
  if (::lseek(fd.get(), 0, SEEK_SET) != 0) {
    return Error(Errc::sys_error, "rewinding a secret's memfd", errno);
  }
  return fd;
}

// The writable v1 pids cgroup this daemon's executions get their children in: beside the
// daemon's own pids cgroup, "custos" below it.
std::string find_pids_v1(std::string const& instance, std::string& why) {
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  std::string mount;
  while (std::getline(mi, line)) {
    auto const dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    std::string source;
    std::string options;
    tail >> fstype >> source >> options;
    if (fstype != "cgroup") continue;
    std::istringstream opts(options);
    std::string opt;
    bool pids = false;
    while (std::getline(opts, opt, ',')) pids = pids || opt == "pids";
    if (!pids) continue;
    std::istringstream head(line.substr(0, dash));
    std::string f;
    for (int i = 0; i < 5 && head >> f; ++i) {
      if (i == 4) mount = f;
    }
    break;
  }
  if (mount.empty()) {
    why = "no cgroup v1 pids hierarchy and no cgroup v2 pids controller";
    return {};
  }
  std::ifstream cg("/proc/self/cgroup");
  std::string own = "/";
  while (std::getline(cg, line)) {
    auto const a = line.find(':');
    auto const b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::istringstream ctrls(line.substr(a + 1, b - a - 1));
    std::string c;
    while (std::getline(ctrls, c, ',')) {
      if (c == "pids") own = line.substr(b + 1);
    }
  }
  std::string const base = mount + (own == "/" ? "" : own) + "/custos";
  std::string dir = base + "/" + instance;
  // Other daemons' instance directories left behind (a daemon killed, a test's state dir gone):
  // rmdir removes only an empty one. A live daemon's may go too between its executions; it
  // makes it again before each (prepare_sandbox).
  if (DIR* d = ::opendir(base.c_str()); d != nullptr) {
    while (dirent const* e = ::readdir(d)) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.' || e->d_name == instance) continue;
      (void)::rmdir((base + "/" + e->d_name).c_str());
    }
    ::closedir(d);
  }
  if ((::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) ||
      (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)) {
    why = "the v1 pids hierarchy is not writable (" + dir + ")";
    return {};
  }
  // What a previous daemon of this state directory left (it crashed before closing an
  // execution): an empty cgroup goes; one still holding a process stays (rmdir says EBUSY)
  // until that process is gone and this sweep runs again at the next start.
  if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
    while (dirent const* e = ::readdir(d)) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      (void)::rmdir((dir + "/" + e->d_name).c_str());
    }
    ::closedir(d);
  }
  if (::access((dir + "/cgroup.procs").c_str(), W_OK) != 0) {
    why = "the v1 pids cgroup " + dir + " is not writable";
    return {};
  }
  return dir;
}

}  // namespace

SandboxHost probe_sandbox_host(std::string const& instance) {
  SandboxHost h;
  h.landlock_abi = sys::landlock_abi();
  h.mount_api = sys::mount_api_available();
  h.seccomp = ::prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0;
  // Creating namespaces takes CAP_SYS_ADMIN in the daemon's user namespace: root here.
  h.namespaces = ::geteuid() == 0 && ::access("/proc/self/ns/pid_for_children", F_OK) == 0 &&
                 ::access("/proc/self/ns/net", F_OK) == 0;
  if (h.namespaces) h.pids_v1_parent = find_pids_v1(instance, h.pids_v1_why);
  return h;
}

void describe_sandbox(Descriptor& d, SandboxHost const& h, bool cgroup_boundary) {
  using F = ControlFidelity;
  auto row = [&](std::string_view name, bool hard, std::string how, std::string why) {
    d.add(std::string{name}, hard ? F::hard : F::none, hard ? std::move(how) : std::move(why));
  };
  bool const ns = h.namespaces;
  std::string const abi = "Landlock ABI " + std::to_string(h.landlock_abi);
  row(ctl::filesystem_mount_namespace, ns && h.mount_api,
      "a private mount namespace: a read-only tmpfs root holding only the listed paths, each a "
      "recursive clone of the host's (read-only, noexec, nodev per its rights; nosuid always), "
      "/proc a fresh procfs of the PID namespace",
      ns ? "no mount API (fsopen, open_tree, move_mount)" : "the daemon cannot make namespaces");
  row(ctl::filesystem_landlock, h.landlock_abi >= 3,
      abi + ": read, execute, list, create, write, truncate and remove per path",
      h.landlock_abi == 0 ? "Landlock is not enabled on this kernel"
                          : abi + ": truncate needs ABI 3");
  row(ctl::process_no_new_privs, true, "PR_SET_NO_NEW_PRIVS before execve", {});
  row(ctl::process_pid_namespace, ns,
      "a private PID namespace (with IPC and UTS), the root its init; Landlock signal scope",
      "the daemon cannot make namespaces");
  row(ctl::process_no_descendants, h.seccomp,
      "seccomp: fork, vfork and clone without CLONE_THREAD kill the process (SIGSYS); clone3 "
      "answers ENOSYS",
      "no seccomp");
  row(ctl::process_max_processes, ns && !h.pids_v1_parent.empty(),
      "pids.max of the execution's own cgroup in the v1 pids hierarchy (" + h.pids_v1_parent + ")",
      h.pids_v1_why.empty() ? std::string{"the daemon cannot make namespaces"} : h.pids_v1_why);
  row(ctl::process_non_root, h.seccomp,
      "a non-root uid set before execve, no_new_privs, and seccomp refusing new user namespaces",
      "no seccomp");
  row(ctl::environment_allow, cgroup_boundary,
      "exactly the plan's entries and env secrets: the cgroup is the boundary, no marker is added",
      "the marker boundary adds CUSTOS_MARKER to the environment");
  row(ctl::network_no_inbound, ns && h.seccomp && h.landlock_abi >= 4,
      "none: a private network namespace; tcp_connect: Landlock refuses every TCP bind and "
      "seccomp every socket but TCP and Unix; any: seccomp refuses bind and listen",
      "needs namespaces, seccomp and Landlock ABI 4");
  row(ctl::network_none, ns, "a private network namespace with only its loopback, up",
      "the daemon cannot make namespaces");
  row(ctl::network_tcp_connect, h.seccomp && h.landlock_abi >= 6,
      abi +
          ": TCP connect to the listed ports only, no TCP bind, no abstract Unix socket of the "
          "host; seccomp: no socket but TCP and Unix",
      "needs seccomp and Landlock ABI 6 (" + abi + ")");
  row(ctl::secrets_env, true, "the variable in the program's environment, from the store", {});
  row(ctl::secrets_file, ns && h.mount_api,
      "a file (0400) in a private read-only tmpfs at " + std::string{kSecretsDir} +
          " ($CUSTOS_SECRETS_DIR)",
      "needs the private mount namespace");
  row(ctl::secrets_fd, true, "a sealed memfd on the descriptor number", {});
}

// NOLINTNEXTLINE(readability-function-cognitive-complexity): the sandbox's parts in order
Result<PreparedSandbox> prepare_sandbox(sandbox::CheckedSandboxPlan const& checked,
                                        PlanView const& plan, RunAs const& run_as,
                                        std::string const& execution_id, SandboxHost const& host,
                                        SecretReader const& secrets) {
  auto const& policy = checked.policy;
  PreparedSandbox p;
  if (!policy.process.run_as_root && run_as.uid == 0) {
    return Error(Errc::sandbox_invalid, "the execution would run as uid 0 without run_as_root",
                 EPERM);
  }
  CUSTOS_TRYV(check_narrowing(policy));

  // Secrets: values from the store, never from the plan.
  sys::ViewFiles files;
  files.path = std::string{kSecretsDir};
  files.uid = run_as.uid;
  files.gid = run_as.gid;
  for (auto const& s : policy.secrets) {
    if (!secrets) {
      return Error(Errc::sandbox_secret_unknown, "no secret store for secret '" + s.ref + "'");
    }
    std::string value = CUSTOS_TRY(secrets(s.ref));
    switch (s.channel) {
      case sandbox::SecretChannel::env:
        p.env_secrets.push_back(s.name + "=" + value);
        break;
      case sandbox::SecretChannel::file:
        files.files.push_back(sys::ViewFile{s.name, value});
        break;
      case sandbox::SecretChannel::fd:
        p.secret_fds.push_back(CUSTOS_TRY(sealed_memfd(value)));
        p.spawn.fds.push_back(
            sys::SpawnSandbox::FdMap{p.secret_fds.back().get(), static_cast<int>(s.fd)});
        break;
    }
    std::fill(value.begin(), value.end(), '\0');
  }
  if (!files.files.empty()) p.env_secrets.push_back("CUSTOS_SECRETS_DIR=" + files.path);

  p.view.emplace(CUSTOS_TRY(
      sys::PrivateView::build(view_paths(policy), files.files.empty() ? nullptr : &files)));
  for (auto& f : files.files) std::fill(f.bytes.begin(), f.bytes.end(), '\0');
  p.spawn.cwd = join_cwd(plan.workspace_root, plan.cwd);

  if (host.landlock_abi >= 1) {
    sys::LandlockSpec spec;
    spec.handled_fs = sys::landlock_fs_handled(host.landlock_abi);
    auto const out = policy.network.outbound;
    if (host.landlock_abi >= 4 && out != sandbox::Outbound::none) {
      spec.handle_tcp_bind = true;
      spec.handle_tcp_connect = out == sandbox::Outbound::tcp_connect;
    }
    if (host.landlock_abi >= 6) {
      spec.scope_signal = true;
      spec.scope_abstract_unix = out != sandbox::Outbound::none;
    }
    p.landlock.emplace(CUSTOS_TRY(sys::LandlockRuleset::create(spec)));
    for (auto const& o : p.view->opened()) {
      std::uint64_t const a = landlock_access(policy.rights_at(o.path)) & spec.handled_fs;
      if (a != 0) CUSTOS_TRYV(p.landlock->allow_path(o.fd.get(), a));
    }
    if (!files.files.empty()) {
      CUSTOS_TRYV(p.landlock->allow_path(
          p.view->attaches().back().fd.get(),
          (sys::landlock_fs::read_file | sys::landlock_fs::read_dir) & spec.handled_fs));
    }
    if (!p.view->procs().empty()) {
      p.spawn.proc_landlock_access = landlock_access(policy.rights_at("/proc")) & spec.handled_fs;
    }
    if (spec.handle_tcp_connect) {
      for (auto port : policy.network.tcp_ports) {
        CUSTOS_TRYV(p.landlock->allow_tcp_connect(static_cast<std::uint16_t>(port)));
      }
    }
  }

  sys::SeccompPolicy sp;
  sp.deny_process_creation = !policy.process.descendants;
  p.kills_on_process_creation = sp.deny_process_creation;
  sp.deny_new_user_namespace = true;
  if (policy.network.outbound == sandbox::Outbound::tcp_connect) {
    sp.sockets = sys::SeccompPolicy::Sockets::unix_and_tcp_only;
  }
  sp.deny_bind_listen = policy.network.outbound == sandbox::Outbound::any;
  auto program = CUSTOS_TRY(sys::seccomp_program(sp));
  auto const* fprog = program->fprog();
  p.spawn.seccomp.assign(reinterpret_cast<sys::BpfInsn const*>(fprog->filter),
                         reinterpret_cast<sys::BpfInsn const*>(fprog->filter) + fprog->len);

  if (policy.process.descendants && !host.pids_v1_parent.empty()) {
    p.pids_dir = pids_cgroup_dir(host.pids_v1_parent, execution_id);
    // The instance directory first: another daemon's start may have swept it while empty.
    int made = -1;
    for (int attempt = 0; attempt < 3 && made != 0; ++attempt) {
      (void)::mkdir(host.pids_v1_parent.c_str(), 0755);
      made = ::mkdir(p.pids_dir.c_str(), 0755);
      if (made != 0 && errno != ENOENT) break;
    }
    if (made != 0) return Error(Errc::sys_error, "mkdir " + p.pids_dir, errno);
    auto fail = [&](std::string what) {
      int const err = errno;
      remove_pids_cgroup(p.pids_dir);
      return Error(Errc::sys_error, std::move(what) + " " + p.pids_dir, err);
    };
    {
      sys::UniqueFd max(::open((p.pids_dir + "/pids.max").c_str(), O_WRONLY | O_CLOEXEC));
      std::string const n = std::to_string(policy.process.max_processes);
      if (!max.valid() ||
          ::write(max.get(), n.data(), n.size()) != static_cast<ssize_t>(n.size())) {
        return fail("writing pids.max of");
      }
    }
    p.pids_procs.reset(::open((p.pids_dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!p.pids_procs.valid()) return fail("opening cgroup.procs of");
  }

  p.spawn.new_pid_namespace = true;
  p.spawn.new_net_namespace = policy.network.outbound == sandbox::Outbound::none;
  p.spawn.no_new_privs = true;
  p.spawn.drop_capabilities = run_as.uid == 0;
  return p;
}

Result<PreparedSandbox> read_only_workspace(PlanView const& plan) {
  PreparedSandbox p;
  p.exact_environment = false;
  sys::ViewPath ws{plan.workspace_root, sys::ViewPath::Kind::visible, true, false, true};
  if (plan.workspace_root == "/") {
    p.view.emplace(CUSTOS_TRY(sys::PrivateView::build({ws})));
  } else {
    p.view.emplace(CUSTOS_TRY(sys::PrivateView::overlay({ws})));
  }
  p.spawn.cwd = join_cwd(plan.workspace_root, plan.cwd);
  p.spawn.no_new_privs = false;
  return p;
}

sys::SpawnSandbox PreparedSandbox::spawn_sandbox() const {
  sys::SpawnSandbox s = spawn;
  s.view = view ? &*view : nullptr;
  s.landlock_fd = landlock ? landlock->fd().get() : -1;
  s.pids_cgroup_procs_fd = pids_procs.valid() ? pids_procs.get() : -1;
  return s;
}

void PreparedSandbox::release_launch() noexcept {
  view.reset();
  landlock.reset();
  pids_procs.reset();
  secret_fds.clear();
  for (auto& e : env_secrets) std::fill(e.begin(), e.end(), '\0');
  env_secrets.clear();
  spawn = sys::SpawnSandbox{};
}

void remove_pids_cgroup(std::string const& dir) noexcept {
  if (!dir.empty()) (void)::rmdir(dir.c_str());
}

std::string pids_cgroup_dir(std::string const& parent, std::string const& execution_id) {
  return parent + "/" + execution_id;
}

}  // namespace custos::backend
