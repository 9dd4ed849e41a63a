// The helper modes of custos_bench: tiny programs the product rows launch through custos, so a
// row needs nothing from the host but this binary (and they are the same code the floors use).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <signal.h>
#include <string>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.hpp"

namespace custos::bench {

void fork_tree(int n) {
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;  // children that exit (the double-fork middles) are reaped by the kernel
  ::sigaction(SIGCHLD, &sa, nullptr);
  for (int k = 0; k < n - 1; ++k) {
    pid_t const pid = ::fork();
    if (pid < 0) ::_exit(1);
    if (pid != 0) continue;
    // Descendants let go of the execution's stdio, so only the root holds its pipes.
    int const devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
    switch (k % 3) {
      case 0:
        break;
      case 1:
        ::setsid();
        break;
      default:
        if (::fork() != 0) ::_exit(0);
        ::setsid();
        break;
    }
    for (;;) ::pause();
  }
}

namespace {

int helper_write(std::uint64_t total) {
  static char buf[64 * 1024];
  std::memset(buf, 'x', sizeof buf);
  while (total > 0) {
    std::size_t const want = total < sizeof buf ? static_cast<std::size_t>(total) : sizeof buf;
    ssize_t const w = ::write(1, buf, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    total -= static_cast<std::uint64_t>(w);
  }
  return 0;
}

[[noreturn]] void helper_tree(int n) {
  fork_tree(n);
  static char const ready[] = "ready\n";
  [[maybe_unused]] auto const w = ::write(1, ready, sizeof ready - 1);
  for (;;) ::pause();
}

// One kDripLine-byte line on stdout every `interval_ms` until `stop` exists, then the number of
// lines on stderr. Lines are numbered, so the whole stdout is known from that count.
int helper_drip(long interval_ms, char const* stop) {
  timespec const pause{interval_ms / 1000, (interval_ms % 1000) * 1000000L};
  std::uint64_t lines = 0;
  struct stat st {};
  while (::stat(stop, &st) != 0) {
    char line[kDripLine + 1];
    std::snprintf(line, sizeof line, "%010llu drip\n", static_cast<unsigned long long>(lines));
    // A pipe write of fewer than PIPE_BUF bytes is whole or fails; a failure is a lost line.
    if (::write(1, line, kDripLine) != static_cast<ssize_t>(kDripLine)) return 1;
    ++lines;
    ::nanosleep(&pause, nullptr);
  }
  char tail[32];
  int const n = std::snprintf(tail, sizeof tail, "%llu\n", static_cast<unsigned long long>(lines));
  return ::write(2, tail, static_cast<std::size_t>(n)) == n ? 0 : 1;
}

[[noreturn]] void helper_sleep() {
  for (;;) ::pause();
}

}  // namespace

std::optional<int> run_helper(int argc, char** argv) {
  if (argc < 2) return std::nullopt;
  std::string const mode = argv[1];
  if (mode == "--helper-write" && argc == 3)
    return helper_write(std::strtoull(argv[2], nullptr, 10));
  if (mode == "--helper-tree" && argc == 3) helper_tree(std::atoi(argv[2]));
  if (mode == "--helper-sleep" && argc == 2) helper_sleep();
  if (mode == "--helper-drip" && argc == 4) return helper_drip(std::atol(argv[2]), argv[3]);
  return std::nullopt;
}

}  // namespace custos::bench
