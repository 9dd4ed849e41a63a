// Fuzz target: arbitrary bytes as the multiplexed stream of an exec. The first byte chooses a
// chunk size; the rest is fed to one demuxer whole and to another in chunks of that size. Both
// must hand out the same bytes per stream and reach the same verdict (the demuxer does not
// depend on how the socket split the stream), every piece must belong to a frame no larger
// than the limit, and re-encoding what was handed out frame by frame must give the input back
// when it was accepted whole.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "custos/engine/wire.hpp"

namespace {

using namespace custos::engine;

void require(bool ok) {
  if (!ok) std::abort();
}

struct Out {
  std::string streams[4];
  bool failed = false;
  bool boundary = false;
  std::vector<std::uint8_t> reencoded;  // frame by frame, from whole-input pieces
};

constexpr std::size_t kMaxFrame = 1024;

Out run(std::span<std::uint8_t const> input, std::size_t chunk) {
  FrameDemuxer d{kMaxFrame};
  Out o;
  std::size_t pos = 0;
  while (pos < input.size() && !o.failed) {
    auto const n = chunk == 0 ? input.size() : std::min(chunk, input.size() - pos);
    std::span<std::uint8_t const> in = input.subspan(pos, n);
    pos += n;
    while (true) {
      auto p = d.next(in);
      if (!p) {
        o.failed = true;
        break;
      }
      if (!*p) break;
      auto const& piece = **p;
      require(piece.bytes.size() <= kMaxFrame);
      require(static_cast<std::uint8_t>(piece.stream) <= 3);
      o.streams[static_cast<std::size_t>(piece.stream)].append(piece.bytes.begin(),
                                                               piece.bytes.end());
      if (chunk == 0) {
        // With the whole input at once, a piece is a whole frame.
        auto f = encode_frame(piece.stream, piece.bytes);
        o.reencoded.insert(o.reencoded.end(), f.begin(), f.end());
      }
    }
  }
  o.boundary = d.at_boundary();
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  if (size == 0) return 0;
  std::size_t const chunk = data[0] % 17 + 1;
  std::span<std::uint8_t const> const input{data + 1, size - 1};
  auto const whole = run(input, 0);
  auto const parts = run(input, chunk);
  require(whole.failed == parts.failed);
  if (!whole.failed) {
    for (int s = 0; s < 4; ++s) require(whole.streams[s] == parts.streams[s]);
    require(whole.boundary == parts.boundary);
    if (whole.boundary) {
      // Zero-length frames hand out nothing, so compare without them.
      std::vector<std::uint8_t> stripped;
      std::span<std::uint8_t const> rest = input;
      while (!rest.empty()) {
        std::size_t const n = (std::size_t{rest[4]} << 24U) | (std::size_t{rest[5]} << 16U) |
                              (std::size_t{rest[6]} << 8U) | std::size_t{rest[7]};
        if (n > 0) stripped.insert(stripped.end(), rest.begin(), rest.begin() + 8 + n);
        rest = rest.subspan(8 + n);
      }
      require(stripped == whole.reencoded);
    }
  }
  return 0;
}
