// Teardown reducer: the full table for every (stage, event) pair along the stop path and the
// exit path, an exhaustive walk of every reachable state under every event, and properties
// under random event sequences and the supervisor's own driving orders.
#include "custos/core/teardown.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace custos::core {
namespace {

using teardown::CloseBegun;
using teardown::DrainExpired;
using teardown::FinalScanFinished;
using teardown::GraceExpired;
using teardown::GracefulSent;
using teardown::KillBoundPassed;
using teardown::KillSent;
using teardown::ReadersDone;
using teardown::RootExited;
using teardown::SpawnFailed;
using teardown::StopRequested;
using teardown::TreeSeenEmpty;
using teardown::TriggerAfterExit;
using S = TeardownStage;
using A = TeardownAction;

Result<TeardownStep> run(std::vector<TeardownEvent> const& events) {
  TeardownStep st;
  for (auto const& e : events) {
    auto r = reduce(st.state, e);
    if (!r) return r;
    st = *r;
  }
  return st;
}

TeardownState reach(std::vector<TeardownEvent> const& events) {
  auto r = run(events);
  EXPECT_TRUE(r) << r.error().message();
  return r ? r->state : TeardownState{};
}

// Every event, with every value of its parameters that matters.
std::vector<TeardownEvent> all_event_variants() {
  std::vector<TeardownEvent> out = {
      StopRequested{true}, StopRequested{false}, GracefulSent{0}, GracefulSent{3}, GraceExpired{},
      DrainExpired{},      TriggerAfterExit{},   TreeSeenEmpty{}, RootExited{},    ReadersDone{},
      KillBoundPassed{},   SpawnFailed{},        CloseBegun{}};
  for (bool sig : {false, true}) {
    for (bool empty : {false, true}) out.emplace_back(KillSent{sig, empty});
  }
  for (bool confirmed : {false, true}) {
    for (std::uint32_t n : {0U, 2U}) out.emplace_back(FinalScanFinished{confirmed, n});
  }
  return out;
}

TEST(Teardown, NamesRoundTripAndAreStable) {
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < kTeardownStageCount; ++i) {
    auto const s = static_cast<TeardownStage>(i);
    EXPECT_TRUE(seen.insert(teardown_stage_name(s)).second);
    EXPECT_EQ(teardown_stage_from_name(teardown_stage_name(s)), s);
  }
  EXPECT_EQ(teardown_stage_name(S::sweeping), "sweeping");
  EXPECT_EQ(teardown_stage_from_name("done"), std::nullopt);
  std::set<std::string_view> actions;
  for (std::size_t i = 0; i < kTeardownActionCount; ++i) {
    auto const n = teardown_action_name(static_cast<TeardownAction>(i));
    EXPECT_NE(n, "invalid");
    EXPECT_TRUE(actions.insert(n).second) << n;
  }
  EXPECT_EQ(teardown_action_name(A::start_final_scan), "start_final_scan");
  std::set<std::string_view> events;
  for (auto const& e : all_event_variants()) events.insert(teardown_event_name(e));
  EXPECT_EQ(events.size(), kTeardownEventCount);
  EXPECT_EQ(teardown_event_name(FinalScanFinished{}), "final_scan_finished");
  EXPECT_EQ(teardown_event_name(TriggerAfterExit{}), "trigger_after_exit");
  EXPECT_EQ(errc_wire(Errc::teardown_illegal_event), "teardown.illegal_event");
  EXPECT_EQ(errc_recovery(Errc::teardown_illegal_event), Recovery::cancel_reap);
}

// ---- the real paths ------------------------------------------------------------------------

TEST(Teardown, NaturalExitWithReadersDoneFirst) {
  // The usual end: output EOF, the root exits, nothing is left in the cgroup.
  auto r = run({ReadersDone{}, RootExited{}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::killing);
  EXPECT_EQ(r->action, A::kill_tree);
  r = reduce(r->state, KillSent{false, true});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::sweeping);
  EXPECT_EQ(r->action, A::start_final_scan);
  r = reduce(r->state, FinalScanFinished{true, 0});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::cancelling);
  EXPECT_EQ(r->action, A::cancel_support);
  r = reduce(r->state, CloseBegun{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::closing);
  EXPECT_EQ(r->action, A::record_terminal);
  EXPECT_EQ(escalation_report(r->state), (EscalationReport{false, false}));
  EXPECT_EQ(r->state.scanned, Cleanup::confirmed);
}

TEST(Teardown, StopWithGraceThatTheTreeHonours) {
  auto r = run({StopRequested{true}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::signal_graceful);
  r = reduce(r->state, GracefulSent{2});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::graceful);
  EXPECT_EQ(r->action, A::arm_grace);
  EXPECT_TRUE(r->state.graceful_sent);
  // The root exits on SIGTERM; the graceful poll sees the empty tree before grace_ms.
  r = reduce(r->state, RootExited{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::none);
  r = reduce(r->state, ReadersDone{});
  ASSERT_TRUE(r);
  r = reduce(r->state, TreeSeenEmpty{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::kill_tree);
  r = reduce(r->state, KillSent{false, true});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::start_final_scan);
  // The grace timer's completion was already queued when the kill cancelled it.
  auto late = reduce(r->state, GraceExpired{});
  ASSERT_TRUE(late);
  EXPECT_EQ(late->state, r->state);
  EXPECT_EQ(late->action, A::none);
  r = reduce(r->state, FinalScanFinished{true, 0});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::cancel_support);
  r = reduce(r->state, CloseBegun{});
  ASSERT_TRUE(r);
  EXPECT_EQ(escalation_report(r->state), (EscalationReport{true, false}));
}

TEST(Teardown, StopThatEscalatesToTheKillAndTheBound) {
  auto r = run({StopRequested{true}, GracefulSent{1}, GraceExpired{}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::kill_tree);
  r = reduce(r->state, KillSent{true, false});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::waiting);
  EXPECT_EQ(r->action, A::await_empty);
  EXPECT_TRUE(r->state.forced);
  r = reduce(r->state, RootExited{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::waiting);
  EXPECT_EQ(r->action, A::check_tree);
  // Something that is not the root survives kill_after_ms.
  r = reduce(r->state, KillBoundPassed{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::start_final_scan);
  r = reduce(r->state, FinalScanFinished{false, 0});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::swept);
  EXPECT_EQ(r->action, A::arm_reader_bound);  // the survivor still holds a pipe
  EXPECT_EQ(r->state.scanned, Cleanup::unconfirmed);
  r = reduce(r->state, ReadersDone{});  // force-closed after reader_close_bound
  ASSERT_TRUE(r);
  EXPECT_EQ(r->action, A::cancel_support);
  r = reduce(r->state, CloseBegun{});
  ASSERT_TRUE(r);
  EXPECT_EQ(escalation_report(r->state), (EscalationReport{true, true}));
}

TEST(Teardown, StopWithoutGraceKillsAtOnce) {
  auto r = run({StopRequested{false}, GracefulSent{0}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::killing);
  EXPECT_EQ(r->action, A::kill_tree);
  EXPECT_FALSE(r->state.graceful_sent);  // nothing received the graceful signal
  // No grace timer was ever armed: its expiry is a bug, not a late completion.
  auto w = reduce(r->state, KillSent{true, false});
  ASSERT_TRUE(w);
  EXPECT_EQ(reduce(w->state, GraceExpired{}).error().code, Errc::teardown_illegal_event);
}

TEST(Teardown, ExitWithDescendantsHoldingThePipes) {
  auto r = run({RootExited{}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::draining);
  EXPECT_EQ(r->action, A::arm_drain);
  // Each of the three ways out of the drain kills the tree.
  for (TeardownEvent e : {TeardownEvent{DrainExpired{}}, TeardownEvent{ReadersDone{}},
                          TeardownEvent{TriggerAfterExit{}}}) {
    auto k = reduce(r->state, e);
    ASSERT_TRUE(k) << teardown_event_name(e);
    EXPECT_EQ(k->state.stage, S::killing);
    EXPECT_EQ(k->action, A::kill_tree);
  }
  // A stop is never begun after the exit: a trigger the exit beat is trigger_after_exit.
  EXPECT_EQ(reduce(r->state, StopRequested{true}).error().code, Errc::teardown_illegal_event);
}

TEST(Teardown, TriggerAfterExitNeedsAnExitAndNoStop) {
  EXPECT_EQ(run({TriggerAfterExit{}}).error().code, Errc::teardown_illegal_event);
  auto stopped = reach({StopRequested{true}, GracefulSent{1}, RootExited{}});
  EXPECT_EQ(reduce(stopped, TriggerAfterExit{}).error().code, Errc::teardown_illegal_event);
  // After the drain it changes nothing (the tree is already being killed or swept).
  auto waiting = reach({RootExited{}, DrainExpired{}, KillSent{true, false}});
  auto r = reduce(waiting, TriggerAfterExit{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, waiting);
  EXPECT_EQ(r->action, A::none);
}

TEST(Teardown, SpawnFailureClosesAtOnceWithNothingToStop) {
  auto r = run({SpawnFailed{}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::closing);
  EXPECT_EQ(r->action, A::record_terminal);
  EXPECT_EQ(r->state.scanned, Cleanup::confirmed);
  EXPECT_TRUE(tree_done(r->state));
  EXPECT_EQ(escalation_report(r->state), (EscalationReport{false, false}));
  EXPECT_EQ(run({StopRequested{true}, SpawnFailed{}}).error().code, Errc::teardown_illegal_event);
  EXPECT_EQ(run({RootExited{}, SpawnFailed{}}).error().code, Errc::teardown_illegal_event);
}

TEST(Teardown, CloseWaitsForTheRootAndTheReaders) {
  // The kill bound passed with an unkillable root: the scan finishes, close waits for the exit.
  auto swept = reach({ReadersDone{}, StopRequested{true}, GracefulSent{1}, GraceExpired{},
                      KillSent{true, false}, KillBoundPassed{}, FinalScanFinished{false, 0}});
  EXPECT_EQ(swept.stage, S::swept);
  EXPECT_TRUE(tree_done(swept));
  EXPECT_FALSE(support_cancelled(swept));
  EXPECT_EQ(reduce(swept, CloseBegun{}).error().code, Errc::teardown_illegal_event);
  auto r = reduce(swept, RootExited{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state.stage, S::cancelling);
  EXPECT_EQ(r->action, A::cancel_support);
  EXPECT_TRUE(support_cancelled(r->state));
  EXPECT_FALSE(closing(r->state));
  // Both facts in before the scan ends: the scan's end cancels the support tasks itself.
  auto both = reach({StopRequested{true}, GracefulSent{1}, GraceExpired{}, KillSent{true, false},
                     RootExited{}, ReadersDone{}, TreeSeenEmpty{}});
  auto done = reduce(both, FinalScanFinished{true, 1});
  ASSERT_TRUE(done);
  EXPECT_EQ(done->state.stage, S::cancelling);
  EXPECT_EQ(done->action, A::cancel_support);
  EXPECT_TRUE(done->state.forced);
}

TEST(Teardown, FactsAreObservedOnce) {
  auto exited = reach({RootExited{}});
  EXPECT_EQ(reduce(exited, RootExited{}).error().code, Errc::teardown_illegal_event);
  auto readers = reach({ReadersDone{}});
  EXPECT_EQ(reduce(readers, ReadersDone{}).error().code, Errc::teardown_illegal_event);
}

TEST(Teardown, QueriesFollowTheStage) {
  auto const g = reach({StopRequested{true}, GracefulSent{1}});
  EXPECT_FALSE(final_scan_started(g));
  auto const x =
      reach({StopRequested{true}, GracefulSent{1}, GraceExpired{}, KillSent{true, true}});
  EXPECT_TRUE(final_scan_started(x));
  EXPECT_FALSE(tree_done(x));
  EXPECT_FALSE(support_cancelled(x));
}

// ---- the table -----------------------------------------------------------------------------

// One canonical parameter set per event kind, in variant order.
std::vector<TeardownEvent> const& table_events() {
  static std::vector<TeardownEvent> const events = {StopRequested{true},
                                                    GracefulSent{1},
                                                    GraceExpired{},
                                                    DrainExpired{},
                                                    TriggerAfterExit{},
                                                    TreeSeenEmpty{},
                                                    RootExited{},
                                                    ReadersDone{},
                                                    KillSent{true, false},
                                                    KillBoundPassed{},
                                                    FinalScanFinished{true, 0},
                                                    SpawnFailed{},
                                                    CloseBegun{}};
  return events;
}

char stage_letter(TeardownStage s) {
  return "RDSGKWXTCZ"[static_cast<std::size_t>(s)];
}

std::map<TeardownAction, std::string> const& action_codes() {
  static std::map<TeardownAction, std::string> const codes = {{A::none, "-"},
                                                              {A::signal_graceful, "sig"},
                                                              {A::arm_grace, "grace"},
                                                              {A::arm_drain, "drain"},
                                                              {A::kill_tree, "kill"},
                                                              {A::await_empty, "await"},
                                                              {A::check_tree, "check"},
                                                              {A::start_final_scan, "scan"},
                                                              {A::arm_reader_bound, "rbound"},
                                                              {A::cancel_support, "cancel"},
                                                              {A::record_terminal, "record"}};
  return codes;
}

// "x" illegal, "=" same state and no action, else "<stage letter>.<action code>".
std::string outcome(TeardownState const& s, TeardownEvent const& e) {
  auto r = reduce(s, e);
  if (!r) {
    EXPECT_EQ(r.error().code, Errc::teardown_illegal_event) << r.error().message();
    return "x";
  }
  if (r->action == A::none && r->state.stage == s.stage) return "=";
  return std::string(1, stage_letter(r->state.stage)) + "." + action_codes().at(r->action);
}

struct Row {
  std::vector<TeardownEvent> path;  // reaches the row's state from the start
  TeardownStage stage;
  // One cell per event of table_events(), in order.
  std::string cells;
};

void check_table(std::vector<Row> const& rows) {
  for (auto const& row : rows) {
    TeardownState const s = reach(row.path);
    ASSERT_EQ(s.stage, row.stage);
    std::istringstream in(row.cells);
    std::vector<std::string> want;
    for (std::string c; in >> c;) want.push_back(c);
    ASSERT_EQ(want.size(), kTeardownEventCount) << stage_letter(row.stage);
    for (std::size_t i = 0; i < kTeardownEventCount; ++i) {
      auto const& e = table_events()[i];
      EXPECT_EQ(outcome(s, e), want[i])
          << "stage " << teardown_stage_name(row.stage) << ", event " << teardown_event_name(e);
    }
  }
}

// clang-format off
// Columns:  stop   gsent   gexp   dexp   tae    empty  exit    rdone   kill    bound  scan     spawn    close
TEST(TeardownTable, StopPath) {
  std::vector<TeardownEvent> const to_w = {StopRequested{true}, GracefulSent{1}, GraceExpired{},
                                           KillSent{true, false}};
  std::vector<TeardownEvent> to_x = to_w;
  to_x.emplace_back(KillBoundPassed{});
  std::vector<TeardownEvent> to_t = to_x;
  to_t.emplace_back(FinalScanFinished{true, 0});
  std::vector<TeardownEvent> to_c = to_w;
  to_c.insert(to_c.end(), {RootExited{}, ReadersDone{}, TreeSeenEmpty{}, FinalScanFinished{true, 0}});
  std::vector<TeardownEvent> to_z = to_c;
  to_z.emplace_back(CloseBegun{});
  check_table({
      {{}, S::running,
       "S.sig  x       x      x      x      x      D.drain =       x       x      x        Z.record x"},
      {{StopRequested{true}}, S::signalling,
       "x      G.grace x      x      x      x      x       x       x       x      x        x        x"},
      {{StopRequested{true}, GracefulSent{1}}, S::graceful,
       "x      x       K.kill x      x      K.kill =       =       x       x      x        x        x"},
      {{StopRequested{true}, GracefulSent{1}, GraceExpired{}}, S::killing,
       "x      x       x      x      x      x      x       x       W.await x      x        x        x"},
      {to_w, S::waiting,
       "x      x       =      x      x      X.scan W.check =       x       X.scan x        x        x"},
      {to_x, S::sweeping,
       "x      x       =      x      x      =      =       =       x       =      T.rbound x        x"},
      {to_t, S::swept,
       "x      x       =      x      x      =      =       =       x       =      x        x        x"},
      {to_c, S::cancelling,
       "x      x       =      x      x      =      x       x       x       =      x        x        Z.record"},
      {to_z, S::closing,
       "x      x       x      x      x      x      x       x       x       x      x        x        x"},
  });
}

TEST(TeardownTable, ExitPath) {
  std::vector<TeardownEvent> const to_w = {RootExited{}, DrainExpired{}, KillSent{true, false}};
  std::vector<TeardownEvent> to_x = to_w;
  to_x.emplace_back(KillBoundPassed{});
  std::vector<TeardownEvent> to_t = to_x;
  to_t.emplace_back(FinalScanFinished{true, 0});
  std::vector<TeardownEvent> to_c = to_w;
  to_c.insert(to_c.end(), {ReadersDone{}, TreeSeenEmpty{}, FinalScanFinished{true, 0}});
  std::vector<TeardownEvent> to_z = to_c;
  to_z.emplace_back(CloseBegun{});
  check_table({
      {{RootExited{}}, S::draining,
       "x      x       x      K.kill K.kill x      x       K.kill  x       x      x        x        x"},
      {{RootExited{}, DrainExpired{}}, S::killing,
       "x      x       x      x      x      x      x       x       W.await x      x        x        x"},
      {to_w, S::waiting,
       "x      x       x      =      =      X.scan x       =       x       X.scan x        x        x"},
      {to_x, S::sweeping,
       "x      x       x      =      =      =      x       =       x       =      T.rbound x        x"},
      {to_t, S::swept,
       "x      x       x      =      =      =      x       C.cancel x      =      x        x        x"},
      {to_c, S::cancelling,
       "x      x       x      =      =      =      x       x       x       =      x        x        Z.record"},
      {to_z, S::closing,
       "x      x       x      x      x      x      x       x       x       x      x        x        x"},
  });
}
// clang-format on

// The parameters of the events that carry some, on their own.
TEST(TeardownTable, EventParameters) {
  EXPECT_EQ(outcome(reach({StopRequested{false}}), GracefulSent{1}), "K.kill");
  EXPECT_EQ(outcome(reach({ReadersDone{}}), RootExited{}), "K.kill");
  auto const killing = reach({RootExited{}, DrainExpired{}});
  EXPECT_EQ(outcome(killing, KillSent{false, true}), "X.scan");
  EXPECT_EQ(outcome(killing, KillSent{true, true}), "X.scan");
  EXPECT_EQ(outcome(killing, KillSent{false, false}), "W.await");
  EXPECT_FALSE(reduce(killing, KillSent{false, true})->state.forced);
  EXPECT_TRUE(reduce(killing, KillSent{true, true})->state.forced);
  // No bounded wait ran: a kill-bound expiry in the sweep is a bug.
  auto const direct = reach({RootExited{}, DrainExpired{}, KillSent{false, true}});
  EXPECT_EQ(outcome(direct, KillBoundPassed{}), "x");
  EXPECT_EQ(outcome(direct, TreeSeenEmpty{}), "x");
  EXPECT_EQ(outcome(direct, DrainExpired{}), "=");
  // The scan's verdict and its kills.
  auto const sweeping =
      reach({RootExited{}, DrainExpired{}, KillSent{false, false}, KillBoundPassed{}});
  auto r = reduce(sweeping, FinalScanFinished{false, 3});
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->state.forced);
  EXPECT_EQ(r->state.scanned, Cleanup::unconfirmed);
  // Root exited, readers done before the scan ends: straight to cancelling.
  auto const ready = reach({ReadersDone{}, RootExited{}, KillSent{false, false}, TreeSeenEmpty{}});
  EXPECT_EQ(outcome(ready, FinalScanFinished{true, 0}), "C.cancel");
  // Readers done, root still running at the scan's end: swept, nothing to do until the exit.
  auto const alive = reach({ReadersDone{}, StopRequested{true}, GracefulSent{1}, GraceExpired{},
                            KillSent{true, false}, KillBoundPassed{}});
  EXPECT_EQ(outcome(alive, FinalScanFinished{false, 0}), "T.-");
  EXPECT_EQ(outcome(reach({ReadersDone{}, StopRequested{true}, GracefulSent{1}, GraceExpired{},
                           KillSent{true, false}, KillBoundPassed{}, FinalScanFinished{false, 0}}),
                    RootExited{}),
            "C.cancel");
}

// ---- every reachable state -----------------------------------------------------------------

bool is_effect(TeardownAction a) {
  return a == A::signal_graceful || a == A::arm_grace || a == A::arm_drain || a == A::kill_tree ||
         a == A::await_empty || a == A::check_tree;
}

// The stage an action leaves the machine in.
TeardownStage stage_of_action(TeardownAction a, TeardownStage fallback) {
  switch (a) {
    case A::signal_graceful:
      return S::signalling;
    case A::arm_grace:
      return S::graceful;
    case A::arm_drain:
      return S::draining;
    case A::kill_tree:
      return S::killing;
    case A::await_empty:
    case A::check_tree:
      return S::waiting;
    case A::start_final_scan:
      return S::sweeping;
    case A::arm_reader_bound:
      return S::swept;
    case A::cancel_support:
      return S::cancelling;
    case A::record_terminal:
      return S::closing;
    case A::none:
      break;
  }
  return fallback;
}

// Every invariant of one step; an empty string when they all hold.
std::string step_violation(TeardownState const& s, TeardownEvent const& e,
                           Result<TeardownStep> const& r) {
  if (!r) {
    return r.error().code == Errc::teardown_illegal_event ? "" : "wrong error code";
  }
  auto const& n = r->state;
  auto const a = r->action;
  if (s.stage == S::closing) return "an event was accepted after close began";
  if (teardown_stage_rank(n.stage) < teardown_stage_rank(s.stage)) return "the stage went back";
  // Facts and flags only ever become true; the scan's verdict is written once.
  auto const lowered = [](bool before, bool after) { return before && !after; };
  if (lowered(s.stop_requested, n.stop_requested) || lowered(s.grace, n.grace) ||
      lowered(s.drained, n.drained) || lowered(s.waited, n.waited) ||
      lowered(s.root_exited, n.root_exited) || lowered(s.readers_done, n.readers_done) ||
      lowered(s.graceful_sent, n.graceful_sent) || lowered(s.forced, n.forced)) {
    return "a flag was lowered";
  }
  if (s.scanned.has_value() && n.scanned != s.scanned) return "the scan's verdict changed";
  // Who may change the report.
  if (n.graceful_sent != s.graceful_sent && !std::holds_alternative<GracefulSent>(e))
    return "graceful_sent changed without a graceful signal";
  if (n.forced != s.forced && !std::holds_alternative<KillSent>(e) &&
      !std::holds_alternative<FinalScanFinished>(e))
    return "forced changed without a kill";
  if (n.graceful_sent && !n.stop_requested) return "graceful_sent without a stop";
  // forced implies a kill was sent: only the kill (leaving killing) or the final scan (which
  // only ever follows a kill) set it.
  if (n.forced && teardown_stage_rank(n.stage) < teardown_stage_rank(S::waiting))
    return "forced before any kill";
  // Once the final scan started nothing is signalled or armed again.
  if (final_scan_started(s) && is_effect(a)) return "a signal or timer after the final scan began";
  // Each action leaves the machine in its stage; no action, no stage change (except the scan's
  // end while the root still runs: swept, waiting for the exit).
  if (n.stage != stage_of_action(a, n.stage)) return "the action does not match the stage";
  if (a == A::none && n.stage != s.stage && !(s.stage == S::sweeping && n.stage == S::swept))
    return "the stage changed without an action";
  if (a == A::arm_reader_bound && n.readers_done) return "reader bound with the readers done";
  if (tree_done(n) != n.scanned.has_value()) return "tree done without a scan verdict";
  if (n.stage == S::cancelling && !(n.root_exited && n.readers_done))
    return "support cancelled before the root exited and the readers finished";
  if (a == A::none && n.stage == s.stage) {
    // A no-op changes nothing but the fact it reports.
    TeardownState expect = s;
    expect.root_exited = n.root_exited;
    expect.readers_done = n.readers_done;
    if (n != expect) return "a no-op changed the state";
  }
  if (escalation_report(n) != (EscalationReport{n.graceful_sent, n.forced}))
    return "the report does not follow the state";
  return "";
}

struct Key {
  TeardownState s;
  bool operator<(Key const& o) const {
    auto const t = [](TeardownState const& x) {
      return std::tuple(x.stage, x.stop_requested, x.grace, x.drained, x.waited, x.root_exited,
                        x.readers_done, x.graceful_sent, x.forced, x.scanned);
    };
    return t(s) < t(o.s);
  }
};

std::set<Key> reachable_states() {
  std::set<Key> seen{Key{TeardownState{}}};
  std::deque<TeardownState> todo{TeardownState{}};
  while (!todo.empty()) {
    auto const s = todo.front();
    todo.pop_front();
    for (auto const& e : all_event_variants()) {
      auto r = reduce(s, e);
      if (r && seen.insert(Key{r->state}).second) todo.push_back(r->state);
    }
  }
  return seen;
}

TEST(TeardownExhaustive, EveryReachableStateUnderEveryEvent) {
  auto const states = reachable_states();
  std::set<TeardownStage> stages;
  std::size_t accepted = 0;
  for (auto const& k : states) {
    stages.insert(k.s.stage);
    std::set<std::size_t> legal_kinds;
    for (auto const& e : all_event_variants()) {
      auto r = reduce(k.s, e);
      auto const why = step_violation(k.s, e, r);
      EXPECT_EQ(why, "") << teardown_stage_name(k.s.stage) << " --" << teardown_event_name(e)
                         << "-->";
      if (r) {
        ++accepted;
        legal_kinds.insert(e.index());
      }
    }
    // The instants accept exactly the report of what they do; closing accepts nothing.
    if (k.s.stage == S::signalling) {
      EXPECT_EQ(legal_kinds, (std::set<std::size_t>{TeardownEvent{GracefulSent{}}.index()}));
    } else if (k.s.stage == S::killing) {
      EXPECT_EQ(legal_kinds, (std::set<std::size_t>{TeardownEvent{KillSent{}}.index()}));
    } else if (k.s.stage == S::closing) {
      EXPECT_TRUE(legal_kinds.empty());
    }
  }
  EXPECT_EQ(stages.size(), kTeardownStageCount) << "every stage is reachable";
  EXPECT_GT(states.size(), 50U);
  EXPECT_GT(accepted, 0U);
}

TEST(TeardownExhaustive, EveryReachableStateCanStillClose) {
  // Liveness: whatever happened, some legal continuation reaches closing.
  auto const states = reachable_states();
  std::set<Key> can_close;
  for (auto const& k : states) {
    if (k.s.stage == S::closing) can_close.insert(k);
  }
  for (bool grew = true; grew;) {
    grew = false;
    for (auto const& k : states) {
      if (can_close.count(k) != 0) continue;
      for (auto const& e : all_event_variants()) {
        auto r = reduce(k.s, e);
        if (r && can_close.count(Key{r->state}) != 0) {
          can_close.insert(k);
          grew = true;
          break;
        }
      }
    }
  }
  for (auto const& k : states) {
    EXPECT_EQ(can_close.count(k), 1U) << "stuck in " << teardown_stage_name(k.s.stage);
  }
}

// ---- properties ----------------------------------------------------------------------------

RC_GTEST_PROP(TeardownProps, RandomSequencesKeepEveryInvariant, ()) {
  auto const variants = all_event_variants();
  auto const picks = *rc::gen::container<std::vector<std::size_t>>(
      rc::gen::inRange<std::size_t>(0, variants.size()));
  TeardownState s;
  bool kill_sent = false;  // a KillSent was accepted
  bool closed = false;
  for (auto i : picks) {
    auto const& e = variants[i];
    auto r = reduce(s, e);
    RC_ASSERT(step_violation(s, e, r) == std::string{});
    if (closed) RC_ASSERT(!r);  // no action, no change, after close began
    if (!r) continue;
    if (std::holds_alternative<KillSent>(e)) kill_sent = true;
    if (r->state.forced) RC_ASSERT(kill_sent);
    // Done is absorbing: once the final scan started, the stage stays at or past it.
    if (final_scan_started(s)) RC_ASSERT(final_scan_started(r->state));
    if (r->state.stage == S::closing) closed = true;
    s = r->state;
  }
}

// The supervisor's real driving orders: a shell that performs each action and reports its
// outcome, with the world's own events (exit, EOF, timers) in any order the loop could see them.
RC_GTEST_PROP(TeardownProps, SupervisorDrivenPathsClose,
              (bool stop, bool grace, bool term_ends_root, bool readers_first,
               bool descendants_linger, bool scan_kills, std::uint8_t graceful_targets)) {
  std::vector<TeardownEvent> evs;
  TeardownState s;
  auto feed = [&s](TeardownEvent const& e) -> TeardownAction {
    auto r = reduce(s, e);
    RC_ASSERT(bool(r));
    s = r->state;
    return r->action;
  };
  bool kill_signalled = false;
  if (readers_first) feed(ReadersDone{});
  if (stop) {
    RC_ASSERT(feed(StopRequested{grace}) == A::signal_graceful);
    auto a = feed(GracefulSent{graceful_targets});
    if (grace) {
      RC_ASSERT(a == A::arm_grace);
      if (term_ends_root) {
        feed(RootExited{});
        if (!readers_first && !descendants_linger) feed(ReadersDone{});
        a = feed(descendants_linger ? TeardownEvent{GraceExpired{}}
                                    : TeardownEvent{TreeSeenEmpty{}});
      } else {
        a = feed(GraceExpired{});
      }
    }
    RC_ASSERT(a == A::kill_tree);
  } else {
    auto a = feed(RootExited{});
    if (!readers_first) {
      RC_ASSERT(a == A::arm_drain);
      a = feed(descendants_linger ? TeardownEvent{DrainExpired{}} : TeardownEvent{ReadersDone{}});
    }
    RC_ASSERT(a == A::kill_tree);
  }
  // The kill: something is left unless the root ended and no descendant lingers.
  bool const something_left = !s.root_exited || descendants_linger;
  kill_signalled = something_left;
  auto a = feed(KillSent{kill_signalled, !something_left});
  if (something_left) {
    RC_ASSERT(a == A::await_empty);
    if (!s.root_exited) RC_ASSERT(feed(RootExited{}) == A::check_tree);
    a = feed(descendants_linger && scan_kills ? TeardownEvent{KillBoundPassed{}}
                                              : TeardownEvent{TreeSeenEmpty{}});
  }
  RC_ASSERT(a == A::start_final_scan);
  a = feed(FinalScanFinished{!scan_kills, scan_kills ? 1U : 0U});
  if (!s.readers_done) {
    RC_ASSERT(a == A::arm_reader_bound);
    a = feed(ReadersDone{});
  }
  RC_ASSERT(a == A::cancel_support);
  // Late completions of cancelled timers change nothing.
  if (s.grace) RC_ASSERT(feed(GraceExpired{}) == A::none);
  if (s.drained) RC_ASSERT(feed(DrainExpired{}) == A::none);
  RC_ASSERT(feed(CloseBegun{}) == A::record_terminal);
  RC_ASSERT(s.stage == S::closing);
  auto const report = escalation_report(s);
  RC_ASSERT(report.graceful_sent == (stop && graceful_targets > 0));
  RC_ASSERT(report.forced == (kill_signalled || scan_kills));
  RC_ASSERT(s.scanned == (scan_kills ? Cleanup::unconfirmed : Cleanup::confirmed));
  for (auto const& e : all_event_variants()) RC_ASSERT(!reduce(s, e));
}

}  // namespace
}  // namespace custos::core
