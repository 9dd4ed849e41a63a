// The lifecycle reducer: the only code that decides whether a phase transition is legal.
//
//   authorized -> starting -> running -> stopping -> exited -> closed -> terminal
//                    |           \___________________^
//                    \--(spawn failed)------------------------------------> terminal
//
// A process may exit while running or while stopping; stopping is entered from running only;
// closed needs exited; terminal comes from closed, or from starting after a spawn failure, or
// (startup recovery only, with classification recovery_indeterminate) from any non-terminal
// phase. Exactly one terminal result is ever accepted: every event after it is
// Errc::lifecycle_already_terminal. docs/lifecycle.md draws the same machine.
//
// A supervisor that adopts a live execution after a daemon restart (its root re-acquired by
// exact pidfs identity) did not see its launch: it enters the machine with `adopted`, which
// places a fresh state (authorized, nothing recorded) in the phase the stored record is already
// in — starting, running or stopping — and the execution goes on from there like any other.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"

namespace custos::core {

enum class Phase : std::uint8_t {
  authorized,
  starting,
  running,
  stopping,
  exited,
  closed,
  terminal
};
inline constexpr std::size_t kPhaseCount = 7;

[[nodiscard]] std::string_view phase_wire(Phase p) noexcept;
[[nodiscard]] std::optional<Phase> phase_from_wire(std::string_view wire) noexcept;
// Position in the order above; the reducer never lowers it.
[[nodiscard]] constexpr int phase_rank(Phase p) noexcept {
  return static_cast<int>(p);
}

// One legal step, as the registry checks stored phase changes. `via` names how a terminal record
// was reached: only absent_without_terminal and indeterminate may jump to terminal from any
// non-terminal phase. Equal phases are not a progression (false).
[[nodiscard]] bool is_legal_progression(Phase from, Phase to,
                                        RecoveryPath via = RecoveryPath::observed) noexcept;

namespace event {
// The gateway's permit was handed to a supervisor, which now prepares and clones.
struct SpawnRequested {
  friend bool operator==(SpawnRequested, SpawnRequested) = default;
};
// The child's ownership was committed and its barrier released: the target program runs.
struct Spawned {
  friend bool operator==(Spawned, Spawned) = default;
};
// The target program never started (exec error, setup error, clone failure).
struct SpawnFailed {
  SpawnFailure failure;
  friend bool operator==(SpawnFailed const&, SpawnFailed const&) = default;
};
// A cancellation trigger was accepted and the supervisor begins escalation.
struct StopRequested {
  friend bool operator==(StopRequested, StopRequested) = default;
};
// The root process's exit was observed (from running or stopping).
struct Exited {
  ExitStatus status;
  friend bool operator==(Exited const&, Exited const&) = default;
};
// Every reader reached EOF, every support task was joined and the tree was swept.
struct Closed {
  friend bool operator==(Closed, Closed) = default;
};
// A supervisor took over a live execution a previous daemon launched (recovery re-acquired its
// root by exact pidfs identity): the stored record is already in `phase` (starting, running or
// stopping). Only as the first event of a fresh state: it replaces the launch this supervisor
// never saw. Not a stored progression (the record is in that phase already).
struct Adopted {
  Phase phase = Phase::running;
  friend bool operator==(Adopted, Adopted) = default;
};
// The one terminal record was durably written.
struct TerminalRecorded {
  Classification classification;
  RecoveryPath recovery = RecoveryPath::observed;
  friend bool operator==(TerminalRecorded const&, TerminalRecorded const&) = default;
};
}  // namespace event

using LifecycleEvent =
    std::variant<event::SpawnRequested, event::Spawned, event::SpawnFailed, event::StopRequested,
                 event::Exited, event::Closed, event::TerminalRecorded, event::Adopted>;

// Stable name of an event kind ("spawn_requested", ..., "terminal_recorded", "adopted").
[[nodiscard]] std::string_view event_name(LifecycleEvent const& e) noexcept;

struct LifecycleState {
  Phase phase = Phase::authorized;
  std::optional<SpawnFailure> spawn_failure;     // set by SpawnFailed (phase stays starting)
  std::optional<ExitStatus> exit;                // set by Exited
  std::optional<Classification> classification;  // set by TerminalRecorded
  std::optional<RecoveryPath> recovery;          // set by TerminalRecorded

  friend bool operator==(LifecycleState const&, LifecycleState const&) = default;
};

// The pure reducer. Errors:
//   lifecycle_already_terminal    any event once the state is terminal
//   lifecycle_illegal_transition  any event not legal in the current phase, an invalid exit
//                                 status, or a terminal classification that contradicts the path
//                                 (a spawn-failure path cannot be exited/signaled; a closed path
//                                 cannot be spawn_failed; a recovery jump must be
//                                 recovery_indeterminate); `adopted` anywhere but first, or
//                                 into a phase other than starting, running or stopping
[[nodiscard]] Result<LifecycleState> reduce(LifecycleState const& state, LifecycleEvent const& ev);

}  // namespace custos::core
