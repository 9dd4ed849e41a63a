// The multiplexed-stream demuxer: exact payloads, any split of the input, and every malformed
// header refused.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "custos/engine/wire.hpp"

namespace custos::engine {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes bytes(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

Bytes concat(std::vector<Bytes> const& parts) {
  Bytes out;
  for (auto const& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct Demuxed {
  std::string out;
  std::string err;
  std::vector<std::pair<StdStream, std::string>> pieces;
  std::optional<Error> error;
  bool at_boundary = false;
};

// Feeds `input` in chunks of `chunk` bytes (0: all at once).
Demuxed demux(Bytes const& input, std::size_t chunk, std::size_t max_frame = 1 << 20) {
  FrameDemuxer d{max_frame};
  Demuxed r;
  std::size_t pos = 0;
  while (pos < input.size() && !r.error) {
    auto const n = chunk == 0 ? input.size() : std::min(chunk, input.size() - pos);
    std::span<std::uint8_t const> in{input.data() + pos, n};
    pos += n;
    while (true) {
      auto p = d.next(in);
      if (!p) {
        r.error = p.error();
        break;
      }
      if (!*p) break;
      std::string s((*p)->bytes.begin(), (*p)->bytes.end());
      (*p)->stream == StdStream::err ? r.err += s : r.out += s;
      r.pieces.emplace_back((*p)->stream, s);
    }
    EXPECT_TRUE(r.error || in.empty());
  }
  r.at_boundary = d.at_boundary();
  return r;
}

TEST(FrameDemuxer, ExactPayloadsInOrder) {
  auto const input =
      concat({encode_frame(StdStream::out, bytes("out\n")),
              encode_frame(StdStream::err, bytes("err\n")), encode_frame(StdStream::out, bytes("")),
              encode_frame(StdStream::out, bytes(std::string("\0\1\2", 3)))});
  auto const r = demux(input, 0);
  ASSERT_FALSE(r.error);
  EXPECT_EQ(r.out, std::string("out\n\0\1\2", 7));
  EXPECT_EQ(r.err, "err\n");
  EXPECT_TRUE(r.at_boundary);
  ASSERT_EQ(r.pieces.size(), 3U);  // an empty frame hands out nothing
  EXPECT_EQ(r.pieces[1], (std::pair<StdStream, std::string>{StdStream::err, "err\n"}));
}

TEST(FrameDemuxer, TheCapturedDockerAnswer) {
  // The stream Docker and Podman sent for `echo out; echo err >&2` (see docs/engines.md).
  std::string const wire(
      "\x01\x00\x00\x00\x00\x00\x00\x04out\n\x02\x00\x00\x00\x00\x00\x00\x04"
      "err\n",
      24);
  auto const r = demux(bytes(wire), 0);
  ASSERT_FALSE(r.error);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
}

TEST(FrameDemuxer, EverySplitGivesTheSameBytes) {
  auto const input = concat({encode_frame(StdStream::out, bytes("hello ")),
                             encode_frame(StdStream::err, bytes("warning")),
                             encode_frame(StdStream::out, bytes("world"))});
  for (std::size_t chunk = 1; chunk <= input.size(); ++chunk) {
    auto const r = demux(input, chunk);
    ASSERT_FALSE(r.error) << chunk;
    EXPECT_EQ(r.out, "hello world") << chunk;
    EXPECT_EQ(r.err, "warning") << chunk;
    EXPECT_TRUE(r.at_boundary) << chunk;
  }
}

TEST(FrameDemuxer, PartialFramesAreNotABoundary) {
  auto const frame = encode_frame(StdStream::out, bytes("abcdef"));
  for (std::size_t cut = 1; cut < frame.size(); ++cut) {
    auto const r = demux(Bytes(frame.begin(), frame.begin() + static_cast<long>(cut)), 0);
    ASSERT_FALSE(r.error);
    EXPECT_FALSE(r.at_boundary) << cut;
  }
}

TEST(FrameDemuxer, RefusesMalformedHeaders) {
  // Unframed text (what a TTY stream or a confused engine would send).
  auto const text = demux(bytes("hello world, not framed"), 0);
  ASSERT_TRUE(text.error);
  EXPECT_EQ(text.error->code, Errc::engine_failed);
  EXPECT_NE(text.error->context.find("names stream 104"), std::string::npos);
  // Non-zero padding.
  auto const pad = demux(Bytes{1, 0, 1, 0, 0, 0, 0, 1, 'x'}, 0);
  ASSERT_TRUE(pad.error);
  EXPECT_NE(pad.error->context.find("padding"), std::string::npos);
  // A frame above the limit is refused at its header, before any payload is taken.
  auto const big = demux(encode_frame(StdStream::out, Bytes(100, 'x')), 0, 99);
  ASSERT_TRUE(big.error);
  EXPECT_NE(big.error->context.find("100 bytes exceeds the limit of 99"), std::string::npos);
  EXPECT_TRUE(big.pieces.empty());
  // The header's size is big-endian and may use all 32 bits.
  auto const huge = demux(Bytes{1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF}, 0);
  ASSERT_TRUE(huge.error);
  EXPECT_NE(huge.error->context.find("4294967295"), std::string::npos);
}

TEST(FrameDemuxer, StaysFailed) {
  FrameDemuxer d{16};
  Bytes bad{9, 0, 0, 0, 0, 0, 0, 0};
  std::span<std::uint8_t const> in{bad};
  ASSERT_FALSE(d.next(in));
  auto good = encode_frame(StdStream::out, bytes("x"));
  std::span<std::uint8_t const> in2{good};
  EXPECT_FALSE(d.next(in2));
}

TEST(FrameDemuxer, SystemFramesAreHandedOut) {
  auto const r = demux(encode_frame(StdStream::system, bytes("boom")), 0);
  ASSERT_FALSE(r.error);
  ASSERT_EQ(r.pieces.size(), 1U);
  EXPECT_EQ(r.pieces[0].first, StdStream::system);
  EXPECT_EQ(r.pieces[0].second, "boom");
}

// A handover cuts the stream anywhere: a demuxer resumed from the first one's position, fed the
// rest, gives exactly what one demuxer fed everything gives.
TEST(FrameDemuxer, APositionTakenAtAnyCutGoesOnExactly) {
  auto const input = concat({encode_frame(StdStream::out, bytes("hello ")),
                             encode_frame(StdStream::err, bytes("warning")),
                             encode_frame(StdStream::out, bytes("")),
                             encode_frame(StdStream::out, bytes("world"))});
  auto drain = [](FrameDemuxer& d, std::span<std::uint8_t const> in, std::string& out,
                  std::string& err) {
    while (true) {
      auto p = d.next(in);
      ASSERT_TRUE(p);
      if (!*p) break;
      ((*p)->stream == StdStream::err ? err : out).append((*p)->bytes.begin(), (*p)->bytes.end());
    }
  };
  for (std::size_t cut = 0; cut <= input.size(); ++cut) {
    std::string out;
    std::string err;
    FrameDemuxer first{1 << 20};
    drain(first, std::span<std::uint8_t const>{input.data(), cut}, out, err);
    auto second = FrameDemuxer::resume(1 << 20, first.position());
    ASSERT_TRUE(second) << cut << ": " << second.error().message();
    drain(*second, std::span<std::uint8_t const>{input.data() + cut, input.size() - cut}, out, err);
    EXPECT_EQ(out, "hello world") << cut;
    EXPECT_EQ(err, "warning") << cut;
    EXPECT_TRUE(second->at_boundary()) << cut;
    EXPECT_EQ(second->frames(), 4U) << cut;
  }
}

TEST(FrameDemuxer, ResumeRefusesPositionsNoDemuxerCanBeAt) {
  using P = FrameDemuxer::Position;
  P const cases[] = {
      P{Bytes(8, 0), 0, StdStream::out, 1},    // a whole header pending
      P{Bytes{1, 0}, 5, StdStream::out, 1},    // a header and a payload
      P{{}, 17, StdStream::out, 1},            // over the limit of 16
      P{{}, 3, static_cast<StdStream>(4), 1},  // no such stream
      P{{}, 3, StdStream::out, 0},             // a payload before any frame
  };
  for (auto const& p : cases) {
    auto r = FrameDemuxer::resume(16, p);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::engine_failed);
  }
  EXPECT_TRUE(FrameDemuxer::resume(16, P{Bytes{1, 0, 0}, 0, StdStream::err, 2}));
  EXPECT_TRUE(FrameDemuxer::resume(16, P{{}, 16, StdStream::err, 2}));
}

// Any sequence of frames, fed in any chunking, gives back exactly the payloads per stream.
RC_GTEST_PROP(FrameDemuxer, RoundTripsUnderAnyChunking, ()) {
  auto const frames = *rc::gen::container<std::vector<std::pair<bool, std::string>>>(
      rc::gen::pair(rc::gen::arbitrary<bool>(), rc::gen::arbitrary<std::string>()));
  auto const chunk = *rc::gen::inRange<std::size_t>(0, 40);
  std::vector<Bytes> encoded;
  std::string want_out;
  std::string want_err;
  for (auto const& [is_err, payload] : frames) {
    encoded.push_back(encode_frame(is_err ? StdStream::err : StdStream::out, bytes(payload)));
    (is_err ? want_err : want_out) += payload;
  }
  auto const r = demux(concat(encoded), chunk);
  RC_ASSERT(!r.error);
  RC_ASSERT(r.out == want_out);
  RC_ASSERT(r.err == want_err);
  RC_ASSERT(r.at_boundary);
}

}  // namespace
}  // namespace custos::engine
