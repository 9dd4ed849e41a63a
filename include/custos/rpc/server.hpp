// The JSON-RPC server: a Unix stream socket on the daemon's single io_context.
//
// Framing is one message per '\n'-terminated line. Everything a client controls is bounded:
// line length, requests in flight, bytes queued for writing, subscriptions, connections.
// Slow-subscriber policy (docs/api.md): events beyond a connection's event budget are dropped
// and counted, never buffered; the next delivered event says how many were lost. Responses are
// never dropped: when a client stops reading, the server stops reading its requests instead.
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "custos/core/result.hpp"
#include "custos/rpc/dispatcher.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::rpc {

struct ServerLimits {
  std::size_t max_line_bytes = std::size_t{1} << 20;         // longer → -32600 and close
  std::size_t max_connections = 256;                         // beyond → rpc.overloaded and close
  std::size_t max_inflight_per_connection = 256;             // beyond → stop reading that client
  std::size_t max_write_queue_bytes = std::size_t{8} << 20;  // responses: stop reading above
  std::size_t event_queue_bytes = std::size_t{1} << 20;      // events: dropped above
  std::size_t max_subscriptions_per_connection = 64;
  // A connection with nothing in flight (no call, no exec.wait), no subscription and nothing
  // left to write is closed after this long without a request; zero disables the timeout.
  // Without it a silent client holds one of max_connections slots forever.
  std::chrono::milliseconds idle_timeout{60000};
};

struct ServerStats {
  std::uint64_t accepted = 0;
  std::uint64_t refused = 0;  // over max_connections
  std::uint64_t open = 0;
  std::uint64_t events_sent = 0;
  std::uint64_t events_dropped = 0;
  std::uint64_t lines_too_long = 0;
  std::uint64_t idle_closed = 0;  // closed by idle_timeout
};

class Server {
 public:
  Server(boost::asio::io_context& io, Dispatcher& dispatcher, ServerLimits limits);
  ~Server();
  Server(Server const&) = delete;
  Server& operator=(Server const&) = delete;

  // Binds and listens on `path` (which must not exist: the daemon removes a stale socket only
  // after proving nobody listens), then chmods it to `mode`.
  [[nodiscard]] Result<void> listen(std::string const& path, unsigned mode);
  // Serves an already-listening socket (systemd socket activation). Takes ownership of `fd`.
  [[nodiscard]] Result<void> adopt(int fd);
  // Stops accepting new connections; existing ones keep being served.
  void stop_accepting();
  // Stops accepting and hands the listening socket over instead of closing it (the daemon's
  // handover keeps it open across execve): connects meanwhile wait in its backlog, never
  // refused. The descriptor keeps O_CLOEXEC. Errors: rpc.unavailable when nothing listens.
  [[nodiscard]] Result<sys::UniqueFd> release_listener();
  // Closes every connection (subscriptions are removed, pending replies discarded).
  void close_all();

  [[nodiscard]] ServerStats stats() const;
  [[nodiscard]] ServerLimits const& limits() const noexcept;

  // Opaque state shared with the connections (they outlive a call into Server).
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace custos::rpc
