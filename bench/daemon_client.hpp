// A release `custos daemon` started for one bench area, and a minimal line client for its socket
// (the rpc and container rows).
#pragma once

#include <string>
#include <sys/types.h>

#include "bench.hpp"

namespace custos::bench {

// A Unix stream socket connected to `path`, or -1.
[[nodiscard]] int connect_unix(std::string const& path);
// Sends one line, reads until one full line came back (dropped).
[[nodiscard]] bool round_trip(int fd, std::string const& line, std::string& buf);
// Reads one line into `out`.
[[nodiscard]] bool read_line(int fd, std::string& buf, std::string& out);

// The daemon; stopped (SIGTERM through its pidfd, SIGKILL after 20 s) and reaped when destroyed.
struct DaemonProc {
  pid_t pid = -1;
  int pidfd = -1;
  std::string socket;
  DaemonProc() = default;
  DaemonProc(DaemonProc const&) = delete;
  DaemonProc& operator=(DaemonProc const&) = delete;
  ~DaemonProc();
};

// Starts env.custos_path as a daemon with state in <work_dir>/<name>-state, its log in
// <work_dir>/<name>-daemon.log and its cgroup subtree <cgroup_root>/<name>; true once it answers
// host.info.
[[nodiscard]] bool start_daemon(Env const& env, std::string const& name, DaemonProc& d);

}  // namespace custos::bench
