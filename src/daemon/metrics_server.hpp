// The metrics endpoint: a minimal HTTP/1.1 server (Boost.Beast) on the daemon's io_context that
// answers GET /metrics with what `render` returns, on a Unix socket or a loopback TCP port.
// Private to daemon/. What it serves is docs/metrics.md.
//
// Everything a scraper controls is bounded: the request head (kMaxHeadBytes, no body at all),
// the time to send a request and to take the answer (kIoTimeout, then the connection is closed),
// and the connections open at once (kMaxConnections; more are closed at accept). A request that
// does not parse gets 400 and the connection is closed; another path 404, another method 405.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::daemon {

struct MetricsEndpoint {
  enum class Kind : std::uint8_t { unix_socket, tcp };
  Kind kind = Kind::unix_socket;
  std::string path;                  // unix_socket: absolute
  boost::asio::ip::address address;  // tcp: loopback
  std::uint16_t port = 0;            // tcp: 0 picks a free port
};

// "unix:/path", "127.0.0.1:PORT" (any 127.0.0.0/8 address) or "[::1]:PORT".
// Errors: daemon.config_invalid for anything else, a non-loopback address included.
[[nodiscard]] Result<MetricsEndpoint> parse_metrics_listen(std::string_view spec);

class MetricsServer {
 public:
  static constexpr std::size_t kMaxHeadBytes = 8192;
  static constexpr std::chrono::seconds kIoTimeout{5};
  static constexpr std::size_t kMaxConnections = 16;

  // `render` is called on the loop for every GET /metrics; it returns the exposition text.
  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(MetricsServer const&) = delete;
  MetricsServer& operator=(MetricsServer const&) = delete;

  // Binds and listens. A Unix socket path must be free (the daemon claims it first) and is
  // chmod'ed to `mode`. Errors: rpc.unavailable (socket, bind, listen).
  [[nodiscard]] Result<void> listen(MetricsEndpoint const& endpoint, unsigned mode);
  // Where it listens, as a URL for the log: http://127.0.0.1:9464/metrics (the bound port when
  // 0 was asked for), or unix:/path.
  [[nodiscard]] std::string url() const;
  // Serves on a listening socket a previous image handed over, only if it is bound where
  // `endpoint` says (the same Unix path, or the same loopback address and port; any port when
  // the endpoint asks for 0). Errors: rpc.unavailable saying which check failed (`fd` is closed).
  [[nodiscard]] Result<void> adopt(MetricsEndpoint const& endpoint, sys::UniqueFd fd);
  // Stops accepting and closes every connection; `render` is not called again.
  void stop();
  // stop(), keeping the listening socket open for the next image (a handover): connects made
  // meanwhile wait in its backlog. Errors: rpc.unavailable when nothing listens.
  [[nodiscard]] Result<sys::UniqueFd> release_listener();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace custos::daemon
