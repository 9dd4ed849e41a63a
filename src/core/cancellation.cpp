// First-trigger-wins and the terminal classification table (docs/lifecycle.md).
#include "custos/core/cancellation.hpp"

#include <limits>

#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

constexpr auto kTriggerNames = wire_names<Trigger>({
    {Trigger::user, "user"},
    {Trigger::deadline, "deadline"},
    {Trigger::output_limit, "output_limit"},
    {Trigger::resource_limit, "resource_limit"},
    {Trigger::lease_fence, "lease_fence"},
    {Trigger::supervisor_shutdown, "supervisor_shutdown"},
    {Trigger::backend_failure, "backend_failure"},
});
static_assert(kTriggerNames.complete() && kTriggerNames.size() == kTriggerCount);

constexpr auto kClassificationNames = wire_names<Classification>({
    {Classification::exited, "exited"},
    {Classification::signaled, "signaled"},
    {Classification::spawn_failed, "spawn_failed"},
    {Classification::cancelled, "cancelled"},
    {Classification::timed_out, "timed_out"},
    {Classification::output_limit, "output_limit"},
    {Classification::resource_limit, "resource_limit"},
    {Classification::sandbox_denied, "sandbox_denied"},
    {Classification::supervisor_failed, "supervisor_failed"},
    {Classification::recovery_indeterminate, "recovery_indeterminate"},
});
static_assert(kClassificationNames.complete() &&
              kClassificationNames.size() == kClassificationCount);

constexpr auto kRecoveryNames = wire_names<RecoveryPath>({
    {RecoveryPath::observed, "observed"},
    {RecoveryPath::already_terminal, "already_terminal"},
    {RecoveryPath::live_owned, "live_owned"},
    {RecoveryPath::absent_without_terminal, "absent_without_terminal"},
    {RecoveryPath::indeterminate, "indeterminate"},
});
static_assert(kRecoveryNames.complete());

constexpr auto kCleanupNames = wire_names<Cleanup>({
    {Cleanup::confirmed, "confirmed"},
    {Cleanup::unconfirmed, "unconfirmed"},
});
static_assert(kCleanupNames.complete());

constexpr auto kOutcomeNames = wire_names<TriggerOutcome>({
    {TriggerOutcome::accepted, "accepted"},
    {TriggerOutcome::ignored, "ignored"},
    {TriggerOutcome::rejected_after_exit, "rejected_after_exit"},
});
static_assert(kOutcomeNames.complete());

void bump(std::uint32_t& counter) noexcept {
  // Saturate: the counts are diagnostics, and wrapping would make a flood look quiet.
  if (counter != std::numeric_limits<std::uint32_t>::max()) ++counter;
}

}  // namespace

std::string_view trigger_wire(Trigger t) noexcept {
  return kTriggerNames.wire(t);
}
std::optional<Trigger> trigger_from_wire(std::string_view wire) noexcept {
  return kTriggerNames.from_wire(wire);
}

std::string_view classification_wire(Classification c) noexcept {
  return kClassificationNames.wire(c);
}
std::optional<Classification> classification_from_wire(std::string_view wire) noexcept {
  return kClassificationNames.from_wire(wire);
}

std::string_view recovery_path_wire(RecoveryPath r) noexcept {
  return kRecoveryNames.wire(r);
}
std::optional<RecoveryPath> recovery_path_from_wire(std::string_view wire) noexcept {
  return kRecoveryNames.from_wire(wire);
}

std::string_view cleanup_wire(Cleanup c) noexcept {
  return kCleanupNames.wire(c);
}
std::optional<Cleanup> cleanup_from_wire(std::string_view wire) noexcept {
  return kCleanupNames.from_wire(wire);
}

std::string_view trigger_outcome_wire(TriggerOutcome o) noexcept {
  return kOutcomeNames.wire(o);
}

Classification trigger_classification(Trigger t) noexcept {
  switch (t) {
    case Trigger::user:
    case Trigger::lease_fence:
    case Trigger::supervisor_shutdown:
      return Classification::cancelled;
    case Trigger::deadline:
      return Classification::timed_out;
    case Trigger::output_limit:
      return Classification::output_limit;
    case Trigger::resource_limit:
      return Classification::resource_limit;
    case Trigger::backend_failure:
      return Classification::supervisor_failed;
  }
  return Classification::supervisor_failed;
}

bool ExitStatus::valid() const noexcept {
  if (code.has_value() && signal.has_value()) return false;
  // Exit codes are the low 8 bits of the status; Linux signals are 1..64 (SIGRTMAX).
  if (code.has_value() && (*code < 0 || *code > 255)) return false;
  if (signal.has_value() && (*signal < 1 || *signal > 64)) return false;
  if (core_dumped && !signal.has_value()) return false;
  return true;
}

Result<TriggerOutcome> CancellationState::offer(Trigger t) {
  if (sealed_) {
    return Error{Errc::lifecycle_trigger_after_terminal,
                 "trigger " + std::string{trigger_wire(t)} + " offered after the terminal record"};
  }
  auto const i = static_cast<std::size_t>(t);
  if (i >= kTriggerCount) return Error{Errc::lifecycle_illegal_transition, "unknown trigger"};
  if (first_.has_value()) {
    bump(ignored_[i]);
    return TriggerOutcome::ignored;
  }
  if (exit_observed_) {
    bump(rejected_[i]);
    return TriggerOutcome::rejected_after_exit;
  }
  first_ = t;
  return TriggerOutcome::accepted;
}

Result<> CancellationState::observe_exit() {
  if (sealed_)
    return Error{Errc::lifecycle_trigger_after_terminal, "exit observed after the terminal record"};
  if (exit_observed_) return Error{Errc::lifecycle_illegal_transition, "exit observed twice"};
  exit_observed_ = true;
  return ok();
}

Result<> CancellationState::seal() {
  if (sealed_) return Error{Errc::lifecycle_already_terminal, "cancellation state sealed twice"};
  sealed_ = true;
  return ok();
}

std::uint32_t CancellationState::ignored_count(Trigger t) const noexcept {
  auto const i = static_cast<std::size_t>(t);
  return i < kTriggerCount ? ignored_[i] : 0;
}

std::uint32_t CancellationState::rejected_count(Trigger t) const noexcept {
  auto const i = static_cast<std::size_t>(t);
  return i < kTriggerCount ? rejected_[i] : 0;
}

Result<Verdict> classify(ClassifyInput const& in) {
  switch (in.recovery) {
    case RecoveryPath::already_terminal:
      return Error{Errc::lifecycle_already_terminal,
                   "recovery found a terminal record; there is nothing to classify"};
    case RecoveryPath::absent_without_terminal:
    case RecoveryPath::indeterminate:
      // Nobody saw the end: whatever the process did is unknown, and unknown is never success.
      return Verdict{Classification::recovery_indeterminate, false};
    case RecoveryPath::observed:
    case RecoveryPath::live_owned:
      break;
  }
  if (!in.exit.valid()) return Error{Errc::lifecycle_illegal_transition, "invalid exit status"};
  if (in.exit.observed() == in.spawn_failed) {
    return Error{Errc::lifecycle_illegal_transition,
                 in.spawn_failed ? "both a spawn failure and an exit were observed"
                                 : "neither an exit nor a spawn failure was observed"};
  }
  // Order matters and is the table of docs/lifecycle.md: a trigger accepted before the end was
  // observed decides, then a sandbox denial, then the spawn failure, then the raw exit.
  if (in.trigger.has_value()) return Verdict{trigger_classification(*in.trigger), false};
  if (in.sandbox_denied) return Verdict{Classification::sandbox_denied, false};
  if (in.spawn_failed) return Verdict{Classification::spawn_failed, false};
  if (in.exit.signal.has_value()) return Verdict{Classification::signaled, false};
  bool const success = *in.exit.code == 0 && in.cleanup == Cleanup::confirmed;
  return Verdict{Classification::exited, success};
}

}  // namespace custos::core
