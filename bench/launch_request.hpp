// The launch request every in-process product row starts from: one fixed identity whose action
// id changes per launch (each launch consumes a claim of its own), run by the bench's own uid.
#pragma once

#include <cstdint>
#include <string>
#include <unistd.h>

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

}  // namespace custos::bench
