// JSON ⇄ identity and plan (docs/api.md "The request: identity and plan"), with every
// diagnostic collected.
//
// Parsing is strict: an unknown member is plan.unknown_field, a JSON type mismatch is
// plan.wrong_type (numbers must be non-negative integers; 3.0 is a double and is refused), a
// missing required member is plan.missing_field, and then the rules of plan.hpp / identity.hpp
// apply. All problems are reported at once through Error::from_diagnostics: one diagnostic keeps
// its own code, several give plan.invalid with the list. Pointers are RFC 6901, below
// `pointer_base` (pass "/identity" and "/plan" when parsing exec.start params).
//
// Optional plan members take the defaults documented in plan.hpp, so the result is the
// effective plan, and to_json writes every member of it back out: parse(to_json(x)) == x.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <string_view>

#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"

namespace custos::core {

[[nodiscard]] Result<ExecutionIdentity> parse_identity(boost::json::value const& v,
                                                       std::string_view pointer_base = "");

// `plan.sandbox` belongs to the sandbox layer: its requirements are types of that layer, and only
// it can compile them into the checked sandbox plan whose digest the plan carries
// (custos/sandbox/plan.hpp, sandbox::parse_plan, which calls this with `skip` and then parses
// and compiles the member itself). Called with `refuse` (the default), a plan that has the
// member at all is refused (sandbox.unsupported at its pointer): a reader that cannot compile a
// sandbox must never run the plan unrestricted. `skip` leaves the member unread and
// ExecutionPlan::sandbox_digest empty; only a caller that handles the member may pass it.
enum class SandboxMember : std::uint8_t { refuse, skip };

[[nodiscard]] Result<ExecutionPlan> parse_plan(boost::json::value const& v,
                                               std::string_view pointer_base = "",
                                               SandboxMember sandbox = SandboxMember::refuse);

[[nodiscard]] boost::json::value to_json(ExecutionIdentity const& id);
// Every member of the effective plan except `sandbox`, which the sandbox layer prints
// (sandbox::to_json of a parsed plan): core holds only the sandbox's digest.
[[nodiscard]] boost::json::value to_json(ExecutionPlan const& plan);

// Parses JSON text strictly: UTF-8 checked, nesting at most 64 deep, and a member name repeated
// within one object refused (Boost.JSON would silently keep the last; a caller's parser may keep
// the first and so have approved a different plan). plan.invalid_json with the reason (for a
// duplicate: its JSON pointer) on failure. Use it for every request whose plan gets digested.
[[nodiscard]] Result<boost::json::value> parse_json_text(std::string_view text);

}  // namespace custos::core
