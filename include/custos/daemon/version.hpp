// The version string reported by `custos --version` and host.info.
#pragma once

#include <string_view>

namespace custos::daemon {

inline constexpr std::string_view kVersion = "0.1.0";

}  // namespace custos::daemon
