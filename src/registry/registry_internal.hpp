// Internal: helpers the registry's source files share (write-path strictness, claim checks).
#pragma once

#include <functional>
#include <initializer_list>
#include <string_view>

#include "custos/core/result.hpp"
#include "custos/registry/registry.hpp"

namespace custos::registry::detail {

// The durability a shared transaction commits with: normal < group < full.
inline int strictness(Durability d) {
  switch (d) {
    case Durability::normal:
      return 0;
    case Durability::group:
      return 1;
    case Durability::full:
      return 2;
  }
  return 2;
}
inline Durability stricter(Durability a, Durability b) {
  return strictness(a) >= strictness(b) ? a : b;
}

// The claim's durability: FULL, or group (FULL's fsync made by the flusher, awaited by the
// caller before anything acts on the claim). Never NORMAL: a consumed authorization must
// not come back after a power loss.
inline Durability claim_durability(Durability d) {
  return d == Durability::group ? Durability::group : Durability::full;
}

// A claim names its action, process and execution.
[[nodiscard]] Result<void> check_claim_ids(std::string_view action_id, std::string_view process_id,
                                           std::string_view execution_id);

// An asynchronous write's completion, with the failpoints its synchronous form fires after
// its commit: a crash there leaves exactly what the immediate write leaves.
[[nodiscard]] std::function<void(Result<void>)> after_commit(
    std::initializer_list<char const*> points, std::function<void(Result<void>)> done);

}  // namespace custos::registry::detail
