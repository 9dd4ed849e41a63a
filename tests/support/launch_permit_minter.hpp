// TestPermitMinter: mints supervisor::LaunchPermit for code that drives the ExecutionManager
// below the gateway — the supervisor and gateway test suites, the registry-only launch path of
// the tests and the benchmark's baselines. It is the one definition of the class declared in
// include/custos/supervisor/launch_permit.hpp; it lives under tests/support (the benchmark
// includes it from here) and scripts/lint fails when any file under src/ defines it, so the
// daemon can mint a permit only through its gateway.
//
// It authorizes nothing: a test that wants authority checked goes through ExecutionGateway.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "custos/core/plan_canonical.hpp"
#include "custos/supervisor/launch_permit.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/types.hpp"

namespace custos::supervisor {

class TestPermitMinter {
 public:
  // A permit for exactly `request` (its digest and claim) under a fresh execution id.
  // `user_checked` = true stands for a minter that checked plan.user itself.
  [[nodiscard]] static Result<LaunchPermit> for_request(LaunchRequest const& request,
                                                        bool user_checked = false) {
    auto digest = core::plan_digest(request.identity, request.plan);
    if (!digest) return digest.error();
    auto id = new_execution_id();
    if (!id) return id.error();
    return mint(std::move(*id), request.identity.action_id, request.identity.process_id,
                digest->to_string(), user_checked);
  }

  // Any permit at all, for the tests that check start() refuses a mismatched one.
  [[nodiscard]] static LaunchPermit mint(std::string execution_id, std::string action_id,
                                         std::string process_id, std::string plan_digest,
                                         bool user_checked = false) {
    return LaunchPermit{std::move(execution_id), std::move(action_id), std::move(process_id),
                        std::move(plan_digest), user_checked};
  }
};

// Starts `request` under `permit` through the daemon's launch path (start_async), running the
// manager's loop until the launch is answered (a bound: 30 s).
[[nodiscard]] inline Result<StartResult> start_with_permit(ExecutionManager& manager,
                                                           LaunchRequest request,
                                                           LaunchPermit permit) {
  auto got = std::make_shared<std::optional<Result<StartResult>>>();
  manager.start_async(std::move(request), std::move(permit),
                      [got](Result<StartResult> r) { *got = std::move(r); });
  auto& io = manager.io();
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!got->has_value() && std::chrono::steady_clock::now() < deadline) {
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(5));
  }
  if (!got->has_value()) return Error(Errc::internal, "the launch was not answered in 30 s");
  return std::move(**got);
}

// The common case of a test: start `request` under a permit minted for it.
[[nodiscard]] inline Result<StartResult> start_with_test_permit(ExecutionManager& manager,
                                                                LaunchRequest request,
                                                                bool user_checked = false) {
  auto permit = TestPermitMinter::for_request(request, user_checked);
  if (!permit) return permit.error();
  return start_with_permit(manager, std::move(request), std::move(*permit));
}

// The same without waiting: `done` as in ExecutionManager::start_async.
inline void start_async_with_test_permit(ExecutionManager& manager, LaunchRequest request,
                                         ExecutionManager::StartDone done) {
  auto permit = TestPermitMinter::for_request(request);
  if (!permit) return done(permit.error());
  manager.start_async(std::move(request), std::move(*permit), std::move(done));
}

}  // namespace custos::supervisor
