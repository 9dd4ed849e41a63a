#include "custos/core/digest.hpp"

#include <openssl/evp.h>

#include <utility>

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

Sha256Stream::Sha256Stream() {
  EVP_MD_CTX* c = EVP_MD_CTX_new();
  if (c == nullptr || EVP_DigestInit_ex(c, sha256_md(), nullptr) != 1) failed_ = true;
  ctx_ = c;
}

Sha256Stream::~Sha256Stream() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

Sha256Stream::Sha256Stream(Sha256Stream&& other) noexcept
    : ctx_(std::exchange(other.ctx_, nullptr)), failed_(std::exchange(other.failed_, true)) {}

Sha256Stream& Sha256Stream::operator=(Sha256Stream&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    ctx_ = std::exchange(other.ctx_, nullptr);
    failed_ = std::exchange(other.failed_, true);
  }
  return *this;
}

Result<void> Sha256Stream::update(std::span<std::uint8_t const> data) {
  if (!failed_ && ctx_ != nullptr &&
      EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size()) == 1) {
    return ok();
  }
  failed_ = true;
  return Error{Errc::digest_failed, "EVP_DigestUpdate(SHA-256)"};
}

Result<Digest> Sha256Stream::finish() {
  Digest d;
  unsigned int len = 0;
  if (failed_ || ctx_ == nullptr ||
      EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.bytes.data(), &len) != 1 ||
      len != Digest::kSize) {
    failed_ = true;
    return Error{Errc::digest_failed, "EVP_DigestFinal_ex(SHA-256)"};
  }
  failed_ = true;  // finished: a second finish() is refused
  return d;
}

}  // namespace custos::core
