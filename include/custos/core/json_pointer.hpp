// RFC 6901 JSON pointers for diagnostics: "/plan/env/3/name".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace custos::core {

// base + "/" + the token escaped per RFC 6901 ("~" → "~0", "/" → "~1").
[[nodiscard]] std::string pointer_append(std::string_view base, std::string_view token);
[[nodiscard]] std::string pointer_append(std::string_view base, std::size_t index);

}  // namespace custos::core
