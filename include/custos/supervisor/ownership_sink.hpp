// OwnershipSink: the durable hook the ExecutionManager calls while it launches and closes an
// execution. The registry implements it; tests and the reference wiring may pass nullptr (the
// manager then keeps everything in memory only).
//
// Order: the manager calls these in the order below, on the event loop, and never blocks on
// them: each write that the launch must wait for completes through its `done`. A failure of the
// authorized, staged or durability steps aborts the launch before any user code runs (the root
// is dropped at its barrier). A failure of the later calls never changes what happened to the
// process: it is reported in the execution's view (`sink_error`) and the terminal record is
// still delivered to waiters.
#pragma once

#include <functional>
#include <string>

#include "custos/core/result.hpp"
#include "custos/supervisor/types.hpp"

namespace custos::sys {
struct PidfsIdentity;
}

namespace custos::supervisor {

class OwnershipSink {
 public:
  virtual ~OwnershipSink() = default;

  // The execution record exists (phase authorized) with its identity, plan and plan digest.
  // `done` gets the result exactly once, before this returns or later as a handler of the event
  // loop the sink was given (never from inside another sink call). The manager creates nothing
  // for the execution before `done` said ok.
  virtual void record_authorized_async(std::string const& execution_id,
                                       core::ExecutionIdentity const& identity,
                                       core::ExecutionPlan const& plan,
                                       std::string const& plan_digest,
                                       std::function<void(Result<>)> done) = 0;

  // The root exists and waits at its barrier; `identity` is its pidfs identity (the only
  // positive process authority; zero for a backend with no host process). `done` as above; the
  // staged record is durable by then. The manager releases the barrier only from `done`.
  virtual void record_staged_async(std::string const& execution_id,
                                   sys::PidfsIdentity const& identity,
                                   StagedBoundary const& boundary,
                                   std::function<void(Result<>)> done) = 0;

  // Everything recorded for this execution so far (its claim above all) is on stable storage
  // when `done` runs. The manager asks after record_staged_async, before the barrier is
  // released, and before it reports any launch outcome to its caller: a sink may commit the
  // claim without waiting for its fsync (the registry's group durability) and pay that wait
  // here, overlapped with the spawn. A failure aborts the launch like a staged failure.
  // Default: everything was durable when written.
  // NOLINTNEXTLINE(performance-unnecessary-value-param): overriders keep `done` for later
  virtual void when_durable(std::string const& execution_id, std::function<void(Result<>)> done) {
    (void)execution_id;
    done(ok());
  }

  // The barrier was released and the target started: ownership slot staged -> committed. The
  // manager records phase `running` right after this call (a sink may write both in one
  // transaction) and answers the launch's caller only from `done`. A failure stops the
  // execution (backend_failure).
  virtual void record_committed_async(std::string const& execution_id,
                                      std::function<void(Result<>)> done) = 0;

  // Every phase change after authorized, in order (starting, running, stopping, exited, closed).
  // Queued: a sink may write it with the next transaction.
  [[nodiscard]] virtual Result<> record_phase(std::string const& execution_id,
                                              core::Phase phase) = 0;

  // The first accepted cancellation trigger, recorded when it is accepted (before the graceful
  // signal), so recovery after a crash still classifies by it. Default: not recorded.
  [[nodiscard]] virtual Result<> record_trigger(std::string const& execution_id,
                                                core::Trigger trigger) {
    (void)execution_id;
    (void)trigger;
    return ok();
  }

  // Final output accounting of one stream, called at close before the terminal record.
  [[nodiscard]] virtual Result<> record_output(std::string const& execution_id, StreamId stream,
                                               core::StreamAccounting const& accounting) = 0;

  // The one terminal record (with its digest), called exactly once per execution; the loop goes
  // on meanwhile. `done` gets the result exactly once, before this returns or later as a
  // handler of the event loop; the record is written by then.
  virtual void record_terminal_async(std::string const& execution_id,
                                     core::TerminalRecord const& record,
                                     std::function<void(Result<>)> done) = 0;
};

}  // namespace custos::supervisor
