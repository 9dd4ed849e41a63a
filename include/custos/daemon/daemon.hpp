// `custos daemon`: start-up as named steps, the event loop, and shutdown.
#pragma once

#include "custos/daemon/config.hpp"

namespace custos::daemon {

// Runs the daemon until SIGTERM/SIGINT and returns the process exit code: 0 after a clean
// shutdown, 1 when start-up failed (the reason is logged with its stable code).
// SIGHUP hands over to a new image of the binary (docs/operations.md, "Handover"); SIGUSR1
// reopens the log file.
[[nodiscard]] int run(DaemonConfig const& config);

// `custos daemon --check-config`: resolves the configuration as run() would and says whether it
// is accepted, creating and locking nothing (the handover's pre-flight runs it with the new
// image). 0: accepted; 1: refused (the reason on stderr).
[[nodiscard]] int check(DaemonConfig const& config);

}  // namespace custos::daemon
