#include "teardown.hpp"

#include <csignal>

#include "supervisor.hpp"

namespace custos::supervisor {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

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
    : owner_(&owner), stage_timer_(io), poll_timer_(io), drain_timer_(io), reader_timer_(io) {}

bool Teardown::tree_gone() const {
  // A boundary that cannot tell (the marker) counts as gone here: only the final scan can say.
  return owner_->root_gone() && owner_->backend_->tree_state() != backend::TreeState::populated;
}

void Teardown::begin_stop() {
  Supervisor& s = *owner_;
  s.advance(core::event::StopRequested{});
  stage_ = Stage::graceful;
  std::uint32_t const n = s.backend_->signal_tree(s.plan_.graceful_signal);
  graceful_sent_ = n > 0;
  boost::json::object f;
  f["signal"] = signal_wire(s.plan_.graceful_signal);
  f["targets"] = n;
  f["step"] = "graceful";
  s.emit("signal_sent", std::move(f));
  if (s.plan_.grace_ms == 0) return kill_stage();
  s.arm(stage_timer_, milliseconds(s.plan_.grace_ms), [this] {
    if (stage_ == Stage::graceful) kill_stage();
  });
  arm_poll(kGracefulPoll);
}

void Teardown::root_exited(bool streams_ended) {
  if (stage_ == Stage::killing) return on_poll();  // the root may have been the last one
  if (stage_ != Stage::none) return;
  if (streams_ended) return kill_stage();
  // Descendants may still hold the output pipes: let them drain for a bounded time, then the
  // whole tree is killed (the execution is over once its root is).
  owner_->arm(drain_timer_, owner_->config().exit_drain, [this] {
    if (stage_ == Stage::none) kill_stage();
  });
}

void Teardown::streams_ended() {
  if (stage_ != Stage::none || !owner_->exit_) return;
  drain_timer_.cancel();
  kill_stage();
}

void Teardown::stop_draining() {
  if (stage_ != Stage::none) return;
  drain_timer_.cancel();
  kill_stage();
}

void Teardown::kill_now() {
  if (stage_ != Stage::none) return;
  kill_stage();
}

void Teardown::tree_changed() {
  if (stage_ == Stage::killing) on_poll();
}

void Teardown::arm_poll(milliseconds every) {
  owner_->arm(poll_timer_, every, [this] { on_poll(); });
}

void Teardown::on_poll() {
  if (stage_ == Stage::graceful) {
    // The tree went away on the graceful signal alone: no need to wait out the grace period.
    if (tree_gone()) return kill_stage();
    arm_poll(kGracefulPoll);
  } else if (stage_ == Stage::killing) {
    if (tree_gone() || Clock::now() >= kill_deadline_) return final_stage();
    arm_poll(watched_ ? kKillPollWatched : kKillPoll);
  }
}

void Teardown::kill_stage() {
  Supervisor& s = *owner_;
  if (stage_ == Stage::killing || stage_ == Stage::done || s.detached_) return;
  stage_ = Stage::killing;
  stage_timer_.cancel();
  bool const populated = s.backend_->tree_state() == backend::TreeState::populated;
  // The usual end of an execution: the root exited and left nothing in its boundary. Nothing to
  // kill and nothing to wait for.
  if (!populated && s.root_gone() && s.backend_->tree_state() == backend::TreeState::empty) {
    kill_deadline_ = Clock::now();
    return final_stage();
  }
  std::uint32_t const hit = s.backend_->kill_tree();
  if (hit > 0) {
    forced_ = true;
    boost::json::object f;
    f["signal"] = "SIGKILL";
    f["step"] = "kill";
    f["targets"] = hit;
    s.emit("signal_sent", std::move(f));
  }
  kill_deadline_ = Clock::now() + milliseconds(s.plan_.kill_after_ms);
  if (s.root_gone() && s.backend_->tree_state() != backend::TreeState::populated) {
    return final_stage();
  }
  // Watch before the next check, so an emptying in between still notifies.
  watched_ = s.backend_->watch_tree();
  on_poll();
}

void Teardown::final_stage() {
  Supervisor& s = *owner_;
  if (stage_ == Stage::done) return;
  stage_ = Stage::done;
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
    forced_ = true;
    boost::json::object f;
    f["signal"] = "SIGKILL";
    f["step"] = "final_sweep";
    f["targets"] = scan.signalled;
    s.emit("signal_sent", std::move(f));
  }
  if (scan.cpu_ms) s.watch_.final_cpu(*scan.cpu_ms);
  cleanup_ = scan.unconfirmed.empty() && cleanup_detail_.empty() ? core::Cleanup::confirmed
                                                                 : core::Cleanup::unconfirmed;
  for (auto const& w : scan.unconfirmed) unconfirm(w);
  tree_done_ = true;
  if (!s.pumps_.all_ended()) {
    s.arm(reader_timer_, s.config().reader_close_bound, [this] {
      // Something outside the known tree still holds a write end: what it may still write is
      // unknown, so the stream is incomplete and the cleanup cannot be confirmed.
      for (auto stream : owner_->backend_->close_streams()) {
        owner_->pumps_.mark_forced(stream);
        unconfirm("a process outside the tree still held " +
                  std::string{core::stream_wire(stream)} + " after reader_close_bound");
      }
    });
  }
}

void Teardown::unconfirm(std::string reason) {
  cleanup_ = core::Cleanup::unconfirmed;
  cleanup_detail_ += (cleanup_detail_.empty() ? "" : "; ") + reason;
}

void Teardown::nothing_ran() {
  stage_ = Stage::done;
  tree_done_ = true;
  cleanup_ = core::Cleanup::confirmed;
}

void Teardown::cancel_timers() {
  stage_timer_.cancel();
  poll_timer_.cancel();
  drain_timer_.cancel();
  reader_timer_.cancel();
}

}  // namespace custos::supervisor
