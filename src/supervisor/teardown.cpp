#include "teardown.hpp"

#include <csignal>

#include "supervisor.hpp"

namespace custos::supervisor {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
namespace td = core::teardown;
using Action = core::TeardownAction;

constexpr milliseconds kGracefulPoll{10};
constexpr milliseconds kKillPoll{2};
// With tree changes notified, the timer is only the fallback (a lost notification, the kill
// bound); the tree-empty wake-up comes from the backend.
constexpr milliseconds kKillPollWatched{20};

std::string signal_wire(int sig) {
  if (sig == SIGKILL) return "SIGKILL";
  if (auto n = core::signal_name(static_cast<std::uint32_t>(sig))) return std::string{*n};
  return "SIG" + std::to_string(sig);
}

}  // namespace

Teardown::Teardown(Supervisor& owner, boost::asio::io_context& io)
    : owner_(&owner), stage_timer_(io), poll_timer_(io), reader_timer_(io) {}

void Teardown::feed(core::TeardownEvent const& ev) {
  if (owner_->detached_) return;
  auto step = core::reduce(state_, ev);
  if (!step) {
    // A shell bug, never a user's doing: the view says so, and nothing is acted on.
    owner_->sink_error_ = "teardown: " + step.error().message();
    return;
  }
  state_ = step->state;
  perform(step->action);
}

void Teardown::perform(Action action) {
  Supervisor& s = *owner_;
  switch (action) {
    case Action::none:
      return;
    case Action::signal_graceful:
      return signal_graceful();
    case Action::arm_grace:
      s.arm(stage_timer_, milliseconds(s.plan_.grace_ms), [this] { feed(td::GraceExpired{}); });
      return arm_poll(kGracefulPoll);
    case Action::arm_drain:
      // Descendants may still hold the output streams: they drain for a bounded time, then the
      // whole tree is killed (the execution is over once its root is).
      return s.arm(stage_timer_, s.config().exit_drain, [this] { feed(td::DrainExpired{}); });
    case Action::kill_tree:
      return kill_tree();
    case Action::await_empty:
      // Watch before the next check, so an emptying in between still notifies.
      kill_deadline_ = Clock::now() + milliseconds(s.plan_.kill_after_ms);
      watched_ = s.backend_->watch_tree();
      return on_poll();
    case Action::check_tree:
      return on_poll();
    case Action::start_final_scan:
      return start_final_scan();
    case Action::arm_reader_bound:
      return s.arm(reader_timer_, s.config().reader_close_bound,
                   [this] { force_streams_closed(); });
    case Action::cancel_support:
      cancel_timers();
      s.watch_.cancel_timers();
      s.backend_->unwatch_tree();
      s.pumps_.close_input("closed");
      return maybe_close(s.pending_);
    case Action::record_terminal:
      return s.close_and_record();
  }
}

// ------------------------------------------------------------------------------ events

void Teardown::stop_requested() {
  feed(td::StopRequested{owner_->plan_.grace_ms > 0 && !skip_graceful_});
}

void Teardown::root_exited() {
  if (!state_.root_exited) feed(td::RootExited{});
}

void Teardown::streams_ended() {
  if (!state_.readers_done) feed(td::ReadersDone{});
}

void Teardown::trigger_after_exit() {
  feed(td::TriggerAfterExit{});
}

void Teardown::spawn_failed() {
  cleanup_ = core::Cleanup::confirmed;  // nothing ran: the staged root was dropped and reaped
  // Its action (record_terminal) is the launch's own: a spawn failure's record is not built by
  // close_and_record, so the step's state is taken and the action left to the caller.
  if (auto step = core::reduce(state_, td::SpawnFailed{})) state_ = step->state;
}

void Teardown::kill_now() {
  if (state_.stage != core::TeardownStage::running) return;
  skip_graceful_ = true;
  feed(td::StopRequested{false});
}

bool Teardown::force() {
  if (state_.stage == core::TeardownStage::graceful) {
    // The grace ends by the caller's will instead of its timer; the timer's late completion is
    // the reducer's no-op (grace_expired after the kill).
    stage_timer_.cancel();
    feed(td::GraceExpired{});
    return true;
  }
  if (state_.stop_requested || state_.root_exited || skip_graceful_) return false;
  skip_graceful_ = true;  // the stop, once it begins (the target runs), kills at once
  return true;
}

void Teardown::tree_changed() {
  if (state_.stage == core::TeardownStage::waiting) on_poll();
}

void Teardown::maybe_close(std::size_t pending_tasks) {
  if (!core::support_cancelled(state_) || core::closing(state_) || pending_tasks > 0) return;
  feed(td::CloseBegun{});
}

// ------------------------------------------------------------------------------ actions

bool Teardown::tree_gone() const {
  return owner_->root_gone() && owner_->backend_->tree_state() != backend::TreeState::populated;
}

void Teardown::signal_graceful() {
  Supervisor& s = *owner_;
  if (skip_graceful_) return feed(td::GracefulSent{0});  // kill_now: nothing graceful is sent
  s.advance(core::event::StopRequested{});
  std::uint32_t const n = s.backend_->signal_tree(s.plan_.graceful_signal);
  boost::json::object f;
  f["signal"] = signal_wire(s.plan_.graceful_signal);
  f["targets"] = n;
  f["step"] = "graceful";
  s.emit("signal_sent", std::move(f));
  feed(td::GracefulSent{n});
}

void Teardown::kill_tree() {
  Supervisor& s = *owner_;
  stage_timer_.cancel();
  poll_timer_.cancel();
  // The usual end of an execution: its root's exit was observed (reaped) and its tree reads
  // empty, so kill_tree would hit nothing and report the tree empty. One look at the tree
  // instead of two (kill_tree looks before it writes cgroup.kill, tree_gone after): a cgroup
  // read is three syscalls on every launch. A boundary that cannot tell (the marker: unknown)
  // still gets its kill sweep.
  if (s.exit_.has_value() && s.backend_->tree_state() == backend::TreeState::empty) {
    return feed(td::KillSent{false, true});
  }
  std::uint32_t const hit = s.backend_->kill_tree();
  if (hit > 0) {
    boost::json::object f;
    f["signal"] = "SIGKILL";
    f["step"] = "kill";
    f["targets"] = hit;
    s.emit("signal_sent", std::move(f));
  }
  feed(td::KillSent{hit > 0, tree_gone()});
}

void Teardown::arm_poll(milliseconds every) {
  owner_->arm(poll_timer_, every, [this] { on_poll(); });
}

void Teardown::on_poll() {
  using core::TeardownStage;
  if (state_.stage == TeardownStage::graceful) {
    // The tree went away on the graceful signal alone: no need to wait out the grace period.
    if (tree_gone()) return feed(td::TreeSeenEmpty{});
    return arm_poll(kGracefulPoll);
  }
  if (state_.stage == TeardownStage::waiting) {
    if (tree_gone()) return feed(td::TreeSeenEmpty{});
    if (Clock::now() >= kill_deadline_) return feed(td::KillBoundPassed{});
    return arm_poll(watched_ ? kKillPollWatched : kKillPoll);
  }
}

void Teardown::start_final_scan() {
  Supervisor& s = *owner_;
  poll_timer_.cancel();
  s.watch_.cancel_timers();  // nothing left to sample
  s.backend_->unwatch_tree();
  watched_ = false;
  s.backend_->final_scan([self = s.shared_from_this(), this](backend::FinalScan scan) {
    if (!self->detached_) on_final_scan(scan);
  });
}

void Teardown::on_final_scan(backend::FinalScan const& scan) {
  Supervisor& s = *owner_;
  if (scan.signalled > 0) {
    boost::json::object f;
    f["signal"] = "SIGKILL";
    f["step"] = "final_sweep";
    f["targets"] = scan.signalled;
    s.emit("signal_sent", std::move(f));
  }
  s.watch_.final_usage(scan.usage);
  cleanup_ = scan.unconfirmed.empty() && cleanup_detail_.empty() ? core::Cleanup::confirmed
                                                                 : core::Cleanup::unconfirmed;
  for (auto const& w : scan.unconfirmed) unconfirm(w);
  feed(td::FinalScanFinished{scan.unconfirmed.empty(), scan.signalled});
}

void Teardown::force_streams_closed() {
  // Something outside the known tree still holds a write end: what it may still write is
  // unknown, so the stream is incomplete and the cleanup cannot be confirmed.
  Supervisor& s = *owner_;
  for (auto stream : s.backend_->close_streams()) {
    unconfirm("a process outside the tree still held " + std::string{core::stream_wire(stream)} +
              " after reader_close_bound");
    s.pumps_.mark_forced(stream);
  }
  if (s.pumps_.all_ended()) streams_ended();
}

void Teardown::unconfirm(std::string const& reason) {
  cleanup_ = core::Cleanup::unconfirmed;
  cleanup_detail_ += (cleanup_detail_.empty() ? "" : "; ") + reason;
}

void Teardown::cancel_timers() {
  stage_timer_.cancel();
  poll_timer_.cancel();
  reader_timer_.cancel();
}

}  // namespace custos::supervisor
