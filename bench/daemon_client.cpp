// A release daemon started for a bench area, and the line-oriented JSON-RPC client the rows use.
#include "daemon_client.hpp"

#include <cstring>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace custos::bench {

int connect_unix(std::string const& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends one line, reads until one full line came back.
bool round_trip(int fd, std::string const& line, std::string& buf) {
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return false;
  }
  for (;;) {
    auto nl = buf.find('\n');
    if (nl != std::string::npos) {
      buf.erase(0, nl + 1);
      return true;
    }
    char tmp[65536];
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<std::size_t>(n));
  }
}

// Reads one line into `out`.
bool read_line(int fd, std::string& buf, std::string& out) {
  for (;;) {
    auto nl = buf.find('\n');
    if (nl != std::string::npos) {
      out = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return true;
    }
    char tmp[65536];
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<std::size_t>(n));
  }
}

DaemonProc::~DaemonProc() {
  if (pidfd < 0) return;
  ::syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0);
  pollfd p{pidfd, POLLIN, 0};
  if (::poll(&p, 1, 20000) <= 0) ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ::close(pidfd);
}

bool start_daemon(Env const& env, std::string const& name, DaemonProc& d) {
  std::string const state = env.work_dir + "/" + name + "-state";
  d.socket = state + "/custos.sock";
  std::vector<std::string> args{env.custos_path,
                                "daemon",
                                "--state-dir",
                                state,
                                "--log-target",
                                "file",
                                "--log-file",
                                env.work_dir + "/" + name + "-daemon.log",
                                "--log-level",
                                "warning",
                                "--no-socket-activation"};
  if (!env.cgroup_root.empty()) {
    args.insert(args.end(), {"--cgroup-subtree", env.cgroup_root + "/" + name});
  }
  d.pid = ::fork();
  if (d.pid == 0) {
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  d.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, d.pid, 0));
  // Polled every 2 ms (10 s in all): the handover row times a fresh start with this.
  for (int i = 0; i < 5000; ++i) {
    int fd = connect_unix(d.socket);
    if (fd >= 0) {
      std::string buf;
      bool ok = round_trip(fd,
                           R"({"jsonrpc":"2.0","method":"host.info","id":1})"
                           "\n",
                           buf);
      ::close(fd);
      if (ok) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

}  // namespace custos::bench
