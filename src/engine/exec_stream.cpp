// The hijacked connection of a started exec.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#pragma GCC diagnostic pop

#include <algorithm>

#include "custos/engine/client.hpp"

namespace custos::engine {

namespace asio = boost::asio;

ExecStream::ExecStream(asio::io_context& io, asio::local::stream_protocol::socket socket,
                       std::vector<std::uint8_t> early, bool tty, std::string what,
                       Limits const& limits)
    : io_(io),
      socket_(std::move(socket)),
      early_(std::move(early)),
      tty_(tty),
      what_(std::move(what)),
      limits_(limits),
      demux_(limits.frame_bytes),
      chunk_(std::max<std::size_t>(limits.read_chunk_bytes, 1)) {
  boost::system::error_code ignored;
  // Writes of stdin never block the loop: a full socket buffer is would_block.
  socket_.non_blocking(true, ignored);
}

ExecStream::~ExecStream() = default;

void ExecStream::start(OutputFn on_output, EndFn on_end) {
  if (started_) return;
  started_ = true;
  on_output_ = std::move(on_output);
  on_end_ = std::move(on_end);
  // Never call back from inside start(): the early bytes go out from the loop.
  asio::post(io_, [self = shared_from_this()] {
    if (self->closed_) return self->finish(StreamEnd{StreamEnd::Kind::closed, std::nullopt});
    auto early = std::move(self->early_);
    self->early_.clear();
    std::span<std::uint8_t const> rest{early};
    while (!rest.empty() && !self->ended_ && !self->closed_) {
      auto const n = std::min(rest.size(), self->chunk_.size());
      self->deliver(rest.first(n));
      rest = rest.subspan(n);
    }
    if (self->closed_) return self->finish(StreamEnd{StreamEnd::Kind::closed, std::nullopt});
    self->read_more();
  });
}

void ExecStream::read_more() {
  if (ended_ || closed_ || reading_) return;
  reading_ = true;
  // A wait, then the read here: no bytes are ever taken off the connection by an operation still
  // pending, so release() at any point between handlers loses none.
  socket_.async_wait(
      asio::socket_base::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
        self->reading_ = false;
        if (self->closed_) {
          return self->finish(StreamEnd{StreamEnd::Kind::closed, std::nullopt});
        }
        if (ec) {
          int const err = ec.category() == boost::system::system_category() ? ec.value() : 0;
          return self->finish(
              StreamEnd{StreamEnd::Kind::failed,
                        Error{Errc::engine_unavailable,
                              self->what_ + ": the stream broke: " + ec.message(), err}});
        }
        self->on_readable();
      });
}

void ExecStream::on_readable() {
  // A few reads per wake-up while data keeps coming (a fast writer costs one wait per ~1 MiB,
  // not per chunk), then back to the loop so other work gets its turn.
  constexpr int kReadsPerWake = 16;
  for (int i = 0; i < kReadsPerWake; ++i) {
    boost::system::error_code ec;
    std::size_t const n = socket_.read_some(asio::buffer(chunk_), ec);
    if (n > 0) deliver(std::span<std::uint8_t const>{chunk_.data(), n});
    if (ended_) return;
    if (closed_) return finish(StreamEnd{StreamEnd::Kind::closed, std::nullopt});
    if (ec == asio::error::would_block || ec == asio::error::try_again) break;
    if (ec == asio::error::eof) {
      if (!tty_ && !demux_.at_boundary()) {
        return finish(
            StreamEnd{StreamEnd::Kind::failed,
                      Error{Errc::engine_failed, what_ + ": the stream ended inside a frame"}});
      }
      if (!system_message_.empty()) {
        return finish(
            StreamEnd{StreamEnd::Kind::failed,
                      Error{Errc::engine_failed,
                            what_ + ": the engine reported in the stream: " + system_message_}});
      }
      return finish(StreamEnd{StreamEnd::Kind::eof, std::nullopt});
    }
    if (ec) {
      int const err = ec.category() == boost::system::system_category() ? ec.value() : 0;
      return finish(StreamEnd{
          StreamEnd::Kind::failed,
          Error{Errc::engine_unavailable, what_ + ": the stream broke: " + ec.message(), err}});
    }
  }
  read_more();
}

void ExecStream::deliver(std::span<std::uint8_t const> bytes) {
  bytes_read_ += bytes.size();
  if (tty_) {
    if (on_output_) on_output_(StdStream::out, bytes);
    return;
  }
  while (!ended_ && !closed_) {
    auto piece = demux_.next(bytes);
    if (!piece) {
      return finish(StreamEnd{StreamEnd::Kind::failed,
                              Error{Errc::engine_failed, what_ + ": " + piece.error().context}});
    }
    if (!*piece) return;
    auto const& p = **piece;
    if (p.stream == StdStream::system) {
      // The engine's own error, in the stream: kept (bounded) for the end of the stream.
      auto const room =
          limits_.message_bytes - std::min(limits_.message_bytes, system_message_.size());
      auto const take = std::min(room, p.bytes.size());
      for (std::size_t i = 0; i < take; ++i) {
        auto const c = static_cast<char>(p.bytes[i]);
        system_message_.push_back(p.bytes[i] < 0x20 ? ' ' : c);
      }
      continue;
    }
    // Docker's stdcopy writes stream 0 to stdout; no engine sends it for an exec.
    auto const which = p.stream == StdStream::err ? StdStream::err : StdStream::out;
    if (on_output_) on_output_(which, p.bytes);
  }
}

void ExecStream::finish(StreamEnd end) {
  if (ended_ || !started_) return;
  ended_ = true;
  auto done = std::move(on_end_);
  on_end_ = nullptr;
  on_output_ = nullptr;
  if (done) done(std::move(end));
}

WriteResult ExecStream::try_write(std::span<std::uint8_t const> bytes) {
  WriteResult out;
  if (closed_ || input_closed_) {
    out.closed = true;
    return out;
  }
  if (bytes.empty()) return out;
  boost::system::error_code ec;
  auto const n = socket_.write_some(asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    out.would_block = true;
    return out;
  }
  if (ec) {
    // EPIPE, ECONNRESET: the engine no longer takes input for this exec.
    input_closed_ = true;
    out.closed = true;
    return out;
  }
  out.written = n;
  return out;
}

void ExecStream::await_writable(std::function<void(Result<>)> done) {
  if (closed_ || input_closed_) {
    asio::post(io_, [done = std::move(done), what = what_] {
      done(Error{Errc::engine_unavailable, what + ": the stream's input is closed"});
    });
    return;
  }
  socket_.async_wait(asio::socket_base::wait_write, [self = shared_from_this(),
                                                     done = std::move(done)](
                                                        boost::system::error_code ec) {
    if (ec || self->closed_ || self->input_closed_) {
      return done(Error{Errc::engine_unavailable, self->what_ + ": the stream's input is closed"});
    }
    done(ok());
  });
}

Result<> ExecStream::close_input() {
  if (input_closed_) return ok();
  if (closed_) return Error{Errc::engine_unavailable, what_ + ": the stream is closed"};
  input_closed_ = true;
  boost::system::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_send, ec);
  if (ec && ec != asio::error::not_connected) {
    int const err = ec.category() == boost::system::system_category() ? ec.value() : 0;
    return Error{Errc::engine_unavailable, what_ + ": cannot close the input: " + ec.message(),
                 err};
  }
  return ok();
}

Result<ExecStream::Released> ExecStream::release() {
  if (ended_ || closed_) return Error{Errc::engine_unavailable, what_ + ": the stream is closed"};
  Released out;
  out.state.tty = tty_;
  if (!tty_) {
    // A failed demuxer (a malformed frame) ended the stream already; this is its position.
    out.state.position = demux_.position();
  }
  // Not delivered yet: the bytes that came with the response header, when start() has not sent
  // them out (a post of it may be pending: it finds the stream closed).
  out.state.unread = std::move(early_);
  early_.clear();
  out.state.engine_message = system_message_;
  out.state.input_closed = input_closed_;
  out.state.bytes_read = bytes_read_;
  closed_ = true;
  boost::system::error_code ec;
  int const fd = socket_.release(ec);  // ends a pending wait (operation_aborted), keeps it open
  bool const failed = ec || fd < 0;
  if (failed) socket_.close(ec);
  // A wait in flight ends the stream (operation_aborted finds it closed); without one, the end
  // is posted here, as by close().
  if (started_ && !ended_ && !reading_) {
    asio::post(io_, [self = shared_from_this()] {
      self->finish(StreamEnd{StreamEnd::Kind::closed, std::nullopt});
    });
  }
  if (failed) return Error{Errc::engine_unavailable, what_ + ": the connection cannot be released"};
  out.connection = sys::UniqueFd{fd};
  return out;
}

void ExecStream::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.cancel(ignored);
  socket_.close(ignored);
  // A read in flight completes (operation_aborted) and ends the stream; without one, the end
  // is posted here. Either way never from inside close().
  if (started_ && !ended_ && !reading_) {
    asio::post(io_, [self = shared_from_this()] {
      self->finish(StreamEnd{StreamEnd::Kind::closed, std::nullopt});
    });
  }
}

}  // namespace custos::engine
