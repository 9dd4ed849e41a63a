// Backend descriptors and sandbox admission (ARCHITECTURE.md step 4).
//
// A backend's Descriptor is its canonical statement of what it can enforce on this host: one
// Control per mechanism, by the names of controls.hpp (and the backend's own: boundary.*, io.*),
// each with a fidelity and one line saying how (host.info and custos doctor show it). Admission
// is the pure comparison of a checked sandbox plan's controls with it: a control is supported
// only at fidelity hard; everything else is missing, and a plan with anything missing is
// refused (sandbox.unsupported, detail.missing) before any claim is consumed — a restricted plan
// never falls back to an unrestricted run.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::sandbox {

// How well a backend enforces one control on this host.
enum class ControlFidelity : std::uint8_t {
  hard,     // the kernel or the supervisor bounds it exactly, for the whole tree
  sampled,  // observed periodically; a limit acts after the fact
  none,     // not available here
};
[[nodiscard]] std::string_view control_fidelity_wire(ControlFidelity f) noexcept;

struct Control {
  std::string name;  // a control of controls.hpp, or a backend's own ("boundary.cgroup", "io.pty")
  ControlFidelity fidelity = ControlFidelity::none;
  std::string how;  // one line: the mechanism, or why it is missing
};

// What a backend is and what it can enforce on this host, in a canonical order (by name).
struct Descriptor {
  core::BackendKind kind = core::BackendKind::native;
  bool available = false;
  std::string unavailable_reason;  // set when !available
  std::vector<Control> controls;   // sorted by name, names unique

  [[nodiscard]] Control const* find(std::string_view name) const noexcept;
  // Adds a control, keeping `controls` in canonical order (sorted by name).
  void add(std::string name, ControlFidelity fidelity, std::string how);
};

// {"kind", "available", "controls": [{"name", "fidelity", "how"}], "unavailable_reason"?}.
[[nodiscard]] boost::json::value to_json(Descriptor const& d);

// Adds every sandbox control of controls.hpp (not the resource ones, which describe limits a
// backend already states) the descriptor does not list yet, at fidelity none with `why`: how a
// backend that enforces none of them says so.
void add_unenforced(Descriptor& d, std::string const& why);

// Every control of `checked` the descriptor does not list at fidelity hard, sorted: empty means
// admitted.
[[nodiscard]] std::vector<std::string> missing_controls(CheckedSandboxPlan const& checked,
                                                        Descriptor const& d);

// sandbox.unsupported naming `missing` (in Error::missing and the message), for a backend `kind`.
[[nodiscard]] Error unsupported(core::BackendKind kind, std::vector<std::string> missing);

}  // namespace custos::sandbox
