// The teardown reducer: the only code that decides how an execution's process tree is stopped,
// escalated, swept and closed. The supervisor (the effect shell) feeds it what it observed and
// performs the one action each step returns; it decides nothing on its own.
//
// Stages, in the order they are reached (a stage never goes back):
//
//   running ─stop_requested─▶ signalling ─graceful_sent─▶ graceful ─grace_expired──────┐
//      │                          │                          └───────tree_seen_empty───┤
//      │                          └─graceful_sent, no grace───────────────────────────▶├─▶ killing
//      ├─root_exited, readers open─▶ draining ─drain_expired, readers_done,            │
//      │                                       trigger_after_exit─────────────────────▶┤
//      ├─root_exited, readers done────────────────────────────────────────────────────┘
//      └─spawn_failed─▶ closing
//
//   killing ─kill_sent, tree empty───────────────────────────────────────────▶ sweeping
//   killing ─kill_sent, something left─▶ waiting ─tree_seen_empty,
//                                                  kill_bound_passed────────▶ sweeping
//   sweeping ─final_scan_finished─▶ swept (or cancelling: root exited and readers done)
//   swept ─root_exited / readers_done, completing the pair─▶ cancelling ─close_begun─▶ closing
//
// `signalling` and `killing` are instants: the shell sends the signal and reports its outcome
// (graceful_sent, kill_sent) before it looks at anything else, so no other event is legal there.
// `sweeping`: the final scan runs; `swept`: the tree is done; `cancelling`: the support tasks were
// cancelled and their completions are awaited; `closing`: the terminal record is being written.
//
// The table ("=": the stage is kept and the action is none; every pair not listed is
// teardown.illegal_event):
//
//   stage       event                                   next stage, action
//   running     stop_requested{grace}                   signalling, signal_graceful
//               root_exited                             draining, arm_drain (readers open)
//                                                       killing, kill_tree (readers done)
//               readers_done                            =
//               spawn_failed                            closing, record_terminal
//   draining    drain_expired, readers_done,            killing, kill_tree
//               trigger_after_exit
//   signalling  graceful_sent{targets}                  graceful, arm_grace
//                                                       killing, kill_tree (no grace)
//   graceful    grace_expired, tree_seen_empty          killing, kill_tree
//               root_exited, readers_done               =
//   killing     kill_sent{signalled, tree_empty}        sweeping, start_final_scan (tree empty)
//                                                       waiting, await_empty
//   waiting     tree_seen_empty, kill_bound_passed      sweeping, start_final_scan
//               root_exited                             =, check_tree
//               readers_done, trigger_after_exit*, late*  =
//   sweeping    final_scan_finished{confirmed,          cancelling, cancel_support (root exited,
//                 signalled}                              readers done)
//                                                       swept, arm_reader_bound (readers open)
//                                                       swept, none (the root still runs)
//               root_exited, readers_done,              =
//               trigger_after_exit*, late*
//   swept       root_exited, readers_done               cancelling, cancel_support (the pair is
//                                                         complete), else =
//               trigger_after_exit*, late*              =
//   cancelling  close_begun                             closing, record_terminal
//               trigger_after_exit*, late*              =
//   closing     nothing
//
// root_exited and readers_done are legal once each. trigger_after_exit* only after the root
// exited with no stop requested (a trigger the exit beat). late*: a late completion of a timer
// that was armed and whose stage is over: grace_expired (a grace timer ran), drain_expired (the
// drain timer ran), tree_seen_empty (a graceful or kill-bound poll ran), kill_bound_passed (the
// bounded wait ran). A completion Asio had already queued when its timer was cancelled still
// runs, with success: that is not a bug, so it is a no-op. Before its stage no such timer can
// exist, and close waits for every completion, so there and after close began it is an error.
//
// docs/lifecycle.md ("Teardown") describes the same machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"

namespace custos::core {

enum class TeardownStage : std::uint8_t {
  running,     // no stop requested, no root exit seen
  draining,    // the root exited with no stop; readers get exit_drain before the tree is killed
  signalling,  // a stop was accepted: the graceful signal is being sent (instant)
  graceful,    // the graceful signal was sent; grace_ms runs, cut short by an empty tree
  killing,     // the kill is being sent (instant)
  waiting,     // killed; waiting for an empty tree, bounded by kill_after_ms
  sweeping,    // the final scan (marker sweep, orphan check) runs
  swept,       // the final scan finished: the tree is done
  cancelling,  // root exited, tree done, readers done: support tasks cancelled, awaited
  closing,     // close began: the terminal record is being written. Nothing is legal any more.
};
inline constexpr std::size_t kTeardownStageCount = 10;

[[nodiscard]] std::string_view teardown_stage_name(TeardownStage s) noexcept;
[[nodiscard]] std::optional<TeardownStage> teardown_stage_from_name(std::string_view name) noexcept;
[[nodiscard]] constexpr int teardown_stage_rank(TeardownStage s) noexcept {
  return static_cast<int>(s);
}

// What the shell must do next. Each action names the event(s) the shell reports when done.
enum class TeardownAction : std::uint8_t {
  none,             // nothing now
  signal_graceful,  // the plan's graceful signal to the tree → graceful_sent{targets}
  arm_grace,    // the grace timer (→ grace_expired) and the graceful poll (→ tree_seen_empty)
  arm_drain,    // the exit_drain timer (→ drain_expired)
  kill_tree,    // cancel the grace/drain timers; SIGKILL the root, cgroup.kill or a SIGKILL
                // marker sweep → kill_sent{signalled, tree_empty}
  await_empty,  // watch cgroup.events and poll (→ tree_seen_empty), bounded by kill_after_ms
                // from now (→ kill_bound_passed)
  check_tree,   // look now whether the tree is empty (the root may have been the last)
  start_final_scan,  // stop polling; the final marker sweep and orphan check
                     // → final_scan_finished{confirmed, signalled}
  arm_reader_bound,  // readers still open after the tree is gone: force them closed after
                     // reader_close_bound (→ readers_done)
  cancel_support,    // cancel every support task (timers, waits, the sampler), close stdin; once
                     // their completions are all in → close_begun
  record_terminal,   // the end: classify and write the one terminal record
};
inline constexpr std::size_t kTeardownActionCount = 11;

[[nodiscard]] std::string_view teardown_action_name(TeardownAction a) noexcept;

namespace teardown {
// A trigger was accepted while the root runs: begin the stop. `grace` is false for grace_ms 0.
struct StopRequested {
  bool grace = true;
  friend bool operator==(StopRequested, StopRequested) = default;
};
// The graceful signal went out; `targets` processes were signalled (0: none was left).
struct GracefulSent {
  std::uint32_t targets = 0;
  friend bool operator==(GracefulSent, GracefulSent) = default;
};
// grace_ms passed.
struct GraceExpired {
  friend bool operator==(GraceExpired, GraceExpired) = default;
};
// exit_drain passed with readers still open after the root's exit.
struct DrainExpired {
  friend bool operator==(DrainExpired, DrainExpired) = default;
};
// A trigger was offered after the root's exit (rejected: the exit decides), with none accepted
// before: it ends a draining tree at once.
struct TriggerAfterExit {
  friend bool operator==(TriggerAfterExit, TriggerAfterExit) = default;
};
// The root is gone and the tree reads empty (a poll, or a cgroup.events change).
struct TreeSeenEmpty {
  friend bool operator==(TreeSeenEmpty, TreeSeenEmpty) = default;
};
// The root's exit was observed.
struct RootExited {
  friend bool operator==(RootExited, RootExited) = default;
};
// Every output reader reached EOF or was force-closed.
struct ReadersDone {
  friend bool operator==(ReadersDone, ReadersDone) = default;
};
// The kill went out. `signalled`: something was killed (the root, a populated cgroup, or a
// marker sweep signalled a process). `tree_empty`: the root is gone and nothing is left to wait
// for (an empty cgroup; a marker boundary can only tell in the final scan).
struct KillSent {
  bool signalled = false;
  bool tree_empty = false;
  friend bool operator==(KillSent, KillSent) = default;
};
// kill_after_ms passed without an empty tree.
struct KillBoundPassed {
  friend bool operator==(KillBoundPassed, KillBoundPassed) = default;
};
// The final scan finished: `confirmed` nothing of the tree is left (sweep complete, cgroup empty,
// root gone, no unattributed orphan); `signalled` processes the sweep had to SIGKILL.
struct FinalScanFinished {
  bool confirmed = false;
  std::uint32_t signalled = 0;
  friend bool operator==(FinalScanFinished, FinalScanFinished) = default;
};
// The target never ran (a spawn failure): nothing to stop, the tree is empty.
struct SpawnFailed {
  friend bool operator==(SpawnFailed, SpawnFailed) = default;
};
// Every cancelled support task completed: close now.
struct CloseBegun {
  friend bool operator==(CloseBegun, CloseBegun) = default;
};
}  // namespace teardown

using TeardownEvent =
    std::variant<teardown::StopRequested, teardown::GracefulSent, teardown::GraceExpired,
                 teardown::DrainExpired, teardown::TriggerAfterExit, teardown::TreeSeenEmpty,
                 teardown::RootExited, teardown::ReadersDone, teardown::KillSent,
                 teardown::KillBoundPassed, teardown::FinalScanFinished, teardown::SpawnFailed,
                 teardown::CloseBegun>;
inline constexpr std::size_t kTeardownEventCount = std::variant_size_v<TeardownEvent>;

// Stable name of an event kind ("stop_requested", ..., "close_begun").
[[nodiscard]] std::string_view teardown_event_name(TeardownEvent const& e) noexcept;

struct TeardownState {
  TeardownStage stage = TeardownStage::running;
  bool stop_requested = false;  // a trigger began the stop
  bool grace = false;           // that stop waits grace_ms (a grace timer was armed)
  bool drained = false;         // the root exited first; the exit_drain timer was armed
  bool waited = false;          // the kill was followed by the bounded wait for an empty tree
  bool root_exited = false;
  bool readers_done = false;
  bool graceful_sent = false;      // the graceful signal reached at least one process
  bool forced = false;             // a kill reached something (the kill, or the final sweep)
  std::optional<Cleanup> scanned;  // the final scan's verdict (confirmed for a spawn failure)

  friend bool operator==(TeardownState const&, TeardownState const&) = default;
};

struct TeardownStep {
  TeardownState state;
  TeardownAction action = TeardownAction::none;

  friend bool operator==(TeardownStep const&, TeardownStep const&) = default;
};

// The pure reducer: the table above. Errors:
//   teardown_illegal_event  an event the current state cannot receive (a blank cell, a second
//                           root_exited/readers_done, trigger_after_exit with a stop requested or
//                           before the exit, a late completion of a timer never armed, anything
//                           once close began)
[[nodiscard]] Result<TeardownStep> reduce(TeardownState const& state, TeardownEvent const& ev);

// The terminal record's escalation report.
[[nodiscard]] EscalationReport escalation_report(TeardownState const& s) noexcept;

// Queries the shell's guards use.
// The final scan started: no more sampling, stdin or resize.
[[nodiscard]] bool final_scan_started(TeardownState const& s) noexcept;
// The final scan finished (or nothing ran): the tree is done.
[[nodiscard]] bool tree_done(TeardownState const& s) noexcept;
// Support tasks were cancelled.
[[nodiscard]] bool support_cancelled(TeardownState const& s) noexcept;
// Close began.
[[nodiscard]] bool closing(TeardownState const& s) noexcept;

}  // namespace custos::core
