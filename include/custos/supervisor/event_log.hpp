// EventLog: numbering, bounded retention and fan-out of one execution's events.
//
// seq starts at 1 and increases by one per appended event, so a subscriber can detect a gap.
// Retention is bounded twice: by event count and by the bytes of output data held (the plan's
// output.retained_bytes); the oldest events are evicted first. Eviction never loses output for
// good: output also goes to the spool file, which exec.output reads.
// Single-threaded (the event loop); a sink may unsubscribe others or itself while being called.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "custos/supervisor/types.hpp"

namespace custos::supervisor {

class EventLog {
 public:
  using Sink = std::function<bool(Event const&)>;

  EventLog(std::string execution_id, std::string plan_digest, std::size_t max_events,
           std::size_t max_data_bytes);
  // The checked sandbox plan's digest every event carries from now on (empty: none).
  void set_sandbox_digest(std::string digest) { sandbox_digest_ = std::move(digest); }

  // Numbers, retains and delivers an event. Returns the ids of subscribers whose sink returned
  // false; they are already removed.
  std::vector<std::uint64_t> append(std::string kind, boost::json::object fields,
                                    std::vector<std::uint8_t> data = {});

  struct Subscribed {
    std::uint64_t id = 0;
    std::uint64_t replay_from = 0;
    bool dropped = false;  // the sink returned false during replay: not subscribed
  };
  // Replays retained events with seq >= from_seq (all retained when nullopt) and then keeps the
  // sink for live events.
  Subscribed subscribe(std::optional<std::uint64_t> from_seq, Sink sink);
  bool unsubscribe(std::uint64_t id);
  // A handover: the next seq and the retained events, oldest first (what resume() takes in the
  // next image).
  [[nodiscard]] std::uint64_t next_seq() const noexcept { return next_seq_; }
  [[nodiscard]] std::deque<Event> const& retained() const noexcept { return retained_; }
  // Continues the log a previous image kept: numbering goes on from `next_seq`, and `events`
  // (each below it, oldest first) are retained as if appended here. Only before the first
  // append; events at or past next_seq are ignored.
  void resume(std::uint64_t next_seq, std::vector<Event> events);
  void clear_subscribers() { subscribers_.clear(); }

  [[nodiscard]] std::uint64_t last_seq() const noexcept { return next_seq_ - 1; }
  [[nodiscard]] std::uint64_t first_retained_seq() const noexcept {
    return retained_.empty() ? next_seq_ : retained_.front().seq;
  }
  [[nodiscard]] std::size_t retained_count() const noexcept { return retained_.size(); }
  [[nodiscard]] std::size_t retained_data_bytes() const noexcept { return retained_bytes_; }
  [[nodiscard]] std::size_t subscriber_count() const noexcept { return subscribers_.size(); }
  [[nodiscard]] std::string const& plan_digest() const noexcept { return plan_digest_; }

 private:
  void evict();

  std::string execution_id_;
  std::string plan_digest_;
  std::string sandbox_digest_;
  std::size_t max_events_;
  std::size_t max_data_bytes_;
  std::uint64_t next_seq_ = 1;
  std::deque<Event> retained_;
  std::size_t retained_bytes_ = 0;
  std::uint64_t next_subscriber_ = 1;
  std::map<std::uint64_t, Sink> subscribers_;
};

}  // namespace custos::supervisor
