// The executions part of the handover manifest: supervisor::Carried as JSON and back
// (handover_carried.cpp; the format is in docs/supervisor.md, "Handover").
#pragma once

#include <boost/json.hpp>

#include <vector>

#include "custos/core/result.hpp"
#include "custos/supervisor/types.hpp"

namespace custos::daemon::handover {

// One execution's entry: its stdio descriptors by number with the device and inode each had,
// its streams, input and retained events (output bytes in base64).
[[nodiscard]] boost::json::object carried_json(supervisor::Carried const& c);
// The descriptor numbers `c` holds, which the execve must keep open.
[[nodiscard]] std::vector<int> carried_fds(supervisor::Carried const& c);
// An entry back, every descriptor it names taken over (O_CLOEXEC) and verified: still the file
// the entry recorded (device and inode), and a pipe or a terminal. Errors:
// daemon.handover_failed naming the execution and the check (its descriptors are then closed).
[[nodiscard]] Result<supervisor::Carried> carried_from_json(boost::json::value const& v);

}  // namespace custos::daemon::handover
