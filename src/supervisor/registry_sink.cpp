#include "custos/supervisor/registry_sink.hpp"

#include <boost/asio/post.hpp>

#include <pthread.h>
#include <sched.h>

#include "custos/registry/ownership.hpp"
#include "custos/sys/identity.hpp"

namespace custos::supervisor {

RegistrySink::~RegistrySink() {
  // A wake still posted to the loop finds no sink.
  turn_->sink = nullptr;
  {
    std::lock_guard<std::mutex> lk(flush_mu_);
    flush_stop_ = true;
  }
  flush_cv_.notify_one();
  if (flush_thread_.joinable()) flush_thread_.join();
  (void)registry_->flush();
}

void RegistrySink::schedule_flush(Urgency urgency) {
  if (urgency == Urgency::lazy) return wake_commit_thread(urgency);
  // Alone, the loop commits the write itself if the registry is free.
  if (solo_ && solo_() && registry_->try_flush()) return;
  // Otherwise the commit thread does, woken once per turn of the loop: the writes every
  // handler of this turn queues (other executions' staged, committed and terminal writes)
  // are then one transaction and one wake-up, not one each. The wake is a handler posted
  // behind the handlers already queued; the write's own completion comes through the loop
  // after it anyway, so it waits for nothing the loop would not have run first.
  if (turn_->wake_posted) return;
  turn_->wake_posted = true;
  boost::asio::post(*loop_, [turn = turn_] {
    turn->wake_posted = false;
    if (turn->sink != nullptr) turn->sink->wake_commit_thread(Urgency::now);
  });
}

void RegistrySink::wake_commit_thread(Urgency urgency) {
  {
    std::lock_guard<std::mutex> lk(flush_mu_);
    if (urgency == Urgency::now) {
      if (flush_urgent_) return;
      flush_urgent_ = true;
    } else {
      if (flush_urgent_ || lazy_due_) return;  // a flush is coming anyway
      lazy_due_ = std::chrono::steady_clock::now() + kLazyFlushBound;
    }
    if (!flush_thread_.joinable()) flush_thread_ = std::thread([this] { flush_thread_main(); });
  }
  flush_cv_.notify_one();
}

void RegistrySink::flush_thread_main() {
  ::pthread_setname_np(::pthread_self(), "custos-commit");  // for top -H and perf
  // A batch thread: woken by the loop for every queued write, it must not preempt the loop
  // that woke it (sched(7): SCHED_BATCH is disfavoured at wake-up); it runs when a CPU is free.
  sched_param param{};
  (void)::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &param);
  std::unique_lock<std::mutex> lk(flush_mu_);
  for (;;) {
    flush_cv_.wait(lk, [this] { return flush_urgent_ || lazy_due_ || flush_stop_; });
    if (!flush_urgent_ && !flush_stop_) {
      // Only lazy writes so far: they wait for their bound, or ride with an urgent write.
      auto const due = *lazy_due_;
      flush_cv_.wait_until(lk, due, [this] { return flush_urgent_ || flush_stop_; });
    }
    if (!flush_urgent_ && !lazy_due_) return;  // stopping, nothing asked for
    flush_urgent_ = false;
    lazy_due_.reset();
    lk.unlock();
    // Everything deferred so far, in one transaction (or several of max_batch writes). A
    // refusal is kept per execution by the registry and reported with that execution's
    // terminal record; a failed transaction is reported the same way to each of its writes.
    (void)registry_->flush();
    lk.lock();
  }
}

Result<> RegistrySink::flush() {
  return registry_->flush();
}

void RegistrySink::record_authorized_async(std::string const& execution_id,
                                           core::ExecutionIdentity const& identity,
                                           core::ExecutionPlan const& plan,
                                           std::string const& plan_digest,
                                           std::function<void(Result<>)> done) {
  auto ex = registry::make_new_execution(execution_id, identity, plan, plan_digest);
  if (!ex) return done(ex.error());
  registry_->record_authorized_async(std::move(*ex), registry::Durability::group,
                                     on_loop(std::move(done)));
  schedule_flush(Urgency::now);
}

void RegistrySink::when_durable(std::string const& execution_id,
                                std::function<void(Result<>)> done) {
  // Usually the flusher made the claim durable while the child was created and staged: the
  // launch goes on now, on the loop it is on, instead of waiting for a turn of it.
  if (auto now = registry_->durable_now(execution_id)) return done(std::move(*now));
  // Otherwise the flusher's completion is posted to the loop.
  registry_->when_durable(execution_id, on_loop(std::move(done)));
}

std::function<void(Result<>)> RegistrySink::on_loop(std::function<void(Result<>)> done) const {
  return [loop = loop_, done = std::move(done)](Result<> r) mutable {
    boost::asio::post(*loop,
                      [done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
  };
}

void RegistrySink::record_staged_async(std::string const& execution_id,
                                       sys::PidfsIdentity const& identity,
                                       StagedBoundary const& boundary,
                                       std::function<void(Result<>)> done) {
  // A reference execution's root is a model: its slot is modelled, with no process identity.
  // An ungated container exec has no process yet: its slot is marked (marker and namespace).
  auto ownership = registry::staged_ownership(identity);
  if (boundary.kind == core::Boundary::reference) {
    ownership = registry::modelled_ownership();
  } else if (identity.pid == 0) {
    ownership = registry::marked_ownership(identity.start_time_ticks);
  }
  registry_->record_staged_async(
      execution_id, ownership,
      registry::boundary_info(boundary.kind, boundary.cgroup_path, boundary.marker_value,
                              boundary.marker_ns_ino),
      on_loop(std::move(done)));
  schedule_flush(Urgency::now);
}

void RegistrySink::record_committed_async(std::string const& execution_id,
                                          std::function<void(Result<>)> done) {
  // `running` is in the same change: the supervisor's record_phase(running) right after this
  // call finds it done.
  running_recorded_.insert(execution_id);
  registry_->record_running_async(execution_id, on_loop(std::move(done)));
  schedule_flush(Urgency::now);
}

Result<> RegistrySink::record_phase(std::string const& execution_id, core::Phase phase) {
  if (phase == core::Phase::running) {
    // Normally already written with the committed slot.
    if (running_recorded_.erase(execution_id) > 0) return ok();
    return registry_->record_phase(execution_id, phase);
  }
  auto r = registry_->record_phase(execution_id, phase, registry::WriteMode::deferred);
  schedule_flush(Urgency::lazy);
  return r;
}

Result<> RegistrySink::record_trigger(std::string const& execution_id, core::Trigger trigger) {
  return registry_->record_trigger(execution_id, trigger, registry::WriteMode::now);
}

Result<> RegistrySink::record_output(std::string const& execution_id, StreamId stream,
                                     core::StreamAccounting const& accounting) {
  auto r = registry_->record_output(execution_id, registry::stream_index(stream), accounting,
                                    registry::WriteMode::deferred);
  schedule_flush(Urgency::lazy);
  return r;
}

Result<> RegistrySink::terminal_result(std::string const& execution_id, Result<> written) {
  // Deferred writes of this execution were committed by now (ahead of the terminal record);
  // a refusal among them is this execution's to report.
  auto deferred = registry_->take_deferred_error(execution_id);
  if (!written) return written;
  if (deferred) return *deferred;
  return ok();
}

void RegistrySink::record_terminal_async(std::string const& execution_id,
                                         core::TerminalRecord const& record,
                                         std::function<void(Result<>)> done) {
  running_recorded_.erase(execution_id);
  auto blob = registry::terminal_blob(record);
  if (!blob) return done(terminal_result(execution_id, blob.error()));
  // The registry calls back on the committing thread (the flush thread, or the loop inside
  // another write); the deferred refusals are taken on the loop.
  // An adopted execution's record (recovery live_owned) continues the one its first daemon
  // wrote: the same checked steps, ending in its one terminal record.
  registry_->record_terminal_async(
      execution_id, std::move(*blob), record.recovery,
      on_loop([this, id = execution_id, done = std::move(done)](Result<> r) {
        done(terminal_result(id, std::move(r)));
      }));
  schedule_flush(Urgency::now);
}

}  // namespace custos::supervisor
