#include "custos/supervisor/event_log.hpp"

#include <algorithm>
#include <utility>

namespace custos::supervisor {

EventLog::EventLog(std::string execution_id, std::string plan_digest, std::size_t max_events,
                   std::size_t max_data_bytes)
    : execution_id_(std::move(execution_id)),
      plan_digest_(std::move(plan_digest)),
      max_events_(max_events == 0 ? 1 : max_events),
      max_data_bytes_(max_data_bytes) {}

std::vector<std::uint64_t> EventLog::append(std::string kind, boost::json::object fields,
                                            std::vector<std::uint8_t> data) {
  Event ev;
  ev.execution_id = execution_id_;
  ev.seq = next_seq_++;
  ev.plan_digest = plan_digest_;
  ev.sandbox_digest = sandbox_digest_;
  ev.kind = std::move(kind);
  ev.fields = std::move(fields);
  ev.data = std::move(data);

  retained_bytes_ += ev.data.size();
  retained_.push_back(std::move(ev));
  Event const& stored = retained_.back();

  // Deliver before evicting so that even an event larger than the retention bound reaches live
  // subscribers. Ids are copied first: a sink may unsubscribe anyone, itself included.
  std::vector<std::uint64_t> ids;
  ids.reserve(subscribers_.size());
  for (auto const& [id, sink] : subscribers_) ids.push_back(id);
  std::vector<std::uint64_t> dropped;
  for (auto id : ids) {
    auto it = subscribers_.find(id);
    if (it == subscribers_.end()) continue;
    // Keep the sink alive while it runs even if it unsubscribes itself.
    Sink sink = it->second;
    if (!sink(stored)) {
      subscribers_.erase(id);
      dropped.push_back(id);
    }
  }
  evict();
  return dropped;
}

void EventLog::evict() {
  // Keep at least the newest event so a late subscriber still sees where the log stands.
  while (retained_.size() > 1 &&
         (retained_.size() > max_events_ || retained_bytes_ > max_data_bytes_)) {
    retained_bytes_ -= retained_.front().data.size();
    retained_.pop_front();
  }
}

EventLog::Subscribed EventLog::subscribe(std::optional<std::uint64_t> from_seq, Sink sink) {
  Subscribed out;
  std::uint64_t const first = first_retained_seq();
  std::uint64_t const start = from_seq ? std::max(*from_seq, first) : first;
  out.replay_from = start;
  // Replay under an index, not an iterator: a sink cannot append (single thread, no re-entry
  // into the supervisor from a sink), but it may be slow; the deque is not touched meanwhile.
  for (auto const& ev : retained_) {
    if (ev.seq < start) continue;
    if (!sink(ev)) {
      out.dropped = true;
      return out;
    }
  }
  out.id = next_subscriber_++;
  subscribers_.emplace(out.id, std::move(sink));
  return out;
}

void EventLog::resume(std::uint64_t next_seq, std::vector<Event> events) {
  if (next_seq_ != 1 || next_seq < 1) return;
  next_seq_ = next_seq;
  for (auto& ev : events) {
    if (ev.seq >= next_seq_ || (!retained_.empty() && ev.seq <= retained_.back().seq)) continue;
    ev.execution_id = execution_id_;
    ev.plan_digest = plan_digest_;
    ev.sandbox_digest = sandbox_digest_;
    retained_bytes_ += ev.data.size();
    retained_.push_back(std::move(ev));
  }
  evict();
}

bool EventLog::unsubscribe(std::uint64_t id) {
  return subscribers_.erase(id) > 0;
}

}  // namespace custos::supervisor
