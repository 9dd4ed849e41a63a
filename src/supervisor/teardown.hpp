// Teardown of one execution's tree, the effect shell of core's teardown reducer
// (custos/core/teardown.hpp): graceful signal → grace → kill → wait until empty (bounded by
// kill_after_ms) → the final scan → support tasks cancelled → close. This type feeds the reducer
// what happened (a stop, the root's exit, the streams' end, a timer, the backend's answers) and
// performs the one action each step returns, through the backend; it decides nothing itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/steady_timer.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/backend.hpp"
#include "custos/core/teardown.hpp"
#include "custos/core/terminal.hpp"

namespace custos::supervisor {

class Supervisor;

class Teardown {
 public:
  Teardown(Supervisor& owner, boost::asio::io_context& io);

  // What happened (each fed to the reducer once; see core::teardown for when each is legal).
  void stop_requested();  // a trigger was accepted while the target runs
  void root_exited();
  void streams_ended();
  void trigger_after_exit();  // a trigger the exit beat: stop the draining descendants now
  void spawn_failed();        // nothing ran
  // Straight to the kill, without the graceful step (an adopted execution: the previous daemon
  // was already stopping it, or its launch was never committed; supervisor/adopt.cpp).
  void kill_now();
  // A forced cancel: the grace being waited out ends now (the kill goes out), and a stop not yet
  // begun goes straight to the kill. Returns whether anything graceful was skipped.
  bool force();
  void tree_changed();  // the backend saw the tree change while the kill waits
  // Every support task completed after they were cancelled: the terminal record is written.
  void maybe_close(std::size_t pending_tasks);

  [[nodiscard]] core::TeardownState const& state() const noexcept { return state_; }
  [[nodiscard]] bool final_scan_started() const noexcept {
    return core::final_scan_started(state_);
  }
  [[nodiscard]] bool tree_done() const noexcept { return core::tree_done(state_); }
  [[nodiscard]] bool closing() const noexcept { return core::closing(state_); }
  [[nodiscard]] bool stop_requested_already() const noexcept { return state_.stop_requested; }
  [[nodiscard]] core::EscalationReport escalation() const noexcept {
    return core::escalation_report(state_);
  }
  [[nodiscard]] core::Cleanup cleanup() const noexcept { return cleanup_; }
  [[nodiscard]] std::string const& cleanup_detail() const noexcept { return cleanup_detail_; }
  void cancel_timers();

 private:
  void feed(core::TeardownEvent const& ev);
  void perform(core::TeardownAction action);
  void signal_graceful();
  void kill_tree();
  void arm_poll(std::chrono::milliseconds every);
  void on_poll();
  void start_final_scan();
  void on_final_scan(backend::FinalScan const& scan);
  void force_streams_closed();
  void unconfirm(std::string const& reason);
  // The root is gone and nothing is seen in its boundary (a boundary that cannot tell — the
  // marker — counts as gone: only the final scan can say).
  [[nodiscard]] bool tree_gone() const;

  Supervisor* owner_;
  core::TeardownState state_;
  bool watched_ = false;        // the backend notifies tree changes (no fast polling needed)
  bool skip_graceful_ = false;  // kill_now: the stop goes to the kill without a graceful signal
  core::Cleanup cleanup_ = core::Cleanup::unconfirmed;
  std::string cleanup_detail_;
  std::chrono::steady_clock::time_point kill_deadline_{};
  boost::asio::steady_timer stage_timer_;   // grace, or exit_drain
  boost::asio::steady_timer poll_timer_;    // tree-empty polling
  boost::asio::steady_timer reader_timer_;  // streams still open after the tree is gone
};

}  // namespace custos::supervisor
