// Black-box harness: the real custos binary, a real daemon per test in a temp state dir, real
// Unix-socket clients. Everything a test creates (daemon, cgroup subtree, temp dir) is removed
// by the destructors, daemons are signalled through their pidfd.
#pragma once

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <grp.h>
#include <optional>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sstream>
#include <string>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/core/base64.hpp"

namespace custos::e2e {

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace std::chrono_literals;

// A private copy of the built binary, made once per test process: the shared build tree may
// relink CUSTOS_BINARY while a suite runs, and a daemon exec'd from a half-written file fails.
class BinaryCopy {
 public:
  BinaryCopy() {
    path_ = "/tmp/custos-e2e-bin-" + std::to_string(::getpid());
    std::error_code ec;
    for (int i = 0; i < 50; ++i) {
      fs::copy_file(CUSTOS_BINARY, path_, fs::copy_options::overwrite_existing, ec);
      if (!ec) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (ec)
      path_ = CUSTOS_BINARY;
    else
      ::chmod(path_.c_str(), 0755);
  }
  BinaryCopy(BinaryCopy const&) = delete;
  BinaryCopy& operator=(BinaryCopy const&) = delete;
  ~BinaryCopy() {
    if (path_ != CUSTOS_BINARY) ::unlink(path_.c_str());
  }
  [[nodiscard]] std::string const& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string binary() {
  static BinaryCopy const copy;
  return copy.path();
}

class TempDir {
 public:
  // Under `base`: /tmp by default.
  explicit TempDir(std::string const& base = "/tmp") {
    std::string tmpl = base + "/custos-e2e-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
    ::chmod(path_.c_str(), 0755);
  }
  TempDir(TempDir const&) = delete;
  TempDir& operator=(TempDir const&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] fs::path const& path() const { return path_; }

 private:
  fs::path path_;
};

inline int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

inline std::string unique_suffix() {
  static std::atomic<int> n{0};
  return std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// A connected Unix socket speaking newline-framed bytes.
class LineClient {
 public:
  explicit LineClient(fs::path const& socket) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof addr.sun_path - 1);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr const*>(&addr), sizeof addr) == 0;
  }
  LineClient(LineClient const&) = delete;
  LineClient& operator=(LineClient const&) = delete;
  LineClient(LineClient&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), connected_(o.connected_), buf_(std::move(o.buf_)) {}
  ~LineClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] bool connected() const { return connected_; }
  [[nodiscard]] int fd() const { return fd_; }

  bool send_raw(std::string_view bytes) {
    std::size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      off += static_cast<std::size_t>(n);
    }
    return true;
  }
  bool send_line(std::string_view line) { return send_raw(std::string{line} + "\n"); }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  // One line (without '\n'), nullopt on timeout or EOF.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = 5000ms) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[65536];
      ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) {
        eof_ = true;
        return std::nullopt;
      }
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }
  std::optional<json::value> read_json(std::chrono::milliseconds timeout = 5000ms) {
    auto line = read_line(timeout);
    if (!line) return std::nullopt;
    boost::system::error_code ec;
    auto v = json::parse(*line, ec);
    if (ec) return std::nullopt;
    return v;
  }
  // Reads messages until the response with `id` arrives; notifications are kept in `events`.
  std::optional<json::object> response(std::int64_t id,
                                       std::chrono::milliseconds timeout = 10000ms) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto v = read_json(std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now()));
      if (!v) return std::nullopt;
      if (!v->is_object()) continue;
      auto& o = v->get_object();
      auto const* idv = o.if_contains("id");
      if (idv != nullptr && idv->is_int64() && idv->get_int64() == id) return o;
      events.push_back(std::move(o));
    }
    return std::nullopt;
  }
  std::optional<json::object> call(std::int64_t id, std::string_view method,
                                   json::object params = {},
                                   std::chrono::milliseconds timeout = 10000ms) {
    json::object req{
        {"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
    if (!send_line(json::serialize(req))) return std::nullopt;
    return response(id, timeout);
  }
  // True when the peer closed the connection within `timeout`.
  bool closed_by_peer(std::chrono::milliseconds timeout = 5000ms) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char tmp[4096];
      ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n == 0) return true;
      if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
    }
    return false;
  }

  std::vector<json::object> events;

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buf_;
};

inline std::string error_code_of(json::object const& response) {
  auto const* err = response.if_contains("error");
  if (err == nullptr || !err->is_object()) return {};
  auto const* data = err->get_object().if_contains("data");
  if (data == nullptr || !data->is_object()) return {};
  auto const* code = data->get_object().if_contains("code");
  return code != nullptr && code->is_string() ? std::string{code->get_string()} : std::string{};
}

inline std::int64_t error_number_of(json::object const& response) {
  auto const* err = response.if_contains("error");
  if (err == nullptr || !err->is_object()) return 0;
  auto const* code = err->get_object().if_contains("code");
  return code != nullptr && code->is_int64() ? code->get_int64() : 0;
}

// Resident set size of a process in KiB (VmRSS), 0 when unreadable.
inline std::uint64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// Runs `fn` in a forked child that switched to uid/gid (with exactly `groups` as supplementary
// groups); whatever `fn` appends to its string comes back with the child's exit code
// ({exit status or 100 + signal, text}). The child is waited for by pid, so nothing is left.
inline std::pair<int, std::string> as_user_output(uid_t uid, gid_t gid,
                                                  std::vector<gid_t> const& groups,
                                                  std::function<int(std::string&)> const& fn) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {99, {}};
  pid_t const pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::setgroups(groups.size(), groups.data()) != 0) ::_exit(90);
    if (::setresgid(gid, gid, gid) != 0) ::_exit(91);
    if (::setresuid(uid, uid, uid) != 0) ::_exit(92);
    std::string out;
    int const rc = fn(out);
    std::size_t off = 0;
    while (off < out.size()) {
      ssize_t const n = ::write(fds[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    ::_exit(rc);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t const n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status), text};
}

// The same without output: fn's result is the child's exit code.
inline int as_user(uid_t uid, gid_t gid, std::vector<gid_t> const& groups,
                   std::function<int()> const& fn) {
  return as_user_output(uid, gid, groups, [&](std::string&) { return fn(); }).first;
}

inline uid_t nobody_uid() {
  passwd* pw = ::getpwnam("nobody");
  return pw != nullptr ? pw->pw_uid : 65534;
}

// authority.grant params for a runner: exec.native under /bin and /usr/bin, workspace w1 = /tmp
// (writable), env1, res1, literal env allowed, a budget of `executions`.
inline boost::json::object runner_grant(std::string const& principal, std::string const& id,
                                        std::uint64_t executions = 3) {
  namespace json = boost::json;
  return json::object{
      {"id", id},
      {"principal", principal},
      {"operations", json::array{"exec.native"}},
      {"executables", json::array{json::object{{"path", "/bin"}, {"prefix", true}},
                                  json::object{{"path", "/usr/bin"}, {"prefix", true}}}},
      {"workspaces", json::array{json::object{
                         {"workspace_id", "w1"}, {"root", "/tmp"}, {"max_access", "writable"}}}},
      {"environment_ids", json::array{"env1"}},
      {"resource_ids", json::array{"res1"}},
      {"literal_env", true},
      {"budget", json::object{{"executions", executions}}}};
}

struct DaemonOptions {
  std::vector<std::string> extra_args;
  bool use_cgroup = true;        // a private subtree under the v2 mount, removed at the end
  std::vector<std::string> env;  // NAME=VALUE added to the daemon's environment
  // A command the daemon is started through (absolute path first), e.g. setpriv with a reduced
  // capability bounding set.
  std::vector<std::string> wrapper;
  // The executable started as the daemon; empty: binary() (a private copy of the build's).
  std::string binary;
};

// One `custos daemon` child with its own state dir and socket. The state dir is outside /tmp and
// outside tmp(): the tests' workspaces are /tmp and directories under tmp(), and a workspace
// containing the daemon's state directory is refused (workspace.state_dir).
class Daemon {
 public:
  // With `state_tmpfs_size` (e.g. "32m"): the state directory's parent is a tmpfs of that size,
  // mounted before the first start and unmounted at the end (a file system that can fill up).
  explicit Daemon(DaemonOptions opts = {}, std::string const& state_tmpfs_size = {})
      : opts_(std::move(opts)) {
    state_ = state_dir_.path() / "state";
    socket_ = state_ / "custos.sock";
    if (opts_.use_cgroup && fs::exists("/sys/fs/cgroup/unified/cgroup.procs")) {
      cgroup_ = "/sys/fs/cgroup/unified/custos-test-e2e-" + unique_suffix();
    }
    if (!state_tmpfs_size.empty()) {
      std::string const data = "size=" + state_tmpfs_size + ",mode=0755";
      if (::mount("tmpfs", state_dir_.path().c_str(), "tmpfs", 0, data.c_str()) != 0)
        throw std::runtime_error(std::string{"mount tmpfs: "} + std::strerror(errno));
      tmpfs_mounted_ = true;
    }
    start();
  }
  Daemon(Daemon const&) = delete;
  Daemon& operator=(Daemon const&) = delete;
  ~Daemon() {
    if (pid_ > 0) {
      (void)signal(SIGKILL);
      (void)wait_exit(10s);
    }
    remove_cgroup();
    if (tmpfs_mounted_) (void)::umount2(state_dir_.path().c_str(), MNT_DETACH);
  }

  void start() {
    std::vector<std::string> args = opts_.wrapper;
    args.insert(args.end(), {opts_.binary.empty() ? binary() : opts_.binary, "daemon",
                             "--state-dir", state_.native(), "--log-file",
                             (dir_.path() / "daemon.log").native(), "--no-socket-activation"});
    if (!cgroup_.empty()) {
      args.push_back("--cgroup-subtree");
      args.push_back(cgroup_);
    }
    for (auto const& a : opts_.extra_args) args.push_back(a);
    pid_ = spawn(args, opts_.env);
    pidfd_ = pidfd_open(pid_);
    ready_ = wait_ready(20s);
  }

  static pid_t spawn(std::vector<std::string> const& args,
                     std::vector<std::string> const& env = {}) {
    pid_t pid = ::fork();
    if (pid == 0) {
      for (auto const& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (auto const& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      int devnull = ::open("/dev/null", O_RDWR);
      ::dup2(devnull, 0);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }

  bool wait_ready(std::chrono::milliseconds timeout) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      LineClient c{socket_};
      if (c.connected()) {
        auto r = c.call(1, "host.info");
        if (r && r->contains("result")) return true;
      }
      if (!alive()) return false;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  bool alive() const {
    if (pidfd_ < 0) return false;
    pollfd p{pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }

  bool signal(int sig) {
    if (pidfd_ < 0) return false;
    return ::syscall(SYS_pidfd_send_signal, pidfd_, sig, nullptr, 0) == 0;
  }

  // The exit status (waitpid), nullopt on timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return exit_status_;
    pollfd p{pidfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    ::close(pidfd_);
    pidfd_ = -1;
    pid_ = -1;
    exit_status_ = status;
    return status;
  }

  void remove_cgroup() {
    if (cgroup_.empty() || !fs::exists(cgroup_)) return;
    // Anything an execution left behind: kill it through the cgroup, then remove the dirs.
    std::error_code ec;
    for (auto const& entry : fs::directory_iterator(cgroup_, ec)) {
      if (!entry.is_directory()) continue;
      {
        std::ofstream k(entry.path() / "cgroup.kill");
        k << "1";
      }
      for (int i = 0; i < 100 && ::rmdir(entry.path().c_str()) != 0; ++i)
        std::this_thread::sleep_for(10ms);
    }
    {
      std::ofstream k(fs::path{cgroup_} / "cgroup.kill");
      k << "1";
    }
    for (int i = 0; i < 100 && ::rmdir(cgroup_.c_str()) != 0; ++i)
      std::this_thread::sleep_for(10ms);
  }

  std::string log() const {
    std::ifstream in(dir_.path() / "daemon.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // The environment additions of the next start() (a restart without a crash failpoint).
  void set_env(std::vector<std::string> env) { opts_.env = std::move(env); }

  [[nodiscard]] bool ready() const { return ready_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] fs::path const& socket() const { return socket_; }
  [[nodiscard]] fs::path const& state() const { return state_; }
  [[nodiscard]] fs::path const& tmp() const { return dir_.path(); }
  [[nodiscard]] std::string const& cgroup() const { return cgroup_; }
  LineClient client() const { return LineClient{socket_}; }

 private:
  DaemonOptions opts_;
  // Outside /tmp, the read-only workspace of start_params: what a test's program writes here
  // (logs, markers) must not land in a read-only workspace.
  TempDir dir_{"/var/tmp"};
  TempDir state_dir_{"/var/tmp"};
  fs::path state_;
  fs::path socket_;
  std::string cgroup_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool ready_ = false;
  std::optional<int> exit_status_;
  bool tmpfs_mounted_ = false;
};

struct CliResult {
  int status = -1;  // exit code, or 128+signal
  std::string out;
  std::string err;
};

// Runs `custos <args>` with `input` on stdin, capturing stdout and stderr.
inline CliResult run_cli(std::vector<std::string> const& args, std::string const& input = {},
                         std::vector<std::string> const& env_extra = {},
                         std::chrono::milliseconds timeout = 60s) {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  (void)::pipe2(in_pipe, O_CLOEXEC);
  (void)::pipe2(out_pipe, O_CLOEXEC);
  (void)::pipe2(err_pipe, O_CLOEXEC);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in_pipe[0], 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    for (auto const& e : env_extra) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    std::string bin = binary();
    argv.push_back(bin.data());
    for (auto const& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  std::thread writer([fd = in_pipe[1], input] {
    std::size_t off = 0;
    while (off < input.size()) {
      ssize_t n = ::write(fd, input.data() + off, input.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    ::close(fd);
  });
  CliResult r;
  int pidfd = pidfd_open(pid);
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    pollfd fds[2] = {{out_open ? out_pipe[0] : -1, POLLIN, 0},
                     {err_open ? err_pipe[0] : -1, POLLIN, 0}};
    if (std::chrono::steady_clock::now() > deadline) {
      ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      break;
    }
    if (::poll(fds, 2, 200) <= 0) continue;
    char buf[65536];
    for (int i = 0; i < 2; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  writer.join();
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(pidfd);
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace custos::e2e

namespace custos::e2e {

// exec.start params for `argv` (argv[0] absolute), pipes, workspace /tmp, unique action id.
inline json::object start_params(std::vector<std::string> const& argv, json::object limits = {},
                                 json::object io = {{"mode", "pipes"}}) {
  static std::atomic<int> n{0};
  std::string const uniq = unique_suffix() + "-" + std::to_string(n++);
  json::array a;
  for (auto const& s : argv) a.emplace_back(s);
  json::object plan{
      {"command", json::object{{"executable", argv.front()}, {"argv", std::move(a)}}},
      {"workspace", json::object{{"root", "/tmp"}, {"access", "read_only"}}},
      {"cwd", "."},
      {"env", json::array{json::object{{"name", "PATH"}, {"value", "/usr/bin:/bin"}}}},
      {"io", std::move(io)}};
  if (!limits.empty()) plan["limits"] = std::move(limits);
  json::object identity{
      {"project_id", "p1"},       {"session_id", "s1"},   {"run_id", "r1"},
      {"attempt_id", "a1"},       {"turn_id", "t1"},      {"action_id", "act-" + uniq},
      {"process_id", "proc-1"},   {"workspace_id", "w1"}, {"resource_id", "res1"},
      {"environment_id", "env1"}, {"generation", 1},      {"revision", 1}};
  return json::object{
      {"identity", std::move(identity)},
      {"plan", std::move(plan)},
      {"authority", json::object{{"epoch", 0}, {"grant_id", nullptr}, {"lease_id", nullptr}}}};
}

// Polls exec.get until `pred(record)` holds; returns the last record.
template <class Pred>
std::optional<json::object> wait_record(LineClient& c, std::string const& id, Pred pred,
                                        std::chrono::milliseconds timeout = 20s) {
  static std::atomic<std::int64_t> rid{100000};
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<json::object> last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = c.call(rid++, "exec.get", {{"execution_id", id}});
    if (r && r->contains("result")) {
      last = r->at("result").as_object();
      if (pred(*last)) return last;
    }
    std::this_thread::sleep_for(20ms);
  }
  return last;
}

// A started execution: its id and a pidfd on its root (-1 when the start failed).
struct Started {
  std::string id;
  int pidfd = -1;
};

// exec.start of `argv` on `c`; with `until_running`, also waits until exec.get says running.
// Test failures are reported through gtest; the caller closes the pidfd.
inline Started start_execution(LineClient& c, std::vector<std::string> const& argv,
                               bool until_running) {
  Started s;
  auto r = c.call(1, "exec.start", start_params(argv));
  EXPECT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "no reply");
  if (!r || !r->contains("result")) return s;
  s.id = std::string{r->at("result").at("execution_id").as_string()};
  s.pidfd = pidfd_open(static_cast<pid_t>(r->at("result").at("pid").as_int64()));
  EXPECT_GE(s.pidfd, 0);
  if (until_running) {
    EXPECT_TRUE(wait_record(
        c, s.id, [](json::object const& x) { return x.at("phase").as_string() == "running"; }));
  }
  return s;
}

// Waits for the image that serves to change (host.info's started_ns).
inline bool await_handover(Daemon const& d, std::int64_t before_ns) {
  auto const deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto c = d.client();
    auto r = c.call(1, "host.info", {}, 2000ms);
    if (r && r->contains("result") && r->at("result").at("started_ns").as_int64() != before_ns) {
      return true;
    }
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

inline std::int64_t started_ns(Daemon const& d) {
  auto c = d.client();
  auto r = c.call(1, "host.info");
  return r && r->contains("result") ? r->at("result").at("started_ns").as_int64() : 0;
}

// Every byte of a stream through exec.output; `complete` is the last slice's.
inline std::string output_of(LineClient& c, std::string const& id, std::string const& stream,
                             bool* complete = nullptr, std::string* error = nullptr) {
  static std::atomic<std::int64_t> rid{3000};
  std::string out;
  for (int i = 0; i < 1000; ++i) {
    auto r = c.call(
        rid++, "exec.output",
        {{"execution_id", id}, {"stream", stream}, {"offset", out.size()}, {"max_bytes", 1 << 20}});
    if (!r || !r->contains("result")) {
      if (error != nullptr && r) *error = error_code_of(*r);
      return out;
    }
    auto const& o = r->at("result").as_object();
    auto data = core::base64_decode(o.at("data_b64").as_string());
    if (!data) {
      ADD_FAILURE() << "data_b64 is not base64";
      return out;
    }
    out.append(data->begin(), data->end());
    if (complete != nullptr) *complete = o.at("complete").as_bool();
    if (o.at("eof").as_bool() || data->empty()) return out;  // the end, or all there is now
  }
  ADD_FAILURE() << "exec.output never reached eof";
  return out;
}

inline bool pid_alive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace custos::e2e
