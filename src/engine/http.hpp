// Private to the engine layer: the Beast parser and request settings both the client and
// parse_response use, and the mapping of read errors to engine.* errors.
#pragma once

// GCC 12 at -O2 reports a "potential null pointer dereference" inside Asio's executor
// comparison, which -Werror turns into a failed release build (see supervisor/manager.hpp); the
// finding is in Boost's code and is silenced for those headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#pragma GCC diagnostic pop

#include <string>
#include <string_view>

#include "custos/engine/wire.hpp"

namespace custos::engine::detail {

namespace http = boost::beast::http;

using ResponseParser = http::response_parser<http::string_body>;
using Request = http::request<http::string_body>;

// Applies the header and body limits (and nothing else: the parser stays strict HTTP/1.x).
void configure(ResponseParser& parser, Limits const& limits);

// The parts of a parsed response the client uses; moves the body out of the parser.
// Errors: engine.failed for a status below 100 (HTTP's status is three digits, but only 1xx to
// 5xx mean anything; Beast accepts "000").
[[nodiscard]] Result<Response> take_response(ResponseParser& parser, std::string_view what);

// The error for a failed read of a response: engine.unavailable when the engine closed without
// answering or the connection broke, engine.failed for anything malformed or over a limit.
// `what` says which call it was ("docker exec create in ci").
[[nodiscard]] Error read_error(boost::system::error_code const& ec, std::string_view what,
                               Limits const& limits);

// A request with Host, User-Agent and, when `body` is not empty, a JSON Content-Type and
// length. `upgrade` asks for the hijacked connection (exec start); otherwise the connection
// closes after the answer.
[[nodiscard]] Request make_request(http::verb verb, std::string_view target, std::string body,
                                   bool upgrade);

}  // namespace custos::engine::detail
