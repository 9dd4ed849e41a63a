// The lifecycle reducer (see lifecycle.hpp and docs/lifecycle.md for the machine).
#include "custos/core/lifecycle.hpp"

#include <array>
#include <string>
#include <type_traits>

#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

constexpr auto kPhaseNames = wire_names<Phase>({
    {Phase::authorized, "authorized"},
    {Phase::starting, "starting"},
    {Phase::running, "running"},
    {Phase::stopping, "stopping"},
    {Phase::exited, "exited"},
    {Phase::closed, "closed"},
    {Phase::terminal, "terminal"},
});
static_assert(kPhaseNames.complete() && kPhaseNames.size() == kPhaseCount);

// A recovery jump is the only way to reach terminal without the supervisor having seen the end.
bool is_recovery_jump(RecoveryPath via) noexcept {
  return via == RecoveryPath::absent_without_terminal || via == RecoveryPath::indeterminate;
}

Error illegal(Phase from, std::string_view what) {
  std::string ctx{what};
  ctx += " is not legal in phase ";
  ctx += phase_wire(from);
  return Error{Errc::lifecycle_illegal_transition, std::move(ctx)};
}

LifecycleState with_phase(LifecycleState s, Phase p) {
  s.phase = p;
  return s;
}

}  // namespace

std::string_view phase_wire(Phase p) noexcept {
  return kPhaseNames.wire(p);
}

std::optional<Phase> phase_from_wire(std::string_view wire) noexcept {
  return kPhaseNames.from_wire(wire);
}

bool is_legal_progression(Phase from, Phase to, RecoveryPath via) noexcept {
  if (via == RecoveryPath::already_terminal) return false;
  if (to == Phase::terminal && from != Phase::terminal && is_recovery_jump(via)) return true;
  switch (from) {
    case Phase::authorized:
      return to == Phase::starting;
    case Phase::starting:
      return to == Phase::running || to == Phase::terminal;
    case Phase::running:
      return to == Phase::stopping || to == Phase::exited;
    case Phase::stopping:
      return to == Phase::exited;
    case Phase::exited:
      return to == Phase::closed;
    case Phase::closed:
      return to == Phase::terminal;
    case Phase::terminal:
      return false;
  }
  return false;
}

std::string_view event_name(LifecycleEvent const& e) noexcept {
  return std::visit(
      [](auto const& ev) -> std::string_view {
        using T = std::decay_t<decltype(ev)>;
        if constexpr (std::is_same_v<T, event::SpawnRequested>)
          return "spawn_requested";
        else if constexpr (std::is_same_v<T, event::Spawned>)
          return "spawned";
        else if constexpr (std::is_same_v<T, event::SpawnFailed>)
          return "spawn_failed";
        else if constexpr (std::is_same_v<T, event::StopRequested>)
          return "stop_requested";
        else if constexpr (std::is_same_v<T, event::Exited>)
          return "exited";
        else if constexpr (std::is_same_v<T, event::Closed>)
          return "closed";
        else if constexpr (std::is_same_v<T, event::Adopted>)
          return "adopted";
        else
          return "terminal_recorded";
      },
      e);
}

namespace {

Result<LifecycleState> on_terminal(LifecycleState const& s, event::TerminalRecorded const& ev) {
  auto const c = ev.classification;
  if (ev.recovery == RecoveryPath::already_terminal) {
    return Error{Errc::lifecycle_illegal_transition,
                 "already_terminal is a recovery finding, not a way to record a terminal result"};
  }
  if (is_recovery_jump(ev.recovery)) {
    if (c != Classification::recovery_indeterminate) {
      return Error{Errc::lifecycle_illegal_transition,
                   "a recovery without an observed end must be recovery_indeterminate"};
    }
  } else if (s.phase == Phase::starting) {
    if (!s.spawn_failure.has_value())
      return illegal(s.phase, "terminal_recorded before a spawn failure");
    // The program never ran, so its outcome cannot be an exit; a trigger accepted during
    // starting may still decide (first trigger wins), hence not only spawn_failed.
    if (c == Classification::exited || c == Classification::signaled ||
        c == Classification::recovery_indeterminate) {
      return illegal(s.phase, "terminal_recorded as " + std::string{classification_wire(c)} +
                                  " after a spawn failure");
    }
  } else if (s.phase == Phase::closed) {
    if (c == Classification::spawn_failed || c == Classification::recovery_indeterminate) {
      return illegal(s.phase, "terminal_recorded as " + std::string{classification_wire(c)} +
                                  " after the process ran and closed");
    }
  } else {
    return illegal(s.phase, "terminal_recorded");
  }
  LifecycleState next = with_phase(s, Phase::terminal);
  next.classification = c;
  next.recovery = ev.recovery;
  return next;
}

}  // namespace

Result<LifecycleState> reduce(LifecycleState const& s, LifecycleEvent const& ev) {
  if (s.phase == Phase::terminal) {
    return Error{Errc::lifecycle_already_terminal,
                 std::string{event_name(ev)} + " after the terminal record"};
  }
  return std::visit(
      [&s](auto const& e) -> Result<LifecycleState> {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, event::SpawnRequested>) {
          if (s.phase != Phase::authorized) return illegal(s.phase, "spawn_requested");
          return with_phase(s, Phase::starting);
        } else if constexpr (std::is_same_v<T, event::Spawned>) {
          if (s.phase != Phase::starting || s.spawn_failure.has_value())
            return illegal(s.phase, "spawned");
          return with_phase(s, Phase::running);
        } else if constexpr (std::is_same_v<T, event::SpawnFailed>) {
          // Exactly one failure per launch: a second report would rewrite the first.
          if (s.phase != Phase::starting || s.spawn_failure.has_value())
            return illegal(s.phase, "spawn_failed");
          LifecycleState next = s;
          next.spawn_failure = e.failure;
          return next;
        } else if constexpr (std::is_same_v<T, event::StopRequested>) {
          if (s.phase != Phase::running) return illegal(s.phase, "stop_requested");
          return with_phase(s, Phase::stopping);
        } else if constexpr (std::is_same_v<T, event::Exited>) {
          if (s.phase != Phase::running && s.phase != Phase::stopping)
            return illegal(s.phase, "exited");
          if (!e.status.observed() || !e.status.valid()) {
            return Error{Errc::lifecycle_illegal_transition, "exited with an invalid exit status"};
          }
          LifecycleState next = with_phase(s, Phase::exited);
          next.exit = e.status;
          return next;
        } else if constexpr (std::is_same_v<T, event::Closed>) {
          if (s.phase != Phase::exited) return illegal(s.phase, "closed");
          return with_phase(s, Phase::closed);
        } else if constexpr (std::is_same_v<T, event::Adopted>) {
          // Only a fresh state takes over an execution (nothing may have been observed of it
          // yet), and only one whose root can still be alive: before its exit was recorded and
          // after its launch began.
          if (s.phase != Phase::authorized) return illegal(s.phase, "adopted");
          if (e.phase != Phase::starting && e.phase != Phase::running &&
              e.phase != Phase::stopping) {
            return Error{Errc::lifecycle_illegal_transition,
                         "adopted into phase " + std::string{phase_wire(e.phase)} +
                             ": only starting, running or stopping hold a live root"};
          }
          return with_phase(s, e.phase);
        } else {
          return on_terminal(s, e);
        }
      },
      ev);
}

}  // namespace custos::core
