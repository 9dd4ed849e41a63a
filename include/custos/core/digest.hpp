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

// SHA-256 of bytes that arrive in pieces (a file read in chunks). Move-only; finish() once.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(Sha256Stream&& other) noexcept;
  Sha256Stream& operator=(Sha256Stream&& other) noexcept;
  Sha256Stream(Sha256Stream const&) = delete;
  Sha256Stream& operator=(Sha256Stream const&) = delete;

  // digest.failed when OpenSSL refused (then every later call fails too).
  [[nodiscard]] Result<void> update(std::span<std::uint8_t const> data);
  [[nodiscard]] Result<Digest> finish();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX, kept opaque so this header needs no OpenSSL
  bool failed_ = false;
};

}  // namespace custos::core
