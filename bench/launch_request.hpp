// The launch request every in-process product row starts from: one fixed identity whose action
// id changes per launch (each launch consumes a claim of its own), run by the bench's own uid.
#pragma once

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>

#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/types.hpp"

namespace custos::bench {

[[nodiscard]] inline supervisor::LaunchRequest bench_request(std::uint64_t action_seq,
                                                             std::uint64_t revision = 1) {
  supervisor::LaunchRequest r;
  auto& id = r.identity;
  id.project_id = "bench";
  id.session_id = "bench";
  id.run_id = "r1";
  id.attempt_id = "a1";
  id.turn_id = "t1";
  id.action_id = "act-" + std::to_string(action_seq);
  id.process_id = "proc-1";
  id.workspace_id = "w1";
  id.resource_id = "res1";
  id.environment_id = "env1";
  id.generation = 1;
  id.revision = revision;
  r.caller = supervisor::CallerCreds{static_cast<std::uint32_t>(::geteuid()),
                                     static_cast<std::uint32_t>(::getegid()), ::getpid()};
  return r;
}

// The manager configuration the in-process rows share: executions in cgroups beneath `subtree`
// (the marker boundary when the run has no writable cgroup), state under `dir`/state.
[[nodiscard]] inline supervisor::ManagerConfig bench_manager_config(
    std::string const& subtree, std::filesystem::path const& dir) {
  supervisor::ManagerConfig cfg;
  cfg.cgroup_subtree = subtree;
  cfg.boundary = subtree.empty() ? supervisor::BoundaryPreference::marker
                                 : supervisor::BoundaryPreference::cgroup;
  cfg.state_dir = dir / "state";
  return cfg;
}

// Runs `io` until `pred` holds (true) or `timeout` passes (false). A completion callback that
// calls io.stop() ends the current slice at once, so a launch's latency is not rounded up to the
// slice; the slice only bounds how often a predicate no callback announces is re-checked.
inline bool drive_until(boost::asio::io_context& io, std::function<bool()> const& pred,
                        std::chrono::milliseconds timeout,
                        std::chrono::milliseconds slice = std::chrono::milliseconds(20)) {
  using Clock = std::chrono::steady_clock;
  auto const deadline = Clock::now() + timeout;
  while (!pred()) {
    auto const now = Clock::now();
    if (now >= deadline) return false;
    io.restart();
    io.run_for(std::min<Clock::duration>(slice, deadline - now));
  }
  return true;
}

// A row's teardown while its manager still runs executions: cancel them all and run the loop
// until their terminal records are written (bounded).
inline void cancel_remaining(supervisor::ExecutionManager& mgr, boost::asio::io_context& io) {
  using namespace std::chrono_literals;
  if (mgr.live_count() == 0) return;
  bool done = false;
  mgr.shutdown(supervisor::ShutdownPolicy::cancel, 20s, [&] {
    done = true;
    io.stop();
  });
  (void)drive_until(
      io, [&] { return done; }, 30s);
}

// A row's teardown once its manager is gone: the subtree (empty by then, but the kernel may
// report it busy for a moment after its last process was reaped) and the row's directory.
inline void remove_bench_dirs(std::string const& subtree, std::filesystem::path const& dir) {
  if (!subtree.empty()) {
    for (int i = 0; i < 2000 && ::rmdir(subtree.c_str()) != 0 && errno == EBUSY; ++i)
      ::usleep(1000);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace custos::bench
