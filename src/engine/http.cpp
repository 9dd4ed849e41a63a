// HTTP/1.1 framing of engine answers, with Beast's parser and the client's limits.
#include "http.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>
#pragma GCC diagnostic pop

namespace custos::engine {
namespace detail {

void configure(ResponseParser& parser, Limits const& limits) {
  parser.header_limit(
      static_cast<std::uint32_t>(std::min<std::size_t>(limits.header_bytes, 0xFFFFFFFFU)));
  parser.body_limit(static_cast<std::uint64_t>(limits.body_bytes));
}

Result<Response> take_response(ResponseParser& parser, std::string_view what) {
  auto& msg = parser.get();
  if (msg.result_int() < 100) {
    return Error{Errc::engine_failed, std::string{what} + ": malformed HTTP response (status " +
                                          std::to_string(msg.result_int()) + ")"};
  }
  Response out;
  out.status = msg.result_int();
  out.reason = std::string{msg.reason()};
  out.content_type = std::string{msg[http::field::content_type]};
  out.api_version = std::string{msg["Api-Version"]};
  out.libpod = msg.find("Libpod-Api-Version") != msg.end();
  out.body = std::move(msg.body());
  return out;
}

Error read_error(boost::system::error_code const& ec, std::string_view what, Limits const& limits) {
  std::string ctx{what};
  if (ec == http::error::end_of_stream) {
    return Error{Errc::engine_unavailable, ctx +
                                               ": the engine closed the connection without "
                                               "answering"};
  }
  if (ec == http::error::partial_message) {
    return Error{Errc::engine_failed, ctx + ": the answer ended before it was complete"};
  }
  if (ec == http::error::header_limit) {
    return Error{Errc::engine_failed, ctx + ": the response header exceeds " +
                                          std::to_string(limits.header_bytes) + " bytes"};
  }
  if (ec == http::error::body_limit) {
    return Error{Errc::engine_failed, ctx + ": the response body exceeds " +
                                          std::to_string(limits.body_bytes) + " bytes"};
  }
  if (ec == http::error::buffer_overflow) {
    return Error{Errc::engine_failed, ctx + ": the response does not fit the read buffer"};
  }
  if (ec.category() == http::make_error_code(http::error::bad_version).category()) {
    return Error{Errc::engine_failed, ctx + ": malformed HTTP response (" + ec.message() + ")"};
  }
  // A broken connection (reset, refused, ...): the engine is not there to answer.
  int const err = ec.category() == boost::system::system_category() ? ec.value() : 0;
  return Error{Errc::engine_unavailable, ctx + ": " + ec.message(), err};
}

Request make_request(http::verb verb, std::string_view target, std::string body, bool upgrade) {
  Request req{verb, target, 11};
  // Engines ignore the host of a Unix-socket request, but HTTP/1.1 requires the field.
  req.set(http::field::host, "localhost");
  req.set(http::field::user_agent, "custos");
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::move(body);
  }
  if (upgrade) {
    req.set(http::field::connection, "Upgrade");
    req.set(http::field::upgrade, "tcp");
  } else {
    req.keep_alive(false);
  }
  req.prepare_payload();
  return req;
}

}  // namespace detail

Result<Response> parse_response(std::string_view bytes, Limits const& limits) {
  detail::ResponseParser parser;
  detail::configure(parser, limits);
  parser.eager(true);
  boost::system::error_code ec;
  std::string_view rest = bytes;
  while (!rest.empty() && !parser.is_done()) {
    auto const n = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    rest.remove_prefix(n);
    if (ec == detail::http::error::need_more) {
      // Everything the engine sent is here: what is missing will never come.
      ec = {};
      break;
    }
    if (ec) return detail::read_error(ec, "response", limits);
    if (n == 0) break;
  }
  if (!parser.is_done()) {
    if (bytes.empty())
      return detail::read_error(detail::http::error::end_of_stream, "response", limits);
    parser.put_eof(ec);
    if (ec) return detail::read_error(ec, "response", limits);
  }
  if (!parser.is_done()) {
    return detail::read_error(detail::http::error::partial_message, "response", limits);
  }
  return detail::take_response(parser, "response");
}

}  // namespace custos::engine
