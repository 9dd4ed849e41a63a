// Base64 (RFC 4648, standard alphabet, padded) for the `data_b64` fields of the API.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace custos::core {

[[nodiscard]] std::string base64_encode(std::span<std::uint8_t const> bytes);
[[nodiscard]] std::string base64_encode(std::string_view bytes);
// nullopt for anything that is not canonical padded base64 (wrong length, bad character).
[[nodiscard]] std::optional<std::vector<std::uint8_t>> base64_decode(std::string_view text);

}  // namespace custos::core
