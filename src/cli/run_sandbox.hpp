// `custos run --sandbox FILE.json` and `--sandbox-profile NAME`: the plan's `sandbox` object
// (docs/sandbox.md, "custos run"). Private to cli/.
#pragma once

#include <boost/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "custos/core/result.hpp"

namespace custos::cli {

struct SandboxFlags {
  std::string file;     // --sandbox FILE.json: a plan.sandbox object, sent as is
  std::string profile;  // --sandbox-profile NAME: a built-in profile ("build")
  [[nodiscard]] bool any() const { return !file.empty() || !profile.empty(); }
};

// The names of the built-in profiles.
[[nodiscard]] std::vector<std::string> sandbox_profiles();

// The plan's sandbox: the profile's (for `workspace_root`, the plan's workspace, writable
// unless `read_only`), then each top-level member of the file replacing the profile's member
// of that name. nullopt when neither flag was given. The daemon validates what this builds.
// Errors: sys.error when the file cannot be read; sandbox.invalid when it is not JSON or not
// an object (diagnostic at /plan/sandbox); sandbox.invalid for an unknown profile.
[[nodiscard]] Result<std::optional<boost::json::object>> build_sandbox(
    SandboxFlags const& f, std::string const& workspace_root, bool read_only);

// The names a sandbox lets the plan's environment hold: its environment.allow (strings only);
// empty when the member is absent or malformed (the daemon reports the malformation).
[[nodiscard]] std::vector<std::string> sandbox_env_allow(boost::json::object const& sandbox);

}  // namespace custos::cli
