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
#include <memory>
#include <optional>
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

// A launch in the event-loop form (ExecutionManager::start_async, the daemon's one launch path):
// calls its argument with the start's result, at once or later from the loop.
using AsyncStart = std::function<void(std::function<void(Result<supervisor::StartResult>)>)>;

// Keeps `in_flight_max` executions from `start` running on `mgr` (its loop `io`) until `total`
// have ended or `deadline` passes; launches per second over the wall time, or nothing with `why`
// set when a start failed, an execution did not end `exited`, or time ran out. The counters are
// shared with the wait callbacks, so one that fires after the return (a timed-out run, then the
// harness's teardown) touches nothing gone.
inline std::optional<double> launches_per_second(supervisor::ExecutionManager& mgr,
                                                 boost::asio::io_context& io,
                                                 AsyncStart const& start, std::size_t in_flight_max,
                                                 std::size_t total,
                                                 std::chrono::steady_clock::time_point deadline,
                                                 std::string& why) {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  struct Counts {
    std::size_t started = 0, finished = 0, in_flight = 0;
    bool failed = false;
    std::string why;
  };
  auto c = std::make_shared<Counts>();
  auto const t0 = Clock::now();
  while (c->finished < total && !c->failed && Clock::now() < deadline) {
    while (c->in_flight < in_flight_max && c->started < total && !c->failed) {
      ++c->started;
      ++c->in_flight;
      // Counted in flight from the request: a slot is busy while its launch awaits the fsync
      // and the child's verdict, as for a client of the daemon.
      start([c, &mgr, &io](Result<supervisor::StartResult> r) {
        if (!r) {
          c->why = "start failed: " + r.error().message();
          c->failed = true;
          --c->in_flight;
          io.stop();
          return;
        }
        mgr.wait(r->execution_id, 10s, [c, &io](Result<core::TerminalRecord> t) {
          --c->in_flight;
          ++c->finished;
          if (!t || t->classification != core::Classification::exited) c->failed = true;
          io.stop();
        });
      });
    }
    // Back to launching when a slot is free and launches remain; in the tail (all started)
    // only completions matter.
    (void)drive_until(
        io,
        [&] {
          return (c->in_flight < in_flight_max && c->started < total) || c->failed ||
                 c->finished >= total;
        },
        10s);
  }
  double const secs = std::chrono::duration<double>(Clock::now() - t0).count();
  (void)drive_until(
      io, [&] { return c->in_flight == 0; }, 20s);
  if (c->failed) {
    why = c->why.empty() ? "an execution did not end as exited" : c->why;
    return std::nullopt;
  }
  if (c->finished < total) {
    why = "the run's time limit was reached";
    return std::nullopt;
  }
  return static_cast<double>(c->finished) / secs;
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
