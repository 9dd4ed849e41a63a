// Lifecycle reducer: the full transition table, the real paths of an execution, and properties
// under random event sequences (never a second terminal, never backwards).
#include "custos/core/lifecycle.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

namespace custos::core {
namespace {

using event::Adopted;
using event::Closed;
using event::Exited;
using event::Spawned;
using event::SpawnFailed;
using event::SpawnRequested;
using event::StopRequested;
using event::TerminalRecorded;

Result<LifecycleState> run(std::vector<LifecycleEvent> const& events) {
  LifecycleState s;
  for (auto const& e : events) {
    auto r = reduce(s, e);
    if (!r) return r;
    s = *r;
  }
  return s;
}

SpawnFailure enoent() {
  return SpawnFailure{"execve", 2, "/nonexistent: No such file or directory"};
}

TEST(Lifecycle, PhaseWireNamesRoundTrip) {
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < kPhaseCount; ++i) {
    auto const p = static_cast<Phase>(i);
    EXPECT_TRUE(seen.insert(phase_wire(p)).second);
    EXPECT_EQ(phase_from_wire(phase_wire(p)), p);
  }
  EXPECT_EQ(phase_wire(Phase::stopping), "stopping");
  EXPECT_EQ(phase_from_wire("Running"), std::nullopt);
  EXPECT_EQ(phase_from_wire(""), std::nullopt);
}

TEST(Lifecycle, NormalExitPath) {
  auto r = run({SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}, Closed{},
                TerminalRecorded{Classification::exited}});
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->phase, Phase::terminal);
  EXPECT_EQ(r->exit, ExitStatus::exited(0));
  EXPECT_EQ(r->classification, Classification::exited);
  EXPECT_EQ(r->recovery, RecoveryPath::observed);
}

TEST(Lifecycle, ExitWhileStopping) {
  auto r = run({SpawnRequested{}, Spawned{}, StopRequested{}, Exited{ExitStatus::signaled(15)},
                Closed{}, TerminalRecorded{Classification::cancelled}});
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->exit, ExitStatus::signaled(15));
  EXPECT_EQ(r->classification, Classification::cancelled);
}

TEST(Lifecycle, SpawnFailurePathGoesStraightToTerminal) {
  auto r = run({SpawnRequested{}, SpawnFailed{enoent()}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->phase, Phase::starting);
  EXPECT_EQ(r->spawn_failure, enoent());
  auto t = reduce(*r, TerminalRecorded{Classification::spawn_failed});
  ASSERT_TRUE(t);
  EXPECT_EQ(t->phase, Phase::terminal);
  // A trigger accepted during starting decides even over a spawn failure.
  EXPECT_TRUE(reduce(*r, TerminalRecorded{Classification::cancelled}));
  // The program never ran: it cannot have exited or been signalled.
  EXPECT_EQ(reduce(*r, TerminalRecorded{Classification::exited}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*r, TerminalRecorded{Classification::signaled}).error().code,
            Errc::lifecycle_illegal_transition);
  // After a spawn failure it can never be running, and a second failure would rewrite the first.
  EXPECT_EQ(reduce(*r, Spawned{}).error().code, Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*r, SpawnFailed{enoent()}).error().code, Errc::lifecycle_illegal_transition);
}

TEST(Lifecycle, TerminalNeedsSpawnFailureOrClose) {
  auto starting = run({SpawnRequested{}});
  ASSERT_TRUE(starting);
  EXPECT_EQ(reduce(*starting, TerminalRecorded{Classification::spawn_failed}).error().code,
            Errc::lifecycle_illegal_transition);
  auto exited = run({SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(1)}});
  ASSERT_TRUE(exited);
  EXPECT_EQ(reduce(*exited, TerminalRecorded{Classification::exited}).error().code,
            Errc::lifecycle_illegal_transition);
  auto closed = run({SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(1)}, Closed{}});
  ASSERT_TRUE(closed);
  EXPECT_EQ(reduce(*closed, TerminalRecorded{Classification::spawn_failed}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*closed, TerminalRecorded{Classification::recovery_indeterminate}).error().code,
            Errc::lifecycle_illegal_transition);
}

TEST(Lifecycle, ExactlyOneTerminalIsAccepted) {
  auto t = run({SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}, Closed{},
                TerminalRecorded{Classification::exited}});
  ASSERT_TRUE(t);
  std::vector<LifecycleEvent> const all = {
      SpawnRequested{},
      Spawned{},
      SpawnFailed{enoent()},
      StopRequested{},
      Exited{ExitStatus::exited(0)},
      Closed{},
      TerminalRecorded{Classification::exited},
      TerminalRecorded{Classification::cancelled},
      TerminalRecorded{Classification::recovery_indeterminate, RecoveryPath::indeterminate},
      Adopted{Phase::running}};
  for (auto const& e : all) {
    auto r = reduce(*t, e);
    ASSERT_FALSE(r) << event_name(e);
    EXPECT_EQ(r.error().code, Errc::lifecycle_already_terminal) << event_name(e);
  }
}

TEST(Lifecycle, StoppingOnlyFromRunning) {
  EXPECT_EQ(run({StopRequested{}}).error().code, Errc::lifecycle_illegal_transition);
  EXPECT_EQ(run({SpawnRequested{}, StopRequested{}}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(run({SpawnRequested{}, Spawned{}, StopRequested{}, StopRequested{}}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(run({SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}, StopRequested{}})
                .error()
                .code,
            Errc::lifecycle_illegal_transition);
}

TEST(Lifecycle, ClosedNeedsExited) {
  EXPECT_EQ(run({SpawnRequested{}, Spawned{}, Closed{}}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(run({SpawnRequested{}, Spawned{}, StopRequested{}, Closed{}}).error().code,
            Errc::lifecycle_illegal_transition);
}

TEST(Lifecycle, ExitStatusMustBeValid) {
  auto running = run({SpawnRequested{}, Spawned{}});
  ASSERT_TRUE(running);
  EXPECT_EQ(reduce(*running, Exited{ExitStatus{}}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*running, Exited{ExitStatus{0, 9}}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*running, Exited{ExitStatus::exited(256)}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*running, Exited{ExitStatus::signaled(0)}).error().code,
            Errc::lifecycle_illegal_transition);
  EXPECT_EQ(reduce(*running, Exited{ExitStatus{0, std::nullopt, true}}).error().code,
            Errc::lifecycle_illegal_transition);  // a core dump comes with a signal only
  EXPECT_TRUE(reduce(*running, Exited{ExitStatus::signaled(9)}));
  EXPECT_TRUE(reduce(*running, Exited{ExitStatus::signaled(11, true)}));
}

TEST(Lifecycle, RecoveryJumpsOnlyWithIndeterminateClassification) {
  std::vector<std::vector<LifecycleEvent>> const prefixes = {
      {},
      {SpawnRequested{}},
      {SpawnRequested{}, Spawned{}},
      {SpawnRequested{}, Spawned{}, StopRequested{}},
      {SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}},
      {SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}, Closed{}},
  };
  for (auto const& prefix : prefixes) {
    auto s = run(prefix);
    ASSERT_TRUE(s);
    for (auto via : {RecoveryPath::absent_without_terminal, RecoveryPath::indeterminate}) {
      auto ok_jump = reduce(*s, TerminalRecorded{Classification::recovery_indeterminate, via});
      ASSERT_TRUE(ok_jump) << phase_wire(s->phase);
      EXPECT_EQ(ok_jump->phase, Phase::terminal);
      EXPECT_EQ(ok_jump->recovery, via);
      EXPECT_TRUE(is_legal_progression(s->phase, Phase::terminal, via));
      EXPECT_EQ(reduce(*s, TerminalRecorded{Classification::exited, via}).error().code,
                Errc::lifecycle_illegal_transition);
    }
    EXPECT_EQ(reduce(*s, TerminalRecorded{Classification::exited, RecoveryPath::already_terminal})
                  .error()
                  .code,
              Errc::lifecycle_illegal_transition);
  }
}

// The full table: every (phase, event kind) pair against the expected successor phase.
TEST(Lifecycle, TransitionTableMatchesIsLegalProgression) {
  std::vector<std::pair<std::vector<LifecycleEvent>, Phase>> const reach = {
      {{}, Phase::authorized},
      {{SpawnRequested{}}, Phase::starting},
      {{SpawnRequested{}, Spawned{}}, Phase::running},
      {{SpawnRequested{}, Spawned{}, StopRequested{}}, Phase::stopping},
      {{SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(3)}}, Phase::exited},
      {{SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(3)}, Closed{}}, Phase::closed},
  };
  std::vector<LifecycleEvent> const events = {SpawnRequested{}, Spawned{}, StopRequested{},
                                              Exited{ExitStatus::exited(3)}, Closed{}};
  int legal = 0;
  for (auto const& [prefix, phase] : reach) {
    auto s = run(prefix);
    ASSERT_TRUE(s);
    ASSERT_EQ(s->phase, phase);
    for (auto const& e : events) {
      auto r = reduce(*s, e);
      if (r) {
        ++legal;
        EXPECT_TRUE(is_legal_progression(phase, r->phase))
            << phase_wire(phase) << " --" << event_name(e) << "--> " << phase_wire(r->phase);
      } else {
        EXPECT_EQ(r.error().code, Errc::lifecycle_illegal_transition);
      }
    }
  }
  // authorized->starting, starting->running, running->stopping, running->exited,
  // stopping->exited, exited->closed.
  EXPECT_EQ(legal, 6);
  // And the other direction: every legal progression of the observed path.
  int progressions = 0;
  for (std::size_t f = 0; f < kPhaseCount; ++f) {
    for (std::size_t t = 0; t < kPhaseCount; ++t) {
      bool const legal_step = is_legal_progression(static_cast<Phase>(f), static_cast<Phase>(t));
      if (legal_step) {
        ++progressions;
        EXPECT_LT(f, t) << "progressions never go backwards";
      }
    }
  }
  EXPECT_EQ(progressions, 8);  // the six above + starting->terminal + closed->terminal
  EXPECT_FALSE(is_legal_progression(Phase::running, Phase::running));
  EXPECT_FALSE(is_legal_progression(Phase::running, Phase::terminal));
  EXPECT_FALSE(is_legal_progression(Phase::terminal, Phase::terminal, RecoveryPath::indeterminate));
}

TEST(Lifecycle, EventNamesAreStable) {
  EXPECT_EQ(event_name(SpawnRequested{}), "spawn_requested");
  EXPECT_EQ(event_name(Spawned{}), "spawned");
  EXPECT_EQ(event_name(SpawnFailed{}), "spawn_failed");
  EXPECT_EQ(event_name(StopRequested{}), "stop_requested");
  EXPECT_EQ(event_name(Exited{}), "exited");
  EXPECT_EQ(event_name(Closed{}), "closed");
  EXPECT_EQ(event_name(TerminalRecorded{}), "terminal_recorded");
  EXPECT_EQ(event_name(Adopted{}), "adopted");
}

// A supervisor that takes over a live execution after a restart enters the machine once, first,
// into a phase that can hold a live root; from anywhere else `adopted` is refused.
TEST(Lifecycle, AdoptedEntersOnlyAFreshStateInALivePhase) {
  for (std::size_t i = 0; i < kPhaseCount; ++i) {
    auto const p = static_cast<Phase>(i);
    auto r = reduce(LifecycleState{}, Adopted{p});
    bool const live = p == Phase::starting || p == Phase::running || p == Phase::stopping;
    if (live) {
      ASSERT_TRUE(r) << phase_wire(p) << ": " << r.error().message();
      EXPECT_EQ(r->phase, p);
      EXPECT_FALSE(r->exit.has_value());
      EXPECT_FALSE(r->spawn_failure.has_value());
    } else {
      ASSERT_FALSE(r) << phase_wire(p);
      EXPECT_EQ(r.error().code, Errc::lifecycle_illegal_transition) << phase_wire(p);
    }
  }
  // Not after anything else: every state past the fresh one has seen part of a life already.
  std::vector<std::vector<LifecycleEvent>> const prefixes = {
      {SpawnRequested{}},
      {SpawnRequested{}, SpawnFailed{enoent()}},
      {SpawnRequested{}, Spawned{}},
      {SpawnRequested{}, Spawned{}, StopRequested{}},
      {SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}},
      {SpawnRequested{}, Spawned{}, Exited{ExitStatus::exited(0)}, Closed{}},
      {Adopted{Phase::running}},
      {Adopted{Phase::starting}},
  };
  for (auto const& prefix : prefixes) {
    auto s = run(prefix);
    ASSERT_TRUE(s);
    for (auto p : {Phase::starting, Phase::running, Phase::stopping}) {
      auto r = reduce(*s, Adopted{p});
      ASSERT_FALSE(r) << phase_wire(s->phase) << " --adopted--> " << phase_wire(p);
      EXPECT_EQ(r.error().code, Errc::lifecycle_illegal_transition);
    }
  }
}

// From the adopted phase an execution ends like any other, with recovery live_owned.
TEST(Lifecycle, AdoptedExecutionsEndLikeAnyOther) {
  auto exited = run({Adopted{Phase::running}, Exited{ExitStatus::exited(7)}, Closed{},
                     TerminalRecorded{Classification::exited, RecoveryPath::live_owned}});
  ASSERT_TRUE(exited) << exited.error().message();
  EXPECT_EQ(exited->recovery, RecoveryPath::live_owned);
  EXPECT_EQ(exited->exit, ExitStatus::exited(7));

  auto cancelled =
      run({Adopted{Phase::running}, StopRequested{}, Exited{ExitStatus::signaled(9)}, Closed{},
           TerminalRecorded{Classification::cancelled, RecoveryPath::live_owned}});
  ASSERT_TRUE(cancelled) << cancelled.error().message();
  // Adopted while the previous daemon was stopping it: the stop goes on, no second stop_requested.
  auto stopping = run({Adopted{Phase::stopping}, Exited{ExitStatus::signaled(9)}, Closed{},
                       TerminalRecorded{Classification::cancelled, RecoveryPath::live_owned}});
  ASSERT_TRUE(stopping) << stopping.error().message();
  EXPECT_EQ(run({Adopted{Phase::stopping}, StopRequested{}}).error().code,
            Errc::lifecycle_illegal_transition);
  // Committed but `running` never recorded: the launch completes as `spawned`.
  auto late = run({Adopted{Phase::starting}, Spawned{}});
  ASSERT_TRUE(late);
  EXPECT_EQ(late->phase, Phase::running);
  // The launch's commit was never recorded: it ends on the spawn-failure path, where a trigger
  // accepted meanwhile decides, and it can never claim an exit.
  auto unreleased = run({Adopted{Phase::starting}, SpawnFailed{SpawnFailure{"barrier", 0, "x"}}});
  ASSERT_TRUE(unreleased);
  EXPECT_TRUE(
      reduce(*unreleased, TerminalRecorded{Classification::cancelled, RecoveryPath::live_owned}));
  EXPECT_EQ(reduce(*unreleased, TerminalRecorded{Classification::exited, RecoveryPath::live_owned})
                .error()
                .code,
            Errc::lifecycle_illegal_transition);
  // No shortcut to terminal: an adopted execution closes first, like any other.
  EXPECT_EQ(run({Adopted{Phase::running},
                 TerminalRecorded{Classification::exited, RecoveryPath::live_owned}})
                .error()
                .code,
            Errc::lifecycle_illegal_transition);
}

// ---- properties ----------------------------------------------------------------------------

LifecycleEvent event_from(int kind, int detail) {
  switch (kind) {
    case 0:
      return SpawnRequested{};
    case 1:
      return Spawned{};
    case 2:
      return SpawnFailed{enoent()};
    case 3:
      return StopRequested{};
    case 4:
      return Exited{detail % 2 == 0 ? ExitStatus::exited(detail % 256)
                                    : ExitStatus::signaled(1 + detail % 64)};
    case 5:
      return Closed{};
    case 6:
      return Adopted{static_cast<Phase>(detail % static_cast<int>(kPhaseCount))};
    default: {
      auto const c = static_cast<Classification>(detail % static_cast<int>(kClassificationCount));
      auto const via = static_cast<RecoveryPath>((detail / 10) % 5);  // independent of c
      return TerminalRecorded{c, via};
    }
  }
}

RC_GTEST_PROP(LifecycleProps, NeverBackwardsNeverTwoTerminals, ()) {
  auto const kinds = *rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 8));
  auto const details =
      *rc::gen::container<std::vector<int>>(kinds.size(), rc::gen::inRange(0, 1000));
  LifecycleState s;
  int terminals = 0;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    auto const e = event_from(kinds[i], details[i]);
    auto r = reduce(s, e);
    if (s.phase == Phase::terminal) {
      RC_ASSERT(!r);
      RC_ASSERT(r.error().code == Errc::lifecycle_already_terminal);
      continue;
    }
    if (!r) {
      RC_ASSERT(r.error().code == Errc::lifecycle_illegal_transition);
      continue;
    }
    RC_ASSERT(phase_rank(r->phase) >= phase_rank(s.phase));
    if (std::holds_alternative<Adopted>(e)) {
      // Not a stored step (the record is in that phase already): only from the fresh state.
      RC_ASSERT(s == LifecycleState{});
    } else if (r->phase != s.phase) {
      RC_ASSERT(
          is_legal_progression(s.phase, r->phase, r->recovery.value_or(RecoveryPath::observed)));
    }
    // Facts once recorded never change.
    if (s.exit.has_value()) RC_ASSERT(r->exit == s.exit);
    if (s.spawn_failure.has_value()) RC_ASSERT(r->spawn_failure == s.spawn_failure);
    if (r->phase == Phase::terminal) {
      ++terminals;
      RC_ASSERT(r->classification.has_value());
      // A process that ran to closed is never spawn_failed; one that never ran never exited.
      if (r->exit.has_value() && r->recovery == RecoveryPath::observed) {
        RC_ASSERT(*r->classification != Classification::spawn_failed);
      }
      if (r->spawn_failure.has_value()) {
        RC_ASSERT(*r->classification != Classification::exited);
        RC_ASSERT(*r->classification != Classification::signaled);
      }
    }
    s = *r;
  }
  RC_ASSERT(terminals <= 1);
}

// The supervisor's real driving order always reaches exactly one terminal.
RC_GTEST_PROP(LifecycleProps, SupervisorDrivenPathsReachTerminal,
              (bool spawn_ok, bool stop, int code)) {
  std::vector<LifecycleEvent> evs = {SpawnRequested{}};
  Classification c = Classification::spawn_failed;
  if (!spawn_ok) {
    evs.emplace_back(SpawnFailed{enoent()});
  } else {
    evs.emplace_back(Spawned{});
    if (stop) evs.emplace_back(StopRequested{});
    evs.emplace_back(Exited{ExitStatus::exited(std::abs(code % 256))});
    evs.emplace_back(Closed{});
    c = stop ? Classification::cancelled : Classification::exited;
  }
  evs.emplace_back(TerminalRecorded{c});
  auto r = run(evs);
  RC_ASSERT(bool(r));
  RC_ASSERT(r->phase == Phase::terminal);
  RC_ASSERT(r->classification == c);
}

}  // namespace
}  // namespace custos::core
