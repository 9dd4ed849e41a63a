// The life of one execution around its backend: lifecycle, events, cancellation, the close and
// the one terminal record. The concurrency model is described in supervisor.hpp.
#include "supervisor.hpp"

#include <csignal>

namespace custos::supervisor {
namespace {

boost::json::object exit_json(core::ExitStatus const& e) {
  boost::json::object o;
  o["code"] = e.code ? boost::json::value(*e.code) : boost::json::value(nullptr);
  o["signal"] = e.signal ? boost::json::value(*e.signal) : boost::json::value(nullptr);
  return o;
}

}  // namespace

Supervisor::Supervisor(ExecutionManager& manager, std::string execution_id, LaunchRequest request,
                       PlanView plan, std::string plan_digest,
                       std::shared_ptr<backend::BackendExecution> backend)
    : manager_(&manager),
      io_(manager.io_),
      id_(std::move(execution_id)),
      request_(std::move(request)),
      plan_(std::move(plan)),
      plan_digest_(std::move(plan_digest)),
      backend_(std::move(backend)),
      events_(id_, plan_digest_, manager.config_.retained_event_count,
              static_cast<std::size_t>(plan_.retained_bytes)),
      pumps_(*this),
      teardown_(*this, io_),
      watch_(*this, io_) {
  if (request_.plan.sandbox_digest)
    events_.set_sandbox_digest(request_.plan.sandbox_digest->to_string());
}

Supervisor::~Supervisor() {
  backend_->detach();  // no callback may reach this object any more
}

OwnershipSink* Supervisor::sink() const noexcept {
  return manager_ != nullptr ? manager_->config_.sink : nullptr;
}

ManagerConfig const& Supervisor::config() const noexcept {
  return manager_->config_;
}

bool Supervisor::root_gone() const noexcept {
  return exit_.has_value() || backend_->root_gone();
}

void Supervisor::arm(boost::asio::steady_timer& timer, std::chrono::milliseconds after,
                     std::function<void()> fn) {
  if (detached_) return;
  ++pending_;
  timer.expires_after(after);
  timer.async_wait([self = shared_from_this(), fn = std::move(fn)](boost::system::error_code ec) {
    --self->pending_;
    if (!ec && !self->detached_) fn();
    self->maybe_close();
  });
}

void Supervisor::task_ended() {
  --pending_;
  maybe_close();
}

// ------------------------------------------------------------------------------ the backend

void Supervisor::on_output(core::Stream stream, std::span<std::uint8_t const> bytes) {
  pumps_.on_chunk(stream, bytes);
}

void Supervisor::on_stream_end(core::Stream stream, bool complete) {
  pumps_.on_end(stream, complete);
  if (pumps_.all_ended()) teardown_.streams_ended();
  maybe_close();
}

void Supervisor::on_input_writable() {
  pumps_.drain_input();
}

void Supervisor::on_tree_change() {
  teardown_.tree_changed();
  maybe_close();
}

void Supervisor::on_root_exit(std::optional<core::ExitStatus> status) {
  if (exit_) return;
  // Only an adopted execution runs with a spawn failure recorded (adopt.cpp).
  if (spawn_failure_) return unreleased_root_exited(status);
  watch_.root_exited();
  core::ExitStatus ex;
  if (status) {
    ex = *status;
  } else {
    // The process ended but its status could not be read. The reducer needs a status, so the
    // record carries SIGKILL as a stand-in, and the backend_failure trigger (offered first, so it
    // wins) makes the classification supervisor_failed: never presented as an observed exit.
    (void)offer(core::Trigger::backend_failure, "root exit status could not be read");
    ex.signal = SIGKILL;
  }
  exit_ = ex;
  (void)cancel_.observe_exit();
  advance(core::event::Exited{ex});
  boost::json::object f;
  f["exit"] = exit_json(ex);
  emit("exited", std::move(f));
  teardown_.root_exited();
}

// ------------------------------------------------------------------------------ requests

Result<CancelResult> Supervisor::cancel(core::Trigger trigger, std::string reason, bool force) {
  auto res = offer(trigger, std::move(reason));
  if (res && force && !terminal_ && !teardown_.closing()) {
    res->forced = teardown_.force();
    maybe_close();
  }
  return res;
}

Result<CancelResult> Supervisor::offer(core::Trigger trigger, std::string const& reason) {
  if (terminal_) return Error(Errc::exec_not_running, id_ + " is terminal");
  if (teardown_.closing()) {
    // Closed, its terminal record being written: the exit decided the outcome and nothing is
    // left to stop (the tree is empty, its handles are gone).
    return CancelResult{false, cancel_.first()};
  }
  auto outcome = cancel_.offer(trigger);
  if (!outcome) return Error(Errc::exec_not_running, outcome.error().message());
  CancelResult res;
  res.accepted = *outcome == core::TriggerOutcome::accepted;
  res.trigger = cancel_.first();
  if (res.accepted) {
    if (auto* s = sink()) {
      if (auto r = s->record_trigger(id_, trigger); !r) sink_error("record_trigger", r.error());
    }
    boost::json::object f;
    f["trigger"] = core::trigger_wire(trigger);
    f["reason"] = reason;
    emit("cancel_requested", std::move(f));
    if (life_.phase == core::Phase::running) teardown_.stop_requested();
  } else if (*outcome == core::TriggerOutcome::rejected_after_exit) {
    // The exit decided the outcome, but descendants may still be draining: stop them now.
    teardown_.trigger_after_exit();
  }
  maybe_close();
  return res;
}

void Supervisor::on_sandbox_denied(std::string control, std::string detail) {
  // The first denial is the one the record names; the exit it causes follows.
  if (!denial_) denial_ = Denial{std::move(control), std::move(detail)};
}

void Supervisor::on_backend_failure(std::string reason) {
  // A trigger like any other: the first accepted one decides the classification
  // (supervisor_failed), and the teardown stops what is left of the tree.
  (void)offer(core::Trigger::backend_failure, std::move(reason));
}

Result<std::uint64_t> Supervisor::input(std::span<std::uint8_t const> data, bool eof) {
  if (terminal_ || teardown_.final_scan_started()) return Error(Errc::exec_not_running, id_);
  auto r = pumps_.input(data, eof);
  maybe_close();
  return r;
}

Result<> Supervisor::resize(std::uint16_t rows, std::uint16_t cols) {
  if (!plan_.pty) return Error(Errc::exec_not_pty, id_);
  if (!plan_.resize) return Error(Errc::exec_resize_refused, "the plan has io.resize=false");
  if (terminal_ || !running_ || teardown_.final_scan_started())
    return Error(Errc::exec_not_running, id_);
  return backend_->resize(rows, cols);
}

// ------------------------------------------------------------------------------ close

void Supervisor::maybe_close() {
  // The teardown reducer decided when the support tasks were cancelled (root exited, tree done,
  // streams ended); close begins once every one of them completed.
  if (terminal_ || detached_ || manager_ == nullptr) return;
  teardown_.maybe_close(pending_);
}

void Supervisor::close_and_record() {
  if (spawn_failure_) return close_unreleased();  // adopted, never committed (adopt.cpp)
  auto const cleanup = teardown_.cleanup();
  advance(core::event::Closed{});
  boost::json::object f;
  f["cleanup"] = core::cleanup_wire(cleanup);
  if (!teardown_.cleanup_detail().empty()) f["cleanup_detail"] = teardown_.cleanup_detail();
  emit("closed", std::move(f));

  core::ClassifyInput in;
  in.exit = *exit_;
  in.trigger = cancel_.first();
  in.cleanup = cleanup;
  in.sandbox_denied = denial_.has_value();
  in.recovery = adopted_ ? core::RecoveryPath::live_owned : core::RecoveryPath::observed;
  auto rec = core::make_terminal_record(in, std::nullopt);
  core::TerminalRecord record;
  if (rec) {
    record = std::move(*rec);
  } else {
    record.classification = core::Classification::supervisor_failed;
    record.exit = *exit_;
    record.trigger = cancel_.first();
    sink_error_ = "classification failed: " + rec.error().message();
  }
  record.output = pumps_.accounting();
  record.resources = watch_.report(true, pumps_.observed_total());
  record.tree = core::TreeReport{acquired_.boundary, cleanup,
                                 acquired_.kernel_enforced ? core::Containment::kernel_enforced
                                                           : core::Containment::escapable};
  record.escalation = teardown_.escalation();
  record.observations = backend_->observations();
  if (denial_) record.observations["sandbox_denied"] = denial_->control + ": " + denial_->detail;
  backend_->close();
  finish_terminal(std::move(record));
}

void Supervisor::finish_terminal(core::TerminalRecord record, std::function<void()> then) {
  auto* s = sink();
  if (s == nullptr) {
    publish_terminal(std::move(record));
    if (then) then();
    return;
  }
  for (auto const& [stream, acc] : record.output) {
    if (auto r = s->record_output(id_, stream, acc); !r) sink_error("record_output", r.error());
  }
  // The loop goes on while the record is written; nobody learns the result (waits, the terminal
  // event, the manager) before the sink answers, and then it is in the WAL.
  auto rec = std::make_shared<core::TerminalRecord>(std::move(record));
  s->record_terminal_async(
      id_, *rec,
      [self = shared_from_this(), rec, then = std::move(then)](Result<> const& r) mutable {
        if (self->manager_ == nullptr) return;  // detached meanwhile: nobody to tell
        if (!r) {
          self->sink_error("record_terminal", r.error());
        } else if (auto const& publish = self->config().terminal_recorded) {
          publish(self->id_);  // off the loop from here: the publisher's thread
        }
        // The committed slot was written before this record (one FIFO queue), but its completion
        // may still be on its way: the caller of the launch hears of the start before anyone
        // hears of the end.
        if (auto p = self->pending_start_; p && p->done) {
          p->then = [self, rec, then = std::move(then)] {
            self->publish_terminal(std::move(*rec));
            if (then) then();
          };
          return;
        }
        self->publish_terminal(std::move(*rec));
        if (then) then();
      });
}

void Supervisor::publish_terminal(core::TerminalRecord record) {
  advance(core::event::TerminalRecorded{record.classification, record.recovery});
  (void)cancel_.seal();
  terminal_ = std::move(record);
  boost::json::object f;
  if (auto j = core::to_json(*terminal_)) {
    f["terminal"] = std::move(*j);
  } else {
    f["terminal"] = nullptr;
    f["error"] = j.error().message();
  }
  emit("terminal", std::move(f));
  events_.clear_subscribers();  // nothing follows the terminal event
  if (stdio_kept_) {
    stdio_kept_ = false;
    if (auto* keeper = config().stdio_keeper) keeper->forget(id_);
  }
  // Pending exec.wait calls are the manager's (answered from on_terminal).
  if (manager_ != nullptr) manager_->on_terminal(id_, *terminal_);
}

void Supervisor::advance(core::LifecycleEvent const& ev) {
  auto next = core::reduce(life_, ev);
  if (!next) {
    sink_error_ = "lifecycle: " + next.error().message();
    return;
  }
  bool const moved = next->phase != life_.phase;
  life_ = *next;
  // Only phase changes are recorded (a spawn failure stays in `starting` until terminal), and
  // terminal is recorded by record_terminal itself.
  if (auto* s = sink(); s != nullptr && moved && life_.phase != core::Phase::terminal) {
    if (auto r = s->record_phase(id_, life_.phase); !r) sink_error("record_phase", r.error());
  }
}

void Supervisor::emit(std::string kind, boost::json::object fields,
                      std::vector<std::uint8_t> data) {
  auto dropped = events_.append(std::move(kind), std::move(fields), std::move(data));
  if (manager_ != nullptr) manager_->stats_.dropped_subscribers += dropped.size();
}

void Supervisor::sink_error(std::string const& what, Error const& e) {
  sink_error_ = what + ": " + e.message();
}

// ------------------------------------------------------------------------------ queries

ExecutionView Supervisor::view() const {
  ExecutionView v;
  v.execution_id = id_;
  v.identity = request_.identity;
  v.plan_digest = plan_digest_;
  v.sandbox_digest = request_.plan.sandbox_digest;
  v.phase = life_.phase;
  v.boundary = acquired_.boundary;
  v.kernel_enforced = acquired_.kernel_enforced;
  v.pid = acquired_.pid;
  v.executable = plan_.executable;
  v.backend = request_.plan.backend.kind;
  v.started_at = watch_.started_wall();
  v.trigger = cancel_.first();
  v.output = pumps_.accounting();
  v.events = events_.last_seq();
  v.terminal = terminal_;
  v.sink_error = sink_error_;
  v.orphans_reaped = orphans_reaped_;
  if (!teardown_.cleanup_detail().empty()) v.cleanup_detail = teardown_.cleanup_detail();
  if (!teardown_.tree_done()) v.usage = watch_.last_sample();
  return v;
}

Result<SubscriptionHandle> Supervisor::subscribe(std::optional<std::uint64_t> from_seq,
                                                 std::function<bool(Event const&)> sink) {
  auto s = events_.subscribe(from_seq, std::move(sink));
  if (s.dropped) {
    if (manager_ != nullptr) ++manager_->stats_.dropped_subscribers;
    return Error(Errc::rpc_overloaded, "subscriber refused events during replay");
  }
  return SubscriptionHandle{id_, s.id, s.replay_from};
}

void Supervisor::unsubscribe(std::uint64_t id) {
  (void)events_.unsubscribe(id);
}

Result<OutputSlice> Supervisor::output(StreamId stream, std::uint64_t offset,
                                       std::uint64_t max_bytes) const {
  return pumps_.slice(stream, offset, max_bytes, spawn_failure_.has_value());
}

void Supervisor::detach() {
  if (detached_) return;
  detached_ = true;
  backend_->detach();      // a launch awaiting its verdict is abandoned, its root dropped
  pending_start_.reset();  // nobody is left to answer (and it may hold this supervisor)
  watch_.cancel_timers();
  teardown_.cancel_timers();
  events_.clear_subscribers();
  // The processes are left as they are: the registry's ownership records let the next daemon
  // start recover them.
  manager_ = nullptr;
}

}  // namespace custos::supervisor
