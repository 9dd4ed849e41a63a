// OwnershipSink: the durable hook the ExecutionManager calls while it launches and closes an
// execution. The registry implements it; tests and the reference wiring may pass nullptr (the
// manager then keeps everything in memory only).
//
// Order and blocking: the manager calls these in the order below, on the event loop, and waits
// for each Result before it continues (the *_async forms: for their completion). A failure of
// record_authorized, record_staged or record_committed aborts the launch before any user code runs
// (the staged child is killed and reaped at its barrier). A failure of the later calls never
// changes what happened to the process: it is reported in the execution's view (`sink_error`) and
// the terminal record is still delivered to waiters.
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
  [[nodiscard]] virtual Result<> record_authorized(std::string const& execution_id,
                                                   core::ExecutionIdentity const& identity,
                                                   core::ExecutionPlan const& plan,
                                                   std::string const& plan_digest) = 0;

  // record_authorized without blocking (the event-loop launch): `done` gets the result
  // record_authorized would return, exactly once, before this returns or later as a handler of
  // the event loop the sink was given (never from inside another sink call). The manager
  // creates nothing for the execution before `done` said ok. Default: record_authorized, then
  // `done` at once.
  virtual void record_authorized_async(std::string const& execution_id,
                                       core::ExecutionIdentity const& identity,
                                       core::ExecutionPlan const& plan,
                                       std::string const& plan_digest,
                                       std::function<void(Result<>)> done) {
    done(record_authorized(execution_id, identity, plan, plan_digest));
  }

  // The child exists and waits on its barrier; `identity` is its pidfs identity (the only
  // positive process authority). Must be durable before it returns: the barrier is released
  // only after this succeeds.
  [[nodiscard]] virtual Result<> record_staged(std::string const& execution_id,
                                               sys::PidfsIdentity const& identity,
                                               Boundary boundary, std::string const& cgroup_path,
                                               std::string const& marker_value) = 0;

  // record_staged without blocking (the event-loop launch): `done` gets the result
  // record_staged would return, exactly once, before this returns or later as a handler of the
  // event loop the sink was given (never from inside another sink call); the staged record is
  // durable by then. The manager releases the barrier only from `done`. Default: record_staged,
  // then `done` at once.
  virtual void record_staged_async(std::string const& execution_id,
                                   sys::PidfsIdentity const& identity, Boundary boundary,
                                   std::string const& cgroup_path, std::string const& marker_value,
                                   std::function<void(Result<>)> done) {
    done(record_staged(execution_id, identity, boundary, cgroup_path, marker_value));
  }

  // Everything recorded for this execution so far (its claim above all) is on stable storage
  // when this returns. The manager calls it after record_staged, before the barrier is
  // released, and before it reports any launch outcome to its caller: a sink may commit the
  // claim without waiting for its fsync (the registry's group durability) and pay that wait
  // here, overlapped with the spawn. A failure aborts the launch like a record_staged failure.
  // Default: everything was durable when written.
  [[nodiscard]] virtual Result<> make_durable(std::string const& execution_id) {
    (void)execution_id;
    return ok();
  }
  // make_durable without blocking (the event-loop launch): `done` gets its result exactly
  // once, before this returns or later as a handler of the event loop the sink was given
  // (never from inside another sink call). Default: make_durable, then `done` at once.
  virtual void when_durable(std::string const& execution_id, std::function<void(Result<>)> done) {
    done(make_durable(execution_id));
  }

  // The barrier was released and execve succeeded: ownership slot staged -> committed.
  [[nodiscard]] virtual Result<> record_committed(std::string const& execution_id) = 0;
  // record_committed without blocking, delivered like record_staged_async's `done`. The manager
  // records phase `running` right after this call (a sink may write both in one transaction)
  // and answers the launch's caller only from `done`. A failure stops the execution
  // (backend_failure). Default: record_committed, then `done` at once.
  virtual void record_committed_async(std::string const& execution_id,
                                      std::function<void(Result<>)> done) {
    done(record_committed(execution_id));
  }

  // Every phase change after authorized, in order (starting, running, stopping, exited, closed).
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

  // Final output accounting of one stream, called at close before record_terminal.
  [[nodiscard]] virtual Result<> record_output(std::string const& execution_id, StreamId stream,
                                               core::StreamAccounting const& accounting) = 0;

  // The one terminal record (with its digest). Called exactly once per execution.
  [[nodiscard]] virtual Result<> record_terminal(std::string const& execution_id,
                                                 core::TerminalRecord const& record) = 0;

  // record_terminal without blocking the caller (the supervisor's close uses it, so the loop
  // does not wait for the transaction): `done` gets the same result record_terminal would
  // return, exactly once, either before this returns or later as a handler of the event loop
  // (never from inside another sink call). The record is written by then. Default: the
  // synchronous record_terminal, then `done` at once.
  virtual void record_terminal_async(std::string const& execution_id,
                                     core::TerminalRecord const& record,
                                     std::function<void(Result<>)> done) {
    done(record_terminal(execution_id, record));
  }
};

}  // namespace custos::supervisor
