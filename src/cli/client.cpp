// Blocking line-framed JSON-RPC client over a Unix stream socket.
#include "custos/cli/client.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

#include "custos/rpc/protocol.hpp"

namespace custos::cli {

namespace json = boost::json;

std::string default_socket() {
  if (char const* env = std::getenv("CUSTOS_SOCKET"); env != nullptr && *env != '\0') return env;
  struct stat st {};
  if (::stat(".custos/custos.sock", &st) == 0 && S_ISSOCK(st.st_mode)) {
    char buf[4096];
    if (::getcwd(buf, sizeof buf) != nullptr) return std::string{buf} + "/.custos/custos.sock";
    return ".custos/custos.sock";
  }
  return "/run/custos/custos.sock";
}

Result<RpcClient> RpcClient::connect(std::string const& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) {
    return Error{Errc::rpc_unavailable, "socket path too long: " + path};
  }
  sys::UniqueFd fd{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!fd.valid()) return Error{Errc::rpc_unavailable, "socket()", errno};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr const*>(&addr), sizeof addr) != 0) {
    int const err = errno;
    return Error{Errc::rpc_unavailable,
                 "no custos daemon at " + path + " (" + std::strerror(err) + ")", err};
  }
  return RpcClient{std::move(fd)};
}

bool connection_lost(Error const& e) noexcept {
  return e.code == Errc::rpc_unavailable || e.code == Errc::daemon_shutting_down;
}

Result<RpcClient> RpcClient::connect_retrying(std::string const& path,
                                              std::chrono::milliseconds budget) {
  using Clock = std::chrono::steady_clock;
  auto const deadline = Clock::now() + budget;
  std::chrono::milliseconds pause{50};
  for (;;) {
    auto c = connect(path);
    if (c || Clock::now() + pause > deadline) return c;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds{1000});
  }
}

void RpcClient::take_notifications(RpcClient& old) {
  std::deque<json::object> kept;
  for (auto& m : old.queue_) {
    if (!m.contains("id")) kept.push_back(std::move(m));
  }
  old.queue_.clear();
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) queue_.push_front(std::move(*it));
}

Result<void> RpcClient::write_all(std::string const& line) {
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t const n = ::send(fd_.get(), line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd_.get(), POLLOUT, 0};
        (void)::poll(&p, 1, -1);
        continue;
      }
      return Error{Errc::rpc_unavailable, "daemon connection lost while sending", errno};
    }
    off += static_cast<std::size_t>(n);
  }
  return ok();
}

Result<std::uint64_t> RpcClient::send(std::string_view method, json::object params) {
  std::uint64_t const id = next_id_++;
  json::object req{
      {"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
  std::string line = json::serialize(req);
  line.push_back('\n');
  CUSTOS_TRYV(write_all(line));
  return id;
}

Result<void> RpcClient::drain_lines() {
  std::size_t nl = 0;
  while ((nl = inbuf_.find('\n')) != std::string::npos) {
    std::string_view const line{inbuf_.data(), nl};
    boost::system::error_code ec;
    json::value v = json::parse(line, ec);
    inbuf_.erase(0, nl + 1);
    if (ec || !v.is_object()) {
      return Error{Errc::rpc_parse_error, "the daemon sent something that is not a JSON object"};
    }
    queue_.push_back(std::move(v.get_object()));
  }
  return ok();
}

Result<bool> RpcClient::read_some(int timeout_ms) {
  pollfd p{fd_.get(), POLLIN, 0};
  int const r = ::poll(&p, 1, timeout_ms);
  if (r < 0) {
    if (errno == EINTR) return false;
    return Error{Errc::sys_error, "poll", errno};
  }
  if (r == 0) return false;
  char buf[65536];
  ssize_t const n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return false;
    return Error{Errc::rpc_unavailable, "daemon connection lost", errno};
  }
  if (n == 0) return Error{Errc::rpc_unavailable, "the daemon closed the connection"};
  inbuf_.append(buf, static_cast<std::size_t>(n));
  CUSTOS_TRYV(drain_lines());
  return true;
}

Result<void> RpcClient::pump() {
  for (;;) {
    auto got = CUSTOS_TRY(read_some(0));
    if (!got) return ok();
  }
}

Result<std::optional<json::object>> RpcClient::next(int timeout_ms) {
  while (queue_.empty()) {
    auto got = CUSTOS_TRY(read_some(timeout_ms));
    if (!got && timeout_ms >= 0) {
      if (queue_.empty()) return std::optional<json::object>{};
    }
  }
  json::object msg = std::move(queue_.front());
  queue_.pop_front();
  return std::optional<json::object>{std::move(msg)};
}

Result<json::value> RpcClient::call(std::string_view method, json::object params) {
  auto const id = CUSTOS_TRY(send(method, std::move(params)));
  std::deque<json::object> held;
  for (;;) {
    while (queue_.empty()) {
      if (auto got = read_some(-1); !got) {
        // Keep what arrived meanwhile for next() (or a reconnect's take_notifications()).
        for (auto it = held.rbegin(); it != held.rend(); ++it) queue_.push_front(std::move(*it));
        return got.error();
      }
    }
    json::object msg = std::move(queue_.front());
    queue_.pop_front();
    auto const* mid = msg.if_contains("id");
    bool ours = false;
    if (mid != nullptr && mid->is_int64()) ours = mid->get_int64() == static_cast<std::int64_t>(id);
    if (mid != nullptr && mid->is_uint64()) ours = mid->get_uint64() == id;
    if (!ours) {
      held.push_back(std::move(msg));
      continue;
    }
    // Put back what arrived meanwhile, in order, for next().
    for (auto it = held.rbegin(); it != held.rend(); ++it) queue_.push_front(std::move(*it));
    if (auto const* err = msg.if_contains("error"); err != nullptr && err->is_object()) {
      return rpc::error_from_object(err->get_object());
    }
    if (auto* res = msg.if_contains("result"); res != nullptr) return std::move(*res);
    return Error{Errc::rpc_invalid_request, "response without result or error"};
  }
}

}  // namespace custos::cli
