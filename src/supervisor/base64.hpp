// Standard base64 (RFC 4648, with padding) for `data_b64` fields. Output bytes of an execution
// are arbitrary (NUL, invalid UTF-8), so they never travel as JSON strings directly.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace custos::supervisor {

[[nodiscard]] std::string base64_encode(std::span<std::uint8_t const> data);
// nullopt on any character outside the alphabet or a bad length/padding.
[[nodiscard]] std::optional<std::vector<std::uint8_t>> base64_decode(std::string_view text);

}  // namespace custos::supervisor
