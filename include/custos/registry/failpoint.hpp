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
//   before_staged    registry, at the start of record_staged: the launch created the cgroup and
//                    the child (at its barrier), the record does not name them yet
//   after_staged     registry, after the staged pidfs ownership committed (child at its barrier)
//   after_committed  registry, after ownership moved to committed (barrier about to be released)
//   while_running    registry, after the phase `running` committed
//   while_stopping   registry, after the phase `stopping` committed
//   before_terminal  registry, just before the terminal record transaction
//
// Behaviour failpoints (failpoint_set, read once when the durability flusher starts, i.e. at the
// registry's first group commit; they kill nothing):
//   flusher_fsync_fails  the flusher's fdatasync fails with EIO (the registry.io path)
//   flusher_slow         the flusher waits 50 ms before each flush (tests of what shares one)
//   authorizer_slow      the gateway's authorizer waits 50 ms before each authorizing
//                        transaction (read when the gateway is made; tests of starts in flight)
//   wal_write_fails      the WAL VFS's write of held frames fails with SQLITE_IOERR_WRITE (read
//                        at each such write; wal_vfs.hpp)
//   handover_start_fails a handed-over image (not a fallback) fails its start at the listen step
//   handover_slow        a handover waits 2 s between the old image's end and the execve
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
// True when CUSTOS_FAILPOINT names `name` (behaviour failpoints: the caller changes what it does).
inline bool failpoint_set(std::string_view name) noexcept {
  char const* want = std::getenv(kFailpointEnv.data());
  return want != nullptr && name == want;
}
inline constexpr bool kFailpointsCompiled = true;
#else
inline void failpoint(std::string_view /*name*/) noexcept {}
inline bool failpoint_set(std::string_view /*name*/) noexcept {
  return false;
}
inline constexpr bool kFailpointsCompiled = false;
#endif

}  // namespace custos::registry
