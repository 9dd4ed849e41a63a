// Teardown of one execution's tree: graceful signal → grace → kill → wait until empty (bounded by
// kill_after_ms) → the final scan. The backend signals, kills and confirms; this type decides
// when, and remembers what was done for the terminal record's escalation report.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/steady_timer.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/backend.hpp"
#include "custos/core/terminal.hpp"

namespace custos::supervisor {

class Supervisor;

class Teardown {
 public:
  enum class Stage : std::uint8_t { none, graceful, killing, done };

  Teardown(Supervisor& owner, boost::asio::io_context& io);

  // A trigger was accepted while the target runs: the graceful signal, then the grace.
  void begin_stop();
  // The root exited on its own: once the output drained (or exit_drain passed) the rest of the
  // tree is killed — the execution is over once its root is.
  void root_exited(bool streams_ended);
  // Every stream ended after the root exited: nothing left to drain.
  void streams_ended();
  // A trigger came after the exit decided the outcome: stop the draining descendants now.
  void stop_draining();
  // Straight to the kill, without the graceful step (an adopted execution: the previous daemon
  // was already stopping it, or its launch was never committed; supervisor/adopt.cpp).
  void kill_now();
  // The backend saw the tree change, or the root ended, while the kill stage waits.
  void tree_changed();
  // The execution closes: every timer of this type is cancelled.
  void cancel_timers();

  [[nodiscard]] Stage stage() const noexcept { return stage_; }
  [[nodiscard]] bool tree_done() const noexcept { return tree_done_; }
  [[nodiscard]] core::EscalationReport escalation() const noexcept {
    return {graceful_sent_, forced_};
  }
  [[nodiscard]] core::Cleanup cleanup() const noexcept { return cleanup_; }
  [[nodiscard]] std::string const& cleanup_detail() const noexcept { return cleanup_detail_; }
  // A reason the cleanup cannot be confirmed, found outside the scan (a stream forced closed).
  void unconfirm(std::string reason);
  // Nothing ran (spawn failure): the tree is done and confirmed empty.
  void nothing_ran();

 private:
  void arm_poll(std::chrono::milliseconds every);
  void on_poll();
  void kill_stage();
  void final_stage();
  void on_final_scan(backend::FinalScan const& scan);
  [[nodiscard]] bool tree_gone() const;

  Supervisor* owner_;
  Stage stage_ = Stage::none;
  bool graceful_sent_ = false;
  bool forced_ = false;
  bool tree_done_ = false;
  bool watched_ = false;  // the backend notifies tree changes (no fast polling needed)
  core::Cleanup cleanup_ = core::Cleanup::unconfirmed;
  std::string cleanup_detail_;
  std::chrono::steady_clock::time_point kill_deadline_{};
  boost::asio::steady_timer stage_timer_;   // grace, then the kill bound
  boost::asio::steady_timer poll_timer_;    // tree-empty polling
  boost::asio::steady_timer drain_timer_;   // root exited, streams still open
  boost::asio::steady_timer reader_timer_;  // streams still open after the tree is gone
};

}  // namespace custos::supervisor
