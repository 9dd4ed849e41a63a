// Cancellation triggers, the first-trigger-wins state, and the pure terminal classification.
//
// The supervisor sees several things race at the end of an execution: a user cancel, the
// deadline, an output or resource limit, a lease fence, a daemon shutdown, a backend failure, and
// the process's own exit. Which of them "decided" the outcome must not depend on scheduling
// luck after the fact, so the rule is fixed here: the first trigger the supervisor *accepted*
// decides the classification, even when the exit is observed a moment later; the raw exit is
// still recorded beside it. docs/lifecycle.md holds the full table.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "custos/core/result.hpp"

namespace custos::core {

// Why an execution was asked to stop. Wire names are API (exec.cancel, exec.event, records).
enum class Trigger : std::uint8_t {
  user,
  deadline,
  output_limit,
  resource_limit,
  lease_fence,
  supervisor_shutdown,
  backend_failure,
};
inline constexpr std::size_t kTriggerCount = 7;

[[nodiscard]] std::string_view trigger_wire(Trigger t) noexcept;
[[nodiscard]] std::optional<Trigger> trigger_from_wire(std::string_view wire) noexcept;

// The top-level outcome of an execution (docs/api.md "The terminal result").
enum class Classification : std::uint8_t {
  exited,
  signaled,
  spawn_failed,
  cancelled,
  timed_out,
  output_limit,
  resource_limit,
  sandbox_denied,
  supervisor_failed,
  recovery_indeterminate,
};
inline constexpr std::size_t kClassificationCount = 10;

[[nodiscard]] std::string_view classification_wire(Classification c) noexcept;
[[nodiscard]] std::optional<Classification> classification_from_wire(
    std::string_view wire) noexcept;

// The classification a trigger imposes when it was the first one accepted.
[[nodiscard]] Classification trigger_classification(Trigger t) noexcept;

// How the terminal result was reached: `observed` by the supervisor that owned the process, or
// one of the outcomes of startup recovery after a daemon restart (issue 4).
enum class RecoveryPath : std::uint8_t {
  observed,
  already_terminal,         // the record was already terminal; recovery only re-read it
  live_owned,               // the process was re-acquired by exact pidfs identity and supervised on
  absent_without_terminal,  // the process is gone and its end was never observed
  indeterminate,            // identity could not be proven either way; nothing was signalled
};

[[nodiscard]] std::string_view recovery_path_wire(RecoveryPath r) noexcept;
[[nodiscard]] std::optional<RecoveryPath> recovery_path_from_wire(std::string_view wire) noexcept;

// Whether the process tree was confirmed empty at close. Never silently omitted.
enum class Cleanup : std::uint8_t { confirmed, unconfirmed };

[[nodiscard]] std::string_view cleanup_wire(Cleanup c) noexcept;
[[nodiscard]] std::optional<Cleanup> cleanup_from_wire(std::string_view wire) noexcept;

// The raw end of a process as the kernel reported it: at most one of code and signal is set.
// Both empty means no exit was observed (spawn failure, or recovery without an observation).
// The one exit type of every layer: sys fills it from waitid/PIDFD_GET_INFO, backends hand it to
// the supervisor, and the terminal record keeps it.
struct ExitStatus {
  std::optional<std::int32_t> code;
  std::optional<std::int32_t> signal;
  // The kernel wrote a core image (CLD_DUMPED, WCOREDUMP); only ever with `signal`. What the
  // kernel said, kept for whoever holds the status; the terminal record's wire and canonical
  // forms carry code and signal only (docs/api.md), so a record read back has it false.
  bool core_dumped = false;

  [[nodiscard]] static ExitStatus exited(std::int32_t c) { return {c, std::nullopt, false}; }
  [[nodiscard]] static ExitStatus signaled(std::int32_t s, bool core = false) {
    return {std::nullopt, s, core};
  }
  [[nodiscard]] bool observed() const noexcept { return code.has_value() || signal.has_value(); }
  // False when both are set, or a code outside 0..255, or a signal outside 1..64, or a core
  // dump without a signal.
  [[nodiscard]] bool valid() const noexcept;

  friend bool operator==(ExitStatus const&, ExitStatus const&) = default;
};

// Why a launch never reached the target program: the failing step's stable code (for example
// "execve", "chdir", "clone3"), its errno, and a human detail.
struct SpawnFailure {
  std::string code;
  std::int32_t sys_errno = 0;
  std::string detail;

  friend bool operator==(SpawnFailure const&, SpawnFailure const&) = default;
};

// What became of one offered trigger.
enum class TriggerOutcome : std::uint8_t {
  accepted,             // the first one: it decides the classification
  ignored,              // a trigger was already accepted; counted, changes nothing
  rejected_after_exit,  // the exit was observed first; the exit decides, the trigger is counted
};

[[nodiscard]] std::string_view trigger_outcome_wire(TriggerOutcome o) noexcept;

// First-trigger-wins bookkeeping for one execution. A value type (no I/O, no clock): the
// supervisor owns one and feeds it in the order it observes things on its event loop. Memory is
// bounded whatever the number of offers: later triggers are only counted (saturating).
class CancellationState {
 public:
  // Offers a trigger. Errc::lifecycle_trigger_after_terminal once sealed.
  [[nodiscard]] Result<TriggerOutcome> offer(Trigger t);
  // Records that the process's end (exit or spawn failure) was observed: from now on triggers
  // are rejected. A trigger accepted earlier keeps deciding. Errc::lifecycle_illegal_transition
  // when called twice, lifecycle_trigger_after_terminal once sealed.
  [[nodiscard]] Result<> observe_exit();
  // The terminal record was written: nothing may be offered any more. Sealing twice is
  // Errc::lifecycle_already_terminal.
  [[nodiscard]] Result<> seal();

  [[nodiscard]] std::optional<Trigger> first() const noexcept { return first_; }
  [[nodiscard]] bool exit_observed() const noexcept { return exit_observed_; }
  [[nodiscard]] bool sealed() const noexcept { return sealed_; }
  [[nodiscard]] std::uint32_t ignored_count(Trigger t) const noexcept;
  [[nodiscard]] std::uint32_t rejected_count(Trigger t) const noexcept;

  friend bool operator==(CancellationState const&, CancellationState const&) = default;

 private:
  std::optional<Trigger> first_;
  bool exit_observed_ = false;
  bool sealed_ = false;
  std::array<std::uint32_t, kTriggerCount> ignored_{};
  std::array<std::uint32_t, kTriggerCount> rejected_{};
};

// Everything classification depends on, and nothing else.
struct ClassifyInput {
  ExitStatus exit;                       // the raw exit; empty if none was observed
  bool spawn_failed = false;             // the target program never started
  std::optional<Trigger> trigger;        // CancellationState::first()
  Cleanup cleanup = Cleanup::confirmed;  // tree confirmed empty at close
  bool sandbox_denied = false;           // the backend observed a sandbox denial ending the run
  RecoveryPath recovery = RecoveryPath::observed;
};

struct Verdict {
  Classification classification;
  // True only for `exited` with code 0, no trigger, and cleanup confirmed. A zero exit with an
  // unconfirmed cleanup is never a success.
  bool success = false;

  friend bool operator==(Verdict const&, Verdict const&) = default;
};

// The pure classification (docs/lifecycle.md, "Classification"). Errors:
//   lifecycle_already_terminal    recovery == already_terminal (there is nothing to decide)
//   lifecycle_illegal_transition  an observed path with neither an exit nor a spawn failure, or
//                                 with both, or an invalid ExitStatus
[[nodiscard]] Result<Verdict> classify(ClassifyInput const& in);

}  // namespace custos::core
