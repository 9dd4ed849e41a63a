// Tests drive the gateway's one launch path (ExecutionGateway::start_async, the daemon's
// exec.start) to its answer by running the loop, as the daemon's loop would.
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <memory>
#include <optional>

#include "custos/gateway/gateway.hpp"

namespace custos::gateway {

// Runs `io` until the start is answered (a bound: 30 s).
[[nodiscard]] inline Result<supervisor::StartResult> start_and_wait(
    ExecutionGateway& gw, boost::asio::io_context& io, Caller const& caller,
    supervisor::LaunchRequest request, AuthorityClaim const& claim) {
  auto got = std::make_shared<std::optional<Result<supervisor::StartResult>>>();
  gw.start_async(caller, std::move(request), claim,
                 [got](Result<supervisor::StartResult> r) { *got = std::move(r); });
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!got->has_value() && std::chrono::steady_clock::now() < deadline) {
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(5));
  }
  if (!got->has_value()) return Error(Errc::internal, "the start was not answered in 30 s");
  return std::move(**got);
}

}  // namespace custos::gateway
