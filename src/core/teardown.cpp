// The teardown reducer (see teardown.hpp for the machine and its table).
#include "custos/core/teardown.hpp"

#include <array>
#include <string>
#include <type_traits>

#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

using S = TeardownStage;
using A = TeardownAction;

constexpr auto kStageNames = wire_names<TeardownStage>({
    {S::running, "running"},
    {S::draining, "draining"},
    {S::signalling, "signalling"},
    {S::graceful, "graceful"},
    {S::killing, "killing"},
    {S::waiting, "waiting"},
    {S::sweeping, "sweeping"},
    {S::swept, "swept"},
    {S::cancelling, "cancelling"},
    {S::closing, "closing"},
});
static_assert(kStageNames.complete() && kStageNames.size() == kTeardownStageCount);

constexpr auto kActionNames = wire_names<TeardownAction>({
    {A::none, "none"},
    {A::signal_graceful, "signal_graceful"},
    {A::arm_grace, "arm_grace"},
    {A::arm_drain, "arm_drain"},
    {A::kill_tree, "kill_tree"},
    {A::await_empty, "await_empty"},
    {A::check_tree, "check_tree"},
    {A::start_final_scan, "start_final_scan"},
    {A::arm_reader_bound, "arm_reader_bound"},
    {A::cancel_support, "cancel_support"},
    {A::record_terminal, "record_terminal"},
});
static_assert(kActionNames.complete() && kActionNames.size() == kTeardownActionCount);

Error illegal(TeardownState const& s, TeardownEvent const& ev, std::string_view why = {}) {
  std::string ctx{teardown_event_name(ev)};
  ctx += " is not legal in teardown stage ";
  ctx += teardown_stage_name(s.stage);
  if (!why.empty()) {
    ctx += " (";
    ctx += why;
    ctx += ")";
  }
  return Error{Errc::teardown_illegal_event, std::move(ctx)};
}

TeardownStep step(TeardownState s, TeardownStage to, TeardownAction a) {
  s.stage = to;
  return TeardownStep{s, a};
}

TeardownStep keep(TeardownState const& s) {
  return TeardownStep{s, A::none};
}

// After the final scan began, a late completion of a timer that was armed is a no-op.
bool after_scan_open(TeardownStage st) noexcept {
  return st == S::sweeping || st == S::swept || st == S::cancelling;
}

// The stages in which a late completion of the grace or drain timer may arrive: their stage is
// over (killing is an instant) and close has not begun.
bool after_kill_open(TeardownStage st) noexcept {
  return st == S::waiting || after_scan_open(st);
}

// The three facts close needs are all in once the scan finished: cancel the support tasks.
TeardownStep after_fact(TeardownState const& s) {
  if (s.stage == S::swept && s.root_exited && s.readers_done) {
    return step(s, S::cancelling, A::cancel_support);
  }
  return keep(s);
}

}  // namespace

std::string_view teardown_stage_name(TeardownStage s) noexcept {
  return kStageNames.wire(s);
}

std::optional<TeardownStage> teardown_stage_from_name(std::string_view name) noexcept {
  return kStageNames.from_wire(name);
}

std::string_view teardown_action_name(TeardownAction a) noexcept {
  return kActionNames.wire(a);
}

std::string_view teardown_event_name(TeardownEvent const& e) noexcept {
  constexpr std::array<std::string_view, kTeardownEventCount> kEventNames = {
      "stop_requested",     "graceful_sent",     "grace_expired",       "drain_expired",
      "trigger_after_exit", "tree_seen_empty",   "root_exited",         "readers_done",
      "kill_sent",          "kill_bound_passed", "final_scan_finished", "spawn_failed",
      "close_begun"};
  return e.index() < kEventNames.size() ? kEventNames[e.index()] : std::string_view{"invalid"};
}

// The transition table: one branch per event, in teardown.hpp's order. It is read (and tested
// exhaustively) as one table, which splitting it would scatter.
// NOLINTNEXTLINE(readability-function-size): the transition table, see above
Result<TeardownStep> reduce(TeardownState const& s, TeardownEvent const& ev) {
  if (s.stage == S::closing) return illegal(s, ev, "close began");
  return std::visit(
      [&s, &ev](auto const& e) -> Result<TeardownStep> {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, teardown::StopRequested>) {
          // Only while the root runs with nothing else begun; a trigger the exit beat is
          // trigger_after_exit, a second trigger is the cancellation state's business.
          if (s.stage != S::running) return illegal(s, ev);
          TeardownState next = s;
          next.stop_requested = true;
          next.grace = e.grace;
          return step(next, S::signalling, A::signal_graceful);
        } else if constexpr (std::is_same_v<T, teardown::GracefulSent>) {
          if (s.stage != S::signalling) return illegal(s, ev);
          TeardownState next = s;
          next.graceful_sent = e.targets > 0;
          if (next.grace) return step(next, S::graceful, A::arm_grace);
          return step(next, S::killing, A::kill_tree);
        } else if constexpr (std::is_same_v<T, teardown::GraceExpired>) {
          if (s.stage == S::graceful) return step(s, S::killing, A::kill_tree);
          if (s.grace && after_kill_open(s.stage)) return keep(s);
          return illegal(s, ev, s.grace ? "" : "no grace timer was armed");
        } else if constexpr (std::is_same_v<T, teardown::DrainExpired>) {
          if (s.stage == S::draining) return step(s, S::killing, A::kill_tree);
          if (s.drained && after_kill_open(s.stage)) return keep(s);
          return illegal(s, ev, s.drained ? "" : "no drain timer was armed");
        } else if constexpr (std::is_same_v<T, teardown::TriggerAfterExit>) {
          if (!s.root_exited || s.stop_requested) {
            return illegal(s, ev,
                           s.stop_requested ? "a stop was requested before the exit"
                                            : "the root has not exited");
          }
          if (s.stage == S::draining) return step(s, S::killing, A::kill_tree);
          if (after_kill_open(s.stage)) return keep(s);
          return illegal(s, ev);
        } else if constexpr (std::is_same_v<T, teardown::TreeSeenEmpty>) {
          if (s.stage == S::graceful) return step(s, S::killing, A::kill_tree);
          if (s.stage == S::waiting) return step(s, S::sweeping, A::start_final_scan);
          if ((s.grace || s.waited) && after_scan_open(s.stage)) return keep(s);
          return illegal(s, ev);
        } else if constexpr (std::is_same_v<T, teardown::RootExited>) {
          if (s.root_exited) return illegal(s, ev, "the root's exit was already observed");
          TeardownState next = s;
          next.root_exited = true;
          switch (s.stage) {
            case S::running:
              if (next.readers_done) return step(next, S::killing, A::kill_tree);
              next.drained = true;
              return step(next, S::draining, A::arm_drain);
            case S::graceful:
            case S::sweeping:
              return keep(next);  // the graceful poll (or the scan) goes on
            case S::waiting:
              return step(next, S::waiting, A::check_tree);
            case S::swept:
              return after_fact(next);
            default:
              return illegal(s, ev);
          }
        } else if constexpr (std::is_same_v<T, teardown::ReadersDone>) {
          if (s.readers_done) return illegal(s, ev, "the readers were already done");
          TeardownState next = s;
          next.readers_done = true;
          switch (s.stage) {
            case S::draining:
              return step(next, S::killing, A::kill_tree);
            case S::running:
            case S::graceful:
            case S::waiting:
            case S::sweeping:
              return keep(next);
            case S::swept:
              return after_fact(next);
            default:
              return illegal(s, ev);
          }
        } else if constexpr (std::is_same_v<T, teardown::KillSent>) {
          if (s.stage != S::killing) return illegal(s, ev);
          TeardownState next = s;
          next.forced = s.forced || e.signalled;
          if (e.tree_empty) return step(next, S::sweeping, A::start_final_scan);
          next.waited = true;
          return step(next, S::waiting, A::await_empty);
        } else if constexpr (std::is_same_v<T, teardown::KillBoundPassed>) {
          if (s.stage == S::waiting) return step(s, S::sweeping, A::start_final_scan);
          if (s.waited && after_scan_open(s.stage)) return keep(s);
          return illegal(s, ev);
        } else if constexpr (std::is_same_v<T, teardown::FinalScanFinished>) {
          if (s.stage != S::sweeping) return illegal(s, ev);
          TeardownState next = s;
          next.forced = s.forced || e.signalled > 0;
          next.scanned = e.confirmed ? Cleanup::confirmed : Cleanup::unconfirmed;
          next.stage = S::swept;
          if (!next.readers_done) return TeardownStep{next, A::arm_reader_bound};
          return after_fact(next);
        } else if constexpr (std::is_same_v<T, teardown::SpawnFailed>) {
          // Nothing ran: no stop was begun and no exit can have been observed.
          if (s.stage != S::running) return illegal(s, ev);
          TeardownState next = s;
          next.scanned = Cleanup::confirmed;
          return step(next, S::closing, A::record_terminal);
        } else {
          static_assert(std::is_same_v<T, teardown::CloseBegun>);
          if (s.stage != S::cancelling) return illegal(s, ev);
          return step(s, S::closing, A::record_terminal);
        }
      },
      ev);
}

EscalationReport escalation_report(TeardownState const& s) noexcept {
  return EscalationReport{s.graceful_sent, s.forced};
}

bool final_scan_started(TeardownState const& s) noexcept {
  return teardown_stage_rank(s.stage) >= teardown_stage_rank(S::sweeping);
}

bool tree_done(TeardownState const& s) noexcept {
  return teardown_stage_rank(s.stage) >= teardown_stage_rank(S::swept);
}

bool support_cancelled(TeardownState const& s) noexcept {
  return teardown_stage_rank(s.stage) >= teardown_stage_rank(S::cancelling);
}

bool closing(TeardownState const& s) noexcept {
  return s.stage == S::closing;
}

}  // namespace custos::core
