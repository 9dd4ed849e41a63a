#include "custos/core/digest.hpp"

#include <openssl/evp.h>

#include "custos/core/canonical.hpp"

namespace custos::core {

std::string Digest::to_string() const {
  std::string out{kPrefix};
  out += to_hex(bytes);
  return out;
}

Result<Digest> Digest::parse(std::string_view text) {
  if (text.size() != kPrefix.size() + 2 * kSize || text.substr(0, kPrefix.size()) != kPrefix) {
    return Error{Errc::plan_invalid_value, "a digest is \"sha256:\" and 64 lowercase hex digits"};
  }
  auto const hex = text.substr(kPrefix.size());
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return Error{Errc::plan_invalid_value, "a digest is \"sha256:\" and 64 lowercase hex digits"};
    }
  }
  auto const raw = from_hex(hex);
  Digest d;
  for (std::size_t i = 0; i < kSize; ++i) d.bytes[i] = (*raw)[i];
  return d;
}

namespace {

// EVP rather than the deprecated SHA256_* calls: OpenSSL 3 routes EVP through its providers,
// which is where FIPS or hardware implementations live. Fetched once: with EVP_sha256() every
// digest looks the implementation up in the provider store again (an implicit fetch), which
// cost more than hashing a ~2 KiB registry record. A fetched EVP_MD is immutable and may be
// shared by every thread; it is kept for the life of the process.
EVP_MD const* sha256_md() noexcept {
  static EVP_MD const* const md = [] {
    EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? static_cast<EVP_MD const*>(fetched) : EVP_sha256();
  }();
  return md;
}

}  // namespace

Result<Digest> sha256(std::span<std::uint8_t const> data) {
  Digest d;
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), d.bytes.data(), &len, sha256_md(), nullptr) != 1 ||
      len != Digest::kSize) {
    return Error{Errc::digest_failed, "EVP_Digest(SHA-256)"};
  }
  return d;
}

}  // namespace custos::core
