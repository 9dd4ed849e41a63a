// A connection's subscription to one execution's events (exec.subscribe, exec.start with
// `subscribe: true`): the slot on the connection, the manager's sink, the slow-subscriber policy.
#include "custos/supervisor/manager.hpp"

#include "exec_internal.hpp"

namespace custos::rpc::detail {

namespace json = boost::json;

EventSubscription::EventSubscription(supervisor::ExecutionManager& manager,
                                     std::weak_ptr<Session> session)
    : manager_(manager), session_(std::move(session)) {}

Result<std::shared_ptr<EventSubscription>> EventSubscription::reserve(
    supervisor::ExecutionManager& manager, std::shared_ptr<Session> const& session) {
  auto sub = std::make_shared<EventSubscription>(manager, session);
  // The connection keeps the subscription alive while it holds the slot, the manager while it
  // holds the sink; the subscription holds neither strongly.
  auto id = session->add_subscription([sub] { sub->on_removed(); });
  if (!id) return id.error();
  sub->id_ = std::move(*id);
  return sub;
}

Result<std::uint64_t> EventSubscription::attach(std::string const& execution_id,
                                                std::optional<std::uint64_t> from_seq, bool hold) {
  if (removed_) {
    return Error{Errc::rpc_subscription_not_found,
                 "subscription " + id_ + " was removed before it was attached"};
  }
  execution_id_ = execution_id;
  holding_ = hold;
  auto handle = manager_.subscribe(
      execution_id, from_seq,
      [self = shared_from_this()](supervisor::Event const& ev) { return self->on_event(ev); });
  if (!handle) {
    holding_ = false;
    held_.clear();
    cancel();
    return handle.error();
  }
  handle_id_ = handle->id;
  // The terminal event was among the replayed (and delivered) ones: nothing more will come.
  if (ended_ && !removed_) {
    if (auto session = session_.lock()) (void)session->remove_subscription(id_);
  }
  return handle->replay_from;
}

void EventSubscription::release_held() {
  if (!holding_) return;
  holding_ = false;
  // Moved out first: delivering the terminal event removes the slot, which clears held_.
  std::vector<supervisor::Event> held = std::move(held_);
  held_.clear();
  for (auto const& ev : held) {
    if (removed_) break;
    deliver(ev);
  }
}

void EventSubscription::cancel() {
  if (removed_) return;
  if (auto session = session_.lock()) (void)session->remove_subscription(id_);
  removed_ = true;
}

bool EventSubscription::on_event(supervisor::Event const& ev) {
  auto session = session_.lock();
  if (!session || session->closed() || removed_) return false;
  if (holding_) {
    // Only a replay can be held (see attach): bounded by what the execution's log retains.
    held_.push_back(ev);
    return true;
  }
  deliver(ev);
  return true;
}

void EventSubscription::deliver(supervisor::Event const& ev) {
  auto session = session_.lock();
  if (!session || session->closed() || removed_) return;
  json::object params = ev.to_json();
  params["subscription"] = id_;
  if (dropped_ != 0) params["dropped"] = dropped_;
  // Slow-subscriber policy (docs/api.md): an event the connection cannot queue is dropped and
  // counted; the next delivered event carries `dropped` (and the seq gap shows it). The terminal
  // event is always queued (notify_final), so that "next delivered event" exists even for a
  // subscriber that read nothing until the end.
  bool const terminal = ev.kind == "terminal";
  bool const queued = terminal ? session->notify_final("exec.event", std::move(params))
                               : session->notify("exec.event", std::move(params));
  if (queued)
    dropped_ = 0;
  else
    ++dropped_;
  if (terminal) {
    // A subscription ends with its execution's terminal event (docs/api.md). During a replay
    // the manager does not hold the sink yet: attach() removes the slot once it returns.
    ended_ = true;
    if (handle_id_) (void)session->remove_subscription(id_);
  }
}

void EventSubscription::on_removed() {
  removed_ = true;
  held_.clear();
  if (handle_id_) {
    manager_.unsubscribe(supervisor::SubscriptionHandle{execution_id_, *handle_id_, 0});
    handle_id_.reset();
  }
}

}  // namespace custos::rpc::detail
