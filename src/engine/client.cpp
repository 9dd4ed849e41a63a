// The asynchronous engine client: one Call per request, each with its own deadline timer, all
// on the caller's io_context.
#include "custos/engine/client.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#pragma GCC diagnostic pop

#include <algorithm>
#include <sys/un.h>
#include <utility>

#include "custos/core/plan.hpp"

#include "http.hpp"

namespace custos::engine {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using stream_protocol = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

namespace {

Error unavailable(std::string ctx, int err = 0) {
  return Error{Errc::engine_unavailable, std::move(ctx), err};
}

std::string describe(EngineKind kind, Operation op, std::string_view subject) {
  std::string out{to_string(kind)};
  out += ' ';
  out += to_string(op);
  if (!subject.empty()) {
    out += ' ';
    out += subject;
  }
  return out;
}

template <class T>
void post_result(asio::io_context& io, std::function<void(Result<T>)> done, Result<T> r) {
  asio::post(io, [done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
}

}  // namespace

class Call;

struct Client::State {
  State(asio::io_context& io_in, Endpoint ep, Limits l, HostPaths h)
      : io(io_in), endpoint(std::move(ep)), limits(l), host(std::move(h)) {}

  asio::io_context& io;
  Endpoint endpoint;
  Limits limits;
  HostPaths host;
  std::optional<ApiVersion> api;         // negotiated
  std::optional<EngineVersion> version;  // the last answer to GET /version
  bool negotiating = false;
  std::vector<std::weak_ptr<Call>> waiting;  // calls waiting for the negotiation
  std::vector<std::weak_ptr<Call>> calls;    // every call in flight, for cancel()
  std::uint64_t cancels = 0;                 // cancel() count: a wait_exec started before stops

  void track(std::shared_ptr<Call> const& c) {
    std::erase_if(calls, [](auto const& w) { return w.expired(); });
    calls.push_back(c);
  }
};

// One request and its answer on its own connection, bounded by one deadline that also covers
// waiting for the API version.
class Call : public std::enable_shared_from_this<Call> {
 public:
  using Build = std::function<detail::Request(ApiVersion)>;
  using Done = std::function<void(Result<Response>)>;
  using Upgraded = std::function<void(Result<std::shared_ptr<ExecStream>>)>;

  Call(std::shared_ptr<Client::State> state, Operation op, std::string subject, bool versioned,
       Build build)
      : state_(std::move(state)),
        op_(op),
        what_(describe(state_->endpoint.kind, op, subject)),
        subject_(std::move(subject)),
        versioned_(versioned),
        build_(std::move(build)),
        socket_(state_->io),
        timer_(state_->io),
        buffer_(state_->limits.header_bytes + state_->limits.read_chunk_bytes) {}

  void run(Clock::duration timeout, Done done) {
    done_ = std::move(done);
    begin(timeout);
  }

  void run_upgrade(Clock::duration timeout, bool tty, Upgraded done) {
    upgraded_ = std::move(done);
    tty_ = tty;
    begin(timeout);
  }

  // The API version is known (or could not be learnt).
  void on_api(Result<ApiVersion> const& api) {
    if (finished_) return;
    if (abort_) return finish(*abort_);
    if (!api) return finish(api.error());
    connect(*api);
  }

  void abort(Error e) {
    if (finished_) return;
    abort_ = std::move(e);
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.close(ignored);
    // A call not yet on the socket (waiting for the version) has no socket handler to end it:
    // it ends from the loop, never inside the caller's cancel().
    if (!on_socket_)
      asio::post(state_->io, [self = shared_from_this()] { self->finish(*self->abort_); });
  }

 private:
  void begin(Clock::duration timeout) {
    state_->track(shared_from_this());
    auto const ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this(), ms](boost::system::error_code ec) {
      if (ec || self->finished_) return;
      self->abort(unavailable(self->what_ + ": no answer within " + std::to_string(ms) + " ms (" +
                              self->state_->endpoint.socket + ")"));
    });
    if (!versioned_)
      return asio::post(state_->io, [self = shared_from_this()] { self->on_api(ApiVersion{}); });
    if (state_->api) {
      return asio::post(state_->io,
                        [self = shared_from_this(), v = *state_->api] { self->on_api(v); });
    }
    negotiate_for(shared_from_this(), timeout);
  }

  static void negotiate_for(std::shared_ptr<Call> const& call, Clock::duration timeout);

  void connect(ApiVersion api) {
    auto const& path = state_->endpoint.socket;
    if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return finish(unavailable(what_ + ": not a usable socket path: \"" + path + "\""));
    }
    request_ = build_(api);
    on_socket_ = true;
    socket_.async_connect(stream_protocol::endpoint{path},
                          [self = shared_from_this()](boost::system::error_code ec) {
                            if (ec) return self->io_failed(ec, "connect to");
                            self->write();
                          });
  }

  void write() {
    http::async_write(socket_, request_,
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (ec) return self->io_failed(ec, "send to");
                        self->read();
                      });
  }

  void read() {
    parser_.emplace();
    detail::configure(*parser_, state_->limits);
    if (upgraded_) {
      http::async_read_header(
          socket_, buffer_, *parser_,
          [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
            if (ec) return self->read_failed(ec);
            self->on_upgrade_header();
          });
      return;
    }
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       if (ec) return self->read_failed(ec);
                       self->finish(detail::take_response(*self->parser_, self->what_));
                     });
  }

  void on_upgrade_header() {
    unsigned const status = parser_->get().result_int();
    if (!is_success(op_, status)) {
      // A refusal: its body carries the engine's message.
      http::async_read(socket_, buffer_, *parser_,
                       [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                         if (ec) return self->read_failed(ec);
                         self->finish(detail::take_response(*self->parser_, self->what_));
                       });
      return;
    }
    // From here on the connection is the exec's stream; what was read past the header is its
    // first bytes.
    auto const data = buffer_.data();
    auto const* p = static_cast<std::uint8_t const*>(data.data());
    std::vector<std::uint8_t> early(p, p + data.size());
    finished_ = true;
    timer_.cancel();
    auto stream = std::make_shared<ExecStream>(state_->io, std::move(socket_), std::move(early),
                                               tty_, what_, state_->limits);
    auto done = std::move(upgraded_);
    done(std::move(stream));
  }

  void io_failed(boost::system::error_code ec, std::string_view step) {
    if (abort_) return finish(*abort_);
    int const err = ec.category() == boost::system::system_category() ? ec.value() : 0;
    finish(unavailable(what_ + ": cannot " + std::string{step} + " " + state_->endpoint.socket +
                           ": " + ec.message(),
                       err));
  }

  void read_failed(boost::system::error_code ec) {
    if (abort_) return finish(*abort_);
    finish(detail::read_error(ec, what_, state_->limits));
  }

  void finish(Result<Response> r) {
    if (finished_) return;
    finished_ = true;
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.close(ignored);
    if (upgraded_) {
      auto done = std::move(upgraded_);
      if (!r) return done(std::move(r).error());
      // The only responses that reach here on an upgrade call are refusals.
      return done(classify_failure(state_->endpoint.kind, op_, subject_, r->status, r->body,
                                   state_->limits.message_bytes));
    }
    auto done = std::move(done_);
    done(std::move(r));
  }

  std::shared_ptr<Client::State> state_;
  Operation op_;
  std::string what_;
  std::string subject_;
  bool versioned_;
  Build build_;
  stream_protocol::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<detail::ResponseParser> parser_;
  detail::Request request_;
  Done done_;
  Upgraded upgraded_;
  bool tty_ = false;
  bool finished_ = false;
  bool on_socket_ = false;
  std::optional<Error> abort_;
};

namespace {

// Runs an unversioned GET and hands the response to `done` (used by the negotiation).
void plain_get(std::shared_ptr<Client::State> const& st, Operation op, std::string target,
               Clock::duration timeout, Call::Done done) {
  auto call = std::make_shared<Call>(
      st, op, std::string{}, false, [target = std::move(target)](ApiVersion) {
        return detail::make_request(http::verb::get, target, {}, false);
      });
  call->run(timeout, std::move(done));
}

Result<EngineVersion> version_from(Client::State& st, Result<Response> r) {
  if (!r) return std::move(r).error();
  if (!is_success(Operation::version, r->status)) {
    return classify_failure(st.endpoint.kind, Operation::version, {}, r->status, r->body,
                            st.limits.message_bytes);
  }
  auto v = parse_version(r->body);
  if (!v) {
    auto e = std::move(v).error();
    e.context = std::string{to_string(st.endpoint.kind)} + " " + e.context;
    return e;
  }
  return v;
}

}  // namespace

void Call::negotiate_for(std::shared_ptr<Call> const& call, Clock::duration timeout) {
  auto st = call->state_;
  st->waiting.push_back(call);
  if (st->negotiating) return;
  st->negotiating = true;
  auto const deadline = Clock::now() + timeout;
  auto settle = [st](Result<ApiVersion> api) {
    st->negotiating = false;
    if (api) st->api = *api;
    auto waiting = std::move(st->waiting);
    st->waiting.clear();
    for (auto const& w : waiting) {
      if (auto c = w.lock()) c->on_api(api);
    }
  };
  // Like Docker's own clients, negotiate with the Api-Version header of _ping: one cheap answer
  // (Podman's /version runs its runtimes' --version commands, about half a second here). An
  // engine that does not send the header is asked GET /version.
  plain_get(st, Operation::ping, "/_ping", timeout, [st, deadline, settle](Result<Response> r) {
    if (!r) return settle(std::move(r).error());
    if (!is_success(Operation::ping, r->status)) {
      return settle(classify_failure(st->endpoint.kind, Operation::ping, {}, r->status, r->body,
                                     st->limits.message_bytes));
    }
    if (auto const newest = parse_api_version(r->api_version)) {
      auto api = negotiate(*newest, ApiVersion{0, 0});
      if (!api) {
        return settle(
            Error{Errc::engine_failed, std::string{to_string(st->endpoint.kind)} +
                                           ": no common API version: the engine speaks up to " +
                                           newest->str() + ", custos " + kMinApiVersion.str() +
                                           " to " + kMaxApiVersion.str()});
      }
      return settle(*api);
    }
    auto const left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      return settle(unavailable(std::string{to_string(st->endpoint.kind)} +
                                ": no API version before the deadline"));
    }
    plain_get(st, Operation::version, "/version", left, [st, settle](Result<Response> rv) {
      auto v = version_from(*st, std::move(rv));
      if (!v) return settle(std::move(v).error());
      st->version = *v;
      settle(v->negotiated);
    });
  });
}

// ---- Client -------------------------------------------------------------------------------

Client::Client(asio::io_context& io, Endpoint endpoint, Limits limits, HostPaths host)
    : state_(std::make_shared<State>(io, std::move(endpoint), limits, std::move(host))) {}

Client::~Client() {
  cancel();
}

Endpoint const& Client::endpoint() const noexcept {
  return state_->endpoint;
}

Limits const& Client::limits() const noexcept {
  return state_->limits;
}

std::optional<ApiVersion> const& Client::negotiated() const noexcept {
  return state_->api;
}

void Client::cancel() {
  ++state_->cancels;
  auto calls = std::move(state_->calls);
  state_->calls.clear();
  for (auto const& w : calls) {
    if (auto c = w.lock()) {
      c->abort(
          unavailable(std::string{to_string(state_->endpoint.kind)} + ": the call was cancelled"));
    }
  }
}

void Client::version(Timeout timeout, Handler<EngineVersion> done) {
  auto st = state_;
  plain_get(st, Operation::version, "/version", timeout,
            [st, done = std::move(done)](Result<Response> r) {
              auto v = version_from(*st, std::move(r));
              if (v) {
                st->version = *v;
                st->api = v->negotiated;
              }
              done(std::move(v));
            });
}

void Client::ping(Timeout timeout, Handler<void> done) {
  auto st = state_;
  plain_get(st, Operation::ping, "/_ping", timeout,
            [st, done = std::move(done)](Result<Response> r) {
              if (!r) return done(std::move(r).error());
              if (!is_success(Operation::ping, r->status)) {
                return done(classify_failure(st->endpoint.kind, Operation::ping, {}, r->status,
                                             r->body, st->limits.message_bytes));
              }
              done(ok());
            });
}

namespace {

// Sends a versioned request about `subject` and hands a successful response to `parse`,
// a refusal to classify_failure.
template <class T, class Parse>
void versioned_call(std::shared_ptr<Client::State> const& st, Operation op,
                    std::string const& subject, Call::Build build, Client::Timeout timeout,
                    Client::Handler<T> done, Parse parse) {
  auto call = std::make_shared<Call>(st, op, subject, true, std::move(build));
  call->run(timeout, [st, op, subject, done = std::move(done),
                      parse = std::move(parse)](Result<Response> r) mutable {
    if (!r) return done(std::move(r).error());
    if (!is_success(op, r->status)) {
      return done(classify_failure(st->endpoint.kind, op, subject, r->status, r->body,
                                   st->limits.message_bytes));
    }
    Result<T> out = parse(*r);
    if (!out) {
      auto e = std::move(out).error();
      e.context = describe(st->endpoint.kind, op, subject) + ": " + e.context;
      return done(std::move(e));
    }
    done(std::move(out));
  });
}

Error bad_container_ref(EngineKind kind, std::string_view ref) {
  return Error{Errc::engine_container_not_found, std::string{to_string(kind)} + ": \"" +
                                                     std::string{ref.substr(0, 300)} +
                                                     "\" is not a container name or id"};
}

Error bad_exec_id(EngineKind kind, std::string_view id) {
  return Error{Errc::engine_failed, std::string{to_string(kind)} + ": \"" +
                                        std::string{id.substr(0, 300)} + "\" is not an exec id"};
}

}  // namespace

void Client::inspect_container(std::string const& ref, Timeout timeout,
                               Handler<ContainerInfo> done) {
  auto st = state_;
  if (!core::is_valid_container_ref(ref)) {
    return post_result<ContainerInfo>(st->io, std::move(done),
                                      bad_container_ref(st->endpoint.kind, ref));
  }
  versioned_call<ContainerInfo>(
      st, Operation::container_inspect, ref,
      [ref](ApiVersion v) {
        return detail::make_request(http::verb::get, container_inspect_target(v, ref), {}, false);
      },
      timeout, std::move(done),
      [st](Response const& r) -> Result<ContainerInfo> {
        ContainerInfo info;
        info.inspect = CUSTOS_TRY(parse_container_inspect(r.body));
        if (info.inspect.running && info.inspect.pid > 0) {
          auto proc = read_container_process(info.inspect.pid, info.inspect.id, st->host);
          if (proc) {
            info.init = std::move(*proc);
          } else {
            info.init_error = std::move(proc).error();
          }
        }
        return info;
      });
}

void Client::create_exec(std::string const& ref, ExecConfig config, Timeout timeout,
                         Handler<std::string> done) {
  auto st = state_;
  if (!core::is_valid_container_ref(ref)) {
    return post_result<std::string>(st->io, std::move(done),
                                    bad_container_ref(st->endpoint.kind, ref));
  }
  if (config.cmd.empty()) {
    return post_result<std::string>(
        st->io, std::move(done),
        Error{Errc::engine_failed,
              std::string{to_string(st->endpoint.kind)} + ": exec create with an empty Cmd"});
  }
  versioned_call<std::string>(
      st, Operation::exec_create, ref,
      [ref, config = std::move(config)](ApiVersion v) {
        return detail::make_request(http::verb::post, exec_create_target(v, ref),
                                    exec_create_body(config, v), false);
      },
      timeout, std::move(done), [](Response const& r) { return parse_exec_create(r.body); });
}

void Client::start_exec(std::string const& id, bool tty, Timeout timeout,
                        Handler<std::shared_ptr<ExecStream>> done) {
  auto st = state_;
  if (!is_valid_exec_id(id)) {
    return post_result<std::shared_ptr<ExecStream>>(st->io, std::move(done),
                                                    bad_exec_id(st->endpoint.kind, id));
  }
  auto call = std::make_shared<Call>(st, Operation::exec_start, id, true, [id, tty](ApiVersion v) {
    return detail::make_request(http::verb::post, exec_start_target(v, id), exec_start_body(tty),
                                true);
  });
  call->run_upgrade(timeout, tty, std::move(done));
}

namespace {

void inspect_exec_on(std::shared_ptr<Client::State> const& st, std::string const& id,
                     Client::Timeout timeout, Client::Handler<ExecInspect> done) {
  if (!is_valid_exec_id(id)) {
    return post_result<ExecInspect>(st->io, std::move(done), bad_exec_id(st->endpoint.kind, id));
  }
  versioned_call<ExecInspect>(
      st, Operation::exec_inspect, id,
      [id](ApiVersion v) {
        return detail::make_request(http::verb::get, exec_inspect_target(v, id), {}, false);
      },
      timeout, std::move(done), [](Response const& r) { return parse_exec_inspect(r.body); });
}

// wait_exec: inspect; while the exec still runs, sleep and inspect again, until the deadline.
struct ExecWait : std::enable_shared_from_this<ExecWait> {
  ExecWait(std::shared_ptr<Client::State> s, std::string i, Clock::time_point d,
           Client::Handler<ExecInspect> h, Client::Timeout first)
      : st(std::move(s)),
        id(std::move(i)),
        deadline(d),
        done(std::move(h)),
        interval(std::max(first, Client::Timeout{1})),
        max_interval(interval * 8),
        timer(st->io),
        cancels(st->cancels) {}

  void step() {
    if (st->cancels != cancels) {
      return done(unavailable(describe(st->endpoint.kind, Operation::exec_inspect, id) +
                              ": the wait was cancelled"));
    }
    auto const left = std::chrono::duration_cast<Client::Timeout>(deadline - Clock::now());
    if (left <= Client::Timeout{0}) return expired();
    inspect_exec_on(st, id, left, [self = shared_from_this()](Result<ExecInspect> r) {
      if (!r || !r->running) return self->done(std::move(r));
      if (Clock::now() + self->interval >= self->deadline) return self->expired();
      self->timer.expires_after(self->interval);
      self->interval = std::min(self->interval * 2, self->max_interval);
      self->timer.async_wait([self](boost::system::error_code) { self->step(); });
    });
  }

  void expired() {
    done(unavailable(describe(st->endpoint.kind, Operation::exec_inspect, id) +
                     ": the exec still runs at the deadline"));
  }

  std::shared_ptr<Client::State> st;
  std::string id;
  Clock::time_point deadline;
  Client::Handler<ExecInspect> done;
  Client::Timeout interval;
  Client::Timeout max_interval;
  asio::steady_timer timer;
  std::uint64_t cancels;
};

}  // namespace

void Client::inspect_exec(std::string const& id, Timeout timeout, Handler<ExecInspect> done) {
  inspect_exec_on(state_, id, timeout, std::move(done));
}

void Client::wait_exec(std::string id, Timeout timeout, Handler<ExecInspect> done,
                       Timeout interval) {
  auto w = std::make_shared<ExecWait>(state_, std::move(id), Clock::now() + timeout,
                                      std::move(done), interval);
  w->step();
}

void Client::resize_exec(std::string const& id, std::uint16_t rows, std::uint16_t cols,
                         Timeout timeout, Handler<void> done) {
  auto st = state_;
  if (!is_valid_exec_id(id)) {
    return post_result<void>(st->io, std::move(done), bad_exec_id(st->endpoint.kind, id));
  }
  versioned_call<void>(
      st, Operation::exec_resize, id,
      [id, rows, cols](ApiVersion v) {
        return detail::make_request(http::verb::post, exec_resize_target(v, id, rows, cols), {},
                                    false);
      },
      timeout, std::move(done), [](Response const&) { return ok(); });
}

Result<std::shared_ptr<ExecStream>> Client::resume_stream(std::string const& id,
                                                          sys::UniqueFd connection,
                                                          ExecStreamState state) {
  auto const& st = *state_;
  if (!is_valid_exec_id(id)) return bad_exec_id(st.endpoint.kind, id);
  std::string what = describe(st.endpoint.kind, Operation::exec_start, id);
  auto demux = CUSTOS_TRY(FrameDemuxer::resume(st.limits.frame_bytes, state.position));
  asio::local::stream_protocol::socket socket{st.io};
  boost::system::error_code ec;
  socket.assign(asio::local::stream_protocol{}, connection.get(), ec);
  if (ec) {
    return Error{Errc::engine_unavailable,
                 what + ": the connection cannot be taken over: " + ec.message()};
  }
  (void)connection.release();  // the socket owns it now
  auto stream = std::make_shared<ExecStream>(st.io, std::move(socket), std::move(state.unread),
                                             state.tty, std::move(what), st.limits);
  stream->demux_ = demux;
  stream->system_message_ = std::move(state.engine_message);
  stream->input_closed_ = state.input_closed;
  stream->bytes_read_ = state.bytes_read;
  return stream;
}

}  // namespace custos::engine
