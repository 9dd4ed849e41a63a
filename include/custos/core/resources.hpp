// The eight resource dimensions of a terminal record, each with its enforcement fidelity.
//
// A record says not only how much was used but how much the number can be trusted: `hard` means
// the kernel enforced the limit (a cgroup controller, an rlimit), `sampled` means the supervisor
// measured at a bounded cadence and cancelled on an observed overrun (so a short spike can pass
// unseen), `unavailable` means this host could neither enforce nor measure it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace custos::core {

enum class ResourceDim : std::uint8_t {
  wall,
  cpu,
  memory,
  disk,
  output,
  descriptors,
  processes,
  concurrency,
};
inline constexpr std::size_t kResourceDimCount = 8;

// Wire key with its unit: "wall_ms", "cpu_ms", "memory_bytes", "disk_bytes", "output_bytes",
// "descriptors", "processes", "concurrency".
[[nodiscard]] std::string_view resource_dim_wire(ResourceDim d) noexcept;
[[nodiscard]] std::optional<ResourceDim> resource_dim_from_wire(std::string_view wire) noexcept;

enum class Fidelity : std::uint8_t { hard, sampled, unavailable };

[[nodiscard]] std::string_view fidelity_wire(Fidelity f) noexcept;
[[nodiscard]] std::optional<Fidelity> fidelity_from_wire(std::string_view wire) noexcept;

struct ResourceObservation {
  std::optional<std::uint64_t>
      value;  // peak or total in the dimension's unit; absent if unmeasured
  std::optional<std::uint64_t> limit;  // the plan's limit, absent when the plan set none
  Fidelity fidelity = Fidelity::unavailable;

  friend bool operator==(ResourceObservation const&, ResourceObservation const&) = default;
};

// All eight dimensions, always present (a record never omits one; unknown is `unavailable`).
struct ResourceReport {
  std::array<ResourceObservation, kResourceDimCount> dims{};

  [[nodiscard]] ResourceObservation& at(ResourceDim d) noexcept {
    return dims[static_cast<std::size_t>(d)];
  }
  [[nodiscard]] ResourceObservation const& at(ResourceDim d) const noexcept {
    return dims[static_cast<std::size_t>(d)];
  }
  // True when some dimension has a value above its limit.
  [[nodiscard]] bool any_over_limit() const noexcept;

  friend bool operator==(ResourceReport const&, ResourceReport const&) = default;
};

}  // namespace custos::core
