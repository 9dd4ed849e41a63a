// HTTP framing of engine answers: every captured answer parses (chunked and sized), and
// everything malformed, truncated or over a limit is a typed error.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "custos/engine/wire.hpp"

#include "captured.hpp"

namespace custos::engine {
namespace {

using testing::captured;

TEST(ParseResponse, EveryCapturedAnswerParses) {
  std::size_t n = 0;
  for (auto const& e : std::filesystem::directory_iterator(
           std::filesystem::path{CUSTOS_SOURCE_DIR} / "fuzz/corpus/fuzz_engine_response")) {
    auto const name = e.path().filename().string();
    // The captures of the real engines (the corpus also holds made-up malformed answers).
    if (name.rfind("docker-", 0) != 0 && name.rfind("podman-", 0) != 0) continue;
    SCOPED_TRACE(name);
    auto r = parse_response(captured(name), Limits{});
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_GE(r->status, 200U);
    EXPECT_EQ(r->libpod, name.rfind("podman-", 0) == 0);
    ++n;
  }
  EXPECT_GE(n, 20U);
}

TEST(ParseResponse, ChunkedAndSizedBodies) {
  auto chunked = parse_response(captured("podman-inspect-running.http"), Limits{});
  ASSERT_TRUE(chunked);
  EXPECT_EQ(chunked->status, 200U);
  EXPECT_EQ(chunked->content_type, "application/json");
  EXPECT_EQ(chunked->api_version, "1.41");
  EXPECT_TRUE(chunked->libpod);
  EXPECT_EQ(chunked->body.front(), '{');
  EXPECT_EQ(chunked->body.back(), '\n');
  auto sized = parse_response(captured("docker-ping.http"), Limits{});
  ASSERT_TRUE(sized);
  EXPECT_EQ(sized->body, "OK");
  EXPECT_FALSE(sized->libpod);
  // A body that runs until the engine closes.
  auto until_close = parse_response("HTTP/1.1 200 OK\r\n\r\nall of it", Limits{});
  ASSERT_TRUE(until_close);
  EXPECT_EQ(until_close->body, "all of it");
}

TEST(ParseResponse, NothingAtAllIsNoAnswer) {
  auto r = parse_response("", Limits{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::engine_unavailable);
}

TEST(ParseResponse, GarbageIsMalformed) {
  for (char const* bad :
       {"garbage\r\n\r\n", "HTTP/9.9 200 OK\r\n\r\n", "HTTP/1.1 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        // Three digits, but not a status (found by fuzz_engine_response).
        "HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 099 OK\r\nContent-Length: 0\r\n\r\n"}) {
    auto r = parse_response(bad, Limits{});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Errc::engine_failed) << bad;
  }
}

TEST(ParseResponse, TruncatedAnswersAreRefused) {
  auto const full = captured("docker-inspect-running.http");
  for (std::size_t cut : {std::size_t{5}, std::size_t{40}, full.size() / 2, full.size() - 1}) {
    auto r = parse_response(std::string_view{full}.substr(0, cut), Limits{});
    ASSERT_FALSE(r) << cut;
    EXPECT_EQ(r.error().code, Errc::engine_failed) << cut;
  }
  auto const chunked = captured("podman-inspect-running.http");
  auto r = parse_response(std::string_view{chunked}.substr(0, chunked.size() - 3), Limits{});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context.find("before it was complete"), std::string::npos);
}

TEST(ParseResponse, LimitsAreEnforced) {
  Limits small;
  small.header_bytes = 256;
  small.body_bytes = 64;
  std::string big_header = "HTTP/1.1 200 OK\r\n";
  for (int i = 0; i < 40; ++i) big_header += "X-Filler-" + std::to_string(i) + ": aaaaaaaa\r\n";
  big_header += "Content-Length: 2\r\n\r\nOK";
  auto h = parse_response(big_header, small);
  ASSERT_FALSE(h);
  EXPECT_EQ(h.error().code, Errc::engine_failed);
  EXPECT_NE(h.error().context.find("header exceeds 256 bytes"), std::string::npos);

  auto b =
      parse_response("HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n" + std::string(65, 'x'), small);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().context.find("body exceeds 64 bytes"), std::string::npos);
  // The limit counts the decoded body, chunked or not.
  std::string chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 10; ++i) chunked += "a\r\n0123456789\r\n";
  chunked += "0\r\n\r\n";
  auto c = parse_response(chunked, small);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().context.find("body exceeds"), std::string::npos);
  auto within =
      parse_response("HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n" + std::string(64, 'x'), small);
  EXPECT_TRUE(within);
  // A body until close is bounded too.
  auto until_close = parse_response("HTTP/1.1 200 OK\r\n\r\n" + std::string(65, 'x'), small);
  ASSERT_FALSE(until_close);
  EXPECT_NE(until_close.error().context.find("body exceeds"), std::string::npos);
}

}  // namespace
}  // namespace custos::engine
