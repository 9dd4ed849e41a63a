// First-trigger-wins and classification: the table of docs/lifecycle.md, and properties under
// random interleavings of triggers and the exit.
#include "custos/core/cancellation.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

namespace custos::core {
namespace {

constexpr Trigger kAllTriggers[] = {Trigger::user,           Trigger::deadline,
                                    Trigger::output_limit,   Trigger::resource_limit,
                                    Trigger::lease_fence,    Trigger::supervisor_shutdown,
                                    Trigger::backend_failure};

TEST(Cancellation, WireNamesRoundTrip) {
  std::set<std::string_view> seen;
  for (auto t : kAllTriggers) {
    EXPECT_TRUE(seen.insert(trigger_wire(t)).second);
    EXPECT_EQ(trigger_from_wire(trigger_wire(t)), t);
  }
  EXPECT_EQ(trigger_wire(Trigger::supervisor_shutdown), "supervisor_shutdown");
  EXPECT_EQ(trigger_from_wire("timeout"), std::nullopt);
  std::set<std::string_view> cls;
  for (std::size_t i = 0; i < kClassificationCount; ++i) {
    auto const c = static_cast<Classification>(i);
    EXPECT_TRUE(cls.insert(classification_wire(c)).second);
    EXPECT_EQ(classification_from_wire(classification_wire(c)), c);
  }
  EXPECT_EQ(classification_wire(Classification::recovery_indeterminate), "recovery_indeterminate");
  for (auto r : {RecoveryPath::observed, RecoveryPath::already_terminal, RecoveryPath::live_owned,
                 RecoveryPath::absent_without_terminal, RecoveryPath::indeterminate}) {
    EXPECT_EQ(recovery_path_from_wire(recovery_path_wire(r)), r);
  }
  EXPECT_EQ(cleanup_from_wire("unconfirmed"), Cleanup::unconfirmed);
  EXPECT_EQ(cleanup_from_wire("gone"), std::nullopt);
}

TEST(Cancellation, TriggerClassificationTable) {
  EXPECT_EQ(trigger_classification(Trigger::user), Classification::cancelled);
  EXPECT_EQ(trigger_classification(Trigger::lease_fence), Classification::cancelled);
  EXPECT_EQ(trigger_classification(Trigger::supervisor_shutdown), Classification::cancelled);
  EXPECT_EQ(trigger_classification(Trigger::deadline), Classification::timed_out);
  EXPECT_EQ(trigger_classification(Trigger::output_limit), Classification::output_limit);
  EXPECT_EQ(trigger_classification(Trigger::resource_limit), Classification::resource_limit);
  EXPECT_EQ(trigger_classification(Trigger::backend_failure), Classification::supervisor_failed);
}

TEST(Cancellation, FirstAcceptedTriggerWins) {
  CancellationState s;
  EXPECT_EQ(s.offer(Trigger::deadline).value(), TriggerOutcome::accepted);
  EXPECT_EQ(s.offer(Trigger::user).value(), TriggerOutcome::ignored);
  EXPECT_EQ(s.offer(Trigger::user).value(), TriggerOutcome::ignored);
  EXPECT_EQ(s.offer(Trigger::deadline).value(), TriggerOutcome::ignored);
  EXPECT_EQ(s.first(), Trigger::deadline);
  EXPECT_EQ(s.ignored_count(Trigger::user), 2U);
  EXPECT_EQ(s.ignored_count(Trigger::deadline), 1U);
  // The exit races in after the trigger: the trigger still decides.
  ASSERT_TRUE(s.observe_exit());
  EXPECT_EQ(s.offer(Trigger::output_limit).value(), TriggerOutcome::ignored);
  EXPECT_EQ(s.first(), Trigger::deadline);
}

TEST(Cancellation, TriggerAfterExitIsRejected) {
  CancellationState s;
  ASSERT_TRUE(s.observe_exit());
  EXPECT_EQ(s.offer(Trigger::user).value(), TriggerOutcome::rejected_after_exit);
  EXPECT_EQ(s.first(), std::nullopt);
  EXPECT_EQ(s.rejected_count(Trigger::user), 1U);
  EXPECT_EQ(s.observe_exit().error().code, Errc::lifecycle_illegal_transition);
}

TEST(Cancellation, SealedStateRefusesEverything) {
  CancellationState s;
  ASSERT_TRUE(s.seal());
  EXPECT_EQ(s.offer(Trigger::user).error().code, Errc::lifecycle_trigger_after_terminal);
  EXPECT_EQ(s.observe_exit().error().code, Errc::lifecycle_trigger_after_terminal);
  EXPECT_EQ(s.seal().error().code, Errc::lifecycle_already_terminal);
}

struct Row {
  ClassifyInput in;
  Classification want;
  bool success;
};

TEST(Classify, Table) {
  auto const ex0 = ExitStatus::exited(0);
  auto const ex1 = ExitStatus::exited(1);
  auto const sig9 = ExitStatus::signaled(9);
  std::vector<Row> const rows = {
      {{ex0, false, {}, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::exited,
       true},
      {{ex0, false, {}, Cleanup::unconfirmed, false, RecoveryPath::observed},
       Classification::exited,
       false},
      {{ex1, false, {}, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::exited,
       false},
      {{sig9, false, {}, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::signaled,
       false},
      {{{}, true, {}, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::spawn_failed,
       false},
      {{ex0, false, Trigger::user, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::cancelled,
       false},
      {{ex0, false, Trigger::deadline, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::timed_out,
       false},
      {{sig9, false, Trigger::output_limit, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::output_limit,
       false},
      {{sig9, false, Trigger::resource_limit, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::resource_limit,
       false},
      {{sig9, false, Trigger::lease_fence, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::cancelled,
       false},
      {{sig9, false, Trigger::supervisor_shutdown, Cleanup::confirmed, false,
        RecoveryPath::observed},
       Classification::cancelled,
       false},
      {{sig9, false, Trigger::backend_failure, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::supervisor_failed,
       false},
      {{{}, true, Trigger::user, Cleanup::confirmed, false, RecoveryPath::observed},
       Classification::cancelled,
       false},
      {{ExitStatus::signaled(31), false, {}, Cleanup::confirmed, true, RecoveryPath::observed},
       Classification::sandbox_denied,
       false},
      {{ExitStatus::signaled(31), false, Trigger::deadline, Cleanup::confirmed, true,
        RecoveryPath::observed},
       Classification::timed_out,
       false},
      {{ex0, false, {}, Cleanup::confirmed, false, RecoveryPath::live_owned},
       Classification::exited,
       true},
      {{{}, false, {}, Cleanup::unconfirmed, false, RecoveryPath::absent_without_terminal},
       Classification::recovery_indeterminate,
       false},
      {{ex0, false, {}, Cleanup::confirmed, false, RecoveryPath::indeterminate},
       Classification::recovery_indeterminate,
       false},
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto v = classify(rows[i].in);
    ASSERT_TRUE(v) << "row " << i << ": " << v.error().message();
    EXPECT_EQ(v->classification, rows[i].want) << "row " << i;
    EXPECT_EQ(v->success, rows[i].success) << "row " << i;
  }
}

TEST(Classify, RejectsImpossibleInputs) {
  ClassifyInput none;  // no exit, no spawn failure
  EXPECT_EQ(classify(none).error().code, Errc::lifecycle_illegal_transition);
  ClassifyInput both;
  both.exit = ExitStatus::exited(0);
  both.spawn_failed = true;
  EXPECT_EQ(classify(both).error().code, Errc::lifecycle_illegal_transition);
  ClassifyInput bad;
  bad.exit = ExitStatus{1, 9};
  EXPECT_EQ(classify(bad).error().code, Errc::lifecycle_illegal_transition);
  ClassifyInput done;
  done.recovery = RecoveryPath::already_terminal;
  EXPECT_EQ(classify(done).error().code, Errc::lifecycle_already_terminal);
}

// ---- properties ----------------------------------------------------------------------------

// Any interleaving of trigger offers and one exit observation: the accepted trigger is the first
// trigger offered before the exit; every later offer is ignored or rejected; classification then
// follows that trigger (or the raw exit when none was accepted).
RC_GTEST_PROP(CancellationProps, FirstTriggerWinsUnderAnyInterleaving, ()) {
  auto const offers = *rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 7));
  auto const exit_at = *rc::gen::inRange<std::size_t>(0, offers.size() + 1);
  auto const code = *rc::gen::inRange(0, 256);
  CancellationState s;
  std::optional<Trigger> expected;
  for (std::size_t i = 0; i <= offers.size(); ++i) {
    if (i == exit_at) RC_ASSERT(bool(s.observe_exit()));
    if (i == offers.size()) break;
    auto const t = static_cast<Trigger>(offers[i]);
    auto const out = s.offer(t);
    RC_ASSERT(bool(out));
    if (!expected.has_value() && i < exit_at) {
      expected = t;
      RC_ASSERT(*out == TriggerOutcome::accepted);
    } else if (expected.has_value()) {
      RC_ASSERT(*out == TriggerOutcome::ignored);
    } else {
      RC_ASSERT(*out == TriggerOutcome::rejected_after_exit);
    }
  }
  RC_ASSERT(s.first() == expected);
  ClassifyInput in;
  in.exit = ExitStatus::exited(code);
  in.trigger = s.first();
  auto const v = classify(in);
  RC_ASSERT(bool(v));
  if (expected.has_value()) {
    RC_ASSERT(v->classification == trigger_classification(*expected));
    RC_ASSERT(!v->success);
  } else {
    RC_ASSERT(v->classification == Classification::exited);
    RC_ASSERT(v->success == (code == 0));
  }
  RC_ASSERT(bool(s.seal()));
  RC_ASSERT(!s.offer(Trigger::user));
}

// Success is never claimed without a clean zero exit and a confirmed cleanup.
RC_GTEST_PROP(CancellationProps, SuccessOnlyForCleanZeroExit,
              (bool spawn_failed, bool has_trigger, int trig, bool signaled, int code,
               bool confirmed, bool denied)) {
  ClassifyInput in;
  in.spawn_failed = spawn_failed;
  if (!spawn_failed) {
    in.exit = signaled ? ExitStatus::signaled(1 + std::abs(code % 64))
                       : ExitStatus::exited(std::abs(code % 256));
  }
  if (has_trigger) in.trigger = static_cast<Trigger>(std::abs(trig % 7));
  in.cleanup = confirmed ? Cleanup::confirmed : Cleanup::unconfirmed;
  in.sandbox_denied = denied;
  auto const v = classify(in);
  RC_ASSERT(bool(v));
  bool const clean =
      !spawn_failed && !has_trigger && !signaled && in.exit.code == 0 && confirmed && !denied;
  RC_ASSERT(v->success == clean);
}

}  // namespace
}  // namespace custos::core
