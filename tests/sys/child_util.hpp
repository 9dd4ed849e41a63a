// Runs a function in a plain forked child and reports how the child ended: for the tests of
// restrictions a process applies to itself (Landlock, seccomp), which must not touch the test
// process. The child never returns into test code: it leaves with _exit (no atexit handlers, so
// no sanitizer runtime work after a restriction that might forbid it).
#pragma once

#include <functional>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/sys/pidfd.hpp"

namespace custos::sys::testing {

// Exit codes a child uses when its setup (before the checked operation) failed.
inline constexpr int kChildSetupFailed = 250;

// Forks; the child runs `body` and exits with its result (an errno for the operation tried, 0
// for success, by convention). Returns the child's status, or nullopt when fork or wait failed.
inline std::optional<ExitStatus> run_in_child(std::function<int()> const& body) {
  pid_t const pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) ::_exit(body());
  auto pfd = Pidfd::open(pid);
  if (!pfd) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return std::nullopt;
  }
  auto st = pfd->wait();
  if (!st) return std::nullopt;
  return *st;
}

// The errno of a syscall-style result: 0 when `rc` is not negative.
inline int errno_of(long rc) {
  return rc < 0 ? errno : 0;
}

}  // namespace custos::sys::testing
