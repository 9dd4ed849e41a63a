// Output accounting per stream: what was observed, what was kept, what was lost.
//
// Invariant, checked after every operation: observed == retained + dropped, and complete is
// false whenever dropped > 0 (truncated output is never reported complete). complete may also be
// false with nothing counted as dropped, when an unknown amount was lost (mark_incomplete).
// Counters never wrap: an operation that would overflow u64 is Errc::accounting_invariant and
// leaves the value unchanged (the functions are pure and return a new value).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>

#include "custos/core/result.hpp"

namespace custos::core {

// Output streams of an execution: two pipes, or one terminal stream in PTY mode.
enum class Stream : std::uint8_t { stdout_stream, stderr_stream, pty };

// "stdout", "stderr", "pty"
[[nodiscard]] std::string_view stream_wire(Stream s) noexcept;
[[nodiscard]] std::optional<Stream> stream_from_wire(std::string_view wire) noexcept;

struct StreamAccounting {
  std::uint64_t observed = 0;
  std::uint64_t retained = 0;
  std::uint64_t dropped = 0;
  bool complete = true;

  // Errc::accounting_invariant when observed != retained + dropped (overflow-safe check) or
  // dropped > 0 while complete.
  [[nodiscard]] Result<> check() const;

  friend bool operator==(StreamAccounting const&, StreamAccounting const&) = default;
};

// A chunk of `bytes` was read. Retains as much as fits under `retain_limit` (the stream's total
// retention bound; retained never exceeds it through this call), drops the rest.
[[nodiscard]] Result<StreamAccounting> account_chunk(StreamAccounting const& acc,
                                                     std::uint64_t bytes,
                                                     std::uint64_t retain_limit);
// `bytes` were observed and deliberately not kept (for example over the event-count bound).
[[nodiscard]] Result<StreamAccounting> account_drop(StreamAccounting const& acc,
                                                    std::uint64_t bytes);
// `bytes` already counted as retained were lost afterwards (a spool write failed): they move
// from retained to dropped. Errc::accounting_invariant if bytes > retained.
[[nodiscard]] Result<StreamAccounting> account_lose_retained(StreamAccounting const& acc,
                                                             std::uint64_t bytes);
// Output of unknown size was lost (for example in flight during a daemon crash).
[[nodiscard]] Result<StreamAccounting> account_mark_incomplete(StreamAccounting const& acc);

// The accounting of every stream an execution has (stdout+stderr in pipe mode, pty in PTY mode).
using OutputAccounting = std::map<Stream, StreamAccounting>;

// Checks every stream. Errc::accounting_invariant naming the first stream that fails.
[[nodiscard]] Result<> check(OutputAccounting const& out);

}  // namespace custos::core
