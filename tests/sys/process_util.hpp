// Helpers for tests that launch real processes through spawn_staged.
#pragma once

#include <chrono>
#include <poll.h>
#include <string>
#include <unistd.h>

#include "custos/sys/spawn.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys::testing {

// Reads until EOF or until `timeout` passes (then returns what arrived; the test fails on it).
inline std::string read_until_eof(UniqueFd const& fd,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::string out;
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd.get(), POLLIN, 0};
    int const r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      break;
    }
    ssize_t const n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

struct RunOutput {
  ExitStatus status;
  std::string out;
};

// Spawns `spec` with stdout captured, releases it, reads stdout to EOF and reaps the child.
inline Result<RunOutput> run_capture(SpawnSpec spec) {
  auto pipe = CUSTOS_TRY(make_pipe());
  spec.stdout_fd = pipe.second.get();
  auto staged = CUSTOS_TRY(spawn_staged(spec));
  pipe.second.reset();
  auto running = CUSTOS_TRY(std::move(staged).release());
  RunOutput r;
  r.out = read_until_eof(pipe.first);
  r.status = CUSTOS_TRY(running.pidfd().wait());
  return r;
}

inline SpawnSpec simple_spec(std::string exe, std::vector<std::string> argv) {
  SpawnSpec s;
  s.executable = std::move(exe);
  s.argv = std::move(argv);
  s.envp = {"PATH=/usr/bin:/bin"};
  return s;
}

}  // namespace custos::sys::testing
