// Adoption: a live execution a previous daemon launched, taken over after a restart through the
// pidfd startup recovery re-acquired its root with (supervisor/recovery.hpp). It enters the
// lifecycle with `adopted` in the phase its record is in, and from then on it is this
// supervisor's like any other: the same cancellation, deadline, sampler, teardown, final scan
// and terminal record (recovery live_owned), written through the same sink. After a crash or a
// plain restart it lacks its output unless the StdioKeeper kept its output descriptors: without
// them the previous daemon's pipes died with it, every stream is accounted incomplete and the
// backend observes `output=not_kept`; with them (`output: restored`) reading goes on from the
// spools' sizes, still incomplete (what the dead daemon had read but not spooled is unknown).
// After a handover the previous image carried its stdio, streams, input and events (hand_over(),
// Carried): they go on, and `adopted` says `output: kept`.
//
// Its record is continued, never re-created: no claim, no `authorized`, no staged write. How it
// goes on depends on what the record says:
//   committed, running         supervised; a recorded trigger (the stop never reached
//                              `stopping`) starts the stop now: graceful, grace, kill
//   committed, starting        `running` was not recorded yet: the launch completes (spawned)
//   committed, stopping        the previous daemon was stopping it and the grace it gave began
//                              at an unknown time: killed now
//   staged (any phase)         the launch's commit was never recorded, so nobody was told it
//                              started: stopped at once (trigger supervisor_shutdown) and ended
//                              on the spawn-failure path (spawn_error "barrier")
#include <csignal>

#include "supervisor.hpp"

namespace custos::supervisor {

Result<> Supervisor::adopt(AdoptRequest request, std::size_t live_executions) {
  watch_.launch_began(live_executions + 1);
  watch_.adopted(request.age);
  backend::AdoptContext ctx = std::move(request.root);
  ctx.execution_id = id_;
  ctx.plan = &request_.plan;
  ctx.view = &plan_;
  std::shared_ptr<Carried> const carried = std::move(request.carried);
  if (carried) {
    ctx.stdio = std::move(carried->stdio);
    ctx.disk_baseline = carried->disk_baseline;
    watch_.resume(carried->peaks);
    // A handover's or the keeper's: the keeper holds them already (kept at the launch).
    stdio_kept_ = config().stdio_keeper != nullptr;
  }
  acquired_ = CUSTOS_TRY(backend_->adopt(std::move(ctx)));
  adopted_ = true;
  claim_durable_ = true;  // the previous daemon's launch awaited it
  running_ = request.launch_committed;
  watch_.acquired(acquired_.memory_hard, acquired_.pids_hard, acquired_.descriptors_hard);

  // The record is in this phase already: nothing is written for it.
  auto entered = core::reduce(life_, core::event::Adopted{request.phase});
  if (!entered) return entered.error();
  life_ = *entered;
  if (request.trigger) {
    // Recorded by the previous daemon: it stays the first accepted one (and is not written
    // again); a later exec.cancel is then not accepted, as for any execution.
    (void)cancel_.offer(*request.trigger);
  }
  if (carried) {
    // A handover: the events, the streams and the input go on where the previous image left
    // them; `adopted` is the next seq. Restored from the keeper: the streams go on from their
    // spools, the events start again at 1.
    events_.resume(carried->next_seq, std::move(carried->events));
    pumps_.resume(plan_.pty, *carried);
  } else {
    pumps_.adopt_streams(plan_.pty, request.out, request.err);
  }

  boost::json::object f;
  f["pid"] = acquired_.pid;
  f["boundary"] = core::boundary_wire(acquired_.boundary);
  f["containment"] = acquired_.kernel_enforced ? "kernel_enforced" : "escapable";
  if (!acquired_.cgroup_path.empty()) f["cgroup"] = acquired_.cgroup_path;
  f["phase"] = core::phase_wire(request.phase);
  f["started_at_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                           watch_.started_wall().time_since_epoch())
                           .count();
  f["output"] = !carried ? "not_kept" : carried->restored ? "restored" : "kept";
  if (request.trigger) f["trigger"] = core::trigger_wire(*request.trigger);
  emit("adopted", std::move(f));

  if (!request.launch_committed) {
    spawn_failure_ = core::SpawnFailure{
        "barrier", 0,
        "the daemon restarted before the commit of the launch was recorded; stopped on adoption"};
    advance(core::event::SpawnFailed{*spawn_failure_});
  } else if (life_.phase == core::Phase::starting) {
    advance(core::event::Spawned{});  // records `running`, the write the crash lost
  }
  backend_->start(*this);
  if (!carried || carried->restored) {
    pumps_.close_input("none");  // no input channel survived the restart
  } else {
    pumps_.drain_input();  // what callers gave before the handover, then their eof
    if (pumps_.all_ended()) teardown_.streams_ended();
  }
  watch_.start();

  if (!request.launch_committed) {
    (void)offer(core::Trigger::supervisor_shutdown,
                "adopted with its launch commit unrecorded: nobody was told it started");
    teardown_.kill_now();
  } else if (life_.phase == core::Phase::stopping) {
    teardown_.kill_now();
  } else if (cancel_.first() && !teardown_.stop_requested_already()) {
    teardown_.stop_requested();
  }
  return ok();
}

bool Supervisor::hold_exit() {
  if (terminal_ || detached_) return false;
  backend_->hold_exit();
  return exit_.has_value();
}

std::optional<Carried> Supervisor::hand_over() {
  // Ended, detached, or launched but not answered yet: recovery's to adopt, without its output.
  if (terminal_ || detached_ || pending_start_ || spawn_failure_) return std::nullopt;
  auto stdio = backend_->hand_over_stdio();
  if (!stdio) return std::nullopt;
  Carried c;
  c.execution_id = id_;
  c.stdio = std::move(*stdio);
  pumps_.carry(c);
  c.next_seq = events_.next_seq();
  watch_.carry(c.peaks);
  c.disk_baseline = backend_->disk_baseline();
  c.events.assign(events_.retained().begin(), events_.retained().end());
  return c;
}

void Supervisor::unreleased_root_exited(std::optional<core::ExitStatus> status) {
  watch_.root_exited();
  // The spawn-failure path keeps no exit (the program's start was never recorded); the status
  // is still told in the event.
  core::ExitStatus ex;
  if (status) {
    ex = *status;
  } else {
    ex.signal = SIGKILL;  // only what closes the gate below: never recorded
  }
  exit_ = ex;
  (void)cancel_.observe_exit();
  boost::json::object f;
  if (status) {
    boost::json::object e;
    e["code"] = ex.code ? boost::json::value(*ex.code) : boost::json::value(nullptr);
    e["signal"] = ex.signal ? boost::json::value(*ex.signal) : boost::json::value(nullptr);
    f["exit"] = std::move(e);
  } else {
    f["exit"] = nullptr;
  }
  emit("exited", std::move(f));
  teardown_.root_exited();
}

void Supervisor::close_unreleased() {
  auto const cleanup = teardown_.cleanup();
  boost::json::object f;
  f["cleanup"] = core::cleanup_wire(cleanup);
  if (!teardown_.cleanup_detail().empty()) f["cleanup_detail"] = teardown_.cleanup_detail();
  emit("closed", std::move(f));

  core::ClassifyInput in;
  in.spawn_failed = true;
  in.trigger = cancel_.first();
  in.cleanup = cleanup;
  in.recovery = core::RecoveryPath::live_owned;
  auto rec = core::make_terminal_record(in, spawn_failure_);
  core::TerminalRecord record;
  if (rec) {
    record = std::move(*rec);
  } else {
    record.classification = core::Classification::spawn_failed;
    record.recovery = core::RecoveryPath::live_owned;
    record.spawn_error = spawn_failure_;
    sink_error_ = "classification failed: " + rec.error().message();
  }
  record.output = pumps_.accounting();
  record.resources = watch_.report(true, pumps_.observed_total());
  record.tree = core::TreeReport{acquired_.boundary, cleanup, core::Containment::escapable};
  record.escalation = teardown_.escalation();
  record.observations = backend_->observations();
  backend_->close();
  finish_terminal(std::move(record));
}

}  // namespace custos::supervisor
