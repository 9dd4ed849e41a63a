// `custos run --progress`: a one-line live status on the terminal while the run goes on —
// elapsed time, bytes of output so far, and the processes in the execution's tree (the daemon's
// latest sample, `exec.get` `usage.processes`). Drawn on stderr only when stderr is a terminal;
// hidden before any output is written, redrawn at the next tick, erased at the end. Private to
// cli/.
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <cstdint>
#include <optional>

namespace custos::cli {

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;

  // Shown only when asked for and stderr is a terminal.
  explicit ProgressLine(bool asked);

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  // Milliseconds until the next redraw (for the caller's poll timeout), or -1 when disabled.
  [[nodiscard]] int wait_ms(Clock::time_point now) const;
  // Whether an exec.get for the process count is due now (at most one a second, one in flight).
  [[nodiscard]] bool sample_due(Clock::time_point now) const;
  void sample_sent(std::uint64_t request_id, Clock::time_point now);
  // The answer to a request: true when it was ours (its usage, if any, is taken).
  bool on_answer(std::uint64_t request_id, boost::json::object const& message);
  // The request in flight will not be answered (its connection was lost): the next is due.
  void forget_sample() { inflight_.reset(); }
  // Redraws the line when a tick passed; `out_bytes` is every byte of output so far.
  void tick(Clock::time_point now, std::uint64_t out_bytes);
  // Erases the line (before output goes to the terminal, and at the end).
  void hide();

 private:
  bool enabled_ = false;
  bool shown_ = false;
  Clock::time_point started_;
  Clock::time_point last_draw_{};
  Clock::time_point last_sample_{};
  std::optional<std::uint64_t> inflight_;
  std::optional<std::uint64_t> processes_;
};

}  // namespace custos::cli
