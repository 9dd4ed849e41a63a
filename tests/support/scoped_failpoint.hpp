// ScopedFailpoint: sets CUSTOS_FAILPOINT for a scope (include/custos/registry/failpoint.hpp).
// Behaviour failpoints are read once, by the thread that acts on them, when it starts (the
// registry's flusher at its first group commit, the gateway when it is made): set it before
// that and keep it until that object is gone.
#pragma once

#include <cstdlib>

#include "custos/registry/failpoint.hpp"

namespace custos::testing {

class ScopedFailpoint {
 public:
  explicit ScopedFailpoint(char const* name) { ::setenv(registry::kFailpointEnv.data(), name, 1); }
  ~ScopedFailpoint() { ::unsetenv(registry::kFailpointEnv.data()); }
  ScopedFailpoint(ScopedFailpoint const&) = delete;
  ScopedFailpoint& operator=(ScopedFailpoint const&) = delete;
};

}  // namespace custos::testing
