// The backends' shared helpers (the descriptor itself is the sandbox layer's: admission.hpp).
#include "custos/backend/backend.hpp"

namespace custos::backend {

core::SpawnFailure step_failure(std::string step, Error const& e) {
  return core::SpawnFailure{std::move(step), e.sys_errno, e.message()};
}

}  // namespace custos::backend
