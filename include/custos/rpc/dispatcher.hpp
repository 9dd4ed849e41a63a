// The method table and the JSON-RPC 2.0 message rules (single calls, batches, notifications),
// independent of the transport so that tests can drive it without a socket.
#pragma once

#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/rpc/protocol.hpp"

namespace custos::rpc {

// One client connection as a method handler sees it. Handlers that outlive the call (exec.wait,
// exec.subscribe) hold a std::weak_ptr<Session> and stop when it expires or closed() is true.
class Session {
 public:
  virtual ~Session() = default;
  [[nodiscard]] virtual PeerCredentials const& peer() const noexcept = 0;
  [[nodiscard]] virtual bool closed() const noexcept = 0;
  // Queues a notification. Returns false when it was dropped because the connection's event
  // budget is exhausted (the client is not reading); the caller does the accounting.
  virtual bool notify(std::string_view method, boost::json::object params) = 0;
  // As notify(), for the one event that ends a subscription (the terminal exec.event): queued
  // even beyond the event budget, so a subscriber that fell behind still learns that the stream
  // ended and, through its `dropped` and seq gap, what it lost. Bounded: one per subscription,
  // at most max_subscriptions_per_connection per connection. Returns false only when the
  // connection is closed. The default forwards to notify().
  virtual bool notify_final(std::string_view method, boost::json::object params) {
    return notify(method, std::move(params));
  }
  // Registers a subscription owned by this connection; `on_remove` runs exactly once, on
  // remove_subscription or when the connection closes. Fails with rpc.subscription_limit.
  [[nodiscard]] virtual Result<std::string> add_subscription(std::function<void()> on_remove) = 0;
  [[nodiscard]] virtual Result<void> remove_subscription(std::string const& id) = 0;
  // Runs `fn` once when the connection closes (not counted as a subscription). Returns a handle
  // for remove_close_hook, or 0 when the connection is already closed (`fn` is not kept). Lets a
  // long-pending call (exec.wait) drop what it holds for a client that went away.
  virtual std::uint64_t add_close_hook(std::function<void()> const& /*fn*/) { return 0; }
  virtual void remove_close_hook(std::uint64_t /*handle*/) {}
};

// Completes one call. Must be invoked exactly once, on the io_context thread; a completion for a
// connection that has gone away is discarded.
using Reply = std::function<void(Result<boost::json::value>)>;
using Handler =
    std::function<void(std::shared_ptr<Session> const&, boost::json::object const& params, Reply)>;
// How a call reached its handler, for the few methods whose answer is followed by more on the
// same connection (exec.start with `subscribe`).
struct CallInfo {
  // One entry of a batch: its answer leaves with the batch's other answers once all of them are
  // done, so whatever the handler queues on the session meanwhile would precede it on the wire.
  bool in_batch = false;
  // No id: nothing is answered at all.
  bool notification = false;
};
// A handler that is told how it was called. Outside a batch, its Reply hands the response line to
// the transport's `emit` before returning (see handle_line), so what the handler queues on the
// session after replying follows the answer on the wire.
using CallHandler = std::function<void(std::shared_ptr<Session> const&,
                                       boost::json::object const& params, CallInfo const&, Reply)>;
// A method whose result is ready-made JSON text (host.info: built once at start-up). The
// dispatcher splices the text into the response line as it is, instead of copying and
// re-encoding a JSON tree on every call. Completes synchronously; the text is shared, never
// modified after it is returned.
using TextHandler = std::function<Result<std::shared_ptr<std::string const>>(
    std::shared_ptr<Session> const&, boost::json::object const& params)>;

struct DispatchStats {
  std::uint64_t calls = 0;
  std::uint64_t notifications = 0;
  std::uint64_t errors = 0;
  std::uint64_t denied = 0;
};

class Dispatcher {
 public:
  explicit Dispatcher(AuthPolicy auth) : auth_(auth) {}

  // Registers `name`. A second registration of the same name replaces the first.
  void add(std::string name, Access access, Handler handler);
  // Registers `name` with a result that is already serialized JSON (TextHandler). Replaces a
  // previous registration of the same name, like add().
  void add_text(std::string name, Access access, TextHandler handler);
  // Registers `name` with a handler that receives the CallInfo. Replaces a previous registration
  // of the same name, like add().
  void add_call(std::string name, Access access, CallHandler handler);
  [[nodiscard]] std::vector<std::string> method_names() const;
  [[nodiscard]] bool has(std::string_view name) const;
  // The handler registered for `name` with add(), or null (also for add_text and add_call
  // methods). Lets a
  // later registration wrap an earlier one (the gateway re-registers exec.* with its own access
  // check in front).
  [[nodiscard]] Handler const* find(std::string_view name) const;
  [[nodiscard]] AuthPolicy const& auth() const noexcept { return auth_; }
  [[nodiscard]] DispatchStats const& stats() const noexcept { return stats_; }

  // Handles one framed line. `emit` is called exactly once, when every call of the message has
  // completed: with the serialized response line (without '\n'), or with an empty string when
  // nothing is owed (notifications only). Completion may be synchronous or later; for a line
  // that is not a batch, `emit` runs inside the handler's Reply call (a transport that queues the
  // line in `emit` therefore has it queued before anything the handler sends afterwards).
  void handle_line(std::shared_ptr<Session> const& session, std::string_view line,
                   std::function<void(std::string)> emit);
  // As above; `admitted(n)` is called synchronously, before any call runs, with the number of
  // calls the line starts (1 for a single request, the entry count for a batch; not called when
  // the line is refused outright). The transport counts them against its in-flight budget until
  // `emit` runs.
  void handle_line(std::shared_ptr<Session> const& session, std::string_view line,
                   std::function<void(std::string)> emit,
                   std::function<void(std::size_t)> const& admitted);

  // Entries per batch; a larger batch is answered with one -32600 error and none of it runs.
  void set_max_batch_entries(std::size_t n) noexcept { max_batch_entries_ = n == 0 ? 1 : n; }
  [[nodiscard]] std::size_t max_batch_entries() const noexcept { return max_batch_entries_; }

 private:
  struct Entry {
    Access access;
    Handler handler;   // set by add()
    TextHandler text;  // set by add_text()
    CallHandler call;  // set by add_call()
  };
  // Runs one request object; `done` gets the serialized response, or an empty string for a
  // notification. `in_batch`: the object is one entry of a batch.
  void handle_one(std::shared_ptr<Session> const& session, boost::json::value const& msg,
                  std::function<void(std::string)> done, bool in_batch);

  AuthPolicy auth_;
  std::map<std::string, Entry, std::less<>> methods_;
  DispatchStats stats_;
  std::size_t max_batch_entries_ = 128;
};

}  // namespace custos::rpc
