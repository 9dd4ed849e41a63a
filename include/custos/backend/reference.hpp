// The reference backend: no process at all. A deterministic model of one walks the plan's script
// (plan.backend.script: writes, sleeps, descendants, ignored signals, resource use, stdin reads,
// an exit or a signal) through the same supervisor as a native execution: the same lifecycle,
// events, accounting, limits, cancellation, escalation and terminal vocabulary. The same script
// gives the same events and terminal result every time (timing aside: wall time is the daemon's
// clock). It is the oracle the conformance suites compare real backends with.
//
// The model, exactly:
//   - output: each write step delivers its bytes in chunks of the plan's chunk_bytes, on stdout
//     or stderr (both on the pty stream in PTY mode);
//   - the tree: the root plus every descendant `spawn` added; the streams stay open while any of
//     them lives, so a root that exits leaving descendants drains like a native one until the
//     supervisor kills the rest;
//   - signals: the graceful signal ends the whole tree unless an `ignore` step named it; SIGKILL
//     (the kill stage) always ends it; a signal arrives as a handler of the loop, after the call
//     that sent it, as a real one arrives after kill(2) returns;
//   - stdin: `read_stdin N` waits until N more bytes arrived or the input ended; input written to
//     a model whose tree has ended is refused as a closed pipe;
//   - resources: `use` sets the observed values (cpu_ms, memory_bytes as RSS, disk_bytes,
//     descriptors), `spawn` the observed process count, each reported to the supervisor at once;
//   - cleanup is always confirmed: nothing of a model can outlive it;
//   - the sandbox: the model admits every control and enforces its checked sandbox plan
//     deterministically: a step the plan denies (a `spawn` under descendants false, or one that
//     would take the tree past max_processes) is refused, the denial reported to the supervisor
//     (the run ends sandbox_denied, its record naming the control) and the root ends as a
//     process killed for a forbidden call does (SIGSYS); the steps after it do not run.
// After a daemon crash nothing of a model survives (it lived in the daemon's memory): recovery
// classifies its record absent_without_terminal.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/backend.hpp"

namespace custos::backend {

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(boost::asio::io_context& io) : io_(io) {}

  [[nodiscard]] core::BackendKind kind() const noexcept override {
    return core::BackendKind::reference;
  }
  // Every control, the sandbox's included, at the fidelity of a model (hard: the model does
  // exactly what it is told, and what its checked sandbox plan allows).
  [[nodiscard]] Descriptor descriptor() const override;
  // Admits every reference plan (its script was validated with the plan).
  [[nodiscard]] Admission admit(core::ExecutionPlan const& plan) const override;
  [[nodiscard]] std::shared_ptr<BackendExecution> create(std::string execution_id) override;

 private:
  boost::asio::io_context& io_;
};

}  // namespace custos::backend
