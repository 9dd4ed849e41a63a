// Wire names of resource dimensions and fidelities (see resources.hpp).
#include "custos/core/resources.hpp"

namespace custos::core {
namespace {

constexpr std::array<std::string_view, kResourceDimCount> kDimNames = {
    "wall_ms",      "cpu_ms",      "memory_bytes", "disk_bytes",
    "output_bytes", "descriptors", "processes",    "concurrency"};

constexpr std::array<std::string_view, 3> kFidelityNames = {"hard", "sampled", "unavailable"};

}  // namespace

std::string_view resource_dim_wire(ResourceDim d) noexcept {
  auto const i = static_cast<std::size_t>(d);
  return i < kDimNames.size() ? kDimNames[i] : std::string_view{"invalid"};
}

std::optional<ResourceDim> resource_dim_from_wire(std::string_view wire) noexcept {
  for (std::size_t i = 0; i < kDimNames.size(); ++i) {
    if (kDimNames[i] == wire) return static_cast<ResourceDim>(i);
  }
  return std::nullopt;
}

std::string_view fidelity_wire(Fidelity f) noexcept {
  auto const i = static_cast<std::size_t>(f);
  return i < kFidelityNames.size() ? kFidelityNames[i] : std::string_view{"invalid"};
}

std::optional<Fidelity> fidelity_from_wire(std::string_view wire) noexcept {
  for (std::size_t i = 0; i < kFidelityNames.size(); ++i) {
    if (kFidelityNames[i] == wire) return static_cast<Fidelity>(i);
  }
  return std::nullopt;
}

bool ResourceReport::any_over_limit() const noexcept {
  for (auto const& d : dims) {
    if (d.value.has_value() && d.limit.has_value() && *d.value > *d.limit) return true;
  }
  return false;
}

}  // namespace custos::core
