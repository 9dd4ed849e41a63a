// Unix-socket transport for the dispatcher: accept, peer credentials, line framing, bounded
// write queues and subscriptions, all on one io_context thread.
#include "custos/rpc/server.hpp"

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <deque>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <poll.h>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; the kernel here has it, older headers may not name it
#endif

namespace custos::rpc {

namespace asio = boost::asio;
namespace json = boost::json;
using stream = asio::local::stream_protocol;

namespace {

// Closes a descriptor obtained from getsockopt(SO_PEERPIDFD); held only during accept.
class OwnedFd {
 public:
  explicit OwnedFd(int fd) noexcept : fd_(fd) {}
  OwnedFd(OwnedFd const&) = delete;
  OwnedFd& operator=(OwnedFd const&) = delete;
  ~OwnedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};

std::vector<std::uint32_t> read_groups(std::int32_t pid) {
  std::vector<std::uint32_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream ss(line.substr(7));
    std::uint32_t g = 0;
    while (ss >> g) out.push_back(g);
    break;
  }
  return out;
}

// Credentials as the kernel saw them at connect time; supplementary groups are read from /proc
// and kept only if the peer pidfd shows the same process is still alive afterwards (a reused
// pid would otherwise lend its groups to the caller).
PeerCredentials read_peer(int fd) {
  PeerCredentials peer;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.uid = cred.uid;
    peer.gid = cred.gid;
    peer.pid = cred.pid;
  } else {
    // Unknown caller: map to an id that is never an administrator.
    peer.uid = static_cast<std::uint32_t>(-2);
    peer.gid = static_cast<std::uint32_t>(-2);
  }
  int pidfd = -1;
  len = sizeof pidfd;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
    OwnedFd const guard{pidfd};
    (void)::fcntl(guard.get(), F_SETFD, FD_CLOEXEC);
    peer.has_pidfd = true;
    if (peer.pid > 0) {
      auto groups = read_groups(peer.pid);
      pollfd p{guard.get(), POLLIN, 0};
      // A pidfd polls readable once the process has exited.
      if (::poll(&p, 1, 0) == 0) peer.groups = std::move(groups);
    }
  } else if (peer.pid > 0) {
    peer.groups = read_groups(peer.pid);
  }
  return peer;
}

}  // namespace

class Connection;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io_in, Dispatcher& d, ServerLimits l)
      : io(io_in), dispatcher(d), limits(l), acceptor(io_in) {}

  void start_accept();
  void on_closed(Connection* c);

  asio::io_context& io;
  Dispatcher& dispatcher;
  ServerLimits limits;
  stream::acceptor acceptor;
  bool accepting = false;
  std::map<Connection*, std::shared_ptr<Connection>> connections;
  ServerStats stats;
};

class Connection final : public Session, public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Server::Impl> server, stream::socket socket, PeerCredentials peer)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        peer_(std::move(peer)),
        idle_timer_(server_->io) {}

  [[nodiscard]] PeerCredentials const& peer() const noexcept override { return peer_; }
  [[nodiscard]] bool closed() const noexcept override { return closed_; }

  bool notify(std::string_view method, json::object params) override {
    if (closed_ || closing_) return false;
    auto const& limits = server_->limits;
    if (queued_bytes_ >= limits.event_queue_bytes) {
      ++server_->stats.events_dropped;
      return false;
    }
    ++server_->stats.events_sent;
    enqueue(json::serialize(notification(method, std::move(params))));
    return true;
  }

  bool notify_final(std::string_view method, json::object params) override {
    if (closed_ || closing_) return false;
    ++server_->stats.events_sent;
    enqueue(json::serialize(notification(method, std::move(params))));
    return true;
  }

  Result<std::string> add_subscription(std::function<void()> on_remove) override {
    if (closed_) return Error{Errc::rpc_unavailable, "connection closed"};
    if (subscriptions_.size() >= server_->limits.max_subscriptions_per_connection) {
      return Error{Errc::rpc_subscription_limit,
                   "at most " + std::to_string(server_->limits.max_subscriptions_per_connection) +
                       " subscriptions per connection"};
    }
    std::string id = "sub-" + std::to_string(++next_subscription_);
    subscriptions_.emplace(id, std::move(on_remove));
    return id;
  }

  Result<void> remove_subscription(std::string const& id) override {
    auto it = subscriptions_.find(id);
    if (it == subscriptions_.end()) {
      return Error{Errc::rpc_subscription_not_found,
                   "no subscription " + id + " on this connection"};
    }
    auto fn = std::move(it->second);
    subscriptions_.erase(it);
    last_activity_ = std::chrono::steady_clock::now();
    if (fn) fn();
    // A half-closed client whose last subscription just ended may have nothing left to serve.
    if (read_eof_) finish_later();
    return ok();
  }

  std::uint64_t add_close_hook(std::function<void()> const& fn) override {
    if (closed_) return 0;
    auto const id = ++next_close_hook_;
    close_hooks_.emplace(id, fn);
    return id;
  }

  void remove_close_hook(std::uint64_t handle) override { close_hooks_.erase(handle); }

  void start() {
    last_activity_ = std::chrono::steady_clock::now();
    arm_idle_timer(server_->limits.idle_timeout);
    read_more();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    idle_timer_.cancel();
    boost::system::error_code ec;
    socket_.shutdown(stream::socket::shutdown_both, ec);
    socket_.close(ec);
    auto subs = std::move(subscriptions_);
    subscriptions_.clear();
    for (auto& [id, fn] : subs) {
      if (fn) fn();
    }
    write_queue_.clear();
    queued_bytes_ = 0;
    auto hooks = std::move(close_hooks_);
    close_hooks_.clear();
    for (auto& [id, fn] : hooks) {
      if (fn) fn();
    }
    server_->on_closed(this);
  }

  // Sends one final error line (used when refusing a connection) and closes after it.
  void refuse(Error const& e) {
    closing_ = true;
    enqueue(json::serialize(error_response(json::value{}, e)));
  }

 private:
  void read_more() {
    if (closed_ || reading_ || read_eof_ || closing_) return;
    if (paused()) return;
    reading_ = true;
    socket_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](
                                                      boost::system::error_code ec, std::size_t n) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec == asio::error::eof) {
        if (self->peer_gone()) {
          // Closed, not half-closed: no reply can be delivered any more, and pending calls
          // (an exec.wait can last days) must not keep the slot and what they hold.
          self->close();
          return;
        }
        // A half-closed client still gets the replies to what it sent.
        self->read_eof_ = true;
        self->process_lines();
        return;
      }
      if (ec) {
        self->close();
        return;
      }
      self->inbuf_.append(self->chunk_.data(), n);
      self->process_lines();
    });
  }

  // After EOF on reading: POLLHUP means the peer shut down both directions (closed its socket),
  // as opposed to shutdown(SHUT_WR) where it still reads our replies.
  [[nodiscard]] bool peer_gone() {
    pollfd p{socket_.native_handle(), POLLOUT, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) != 0;
  }

  [[nodiscard]] bool paused() const {
    auto const& limits = server_->limits;
    return inflight_ >= limits.max_inflight_per_connection ||
           queued_bytes_ >= limits.max_write_queue_bytes;
  }

  void process_lines() {
    auto const max_line = server_->limits.max_line_bytes;
    // Lines are handed to the dispatcher as views into inbuf_ (it parses them before returning,
    // and nothing refills inbuf_ meanwhile); the consumed prefix is erased once at the end.
    std::size_t begin = 0;
    while (!closed_ && !closing_ && !paused()) {
      auto const nl = inbuf_.find('\n', std::max(begin, scan_from_));
      if (nl == std::string::npos) {
        scan_from_ = inbuf_.size();
        if (inbuf_.size() - begin > max_line) {
          line_too_long();
          return;
        }
        break;
      }
      if (nl - begin > max_line) {
        line_too_long();
        return;
      }
      std::string_view line{inbuf_.data() + begin, nl - begin};
      begin = nl + 1;
      scan_from_ = begin;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank keep-alive
      last_activity_ = std::chrono::steady_clock::now();
      // Every call the line starts (each batch entry) holds in-flight budget until the line is
      // answered; `admitted` runs before any of them, the reply may come synchronously.
      auto cost = std::make_shared<std::size_t>(0);
      server_->dispatcher.handle_line(
          shared_from_this(), line,
          [weak = weak_from_this(), cost](std::string response) {
            auto self = weak.lock();
            if (!self) return;
            self->on_reply(std::move(response), *cost);
          },
          [this, cost](std::size_t n) {
            *cost = n;
            inflight_ += n;
          });
    }
    if (begin > 0 && !inbuf_.empty()) {
      inbuf_.erase(0, begin);
      scan_from_ = scan_from_ > begin ? scan_from_ - begin : 0;
    }
    if (!closed_ && !closing_) {
      if (read_eof_)
        maybe_finish();
      else
        read_more();
    }
  }

  // The dispatcher calls this exactly once per line, with an empty string when nothing is owed.
  void on_reply(std::string response, std::size_t cost) {
    if (closed_) return;
    last_activity_ = std::chrono::steady_clock::now();
    bool const was_full = inflight_ >= server_->limits.max_inflight_per_connection;
    inflight_ -= std::min(inflight_, cost);
    if (!response.empty()) enqueue(std::move(response));
    if (closing_ || closed_) return;
    if (was_full) {
      // Resume later, not inside the caller's stack (it may be mid-dispatch).
      asio::post(server_->io, [self = shared_from_this()] {
        if (!self->closed_ && !self->closing_) self->process_lines();
      });
    } else if (read_eof_) {
      finish_later();
    }
  }

  void enqueue(std::string line) {
    line.push_back('\n');
    if (!writing_ && write_queue_.empty()) {
      // The common case, one reply to a waiting client: write it now with one non-blocking send
      // instead of queueing an asynchronous write and running its completion on a later turn.
      // Whatever the socket does not take now goes through the queue as before.
      std::size_t const sent = try_send_now(line);
      if (sent == line.size()) {
        after_direct_write();
        return;
      }
      if (sent > 0) line.erase(0, sent);
    }
    queued_bytes_ += line.size();
    write_queue_.push_back(std::move(line));
    if (!writing_) write_next();
  }

  // Bytes of `line` the socket accepted without blocking; 0 on EAGAIN or an error (the queued
  // asynchronous write then meets the same error and closes the connection as before).
  std::size_t try_send_now(std::string const& line) {
    if (closed_) return 0;
    ssize_t n = 0;
    do {
      n = ::send(socket_.native_handle(), line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }

  // What a completed asynchronous write does once the queue is empty (write_next), minus the
  // resumption of reading (a direct write happens inside process_lines or on_reply, which resume
  // it themselves).
  void after_direct_write() {
    if (closing_ || read_eof_) finish_later();
  }

  // Closes after a refusal, or a half-closed client with nothing left to serve, on a later turn
  // of the loop: a direct write or a subscription's end can happen inside a manager callback (an
  // event, a wait's completion), and closing there would remove subscriptions and waiters from
  // inside the manager's own iteration over them.
  void finish_later() {
    if (finish_posted_ || closed_) return;
    finish_posted_ = true;
    asio::post(server_->io, [self = shared_from_this()] {
      self->finish_posted_ = false;
      if (self->closed_) return;
      if (self->closing_) {
        if (!self->writing_ && self->write_queue_.empty()) self->close();
        return;
      }
      self->maybe_finish();
    });
  }

  void write_next() {
    if (closed_) return;
    if (write_queue_.empty()) {
      writing_ = false;
      if (closing_) {
        close();
        return;
      }
      maybe_finish();
      return;
    }
    writing_ = true;
    asio::async_write(socket_, asio::buffer(write_queue_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (self->closed_) return;
                        if (ec) {
                          self->close();
                          return;
                        }
                        self->queued_bytes_ -= self->write_queue_.front().size();
                        self->write_queue_.pop_front();
                        self->write_next();
                        // Reading may have paused on a full queue; process_lines resumes it.
                        if (!self->closed_ && !self->closing_) self->process_lines();
                      });
  }

  void line_too_long() {
    ++server_->stats.lines_too_long;
    inbuf_.clear();
    refuse(Error{
        Errc::rpc_line_too_long,
        "a line is longer than " + std::to_string(server_->limits.max_line_bytes) + " bytes"});
  }

  // One timer per connection, re-armed to the remaining time instead of on every request.
  void arm_idle_timer(std::chrono::steady_clock::duration after) {
    if (server_->limits.idle_timeout.count() <= 0 || closed_) return;
    idle_timer_.expires_after(after);
    idle_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (!self || ec || self->closed_) return;
      self->on_idle_timer();
    });
  }

  void on_idle_timer() {
    auto const timeout = server_->limits.idle_timeout;
    auto const idle_for = std::chrono::steady_clock::now() - last_activity_;
    // A pending call (an exec.wait can take hours), a subscription or unsent bytes mean the
    // client is being served, not idle.
    bool const busy = inflight_ > 0 || !subscriptions_.empty() || !write_queue_.empty();
    if (!busy && idle_for >= timeout) {
      ++server_->stats.idle_closed;
      close();
      return;
    }
    arm_idle_timer(busy ? std::chrono::steady_clock::duration{timeout} : timeout - idle_for);
  }

  void maybe_finish() {
    if (closed_ || !read_eof_) return;
    if (inflight_ == 0 && write_queue_.empty() && subscriptions_.empty()) close();
  }

  std::shared_ptr<Server::Impl> server_;
  stream::socket socket_;
  PeerCredentials peer_;
  std::array<char, 65536> chunk_{};
  std::string inbuf_;
  std::size_t scan_from_ = 0;
  std::deque<std::string> write_queue_;
  std::size_t queued_bytes_ = 0;
  std::size_t inflight_ = 0;
  bool reading_ = false;
  bool writing_ = false;
  bool read_eof_ = false;
  bool closing_ = false;
  bool closed_ = false;
  bool finish_posted_ = false;
  std::map<std::string, std::function<void()>> subscriptions_;
  std::uint64_t next_subscription_ = 0;
  std::map<std::uint64_t, std::function<void()>> close_hooks_;
  std::uint64_t next_close_hook_ = 0;
  asio::steady_timer idle_timer_;
  std::chrono::steady_clock::time_point last_activity_{};
};

void Server::Impl::start_accept() {
  if (!accepting) return;
  acceptor.async_accept(
      [self = shared_from_this()](boost::system::error_code ec, stream::socket socket) {
        if (!self->accepting) return;
        if (!ec) {
          auto peer = read_peer(socket.native_handle());
          auto conn = std::make_shared<Connection>(self, std::move(socket), std::move(peer));
          self->connections.emplace(conn.get(), conn);
          ++self->stats.accepted;
          self->stats.open = self->connections.size();
          if (self->connections.size() > self->limits.max_connections) {
            ++self->stats.refused;
            conn->refuse(
                Error{Errc::rpc_overloaded,
                      "at most " + std::to_string(self->limits.max_connections) + " connections"});
          } else {
            conn->start();
          }
        } else if (ec == asio::error::operation_aborted) {
          return;
        }
        // Transient accept failures (EMFILE, ECONNABORTED) must not stop the server.
        self->start_accept();
      });
}

void Server::Impl::on_closed(Connection* c) {
  // Defer the erase: the connection may be inside one of its own handlers.
  asio::post(io, [self = shared_from_this(), c] {
    self->connections.erase(c);
    self->stats.open = self->connections.size();
  });
}

Server::Server(asio::io_context& io, Dispatcher& dispatcher, ServerLimits limits)
    : impl_(std::make_shared<Impl>(io, dispatcher, limits)) {}

Server::~Server() {
  stop_accepting();
  close_all();
}

Result<void> Server::listen(std::string const& path, unsigned mode) {
  boost::system::error_code ec;
  stream::endpoint const ep{path};
  impl_->acceptor.open(ep.protocol(), ec);
  if (ec) return Error{Errc::rpc_unavailable, "socket for " + path, ec.value()};
  impl_->acceptor.bind(ep, ec);
  if (ec) return Error{Errc::rpc_unavailable, "bind " + path, ec.value()};
  if (::chmod(path.c_str(), mode) != 0) {
    return Error{Errc::rpc_unavailable, "chmod " + path, errno};
  }
  impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error{Errc::rpc_unavailable, "listen " + path, ec.value()};
  impl_->accepting = true;
  impl_->start_accept();
  return ok();
}

Result<void> Server::adopt(int fd) {
  boost::system::error_code ec;
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
  impl_->acceptor.assign(stream{}, fd, ec);
  if (ec) {
    ::close(fd);
    return Error{Errc::rpc_unavailable, "adopt activated socket", ec.value()};
  }
  impl_->accepting = true;
  impl_->start_accept();
  return ok();
}

void Server::stop_accepting() {
  impl_->accepting = false;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
}

Result<sys::UniqueFd> Server::release_listener() {
  impl_->accepting = false;
  if (!impl_->acceptor.is_open()) return Error{Errc::rpc_unavailable, "no listening socket"};
  // The pending accept completes with operation_aborted and is not re-armed (accepting false).
  boost::system::error_code ec;
  int const fd = impl_->acceptor.release(ec);
  if (ec) return Error{Errc::rpc_unavailable, "release the listening socket", ec.value()};
  return sys::UniqueFd{fd};
}

void Server::close_all() {
  // Drop the server's references now: after close_all the loop may never run again, and a
  // deferred erase would then leave Connection <-> Impl reference cycles behind.
  auto conns = std::move(impl_->connections);
  impl_->connections.clear();
  impl_->stats.open = 0;
  for (auto& [ptr, conn] : conns) conn->close();
}

ServerStats Server::stats() const {
  return impl_->stats;
}
ServerLimits const& Server::limits() const noexcept {
  return impl_->limits;
}

}  // namespace custos::rpc
