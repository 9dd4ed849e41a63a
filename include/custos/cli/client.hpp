// A blocking JSON-RPC client for the CLI: one connection, line framing, calls and notifications.
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::cli {

// $CUSTOS_SOCKET if set, else ./.custos/custos.sock when it exists, else /run/custos/custos.sock.
[[nodiscard]] std::string default_socket();

// How long a client that lost its connection keeps trying to reach the daemon again (docs/cli.md,
// "Reconnecting"): a handover closes every connection, and connects made meanwhile wait in the
// listening socket's backlog, so one attempt normally suffices; while the socket refuses them or
// is absent (a restart rather than a handover) connects are retried with backoff, for at most
// this long in total.
inline constexpr std::chrono::milliseconds kReconnectBudget{30000};

// Whether `e` means the connection is gone and the call may be made again on a new one: the
// daemon closed it or it broke (rpc.unavailable), or the daemon answered that it is going away
// (daemon.shutting_down: a handover answers a pending exec.wait so before closing).
[[nodiscard]] bool connection_lost(Error const& e) noexcept;

class RpcClient {
 public:
  // Errors: rpc.unavailable (no daemon answers: ENOENT, ECONNREFUSED, EACCES ...).
  [[nodiscard]] static Result<RpcClient> connect(std::string const& socket_path);
  // connect(), retried with backoff (50 ms doubling to 1 s) while it fails, for at most `budget`
  // in total. Errors: the last attempt's rpc.unavailable.
  [[nodiscard]] static Result<RpcClient> connect_retrying(std::string const& socket_path,
                                                          std::chrono::milliseconds budget);

  RpcClient(RpcClient&&) noexcept = default;
  RpcClient& operator=(RpcClient&&) noexcept = default;

  // Sends a request and waits for its response; notifications that arrive meanwhile are kept in
  // notifications(). An error response becomes the Error it carries (data.code → Errc).
  [[nodiscard]] Result<boost::json::value> call(std::string_view method,
                                                boost::json::object params);
  // Sends a request without waiting; its response is later returned by next() as an object with
  // "id". Returns the id used.
  [[nodiscard]] Result<std::uint64_t> send(std::string_view method, boost::json::object params);
  // Next incoming message (queued notifications first). timeout_ms < 0 waits forever;
  // nullopt on timeout. Errors: rpc.unavailable when the daemon closed the connection.
  [[nodiscard]] Result<std::optional<boost::json::object>> next(int timeout_ms);
  // Reads whatever the socket has without blocking into the queue (for poll loops).
  [[nodiscard]] Result<void> pump();
  [[nodiscard]] bool has_queued() const noexcept { return !queue_.empty(); }
  // Moves the notifications `old` received but did not hand out yet to the front of this
  // client's queue, in order, so a reconnect loses none of them. Responses stay behind: their
  // ids belong to the old connection.
  void take_notifications(RpcClient& old);

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

 private:
  explicit RpcClient(sys::UniqueFd fd) noexcept : fd_(std::move(fd)) {}
  [[nodiscard]] Result<void> write_all(std::string const& line);
  // Parses complete lines of inbuf_ into queue_.
  [[nodiscard]] Result<void> drain_lines();
  [[nodiscard]] Result<bool> read_some(int timeout_ms);

  sys::UniqueFd fd_;
  std::uint64_t next_id_ = 1;
  std::string inbuf_;
  std::deque<boost::json::object> queue_;
};

}  // namespace custos::cli
