// The multiplexed stream of a non-TTY exec (Docker's stdcopy format, which Podman's
// compatible API writes too).
#include <algorithm>
#include <cstring>

#include "custos/engine/wire.hpp"

namespace custos::engine {

Result<std::optional<FramePiece>> FrameDemuxer::next(std::span<std::uint8_t const>& in) {
  if (failed_) return *failed_;
  while (!in.empty()) {
    if (remaining_ > 0) {
      auto const n = std::min(remaining_, in.size());
      FramePiece piece{stream_, in.first(n)};
      in = in.subspan(n);
      remaining_ -= n;
      return std::optional<FramePiece>{piece};
    }
    auto const take = std::min(sizeof header_ - header_fill_, in.size());
    std::memcpy(header_ + header_fill_, in.data(), take);
    header_fill_ += take;
    in = in.subspan(take);
    if (header_fill_ < sizeof header_) break;
    header_fill_ = 0;
    std::uint8_t const kind = header_[0];
    if (kind > static_cast<std::uint8_t>(StdStream::system)) {
      failed_ = Error{Errc::engine_failed, "exec stream: frame " + std::to_string(frames_) +
                                               " names stream " + std::to_string(kind) +
                                               " (not a multiplexed stream)"};
      return *failed_;
    }
    if (header_[1] != 0 || header_[2] != 0 || header_[3] != 0) {
      failed_ = Error{Errc::engine_failed, "exec stream: frame " + std::to_string(frames_) +
                                               " has non-zero header padding"};
      return *failed_;
    }
    std::size_t const size = (std::size_t{header_[4]} << 24U) | (std::size_t{header_[5]} << 16U) |
                             (std::size_t{header_[6]} << 8U) | std::size_t{header_[7]};
    if (size > max_frame_) {
      failed_ =
          Error{Errc::engine_failed, "exec stream: frame " + std::to_string(frames_) + " of " +
                                         std::to_string(size) + " bytes exceeds the limit of " +
                                         std::to_string(max_frame_)};
      return *failed_;
    }
    stream_ = static_cast<StdStream>(kind);
    remaining_ = size;
    ++frames_;
  }
  return std::optional<FramePiece>{};
}

FrameDemuxer::Position FrameDemuxer::position() const {
  return Position{std::vector<std::uint8_t>(header_, header_ + header_fill_), remaining_, stream_,
                  frames_};
}

Result<FrameDemuxer> FrameDemuxer::resume(std::size_t max_frame_bytes, Position const& p) {
  auto bad = [](std::string why) {
    return Error{Errc::engine_failed, "exec stream position: " + std::move(why)};
  };
  if (p.header.size() >= sizeof header_) return bad("a header of 8 or more bytes");
  if (!p.header.empty() && p.remaining > 0) return bad("a header and a payload both pending");
  if (p.remaining > max_frame_bytes) return bad("a frame over the limit");
  if (p.stream > StdStream::system) return bad("an unknown stream");
  if (p.remaining > 0 && p.frames == 0) return bad("a payload before any frame");
  FrameDemuxer d{max_frame_bytes};
  std::copy(p.header.begin(), p.header.end(), d.header_);
  d.header_fill_ = p.header.size();
  d.remaining_ = p.remaining;
  d.stream_ = p.stream;
  d.frames_ = p.frames;
  return d;
}

std::vector<std::uint8_t> encode_frame(StdStream stream, std::span<std::uint8_t const> payload) {
  std::vector<std::uint8_t> out(8 + payload.size());
  auto const n = static_cast<std::uint32_t>(payload.size());
  out[0] = static_cast<std::uint8_t>(stream);
  out[4] = static_cast<std::uint8_t>(n >> 24U);
  out[5] = static_cast<std::uint8_t>(n >> 16U);
  out[6] = static_cast<std::uint8_t>(n >> 8U);
  out[7] = static_cast<std::uint8_t>(n);
  std::copy(payload.begin(), payload.end(), out.begin() + 8);
  return out;
}

}  // namespace custos::engine
