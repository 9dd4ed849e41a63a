// The metrics endpoint's HTTP side: accept, one bounded request at a time per connection, the
// answer, keep-alive; all on the daemon's io_context thread, like the JSON-RPC server.
#include "metrics_server.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#pragma GCC diagnostic pop
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <map>
#include <optional>
#include <sys/stat.h>

namespace custos::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using local = asio::local::stream_protocol;
using boost::system::error_code;

Result<MetricsEndpoint> parse_metrics_listen(std::string_view spec) {
  auto bad = [spec](std::string_view why) {
    return Error{Errc::daemon_config_invalid,
                 "metrics-listen " + std::string{spec} + ": " + std::string{why}};
  };
  MetricsEndpoint ep;
  if (spec.starts_with("unix:")) {
    ep.kind = MetricsEndpoint::Kind::unix_socket;
    ep.path = std::string{spec.substr(5)};
    if (ep.path.empty() || ep.path.front() != '/') {
      return bad("a Unix socket needs an absolute path (unix:/run/custos/metrics.sock)");
    }
    // sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
    if (ep.path.size() >= 108) return bad("socket path longer than 107 bytes");
    return ep;
  }
  std::string_view host;
  std::string_view port;
  if (spec.starts_with('[')) {
    auto const close = spec.find("]:");
    if (close == std::string_view::npos) return bad("expected [::1]:PORT");
    host = spec.substr(1, close - 1);
    port = spec.substr(close + 2);
  } else {
    auto const colon = spec.rfind(':');
    if (colon == std::string_view::npos) {
      return bad("expected unix:/path, 127.0.0.1:PORT or [::1]:PORT");
    }
    host = spec.substr(0, colon);
    port = spec.substr(colon + 1);
  }
  unsigned value = 0;
  auto const [end, err] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || err != std::errc{} || end != port.data() + port.size() || value > 65535) {
    return bad("not a port number (0 to 65535)");
  }
  error_code ec;
  auto const address = asio::ip::make_address(std::string{host}, ec);
  if (ec) return bad("not an IP address (names are not resolved: use 127.0.0.1 or [::1])");
  // Metrics describe every execution the daemon holds; they are not for the network. A proxy
  // or the scraper's host can reach a Unix socket or a loopback port.
  if (!address.is_loopback()) {
    return bad("not a loopback address; metrics are served on a Unix socket or on loopback only");
  }
  ep.kind = MetricsEndpoint::Kind::tcp;
  ep.address = address;
  ep.port = static_cast<std::uint16_t>(value);
  return ep;
}

namespace {

struct SessionBase {
  SessionBase() = default;
  SessionBase(SessionBase const&) = delete;
  SessionBase& operator=(SessionBase const&) = delete;
  virtual ~SessionBase() = default;
  virtual void close() = 0;
};

}  // namespace

struct MetricsServer::State {
  State(asio::io_context& io_in, std::function<std::string()> r)
      : io(io_in), render(std::move(r)), retry(io_in) {}

  asio::io_context& io;
  std::function<std::string()> render;
  std::optional<tcp::acceptor> tcp_acceptor;
  std::optional<local::acceptor> unix_acceptor;
  asio::steady_timer retry;  // after a failed accept (EMFILE): no busy loop
  std::map<SessionBase*, std::weak_ptr<SessionBase>> sessions;
  std::string url;
  bool stopped = false;
};

namespace {

using State = MetricsServer::State;

template <class Socket>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Socket>> {
 public:
  Session(std::shared_ptr<State> state, Socket socket)
      : state_(std::move(state)), socket_(std::move(socket)), timer_(state_->io) {}

  void start() { read(); }

  void close() override {
    error_code ignored;
    timer_.cancel();
    socket_.close(ignored);
  }

 private:
  // Every read and write runs under the deadline: a scraper that stops sending or reading is
  // closed, never waited for.
  void arm() {
    timer_.expires_after(MetricsServer::kIoTimeout);
    timer_.async_wait([weak = this->weak_from_this()](error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->close();
    });
  }

  void read() {
    parser_.emplace();
    parser_->header_limit(MetricsServer::kMaxHeadBytes);
    arm();
    http::async_read(
        socket_, buffer_, *parser_,
        [self = this->shared_from_this()](error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(error_code ec) {
    timer_.cancel();
    if (state_->stopped || ec == http::error::end_of_stream ||
        ec == asio::error::operation_aborted || !socket_.is_open()) {
      return finish();
    }
    // Not HTTP, a head over the limit, a body (a GET has none): answered once, then closed.
    if (ec) return respond(http::status::bad_request, "bad request\n", 11, false);
    auto const& req = parser_->get();
    std::string_view target = req.target();
    target = target.substr(0, target.find('?'));
    if (target != "/metrics") {
      return respond(http::status::not_found, "not found; try /metrics\n", req.version(),
                     req.keep_alive());
    }
    if (req.method() != http::verb::get) {
      return respond(http::status::method_not_allowed, "method not allowed\n", req.version(),
                     req.keep_alive());
    }
    respond(http::status::ok, state_->render(), req.version(), req.keep_alive());
  }

  void respond(http::status status, std::string body, unsigned version, bool keep_alive) {
    res_ = {};
    res_.version(version);
    res_.result(status);
    res_.set(http::field::server, "custos");
    res_.set(http::field::content_type, status == http::status::ok
                                            ? "text/plain; version=0.0.4; charset=utf-8"
                                            : "text/plain; charset=utf-8");
    if (status == http::status::method_not_allowed) res_.set(http::field::allow, "GET");
    res_.keep_alive(keep_alive);
    res_.body() = std::move(body);
    res_.prepare_payload();
    arm();
    http::async_write(socket_, res_, [self = this->shared_from_this()](error_code ec, std::size_t) {
      self->timer_.cancel();
      if (ec || self->state_->stopped) return self->finish();
      if (self->res_.keep_alive()) return self->read();
      self->linger();
    });
  }

  // Closing with unread bytes queued makes the kernel send a reset, which can destroy the answer
  // before the client read it (a head over the limit is only partly read). So the sending side
  // is shut first and what the client still sends is read and discarded, under the deadline,
  // until it closes too.
  void linger() {
    error_code ignored;
    socket_.shutdown(Socket::shutdown_send, ignored);
    arm();
    socket_.async_read_some(asio::buffer(scratch_),
                            [self = this->shared_from_this()](error_code ec, std::size_t) {
                              if (ec || self->state_->stopped) {
                                self->timer_.cancel();
                                return self->finish();
                              }
                              self->linger();
                            });
  }

  void finish() {
    close();
    state_->sessions.erase(this);
  }

  std::shared_ptr<State> state_;
  Socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_{MetricsServer::kMaxHeadBytes};
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::response<http::string_body> res_;
  std::array<char, 4096> scratch_{};
};

// The log's URL of a bound TCP endpoint: http://127.0.0.1:9464/metrics, http://[::1]:9464/metrics.
std::string url_of(tcp::endpoint const& bound) {
  std::string const host = bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                                   : bound.address().to_string();
  return "http://" + host + ":" + std::to_string(bound.port()) + "/metrics";
}

template <class Acceptor>
void accept(std::shared_ptr<State> const& st, Acceptor& acceptor) {
  using Socket = typename Acceptor::protocol_type::socket;
  acceptor.async_accept([st, &acceptor](error_code ec, Socket socket) {
    if (st->stopped || ec == asio::error::operation_aborted) return;
    if (ec) {
      spdlog::warn("metrics: accept failed: {}", ec.message());
      st->retry.expires_after(std::chrono::milliseconds{100});
      st->retry.async_wait([st, &acceptor](error_code wec) {
        if (!wec && !st->stopped) accept(st, acceptor);
      });
      return;
    }
    if (st->sessions.size() >= MetricsServer::kMaxConnections) {
      error_code ignored;
      socket.close(ignored);
    } else {
      auto session = std::make_shared<Session<Socket>>(st, std::move(socket));
      st->sessions.emplace(session.get(), session);
      session->start();
    }
    accept(st, acceptor);
  });
}

}  // namespace

MetricsServer::MetricsServer(asio::io_context& io, std::function<std::string()> render)
    : state_(std::make_shared<State>(io, std::move(render))) {}

MetricsServer::~MetricsServer() {
  stop();
}

Result<void> MetricsServer::listen(MetricsEndpoint const& endpoint, unsigned mode) {
  error_code ec;
  auto fail = [](std::string what, error_code const& e) {
    return Error{Errc::rpc_unavailable, "metrics: " + what, e.value()};
  };
  if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
    local::endpoint const ep{endpoint.path};
    auto& acceptor = state_->unix_acceptor.emplace(state_->io);
    acceptor.open(ep.protocol(), ec);
    if (ec) return fail("socket for " + endpoint.path, ec);
    acceptor.bind(ep, ec);
    if (ec) return fail("bind " + endpoint.path, ec);
    if (::chmod(endpoint.path.c_str(), mode) != 0) {
      return Error{Errc::rpc_unavailable, "metrics: chmod " + endpoint.path, errno};
    }
    acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return fail("listen " + endpoint.path, ec);
    state_->url = "unix:" + endpoint.path;
    accept(state_, acceptor);
    return ok();
  }
  tcp::endpoint const ep{endpoint.address, endpoint.port};
  std::string const what = ep.address().to_string() + " port " + std::to_string(ep.port());
  auto& acceptor = state_->tcp_acceptor.emplace(state_->io);
  acceptor.open(ep.protocol(), ec);
  if (ec) return fail("socket for " + what, ec);
  // A restarted daemon must get its port back while the old connections are in TIME_WAIT.
  acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  acceptor.bind(ep, ec);
  if (ec) return fail("bind " + what, ec);
  acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen " + what, ec);
  auto const bound = acceptor.local_endpoint(ec);
  state_->url = url_of(bound);
  accept(state_, acceptor);
  return ok();
}

Result<void> MetricsServer::adopt(MetricsEndpoint const& endpoint, sys::UniqueFd fd) {
  auto refuse = [](std::string why) {
    return Error{Errc::rpc_unavailable, "metrics: the handed-over listener " + why};
  };
  int listening = 0;
  socklen_t len = sizeof listening;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening != 1) {
    return refuse("is not a listening socket");
  }
  error_code ec;
  if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
    auto& acceptor = state_->unix_acceptor.emplace(state_->io);
    acceptor.assign(local{}, fd.get(), ec);
    if (ec) return refuse("cannot be used: " + ec.message());
    (void)fd.release();  // the acceptor's now
    auto const bound = acceptor.local_endpoint(ec);
    if (ec || bound.path() != endpoint.path) {
      state_->unix_acceptor.reset();
      return refuse("is not bound at " + endpoint.path);
    }
    state_->url = "unix:" + endpoint.path;
    accept(state_, acceptor);
    return ok();
  }
  auto& acceptor = state_->tcp_acceptor.emplace(state_->io);
  acceptor.assign(endpoint.address.is_v6() ? tcp::v6() : tcp::v4(), fd.get(), ec);
  if (ec) return refuse("cannot be used: " + ec.message());
  (void)fd.release();
  auto const bound = acceptor.local_endpoint(ec);
  if (ec || bound.address() != endpoint.address ||
      (endpoint.port != 0 && bound.port() != endpoint.port)) {
    state_->tcp_acceptor.reset();
    return refuse("is not bound at the configured address and port");
  }
  state_->url = url_of(bound);
  accept(state_, acceptor);
  return ok();
}

Result<sys::UniqueFd> MetricsServer::release_listener() {
  error_code ec;
  int fd = -1;
  // The pending accept completes with operation_aborted once stopped, and is not armed again.
  state_->retry.cancel();
  if (state_->tcp_acceptor && state_->tcp_acceptor->is_open()) {
    fd = state_->tcp_acceptor->release(ec);
  } else if (state_->unix_acceptor && state_->unix_acceptor->is_open()) {
    fd = state_->unix_acceptor->release(ec);
  }
  stop();
  if (fd < 0 || ec)
    return Error{Errc::rpc_unavailable, "metrics: no listening socket to hand over"};
  return sys::UniqueFd{fd};
}

std::string MetricsServer::url() const {
  return state_->url;
}

void MetricsServer::stop() {
  if (state_->stopped) return;
  state_->stopped = true;
  state_->render = nullptr;
  error_code ignored;
  state_->retry.cancel();
  if (state_->tcp_acceptor) state_->tcp_acceptor->close(ignored);
  if (state_->unix_acceptor) state_->unix_acceptor->close(ignored);
  auto sessions = std::move(state_->sessions);
  state_->sessions.clear();
  for (auto const& [raw, weak] : sessions) {
    if (auto s = weak.lock()) s->close();
  }
}

}  // namespace custos::daemon
