// Output accounting: pure, overflow-checked counter updates (see accounting.hpp).
#include "custos/core/accounting.hpp"

#include <array>
#include <limits>
#include <string>

#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

constexpr auto kStreamNames = wire_names<Stream>({
    {Stream::stdout_stream, "stdout"},
    {Stream::stderr_stream, "stderr"},
    {Stream::pty, "pty"},
});
static_assert(kStreamNames.complete());

Error overflow(std::string_view what) {
  return Error{Errc::accounting_invariant, std::string{what} + " would overflow u64"};
}

// a + b, or nothing when it does not fit: a counter that wrapped would lie about how much was seen.
std::optional<std::uint64_t> add(std::uint64_t a, std::uint64_t b) noexcept {
  if (a > std::numeric_limits<std::uint64_t>::max() - b) return std::nullopt;
  return a + b;
}

}  // namespace

std::string_view stream_wire(Stream s) noexcept {
  return kStreamNames.wire(s);
}

std::optional<Stream> stream_from_wire(std::string_view wire) noexcept {
  return kStreamNames.from_wire(wire);
}

Result<> StreamAccounting::check() const {
  auto const sum = add(retained, dropped);
  if (!sum.has_value() || *sum != observed) {
    return Error{Errc::accounting_invariant, "observed " + std::to_string(observed) +
                                                 " != retained " + std::to_string(retained) +
                                                 " + dropped " + std::to_string(dropped)};
  }
  if (dropped > 0 && complete) {
    return Error{Errc::accounting_invariant,
                 std::to_string(dropped) + " bytes dropped but the stream claims to be complete"};
  }
  return ok();
}

Result<StreamAccounting> account_chunk(StreamAccounting const& acc, std::uint64_t bytes,
                                       std::uint64_t retain_limit) {
  CUSTOS_TRYV(acc.check());
  std::uint64_t const room = acc.retained < retain_limit ? retain_limit - acc.retained : 0;
  std::uint64_t const keep = bytes < room ? bytes : room;
  std::uint64_t const lose = bytes - keep;
  auto const observed = add(acc.observed, bytes);
  if (!observed.has_value()) return overflow("observed");
  // retained + keep <= retain_limit, and dropped + lose <= observed: neither can overflow once
  // observed did not, but the check keeps the argument local.
  auto const dropped = add(acc.dropped, lose);
  if (!dropped.has_value()) return overflow("dropped");
  StreamAccounting next = acc;
  next.observed = *observed;
  next.retained = acc.retained + keep;
  next.dropped = *dropped;
  if (lose > 0) next.complete = false;
  CUSTOS_TRYV(next.check());
  return next;
}

Result<StreamAccounting> account_drop(StreamAccounting const& acc, std::uint64_t bytes) {
  CUSTOS_TRYV(acc.check());
  auto const observed = add(acc.observed, bytes);
  if (!observed.has_value()) return overflow("observed");
  auto const dropped = add(acc.dropped, bytes);
  if (!dropped.has_value()) return overflow("dropped");
  StreamAccounting next = acc;
  next.observed = *observed;
  next.dropped = *dropped;
  if (bytes > 0) next.complete = false;
  CUSTOS_TRYV(next.check());
  return next;
}

Result<StreamAccounting> account_lose_retained(StreamAccounting const& acc, std::uint64_t bytes) {
  CUSTOS_TRYV(acc.check());
  if (bytes > acc.retained) {
    return Error{Errc::accounting_invariant, "cannot lose " + std::to_string(bytes) +
                                                 " retained bytes; only " +
                                                 std::to_string(acc.retained) + " are retained"};
  }
  StreamAccounting next = acc;
  next.retained = acc.retained - bytes;
  next.dropped = acc.dropped + bytes;  // cannot overflow: retained + dropped == observed
  if (bytes > 0) next.complete = false;
  CUSTOS_TRYV(next.check());
  return next;
}

Result<StreamAccounting> account_mark_incomplete(StreamAccounting const& acc) {
  CUSTOS_TRYV(acc.check());
  StreamAccounting next = acc;
  next.complete = false;
  return next;
}

Result<> check(OutputAccounting const& out) {
  for (auto const& [stream, acc] : out) {
    if (auto r = acc.check(); !r) {
      Error e = r.error();
      e.context = std::string{stream_wire(stream)} + ": " + e.context;
      return e;
    }
  }
  return ok();
}

}  // namespace custos::core
