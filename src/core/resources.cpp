// Wire names of resource dimensions and fidelities (see resources.hpp).
#include "custos/core/resources.hpp"

#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

constexpr auto kDimNames = wire_names<ResourceDim>({
    {ResourceDim::wall, "wall_ms"},
    {ResourceDim::cpu, "cpu_ms"},
    {ResourceDim::memory, "memory_bytes"},
    {ResourceDim::disk, "disk_bytes"},
    {ResourceDim::output, "output_bytes"},
    {ResourceDim::descriptors, "descriptors"},
    {ResourceDim::processes, "processes"},
    {ResourceDim::concurrency, "concurrency"},
});
static_assert(kDimNames.complete() && kDimNames.size() == kResourceDimCount);

constexpr auto kFidelityNames = wire_names<Fidelity>({
    {Fidelity::hard, "hard"},
    {Fidelity::sampled, "sampled"},
    {Fidelity::unavailable, "unavailable"},
});
static_assert(kFidelityNames.complete());

}  // namespace

std::string_view resource_dim_wire(ResourceDim d) noexcept {
  return kDimNames.wire(d);
}

std::optional<ResourceDim> resource_dim_from_wire(std::string_view wire) noexcept {
  return kDimNames.from_wire(wire);
}

std::string_view fidelity_wire(Fidelity f) noexcept {
  return kFidelityNames.wire(f);
}

std::optional<Fidelity> fidelity_from_wire(std::string_view wire) noexcept {
  return kFidelityNames.from_wire(wire);
}

bool ResourceReport::any_over_limit() const noexcept {
  for (auto const& d : dims) {
    if (d.value.has_value() && d.limit.has_value() && *d.value > *d.limit) return true;
  }
  return false;
}

}  // namespace custos::core
