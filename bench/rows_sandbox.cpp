// sandbox rows (issue 19): a sandboxed launch through a real daemon beside the sandbox launcher
// people use today, and beside the same launch unsandboxed, all in the same run.
//   `bwrap --unshare-all --die-with-parent --ro-bind /usr /usr ... <no-op>`: fork + exec + wait
//       from the bench (bwrap's own start-up included, as a user pays it); the floor row
//   exec.start -> terminal of the no-op with every domain the native backend admits on, as
//       nobody (uid/gid 65534), with its durable claim and its cgroup       vs bwrap: target <=
//       0.8x
//   the same plan without plan.sandbox (same daemon, same user, same read-only workspace): the
//       sandbox's own cost, sandboxed / unsandboxed — for the record, no target
//   the sandboxed launch with network tcp_connect [443] instead of none (no network namespace;
//       Landlock and seccomp instead) vs bwrap: for the record, no target
// The three (four) launches alternate in blocks of 10 so a noisy neighbour moves all of them.
// Before any launch, exec.check of the sandboxed plan must admit it; a control this host does
// not enforce at `hard` makes the rows say which (host.info's native descriptor) and have no
// value — never a run with the control off.
#include <boost/json.hpp>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sched.h>
#include <string>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.hpp"
#include "daemon_client.hpp"

namespace custos::bench {
namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kNobody = 65534;

// What a launch of the no-op runs with.
enum class Variant : std::uint8_t { unsandboxed, sandboxed, tcp_connect };

json::array rx() {
  return json::array{"discover", "metadata", "read", "execute"};
}

// Every domain at its strictest the no-op allows: the system directories it could need and the
// workspace read-only and executable (the no-op lives there), no process creation, an empty
// environment, no network (or TCP connect to 443 only), stdin closed, wall time and output
// enforced, no secrets.
json::object sandbox_of(std::string const& ws, Variant v) {
  json::array fs;
  for (char const* p : {"/usr", "/lib", "/lib64", "/bin"}) {
    struct stat st {};
    if (::lstat(p, &st) == 0) fs.push_back(json::object{{"path", p}, {"allow", rx()}});
  }
  fs.push_back(json::object{{"path", ws}, {"allow", rx()}});
  json::value network = "none";
  if (v == Variant::tcp_connect) {
    network = json::object{{"tcp_connect", json::array{443}}};
  }
  return json::object{
      {"filesystem", std::move(fs)},
      {"process",
       json::object{{"descendants", false}, {"signal_scope", "own_tree"}, {"run_as_root", false}}},
      {"environment", json::object{{"allow", json::array{}}}},
      {"network", json::object{{"outbound", std::move(network)}}},
      {"secrets", json::array{}},
      {"resources", json::object{{"enforce", json::array{"wall_ms", "output_bytes"}}}},
      {"terminal",
       json::object{{"modes", json::array{"pipes"}}, {"input", false}, {"resize", false}}}};
}

// The grant every launch runs under: an admin's implicit authority runs as the caller only, so
// running as nobody takes a runner grant naming uid 65534 in run_as_uids (docs/authority.md,
// "run_as"). The workspace read-only, the no-op the only executable.
constexpr char const* kGrant = "g-bench-sandbox";

json::object grant_spec(std::string const& ws) {
  return json::object{
      {"id", kGrant},
      {"principal", "uid:" + std::to_string(::geteuid())},
      {"role", "runner"},
      {"operations", json::array{"exec.native"}},
      {"executables", json::array{json::object{{"path", ws + "/noop"}, {"prefix", false}}}},
      {"workspaces",
       json::array{json::object{{"workspace_id", "w"}, {"root", ws}, {"max_access", "read_only"}}}},
      {"environment_ids", json::array{"e"}},
      {"resource_ids", json::array{"r"}},
      {"run_as_uids", json::array{kNobody}},
      {"budget", json::object{{"executions", 1000000}}}};
}

std::string request(std::string const& method, std::string const& ws, std::string const& noop,
                    std::string const& action, Variant v, std::uint64_t epoch) {
  json::object identity{{"project_id", "bench"}, {"session_id", "bench"}, {"run_id", "r"},
                        {"attempt_id", "a"},     {"turn_id", "t"},        {"action_id", action},
                        {"process_id", "p"},     {"workspace_id", "w"},   {"resource_id", "r"},
                        {"environment_id", "e"}, {"generation", 1},       {"revision", 1}};
  json::object plan{{"command", json::object{{"executable", noop}, {"argv", json::array{"noop"}}}},
                    {"workspace", json::object{{"root", ws}, {"access", "read_only"}}},
                    {"io", json::object{{"mode", "pipes"}}},
                    {"limits", json::object{{"wall_ms", 10000}, {"output_bytes", 65536}}},
                    {"user", json::object{{"uid", kNobody}, {"gid", kNobody}}}};
  if (v != Variant::unsandboxed) plan["sandbox"] = sandbox_of(ws, v);
  json::object req{{"jsonrpc", "2.0"},
                   {"id", 1},
                   {"method", method},
                   {"params", json::object{{"identity", identity},
                                           {"plan", plan},
                                           {"authority", json::object{{"epoch", epoch},
                                                                      {"grant_id", kGrant},
                                                                      {"lease_id", nullptr}}}}}};
  return json::serialize(req) + "\n";
}

bool send_line(int fd, std::string const& line) {
  return ::send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
}

// One call; the parsed answer, or a null value with `why` set.
json::value call(int fd, std::string& buf, std::string const& line, std::string& why) {
  std::string reply;
  if (!send_line(fd, line) || !read_line(fd, buf, reply)) {
    why = "the daemon's connection failed";
    return nullptr;
  }
  boost::system::error_code ec;
  auto v = json::parse(reply, ec);
  if (ec || !v.is_object()) {
    why = "not a JSON object: " + reply;
    return nullptr;
  }
  if (auto const* e = v.as_object().if_contains("error")) {
    why = json::serialize(*e);
    return nullptr;
  }
  return v.as_object().at("result");
}

// exec.start + exec.wait; true when the execution ended exited 0.
bool launch_once(int fd, std::string& buf, std::string const& start, std::string& why) {
  auto const started = call(fd, buf, start, why);
  if (!started.is_object()) return false;
  std::string const id{started.at("execution_id").as_string()};
  std::string const wait =
      json::serialize(json::object{{"jsonrpc", "2.0"},
                                   {"id", 2},
                                   {"method", "exec.wait"},
                                   {"params", json::object{{"execution_id", id}}}}) +
      "\n";
  auto const t = call(fd, buf, wait, why);
  if (!t.is_object()) return false;
  auto const* cls = t.as_object().if_contains("classification");
  auto const* exit = t.as_object().if_contains("exit");
  auto const* code =
      exit != nullptr && exit->is_object() ? exit->as_object().if_contains("code") : nullptr;
  if (cls != nullptr && cls->is_string() && cls->as_string() == "exited" && code != nullptr &&
      code->is_int64() && code->as_int64() == 0) {
    return true;
  }
  why = "did not end exited 0: " + json::serialize(t);
  return false;
}

// Empty when exec.check admits the plan; else which controls this host lacks, each with what
// host.info's native descriptor says of it.
std::string admission_gap(int fd, std::string& buf, std::string const& check) {
  std::string why;
  auto const answer = call(fd, buf, check, why);
  if (!answer.is_object()) return "exec.check failed: " + why;
  auto const& adm = answer.at("admission").as_object();
  if (adm.at("admitted").as_bool()) return {};
  auto const info = call(fd, buf,
                         R"({"jsonrpc":"2.0","method":"host.info","id":3})"
                         "\n",
                         why);
  std::string out = "not admitted on this host:";
  for (auto const& m : adm.at("missing").as_array()) {
    std::string const name{m.as_string()};
    std::string how = "absent from the descriptor";
    if (info.is_object()) {
      for (auto const& b : info.at("backends").as_array()) {
        if (b.at("kind") != "native") continue;
        for (auto const& c : b.at("controls").as_array()) {
          if (c.at("name") != name.c_str()) continue;
          how = std::string{c.at("fidelity").as_string()} + " (" +
                std::string{c.at("how").as_string()} + ")";
        }
      }
    }
    out += " " + name + " is " + how + ";";
  }
  return out;
}

// The first executable named `name` on $PATH, or "".
std::string on_path(std::string const& name) {
  char const* path = std::getenv("PATH");
  std::string const dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string const candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

// The bwrap command: every namespace, the system directories read-only as the sandboxed plan
// lists them, a fresh /proc and a minimal /dev, and the workspace (holding the no-op) read-only.
std::vector<std::string> bwrap_argv(std::string const& bwrap, std::string const& ws,
                                    std::string const& noop) {
  std::vector<std::string> a{bwrap,       "--unshare-all", "--die-with-parent",
                             "--ro-bind", "/usr",          "/usr"};
  for (auto const& [link, target] : {std::pair<char const*, char const*>{"/lib", "usr/lib"},
                                     {"/lib64", "usr/lib64"},
                                     {"/bin", "usr/bin"}}) {
    std::error_code ec;
    if (std::filesystem::is_symlink(link, ec)) {
      a.insert(a.end(), {"--symlink", target, link});
    } else if (std::filesystem::exists(link, ec)) {
      a.insert(a.end(), {"--ro-bind", link, link});
    }
  }
  a.insert(a.end(), {"--proc", "/proc", "--dev", "/dev", "--ro-bind", ws, ws, noop});
  return a;
}

// One bwrap: fork, exec, wait. The waitpid status, -1 when fork failed.
int bwrap_once(std::vector<std::string> const& args, std::string const& err_path) {
  std::vector<char*> argv;
  for (auto const& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  pid_t const pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int const err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// The kernel's part of it: a child in new namespaces (`ns_flags`, 0 for none) that execs the
// no-op, waited for; no cgroup, no view. CLONE_VM | CLONE_VFORK on a stack of its own, as the
// daemon's spawn does, so the bench's own address space (large by now) is not copied. The
// waitpid status, -1 when clone failed.
int exec_noop(void* arg) {
  char* const argv[] = {const_cast<char*>("noop"), nullptr};
  ::execv(static_cast<char const*>(arg), argv);
  ::_exit(127);
}

int clone_ns_once(int ns_flags, std::string const& noop) {
  static std::vector<char> stack(256 * 1024);
  int const pid =
      ::clone(&exec_noop, stack.data() + stack.size(), ns_flags | CLONE_VM | CLONE_VFORK | SIGCHLD,
              const_cast<char*>(noop.c_str()));
  if (pid < 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string first_line(std::string const& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// The row's workspace: a directory nobody can enter and read, holding a copy of the no-op (the
// work dir itself is made traversable, not listable, so the unsandboxed run as nobody reaches it).
bool make_workspace(Env const& env, std::string const& ws, std::string const& noop,
                    std::string& why) {
  std::error_code ec;
  if (::chmod(env.work_dir.c_str(), 0711) != 0 || ::mkdir(ws.c_str(), 0755) != 0 ||
      !std::filesystem::copy_file(env.noop_path, noop, ec) || ::chmod(noop.c_str(), 0755) != 0) {
    why = "cannot prepare the workspace " + ws + ": " +
          (ec ? ec.message() : std::string{std::strerror(errno)});
    return false;
  }
  return true;
}

}  // namespace

std::vector<Row> sandbox_rows(Env const& env, Floors const& /*floors*/) {
  std::size_t const block = 10;
  std::size_t const blocks = env.quick ? 3 : 20;
  std::string const ws = env.work_dir + "/sandbox-ws";
  std::string const noop = ws + "/noop";
  std::string const bwrap_cmd =
      "`bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/lib /lib "
      "--symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev --ro-bind WS "
      "WS WS/noop`";

  Row bw;
  bw.name = "sandbox: the no-op through " + bwrap_cmd + ", fork + exec + wait (median)";
  bw.unit = "ms";
  bw.floor_name = bw.name;
  bw.better = Better::lower;
  Row sb = unmeasured(
      "sandbox: exec.start -> terminal of the no-op with every domain on, as nobody (median)", "ms",
      "bwrap --unshare-all of the same no-op (row above, same run)", std::nullopt, 0.8,
      Better::lower, "");
  Row cost;
  cost.name =
      "sandbox: its own cost, sandboxed / unsandboxed exec.start -> terminal (median, for the "
      "record)";
  cost.unit = "ms";
  cost.floor_name =
      "the same plan without plan.sandbox, same daemon, user and read-only workspace (same run)";
  cost.better = Better::lower;
  Row tcp;
  tcp.name =
      "sandbox: the same with network tcp_connect [443] instead of none (median, for the record)";
  tcp.unit = "ms";
  tcp.floor_name = "bwrap --unshare-all of the same no-op (same run)";
  tcp.better = Better::lower;
  // The kernel's share: the namespaces the sandboxed launch asks for, created and torn down
  // around the no-op by the bench itself (no cgroup, no view, no daemon).
  Row ns_none;
  ns_none.name =
      "sandbox, kernel part: clone (CLONE_VM|CLONE_VFORK) + execve + wait of the no-op, no "
      "namespace (median)";
  ns_none.unit = "ms";
  ns_none.floor_name = ns_none.name;
  ns_none.better = Better::lower;
  Row ns_all;
  ns_all.name =
      "sandbox, kernel part: the same in new mount, PID, IPC, UTS and network namespaces "
      "(median, for the record)";
  ns_all.unit = "ms";
  ns_all.floor_name = "the same clone with no namespace (row above, same run)";
  ns_all.better = Better::lower;
  Row ns_nonet = ns_all;
  ns_nonet.name =
      "sandbox, kernel part: the same without the network namespace (median, for the record)";
  auto all = [&] { return std::vector<Row>{bw, sb, cost, tcp, ns_none, ns_all, ns_nonet}; };
  auto fail_all = [&](std::string const& why) {
    bw.note = sb.note = cost.note = tcp.note = ns_none.note = ns_all.note = ns_nonet.note = why;
    return all();
  };

  std::string why;
  if (!make_workspace(env, ws, noop, why)) return fail_all(why);
  std::string const bwrap = on_path("bwrap");
  auto const bargs = bwrap_argv(bwrap, ws, noop);
  std::string const err_path = env.work_dir + "/sandbox-bwrap.err";
  DaemonProc d;
  if (!start_daemon(env, "sandbox", d)) return fail_all("the daemon did not answer on " + d.socket);
  int const fd = connect_unix(d.socket);
  if (fd < 0) return fail_all("cannot connect to " + d.socket);
  std::string buf;

  static std::atomic<std::uint64_t> counter{0};
  auto action = [] {
    return "act-sandbox-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  };
  std::uint64_t epoch = 0;
  {
    std::string const grant = json::serialize(json::object{{"jsonrpc", "2.0"},
                                                           {"id", 4},
                                                           {"method", "authority.grant"},
                                                           {"params", grant_spec(ws)}}) +
                              "\n";
    auto const granted = call(fd, buf, grant, why);
    if (!granted.is_object()) {
      ::close(fd);
      return fail_all("authority.grant failed: " + why);
    }
    epoch = granted.at("epoch").to_number<std::uint64_t>();
  }
  std::string const gap =
      admission_gap(fd, buf, request("exec.check", ws, noop, action(), Variant::sandboxed, epoch));
  std::string const tcp_gap = admission_gap(
      fd, buf, request("exec.check", ws, noop, action(), Variant::tcp_connect, epoch));
  if (!gap.empty()) sb.note = cost.note = gap;
  if (!tcp_gap.empty()) tcp.note = tcp_gap;
  if (bwrap.empty()) {
    bw.note = sb.note = tcp.note =
        "bwrap is not installed here (scripts/install-deps installs bubblewrap)";
  }

  std::vector<double> ms_bw;
  std::vector<double> ms_sb;
  std::vector<double> ms_un;
  std::vector<double> ms_tcp;
  bool bw_ok = !bwrap.empty();
  bool sb_ok = gap.empty();
  bool un_ok = true;
  bool tcp_ok = tcp_gap.empty();
  auto custos_block = [&](Variant v, bool& ok, std::vector<double>& ms, Row& r) {
    for (std::size_t i = 0; ok && i < block; ++i) {
      std::string const start = request("exec.start", ws, noop, action(), v, epoch);
      std::string err;
      auto const t0 = Clock::now();
      if (!launch_once(fd, buf, start, err)) {
        ok = false;
        r.note = "a launch failed after " + std::to_string(ms.size()) + ": " + err;
        return;
      }
      ms.push_back(seconds_since(t0) * 1e3);
    }
  };
  // A block of launches made by the bench process itself (bwrap, the bare namespaces).
  auto local_block = [&](auto const& once, bool& ok, std::vector<double>& ms, Row& r) {
    for (std::size_t i = 0; ok && i < block; ++i) {
      auto const t0 = Clock::now();
      int const status = once();
      double const took = seconds_since(t0) * 1e3;
      if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::string const line = first_line(err_path);
        r.note = "cannot run here (status " + std::to_string(status) +
                 (line.empty() ? "" : ": " + line) + ")";
        ok = false;
        return;
      }
      ms.push_back(took);
    }
  };
  int const ns_flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
  std::vector<double> ms_ns_none;
  bool ns_none_ok = true;
  std::vector<double> ms_ns_all;
  std::vector<double> ms_ns_nonet;
  bool ns_all_ok = true;
  bool ns_nonet_ok = true;
  // Each round: the custos variants, then bwrap and the kernel's namespace floors (the order
  // only spreads host noise evenly; the first launch of a fresh daemon once failed at the view
  // step when it followed a bwrap block — the spawn's start-over consumed the view's detached
  // mounts, fixed in sys/spawn.cpp — and the blocks alternate either way).
  for (std::size_t b = 0; b < blocks && Clock::now() < env.deadline; ++b) {
    custos_block(Variant::sandboxed, sb_ok, ms_sb, sb);
    custos_block(Variant::unsandboxed, un_ok, ms_un, cost);
    custos_block(Variant::tcp_connect, tcp_ok, ms_tcp, tcp);
    local_block([&] { return bwrap_once(bargs, err_path); }, bw_ok, ms_bw, bw);
    local_block([&] { return clone_ns_once(0, noop); }, ns_none_ok, ms_ns_none, ns_none);
    local_block([&] { return clone_ns_once(ns_flags | CLONE_NEWNET, noop); }, ns_all_ok, ms_ns_all,
                ns_all);
    local_block([&] { return clone_ns_once(ns_flags, noop); }, ns_nonet_ok, ms_ns_nonet, ns_nonet);
  }
  ::close(fd);
  ::unlink(err_path.c_str());

  std::string const n = std::to_string(ms_sb.size());
  if (bw_ok && !ms_bw.empty()) {
    bw.value = bw.floor_value = median(ms_bw);
    bw.note = std::to_string(ms_bw.size()) +
              " launches in new user, mount, pid, net, ipc, uts and cgroup namespaces: no "
              "cgroup, no durable record, no events, no seccomp, no Landlock";
  }
  std::optional<double> const bw_ms = bw.value;
  sb.floor_value = tcp.floor_value = bw_ms;
  if (sb_ok && !ms_sb.empty()) {
    sb.value = median(ms_sb);
    sb.note = n +
              " launches, alternating with bwrap in blocks of 10: a private view (/usr, /lib, "
              "/lib64, /bin and the workspace, read + execute), PID/IPC/UTS and network "
              "namespaces, descendants false (seccomp), an empty environment, no_new_privs, "
              "uid 65534, stdin closed, wall time and output enforced; each claim consumed "
              "durably, each execution in its own cgroup";
  }
  if (un_ok && !ms_un.empty()) cost.floor_value = median(ms_un);
  if (sb_ok && un_ok && !ms_sb.empty()) {
    cost.value = sb.value;
    cost.note = n +
                " launches each way in alternating blocks; the unsandboxed launch still enters "
                "a mount namespace (its read-only workspace is laid read-only over itself)";
  }
  if (tcp_ok && !ms_tcp.empty()) {
    tcp.value = median(ms_tcp);
    tcp.note = std::to_string(ms_tcp.size()) +
               " launches: no network namespace; Landlock allows TCP connect to 443 only, "
               "seccomp no socket but TCP and Unix";
  }
  if (ns_none_ok && !ms_ns_none.empty()) {
    ns_none.value = ns_none.floor_value = median(ms_ns_none);
    ns_none.note = std::to_string(ms_ns_none.size()) + " launches";
  }
  ns_all.floor_value = ns_nonet.floor_value = ns_none.value;
  if (ns_all_ok && !ms_ns_all.empty()) {
    ns_all.value = median(ms_ns_all);
    ns_all.note = std::to_string(ms_ns_all.size()) +
                  " launches: what the kernel alone takes to create and tear down the "
                  "sandboxed launch's namespaces around the no-op";
  }
  if (ns_nonet_ok && !ms_ns_nonet.empty()) {
    ns_nonet.value = median(ms_ns_nonet);
    ns_nonet.note = std::to_string(ms_ns_nonet.size()) + " launches";
  }
  return all();
}

}  // namespace custos::bench
