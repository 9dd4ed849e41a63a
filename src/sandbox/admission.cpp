// Descriptors and admission (admission.hpp).
#include "custos/sandbox/admission.hpp"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <algorithm>
#include <array>

#include "custos/sandbox/controls.hpp"

namespace custos::sandbox {
namespace {

constexpr std::array<std::string_view, 3> kFidelityNames = {"hard", "sampled", "none"};

}  // namespace

std::string_view control_fidelity_wire(ControlFidelity f) noexcept {
  auto const i = static_cast<std::size_t>(f);
  return i < kFidelityNames.size() ? kFidelityNames[i] : std::string_view{"none"};
}

Control const* Descriptor::find(std::string_view name) const noexcept {
  auto it = std::lower_bound(controls.begin(), controls.end(), name,
                             [](Control const& c, std::string_view n) { return c.name < n; });
  return it != controls.end() && it->name == name ? &*it : nullptr;
}

void Descriptor::add(std::string name, ControlFidelity fidelity, std::string how) {
  auto it = std::upper_bound(controls.begin(), controls.end(), name,
                             [](std::string const& n, Control const& c) { return n < c.name; });
  controls.insert(it, Control{std::move(name), fidelity, std::move(how)});
}

boost::json::value to_json(Descriptor const& d) {
  boost::json::array controls;
  for (auto const& c : d.controls) {
    controls.push_back(boost::json::object{
        {"name", c.name}, {"fidelity", control_fidelity_wire(c.fidelity)}, {"how", c.how}});
  }
  boost::json::object o{{"kind", core::to_string(d.kind)},
                        {"available", d.available},
                        {"controls", std::move(controls)}};
  if (!d.available) o["unavailable_reason"] = d.unavailable_reason;
  return o;
}

void add_unenforced(Descriptor& d, std::string const& why) {
  for (auto const& c : sandbox_controls()) {
    if (d.find(c.name) == nullptr) d.add(std::string{c.name}, ControlFidelity::none, why);
  }
}

std::vector<std::string> missing_controls(CheckedSandboxPlan const& checked, Descriptor const& d) {
  std::vector<std::string> missing;
  for (auto const& name : checked.controls) {
    auto const* c = d.find(name);
    if (c == nullptr || c->fidelity != ControlFidelity::hard) missing.push_back(name);
  }
  std::sort(missing.begin(), missing.end());
  return missing;
}

Error unsupported(core::BackendKind kind, std::vector<std::string> missing) {
  std::string list;
  for (auto const& m : missing) list += (list.empty() ? "" : ", ") + m;
  Error e{Errc::sandbox_unsupported, "the " + std::string{core::to_string(kind)} +
                                         " backend cannot enforce on this host: " + list};
  e.missing = std::move(missing);
  return e;
}

}  // namespace custos::sandbox
