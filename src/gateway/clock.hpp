// The wall clock the gateway stamps authority with (grants, leases, expiry, evidence).
#pragma once

#include <cstdint>
#include <time.h>

namespace custos::gateway {

// CLOCK_REALTIME in nanoseconds since the epoch.
inline std::int64_t realtime_ns() noexcept {
  timespec ts{};
  (void)clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace custos::gateway
