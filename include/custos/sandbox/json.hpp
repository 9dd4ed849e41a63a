// JSON ⇄ sandbox requirements (API.md "Sandbox requirements and contracts"), with every
// diagnostic collected and pointing into the request.
//
// One reader for both shapes that use it: a plan's `plan.sandbox` (pointer "/plan/sandbox")
// and a grant's contract (pointer "/sandbox"). Parsing is strict like the plan's: an unknown
// member is plan.unknown_field, a JSON type mismatch plan.wrong_type, a missing required member
// plan.missing_field, a size over its bound (types.hpp) plan.too_large, a NUL byte in a path
// plan.nul_byte, and every rule of the requirements themselves sandbox.invalid:
//   - filesystem: an absolute path (normalized; ".." refused), rights among discover, metadata,
//     read, execute, create, write, remove, and every right but metadata needs metadata (no
//     host can hide a file's metadata from a process that may open it); a path listed twice
//     with two different sets of rights;
//   - process: max_processes is required when descendants is true, and at most 1 (the root)
//     when it is not; signal_scope is own_tree;
//   - environment.allow: valid environment names;
//   - network.outbound: "none", "any" or {"tcp_connect": [ports 1..65535, at least one]};
//   - secrets: a valid ref, `to` naming exactly one of env (a valid name), file (one path
//     component of [A-Za-z0-9_.-]) or fd (3..1023); two secrets delivered to the same place;
//   - resources.enforce: resource dimension wire keys; concurrency is refused (no plan limit
//     bounds it, so nothing could be enforced);
//   - terminal.modes: pipes and pty, at least one.
// The rules that need the plan (its env, io, limits, workspace) are compilation's (compile.hpp).
//
// to_json prints requirements exactly as given (parse(to_json(r)) == r); the policy's to_json
// prints every domain and default, and parses back to requirements meaning the same policy.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <string>
#include <string_view>

#include "custos/core/json_fields.hpp"
#include "custos/core/result.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::sandbox {

// Reads the requirements object at `ptr` into `out`, every finding into `r` (whose codes it
// uses for the structural findings). For parsers that report several members at once.
void read_requirements(core::FieldReader& r, boost::json::value const& v, std::string const& ptr,
                       SandboxRequirements& out);
// The same, alone: one diagnostic keeps its code, several give plan.invalid.
[[nodiscard]] Result<SandboxRequirements> parse_requirements(boost::json::value const& v,
                                                             std::string_view ptr);

[[nodiscard]] boost::json::value to_json(SandboxRequirements const& requirements);
// Every domain with every field; sets in their canonical order (rights, modes and dimensions
// in enum order, names and ports ascending).
[[nodiscard]] boost::json::value to_json(SandboxPolicy const& policy);
// The policy's members plus "controls": the checked plan as exec.check shows it.
[[nodiscard]] boost::json::object to_json(CheckedSandboxPlan const& checked);

}  // namespace custos::sandbox
