// `custos daemon`: start-up as named steps, the event loop, and shutdown.
#pragma once

#include "custos/daemon/config.hpp"

namespace custos::daemon {

// Runs the daemon until SIGTERM/SIGINT and returns the process exit code: 0 after a clean
// shutdown, 1 when start-up failed (the reason is logged with its stable code).
[[nodiscard]] int run(DaemonConfig const& config);

}  // namespace custos::daemon
