// The launch of one execution, none of it holding the loop:
//   1. the claim and the execution record (OwnershipSink::record_authorized_async);
//   2. acquire: the backend creates the root held at its barrier;
//   3. the staged ownership is recorded and the claim made durable (record_staged_async,
//      when_durable) — no code of the target can run before both are on stable storage;
//   4. release: the barrier opens, the backend reports the verdict;
//   5. the committed ownership with phase running (record_committed_async); the caller is
//      answered once both the launch's result and that write are known.
// A failure before 4 drops the root at its barrier (nothing of the target ran) and ends the
// execution spawn_failed, with the step that failed.
#include <unistd.h>

#include "supervisor.hpp"

namespace custos::supervisor {
namespace {

core::SpawnFailure failure_from(std::string step, Error const& e) {
  return core::SpawnFailure{std::move(step), e.sys_errno, e.message()};
}

}  // namespace

StartResult Supervisor::start_result() const {
  StartResult res;
  res.execution_id = id_;
  res.plan_digest = plan_digest_;
  res.sandbox_digest = request_.plan.sandbox_digest;
  res.phase = life_.phase;
  res.boundary = acquired_.boundary;
  res.pid = running_ ? acquired_.pid : 0;
  return res;
}

backend::LaunchContext Supervisor::launch_context(std::size_t live_executions) const {
  backend::LaunchContext ctx;
  ctx.execution_id = id_;
  ctx.plan = &request_.plan;
  ctx.view = &plan_;
  ctx.live_executions = live_executions;
  ctx.sandbox = request_.sandbox ? &request_.sandbox->checked : nullptr;
  // Inherited values come from the daemon's snapshot only (ManagerConfig::inherit_source).
  auto const& source = config().inherit_source;
  ctx.env.reserve(plan_.env.size());
  for (auto const& e : plan_.env) {
    if (e.value) {
      ctx.env.push_back(e.name + "=" + *e.value);
    } else if (source) {
      if (auto it = source->find(e.name); it != source->end())
        ctx.env.push_back(e.name + "=" + it->second);
    }
  }
  // Credentials: the caller's unless the plan names a user (the manager already refused a
  // non-root caller naming someone else).
  ctx.run_as.uid = plan_.user ? plan_.user->uid : request_.caller.uid;
  ctx.run_as.gid = plan_.user ? plan_.user->gid : request_.caller.gid;
  ctx.run_as.explicit_user = plan_.user.has_value();
  if (plan_.user) ctx.run_as.groups = plan_.user->groups;
  return ctx;
}

void Supervisor::launch(std::size_t live_executions, LaunchDone done) {
  watch_.launch_began(live_executions + 1);
  auto* s = sink();
  if (s == nullptr) return acquire(std::move(done));
  // The claim and the record are committed off the loop; nothing is created for the execution
  // (no cgroup, no root) before they are.
  s->record_authorized_async(
      id_, request_.identity, request_.plan, plan_digest_,
      [self = shared_from_this(), done = std::move(done)](Result<> const& r) mutable {
        if (self->detached_) return;  // the manager is gone
        if (!r) return done(r.error());
        self->acquire(std::move(done));
      });
}

void Supervisor::acquire(LaunchDone done) {
  advance(core::event::SpawnRequested{});
  // The context lives as long as the call: a backend copies what it keeps.
  auto const ctx = launch_context(watch_.concurrency() - 1);
  backend_->acquire(ctx, [self = shared_from_this(),
                          done = std::move(done)](backend::Step<backend::Acquired> a) mutable {
    if (self->detached_) return;
    self->on_acquired(std::move(a), std::move(done));
  });
}

void Supervisor::on_acquired(backend::Step<backend::Acquired> acquired, LaunchDone done) {
  if (auto* f = std::get_if<core::SpawnFailure>(&acquired)) {
    return fail_launch(std::move(*f), std::move(done));
  }
  acquired_ = std::get<backend::Acquired>(std::move(acquired));
  watch_.acquired(acquired_.memory_hard, acquired_.pids_hard, acquired_.descriptors_hard);
  auto release = [self = shared_from_this()](LaunchDone d) {
    self->backend_->release([self, d = std::move(d)](backend::Step<std::monostate> v) mutable {
      if (self->detached_) return;
      self->on_released(std::move(v), std::move(d));
    });
  };
  auto* s = sink();
  if (s == nullptr) {
    claim_durable_ = true;
    return release(std::move(done));
  }
  // The staged record is committed off the loop (with other launches' writes); the barrier is
  // released only once it is in the WAL and the claim is durable.
  s->record_staged_async(
      id_, acquired_.identity,
      StagedBoundary{acquired_.boundary, acquired_.cgroup_path, acquired_.marker_value,
                     acquired_.marker_ns_ino},
      [self = shared_from_this(), release, done = std::move(done)](Result<> const& staged) mutable {
        if (self->detached_) return;
        if (!staged)
          return self->fail_launch(failure_from("record_staged", staged.error()), std::move(done));
        self->sink()->when_durable(self->id_, [self, release, done = std::move(done)](
                                                  Result<> const& durable) mutable {
          if (self->detached_) return;
          if (!durable)
            return self->fail_launch(failure_from("durability", durable.error()), std::move(done));
          self->claim_durable_ = true;
          release(std::move(done));
        });
      });
}

void Supervisor::on_released(backend::Step<std::monostate> verdict, LaunchDone done) {
  if (auto* f = std::get_if<core::SpawnFailure>(&verdict)) {
    return fail_launch(std::move(*f), std::move(done));
  }
  running_ = true;
  // The caller hears of the start once the committed slot (with phase running) is in the WAL: a
  // crash before that is recovered as a launch whose commit was not recorded, and no caller was
  // told otherwise. Whichever of that write and the launch's own result comes second answers.
  auto pending = std::make_shared<PendingStart>();
  pending->done = std::move(done);
  pending_start_ = pending;
  if (auto* s = sink()) {
    // Before `running` is recorded (advance below): the sink may write both in one change.
    s->record_committed_async(id_, [self = shared_from_this(), pending](Result<> committed) {
      if (self->detached_) return;  // the manager is gone: nobody is left to tell
      if (!pending->done) {
        // Answered already: a failure still stops the target.
        if (!committed) self->on_commit_failed(committed.error());
        return;
      }
      pending->committed = std::move(committed);
      self->answer_start(*pending);
    });
  } else {
    pending->committed = ok();
  }
  advance(core::event::Spawned{});
  pumps_.open_streams(plan_.pty);
  if (auto* keeper = config().stdio_keeper) {
    if (auto copies = backend_->copy_output()) {
      keeper->keep(id_, *copies);
      stdio_kept_ = true;
    }
  }
  boost::json::object started;
  started["pid"] = acquired_.pid;
  started["boundary"] = core::boundary_wire(acquired_.boundary);
  started["containment"] = acquired_.kernel_enforced ? "kernel_enforced" : "escapable";
  started["io"] = plan_.pty ? "pty" : "pipes";
  if (!acquired_.cgroup_path.empty()) started["cgroup"] = acquired_.cgroup_path;
  emit("started", std::move(started));
  backend_->start(*this);
  if (!backend_->has_input()) {
    pumps_.close_input("none");
  } else if (request_.sandbox && !request_.sandbox->checked.policy.terminal.input) {
    // terminal.input false: no stdin at all, for every backend — the program reads end of file
    // at once and exec.input is refused (exec.input_closed).
    pumps_.close_input("sandbox");
  }
  watch_.start();
  // A cancel accepted while the launch awaited its verdict acts now that the target runs.
  if (cancel_.first() && !teardown_.stop_requested_already() &&
      life_.phase == core::Phase::running) {
    teardown_.stop_requested();
  }
  pending->result = start_result();
  answer_start(*pending);
}

void Supervisor::answer_start(PendingStart& p) {
  if (!p.result || !p.committed || !p.done) return;
  if (!*p.committed) on_commit_failed(p.committed->error());
  LaunchDone done = std::move(p.done);
  p.done = nullptr;
  done(std::move(*p.result));
  // A terminal record whose completion overtook this one (completions of batches committed by
  // different threads may reach the loop in either order) is published now, after the start.
  if (p.then) {
    auto then = std::move(p.then);
    p.then = nullptr;
    then();
  }
  pending_start_.reset();
}

void Supervisor::on_commit_failed(Error const& e) {
  // The target runs but its ownership is not durable: it is stopped, and the view says why.
  sink_error("record_committed", e);
  (void)offer(core::Trigger::backend_failure, "ownership commit failed: " + e.message());
}

void Supervisor::fail_launch(core::SpawnFailure failure, LaunchDone done) {
  backend_->abort();  // kills a root still at its barrier: no code of the target ran
  auto finish = [self = shared_from_this(), failure = std::move(failure),
                 done = std::move(done)]() mutable {
    self->spawn_failure_ = failure;
    self->advance(core::event::SpawnFailed{failure});
    // A trigger accepted while the launch was under way decides the classification (core's
    // table: the trigger before the spawn failure); the spawn_error still says nothing ran.
    auto const trigger = self->cancel_.first();
    (void)self->cancel_.observe_exit();
    self->teardown_.spawn_failed();
    core::ClassifyInput in;
    in.spawn_failed = true;
    in.trigger = trigger;
    in.cleanup = self->backend_->abort_cleanup();
    auto rec = core::make_terminal_record(in, failure);
    core::TerminalRecord record;
    if (rec) {
      record = std::move(*rec);
    } else {
      record.classification = core::Classification::spawn_failed;
      record.spawn_error = failure;
    }
    record.output = self->pumps_.accounting();
    record.resources = self->watch_.report(self->acquired_.pid > 0, 0);
    record.tree =
        core::TreeReport{self->acquired_.boundary, in.cleanup,
                         self->acquired_.kernel_enforced ? core::Containment::kernel_enforced
                                                         : core::Containment::escapable};
    record.escalation = core::EscalationReport{false, false};
    record.observations = self->backend_->observations();
    self->backend_->close();
    // The caller learns of the outcome once the record (and the claim behind it) is written.
    self->finish_terminal(std::move(record),
                          [self, done = std::move(done)]() mutable { done(self->start_result()); });
  };
  // The claim behind this outcome must be durable before anyone learns of it (a sink may commit
  // it without waiting for its fsync) — unless the launch awaited that already.
  auto* s = sink();
  if (s == nullptr || claim_durable_) return finish();
  s->when_durable(id_,
                  [self = shared_from_this(), finish = std::move(finish)](Result<> const&) mutable {
                    if (self->detached_) return;
                    finish();
                  });
}

}  // namespace custos::supervisor
