#include "custos/core/digest.hpp"

#include <openssl/evp.h>

#include <memory>

#include "custos/core/canonical.hpp"

namespace custos::core {
namespace {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};

}  // namespace

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

Result<Digest> sha256(std::span<std::uint8_t const> data) {
  // EVP rather than the deprecated SHA256_* calls: OpenSSL 3 routes EVP through its providers,
  // which is where FIPS or hardware implementations live.
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx{EVP_MD_CTX_new()};
  if (!ctx) return Error{Errc::digest_failed, "EVP_MD_CTX_new"};
  if (EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Error{Errc::digest_failed, "EVP_DigestInit_ex"};
  }
  if (!data.empty() && EVP_DigestUpdate(ctx.get(), data.data(), data.size()) != 1) {
    return Error{Errc::digest_failed, "EVP_DigestUpdate"};
  }
  Digest d;
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), d.bytes.data(), &len) != 1 || len != Digest::kSize) {
    return Error{Errc::digest_failed, "EVP_DigestFinal_ex"};
  }
  return d;
}

}  // namespace custos::core
