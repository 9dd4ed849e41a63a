// The daemon's secret store (docs/sandbox.md, "Secrets"; docs/api.md, secret.*): the effect shell
// over <state-dir>/secrets/, one file per secret, plus systemd's $CREDENTIALS_DIRECTORY as a
// read-only second source.
//
// Its own layer (custos_secrets: core, sandbox, sys) because two layers above it need it and
// neither may depend on the other's folder: rpc serves secret.set/list/delete, the daemon opens
// the store and hands the gateway its `contains` predicate, and the backends (below the gateway)
// will call read() at spawn time to deliver a value. Nothing here logs.
//
// Rules:
// - The store directory belongs to the daemon's effective uid (root in production) with mode
//   exactly 0700; every entry in it is a regular file of that owner, mode 0600, named by a
//   valid secret ref (sandbox::is_valid_secret_ref). Anything else is secret.store_unsafe: the
//   store is refused (at open, or by the call that meets it), never repaired, because a wider
//   mode or a foreign owner means a value may already have been read or planted.
// - A write is atomic: a temporary file (0600, O_EXCL) in the directory, written and fsync'd,
//   renamed over the name, then the directory fsync'd. Temporaries an interrupted write left
//   (".set-*": a ref never starts with '.') are removed at open.
// - A name in both sources is the store's: secret.set shadows a credential, and secret.delete
//   of that name removes the store's file, after which the credential is served again. A name
//   only in $CREDENTIALS_DIRECTORY cannot be deleted (secret.read_only). Credential files with
//   a name that is not a valid ref are invisible.
// - No error, and nothing this type returns besides read(), carries a value: errors name the
//   secret only.
//
// Threading: every method may be called from any thread (the gateway asks `contains` on the loop
// and on its authorizer thread); one mutex serializes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::secrets {

// A value's bound, in bytes (docs/api.md): secret.set beyond it is secret.too_large, and so is a
// credential file beyond it when read.
inline constexpr std::size_t kMaxSecretValueBytes = std::size_t{64} * 1024;

// The bytes of one secret. Move-only; its buffer is allocated once at its final size (never
// grown, so no stale copy is left behind by a reallocation) and zeroed when it is destroyed or
// assigned over. Never formatted, logged or serialized by custos: the only way out is bytes().
class SecretValue {
 public:
  SecretValue() noexcept = default;
  // Copies `bytes` into a fresh buffer.
  static SecretValue copy_of(std::span<std::uint8_t const> bytes);
  // A zero-filled buffer of `size` bytes, for a reader to fill in place (data()).
  static SecretValue zeroed(std::size_t size);
  ~SecretValue() { wipe(); }
  SecretValue(SecretValue const&) = delete;
  SecretValue& operator=(SecretValue const&) = delete;
  SecretValue(SecretValue&& other) noexcept;
  SecretValue& operator=(SecretValue&& other) noexcept;

  [[nodiscard]] std::span<std::uint8_t const> bytes() const noexcept {
    return {data_.get(), size_};
  }
  [[nodiscard]] std::uint8_t* data() noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

 private:
  void wipe() noexcept;

  std::unique_ptr<std::uint8_t[]> data_;
  std::size_t size_ = 0;
};

// Zeroes a buffer that held a value (a decoded secret.set parameter, a CLI's stdin) in a way the
// compiler may not elide.
void wipe_bytes(void* data, std::size_t size) noexcept;

enum class SecretSource : std::uint8_t {
  store,        // <state-dir>/secrets/<name>, written by secret.set
  credentials,  // $CREDENTIALS_DIRECTORY/<name>, read-only (systemd LoadCredential= & co.)
};
[[nodiscard]] std::string_view secret_source_wire(SecretSource s) noexcept;  // "store", ...

// What secret.list answers per name: never the value, nor its size.
struct SecretEntry {
  std::string name;
  std::int64_t created_ns = 0;  // the file's mtime: the last secret.set of the name
  SecretSource source = SecretSource::store;

  friend bool operator==(SecretEntry const&, SecretEntry const&) = default;
};

struct SecretStoreOptions {
  std::filesystem::path dir;              // <state-dir>/secrets; its parent must exist
  std::filesystem::path credentials_dir;  // $CREDENTIALS_DIRECTORY; empty: no second source
};

class SecretStore {
 public:
  // Creates `dir` (mode 0700) when it does not exist, then checks it and every entry in it
  // (rules above) and opens `credentials_dir` when given.
  // Errors: secret.store_unsafe (a symlink or not a directory, another owner, a mode other than
  // 0700; an entry that is not a 0600 regular file of the owner with a valid ref as its name);
  // sys.error (mkdir, open or read of either directory failed, with errno).
  [[nodiscard]] static Result<std::unique_ptr<SecretStore>> open(SecretStoreOptions options);

  SecretStore(SecretStore const&) = delete;
  SecretStore& operator=(SecretStore const&) = delete;
  ~SecretStore();

  // Stores `value` under `name`, replacing the store's previous value atomically.
  // Errors: secret.invalid_name; secret.too_large (beyond kMaxSecretValueBytes); sys.error
  // (create, write, fsync or rename failed; nothing half-written is left under the name).
  [[nodiscard]] Result<void> set(std::string_view name, std::span<std::uint8_t const> value);

  // Every name either source holds, sorted, each once (a name in both is the store's).
  // Errors: secret.store_unsafe (an entry of the store breaks the rules); sys.error.
  [[nodiscard]] Result<std::vector<SecretEntry>> list() const;

  // Deletes the store's value of `name` (the directory fsync'd after the unlink).
  // Errors: secret.invalid_name; secret.read_only (only $CREDENTIALS_DIRECTORY holds it);
  // sandbox.secret_unknown (neither source holds it); sys.error.
  [[nodiscard]] Result<void> remove(std::string_view name);

  // The value of `name`, for delivery at spawn time; the store's when both sources hold it.
  // Errors: secret.invalid_name; sandbox.secret_unknown; secret.too_large (a credential beyond
  // the bound); secret.store_unsafe (the store's file is not a 0600 regular file of the owner);
  // sys.error.
  [[nodiscard]] Result<SecretValue> read(std::string_view name) const;

  // Whether either source holds `name` (the gateway's GatewayOptions::secret_exists). False for
  // an invalid name and when the answer cannot be read.
  [[nodiscard]] bool contains(std::string_view name) const;

  [[nodiscard]] std::filesystem::path const& dir() const noexcept { return options_.dir; }

 private:
  SecretStore(SecretStoreOptions options, sys::UniqueFd dir, sys::UniqueFd credentials,
              std::uint32_t owner) noexcept;

  SecretStoreOptions options_;
  sys::UniqueFd dir_;          // O_RDONLY|O_DIRECTORY: openat, renameat, unlinkat, fsync
  sys::UniqueFd credentials_;  // invalid when there is no credentials directory
  std::uint32_t owner_ = 0;    // the daemon's effective uid when the store was opened
  mutable std::mutex mutex_;
};

}  // namespace custos::secrets
