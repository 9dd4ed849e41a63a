// Crash failpoints for durability tests.
//
// `failpoint("after_claim")` kills the calling process with SIGKILL when the environment variable
// CUSTOS_FAILPOINT names exactly that point, to simulate a daemon crash at that instant (no
// destructors, no atexit, no flush: the same as an OOM kill or `kill -9`). Compiled in only when
// CUSTOS_FAILPOINTS is defined (the `dev` preset); in release builds the call is an empty inline
// function and the names cost nothing.
//
// Points and where they are hit (docs/durability.md):
//   after_claim      registry, after the one-use claim transaction committed
//   after_staged     registry, after the staged pidfs ownership committed (child at its barrier)
//   after_committed  registry, after ownership moved to committed (barrier about to be released)
//   while_running    registry, after the phase `running` committed
//   while_stopping   registry, after the phase `stopping` committed
//   before_terminal  registry, just before the terminal record transaction
#pragma once

#include <string_view>

#if defined(CUSTOS_FAILPOINTS)
#include <csignal>
#include <cstdlib>
#endif

namespace custos::registry {

inline constexpr std::string_view kFailpointEnv = "CUSTOS_FAILPOINT";

#if defined(CUSTOS_FAILPOINTS)
inline void failpoint(std::string_view name) noexcept {
  // Read on every call (not cached) so a test can set the variable in a forked child.
  char const* want = std::getenv(kFailpointEnv.data());
  if (want != nullptr && name == want) {
    (void)std::raise(SIGKILL);
  }
}
inline constexpr bool kFailpointsCompiled = true;
#else
inline void failpoint(std::string_view /*name*/) noexcept {}
inline constexpr bool kFailpointsCompiled = false;
#endif

}  // namespace custos::registry
