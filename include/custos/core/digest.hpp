// SHA-256 digests, written "sha256:<64 lowercase hex>" everywhere they leave the process.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "custos/core/result.hpp"

namespace custos::core {

struct Digest {
  static constexpr std::size_t kSize = 32;
  static constexpr std::string_view kPrefix = "sha256:";

  std::array<std::uint8_t, kSize> bytes{};

  // "sha256:" followed by 64 lowercase hex digits.
  [[nodiscard]] std::string to_string() const;
  // Accepts exactly the form to_string() produces (lowercase only, so one digest has one
  // spelling); anything else is plan.invalid_value.
  [[nodiscard]] static Result<Digest> parse(std::string_view text);

  friend bool operator==(Digest const&, Digest const&) = default;
  friend auto operator<=>(Digest const&, Digest const&) = default;
};

// SHA-256 through OpenSSL's EVP interface; digest.failed if OpenSSL reports an error.
[[nodiscard]] Result<Digest> sha256(std::span<std::uint8_t const> data);

}  // namespace custos::core
