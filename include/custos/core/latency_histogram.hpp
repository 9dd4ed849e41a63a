// A latency histogram with fixed bucket bounds (10 µs to 1 s) that any thread may record into
// and any thread may read, without a lock: each bucket, the count and the sum are relaxed
// atomics. A reader sees each counter exact but the set of them not as one instant; the
// snapshot makes the cumulative buckets monotone and the count their total, as the Prometheus
// exposition requires.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace custos::core {

class LatencyHistogram {
 public:
  // Upper bounds in nanoseconds (le), smallest first; +Inf is implicit.
  static constexpr std::array<std::uint64_t, 16> kBoundsNs{
      10'000,      25'000,      50'000,      100'000,      250'000,    500'000,
      1'000'000,   2'500'000,   5'000'000,   10'000'000,   25'000'000, 50'000'000,
      100'000'000, 250'000'000, 500'000'000, 1'000'000'000};

  struct Snapshot {
    // cumulative[i]: observations <= kBoundsNs[i]; the last entry is +Inf (== count).
    std::array<std::uint64_t, kBoundsNs.size() + 1> cumulative{};
    std::uint64_t count = 0;
    std::uint64_t sum_ns = 0;
  };

  void record(std::chrono::nanoseconds d) noexcept {
    auto const ns = static_cast<std::uint64_t>(d.count() < 0 ? 0 : d.count());
    std::size_t i = 0;
    while (i < kBoundsNs.size() && ns > kBoundsNs[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  }

  [[nodiscard]] Snapshot snapshot() const noexcept {
    Snapshot s;
    std::uint64_t running = 0;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      running += buckets_[i].load(std::memory_order_relaxed);
      s.cumulative[i] = running;
    }
    s.count = running;
    s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // Per-bucket (not cumulative) counts; the last one is above the largest bound.
  std::array<std::atomic<std::uint64_t>, kBoundsNs.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

}  // namespace custos::core
