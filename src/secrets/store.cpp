// The secret store's effects (include/custos/secrets/store.hpp states the rules). Every path is
// reached through the store's directory descriptor (openat, renameat, unlinkat, fstatat with
// AT_SYMLINK_NOFOLLOW), so a symlink planted in the directory is never followed.
#include "custos/secrets/store.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <map>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

#include "custos/sandbox/types.hpp"

namespace custos::secrets {

namespace fs = std::filesystem;

namespace {

// A write in progress: a ref never starts with '.', so these never collide with a secret.
constexpr std::string_view kTempPrefix = ".set-";

Error sys_failure(std::string what, int err) {
  return Error{Errc::sys_error, std::move(what), err};
}

Error unsafe(fs::path const& where, std::string const& why) {
  return Error{Errc::secret_store_unsafe, where.native() + ": " + why};
}

std::string secret_label(std::string_view name) {
  return "secret " + std::string(name);
}

std::int64_t mtime_ns(struct stat const& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
         static_cast<std::int64_t>(st.st_mtim.tv_nsec);
}

// An entry of the store: a regular file of the owner, mode 0600, one link (a second link would
// be a second way to the value, outside the 0700 directory's protection).
Result<void> check_file(struct stat const& st, fs::path const& where, std::uint32_t owner) {
  if (!S_ISREG(st.st_mode)) return unsafe(where, "not a regular file");
  if (st.st_uid != owner) {
    return unsafe(where, fmt::format("owned by uid {}, not {}", st.st_uid, owner));
  }
  if ((st.st_mode & 07777) != 0600) {
    return unsafe(where, fmt::format("mode {:04o}, not 0600", st.st_mode & 07777));
  }
  if (st.st_nlink != 1) return unsafe(where, fmt::format("{} hard links, not 1", st.st_nlink));
  return ok();
}

Result<void> check_dir(struct stat const& st, fs::path const& where, std::uint32_t owner) {
  if (!S_ISDIR(st.st_mode)) return unsafe(where, "not a directory");
  if (st.st_uid != owner) {
    return unsafe(where, fmt::format("owned by uid {}, not {}", st.st_uid, owner));
  }
  if ((st.st_mode & 07777) != 0700) {
    return unsafe(where, fmt::format("mode {:04o}, not 0700", st.st_mode & 07777));
  }
  return ok();
}

// The names in a directory (not "." and ".."), read through a descriptor of its own so the
// caller's descriptor keeps no directory-stream position.
Result<std::vector<std::string>> names_in(int dirfd, fs::path const& where) {
  int const fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_failure("open " + where.native(), errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    int const err = errno;
    ::close(fd);
    return sys_failure("fdopendir " + where.native(), err);
  }
  std::vector<std::string> out;
  for (;;) {
    errno = 0;
    dirent const* e = ::readdir(d);
    if (e == nullptr) break;
    std::string_view const n = e->d_name;
    if (n == "." || n == "..") continue;
    out.emplace_back(n);
  }
  int const err = errno;
  ::closedir(d);
  if (err != 0) return sys_failure("readdir " + where.native(), err);
  return out;
}

// The store's entries, checked; `sweep` removes the temporaries an interrupted set left.
Result<std::vector<SecretEntry>> scan_store(int dirfd, fs::path const& dir, std::uint32_t owner,
                                            bool sweep) {
  std::vector<SecretEntry> out;
  for (auto const& n : CUSTOS_TRY(names_in(dirfd, dir))) {
    if (n.starts_with(kTempPrefix)) {
      if (sweep && ::unlinkat(dirfd, n.c_str(), 0) != 0 && errno != ENOENT) {
        return sys_failure("unlink " + (dir / n).native(), errno);
      }
      continue;
    }
    if (!sandbox::is_valid_secret_ref(n)) return unsafe(dir / n, "not a secret's name");
    struct stat st {};
    if (::fstatat(dirfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return sys_failure("stat " + (dir / n).native(), errno);
    }
    CUSTOS_TRYV(check_file(st, dir / n, owner));
    out.push_back({n, mtime_ns(st), SecretSource::store});
  }
  return out;
}

// A credential is a regular file with a valid ref as its name; anything else there is not a
// secret of ours (systemd may keep other files in the directory).
bool is_credential(int dirfd, std::string const& name, struct stat* st) {
  if (!sandbox::is_valid_secret_ref(name)) return false;
  if (::fstatat(dirfd, name.c_str(), st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  return S_ISREG(st->st_mode);
}

bool regular_at(int dirfd, std::string const& name) {
  struct stat st {};
  return ::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

// Reads `name` in `dirfd`: empty when there is no such file. The store's file is checked
// (owner, mode, links) on the descriptor that is then read, so what was checked is what is read.
Result<std::optional<SecretValue>> read_at(int dirfd, std::string const& name,
                                           fs::path const& where,
                                           std::optional<std::uint32_t> owner) {
  // O_NONBLOCK: a FIFO planted under the name must not hang the caller (it is refused below).
  int const fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<SecretValue>{};
    if (errno == ELOOP) return unsafe(where, "a symbolic link");
    return sys_failure("open " + secret_label(name), errno);
  }
  sys::UniqueFd file(fd);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return sys_failure("stat " + secret_label(name), errno);
  if (owner) {
    CUSTOS_TRYV(check_file(st, where, *owner));
  } else if (!S_ISREG(st.st_mode)) {
    return std::optional<SecretValue>{};
  }
  auto const size = static_cast<std::size_t>(st.st_size);
  if (size > kMaxSecretValueBytes) {
    return Error{Errc::secret_too_large, fmt::format("{}: {} bytes, at most {}", secret_label(name),
                                                     size, kMaxSecretValueBytes)};
  }
  auto value = SecretValue::zeroed(size);
  std::size_t done = 0;
  while (done < size) {
    ssize_t const n =
        ::pread(file.get(), value.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_failure("read " + secret_label(name), errno);
    if (n == 0) return sys_failure("read " + secret_label(name) + ": shorter than its size", EIO);
    done += static_cast<std::size_t>(n);
  }
  return std::optional<SecretValue>{std::move(value)};
}

Result<void> fsync_fd(int fd, std::string const& what) {
  if (::fsync(fd) != 0) return sys_failure("fsync " + what, errno);
  return ok();
}

Result<void> write_all(int fd, std::span<std::uint8_t const> bytes, std::string_view name) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t const n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_failure("write " + secret_label(name), errno);
    done += static_cast<std::size_t>(n);
  }
  return ok();
}

Result<void> check_name(std::string_view name) {
  if (sandbox::is_valid_secret_ref(name)) return ok();
  // The name is shown only when it is short and printable; it is the caller's own input.
  return Error{Errc::secret_invalid_name, "a secret name is 1-" +
                                              std::to_string(sandbox::kMaxSecretRefBytes) +
                                              " bytes of [A-Za-z0-9_.-], first alphanumeric"};
}

// Creates the store's directory when absent: 0700 whatever the umask, and its parent fsync'd so
// the directory survives a crash.
Result<void> ensure_dir(fs::path const& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    if (::chmod(dir.c_str(), 0700) != 0) return sys_failure("chmod " + dir.native(), errno);
    int const parent = ::open(dir.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0) return sys_failure("open " + dir.parent_path().native(), errno);
    sys::UniqueFd p(parent);
    return fsync_fd(p.get(), dir.parent_path().native());
  }
  if (errno == EEXIST) return ok();
  return sys_failure("mkdir " + dir.native(), errno);
}

}  // namespace

// ------------------------------------------------------------------------- SecretValue

void wipe_bytes(void* data, std::size_t size) noexcept {
  if (data != nullptr && size > 0) ::explicit_bzero(data, size);
}

SecretValue SecretValue::copy_of(std::span<std::uint8_t const> bytes) {
  auto v = zeroed(bytes.size());
  if (!bytes.empty()) std::memcpy(v.data_.get(), bytes.data(), bytes.size());
  return v;
}

SecretValue SecretValue::zeroed(std::size_t size) {
  SecretValue v;
  // One byte at least, so data() is never null even for an empty secret.
  v.data_ = std::make_unique<std::uint8_t[]>(std::max<std::size_t>(size, 1));
  v.size_ = size;
  return v;
}

SecretValue::SecretValue(SecretValue&& other) noexcept
    : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}

SecretValue& SecretValue::operator=(SecretValue&& other) noexcept {
  if (this != &other) {
    wipe();
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SecretValue::wipe() noexcept {
  wipe_bytes(data_.get(), size_);
  data_.reset();
  size_ = 0;
}

std::string_view secret_source_wire(SecretSource s) noexcept {
  switch (s) {
    case SecretSource::store:
      return "store";
    case SecretSource::credentials:
      return "credentials";
  }
  return "invalid";
}

// ------------------------------------------------------------------------- SecretStore

SecretStore::SecretStore(SecretStoreOptions options, sys::UniqueFd dir, sys::UniqueFd credentials,
                         std::uint32_t owner) noexcept
    : options_(std::move(options)),
      dir_(std::move(dir)),
      credentials_(std::move(credentials)),
      owner_(owner) {}

SecretStore::~SecretStore() = default;

Result<std::unique_ptr<SecretStore>> SecretStore::open(SecretStoreOptions options) {
  auto const owner = static_cast<std::uint32_t>(::geteuid());
  fs::path const& dir = options.dir;
  CUSTOS_TRYV(ensure_dir(dir));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return sys_failure("stat " + dir.native(), errno);
  if (S_ISLNK(st.st_mode)) return unsafe(dir, "a symbolic link");
  int const fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return sys_failure("open " + dir.native(), errno);
  sys::UniqueFd dirfd(fd);
  // Checked on the descriptor the store keeps, not on the path looked at above.
  if (::fstat(dirfd.get(), &st) != 0) return sys_failure("stat " + dir.native(), errno);
  CUSTOS_TRYV(check_dir(st, dir, owner));
  CUSTOS_TRYV(scan_store(dirfd.get(), dir, owner, /*sweep=*/true));
  if (::fsync(dirfd.get()) != 0) return sys_failure("fsync " + dir.native(), errno);

  sys::UniqueFd credentials;
  if (!options.credentials_dir.empty()) {
    int const c = ::open(options.credentials_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c < 0) return sys_failure("open " + options.credentials_dir.native(), errno);
    credentials.reset(c);
  }
  return std::unique_ptr<SecretStore>(
      new SecretStore(std::move(options), std::move(dirfd), std::move(credentials), owner));
}

Result<void> SecretStore::set(std::string_view name, std::span<std::uint8_t const> value) {
  CUSTOS_TRYV(check_name(name));
  if (value.size() > kMaxSecretValueBytes) {
    return Error{Errc::secret_too_large, fmt::format("{}: {} bytes, at most {}", secret_label(name),
                                                     value.size(), kMaxSecretValueBytes)};
  }
  std::lock_guard const lock(mutex_);
  std::string const target(name);
  std::string const temp = std::string(kTempPrefix) + target;
  if (::unlinkat(dir_.get(), temp.c_str(), 0) != 0 && errno != ENOENT) {
    return sys_failure("unlink the temporary of " + secret_label(name), errno);
  }
  int const fd = ::openat(dir_.get(), temp.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return sys_failure("create the temporary of " + secret_label(name), errno);
  sys::UniqueFd file(fd);
  auto written = [&]() -> Result<void> {
    // The umask may have taken bits from 0600 (never added any): set it exactly.
    if (::fchmod(file.get(), 0600) != 0) return sys_failure("chmod " + secret_label(name), errno);
    CUSTOS_TRYV(write_all(file.get(), value, name));
    CUSTOS_TRYV(fsync_fd(file.get(), secret_label(name)));
    if (::renameat(dir_.get(), temp.c_str(), dir_.get(), target.c_str()) != 0) {
      return sys_failure("rename " + secret_label(name) + " into place", errno);
    }
    return ok();
  }();
  if (!written) {
    static_cast<void>(::unlinkat(dir_.get(), temp.c_str(), 0));
    return written.error();
  }
  return fsync_fd(dir_.get(), options_.dir.native());
}

Result<std::vector<SecretEntry>> SecretStore::list() const {
  std::lock_guard const lock(mutex_);
  auto entries = CUSTOS_TRY(scan_store(dir_.get(), options_.dir, owner_, /*sweep=*/false));
  if (credentials_.valid()) {
    std::map<std::string, bool, std::less<>> held;
    for (auto const& e : entries) held.emplace(e.name, true);
    for (auto const& n : CUSTOS_TRY(names_in(credentials_.get(), options_.credentials_dir))) {
      struct stat st {};
      if (held.contains(n) || !is_credential(credentials_.get(), n, &st)) continue;
      entries.push_back({n, mtime_ns(st), SecretSource::credentials});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](SecretEntry const& a, SecretEntry const& b) { return a.name < b.name; });
  return entries;
}

Result<void> SecretStore::remove(std::string_view name) {
  CUSTOS_TRYV(check_name(name));
  std::lock_guard const lock(mutex_);
  std::string const target(name);
  if (::unlinkat(dir_.get(), target.c_str(), 0) != 0) {
    int const err = errno;
    if (err != ENOENT) return sys_failure("unlink " + secret_label(name), err);
    struct stat st {};
    if (credentials_.valid() && is_credential(credentials_.get(), target, &st)) {
      return Error{Errc::secret_read_only,
                   secret_label(name) + " comes from $CREDENTIALS_DIRECTORY and cannot be deleted"};
    }
    return Error{Errc::sandbox_secret_unknown, "the secret store holds no " + secret_label(name)};
  }
  return fsync_fd(dir_.get(), options_.dir.native());
}

Result<SecretValue> SecretStore::read(std::string_view name) const {
  CUSTOS_TRYV(check_name(name));
  std::lock_guard const lock(mutex_);
  std::string const n(name);
  auto own = CUSTOS_TRY(read_at(dir_.get(), n, options_.dir / n, owner_));
  if (own) return std::move(*own);
  if (credentials_.valid() && sandbox::is_valid_secret_ref(n)) {
    auto cred = CUSTOS_TRY(read_at(credentials_.get(), n, options_.credentials_dir / n, {}));
    if (cred) return std::move(*cred);
  }
  return Error{Errc::sandbox_secret_unknown, "the secret store holds no " + secret_label(name)};
}

bool SecretStore::contains(std::string_view name) const {
  if (!sandbox::is_valid_secret_ref(name)) return false;
  std::lock_guard const lock(mutex_);
  std::string const n(name);
  return regular_at(dir_.get(), n) || (credentials_.valid() && regular_at(credentials_.get(), n));
}

}  // namespace custos::secrets
