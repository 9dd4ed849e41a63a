// Landlock rulesets, prepared in the daemon and applied by a staged child.
//
// The daemon creates the ruleset and adds every rule before the clone (this is where paths are
// resolved, errors reported and allocation allowed); the child only calls
// prctl(PR_SET_NO_NEW_PRIVS) and landlock_restrict_self(fd(), 0) between clone3 and execve.
// The kernel structures are spelled here and in landlock.cpp, so the build does not depend on how
// recent the installed linux/landlock.h is; features are detected by the ABI the kernel reports,
// never by its version.
#pragma once

#include <cstdint>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// The Landlock ABI version of this kernel (landlock_create_ruleset(NULL, 0,
// LANDLOCK_CREATE_RULESET_VERSION)); 0 when Landlock is absent or disabled (ENOSYS,
// EOPNOTSUPP). Probed once per process and cached.
[[nodiscard]] int landlock_abi() noexcept;

// Filesystem access bits: the kernel's LANDLOCK_ACCESS_FS_* values.
namespace landlock_fs {
inline constexpr std::uint64_t execute = 1ULL << 0, write_file = 1ULL << 1, read_file = 1ULL << 2,
                               read_dir = 1ULL << 3, remove_dir = 1ULL << 4,
                               remove_file = 1ULL << 5, make_char = 1ULL << 6, make_dir = 1ULL << 7,
                               make_reg = 1ULL << 8, make_sock = 1ULL << 9, make_fifo = 1ULL << 10,
                               make_block = 1ULL << 11, make_sym = 1ULL << 12, refer = 1ULL << 13,
                               truncate = 1ULL << 14, ioctl_dev = 1ULL << 15;
// The accesses that apply to a file that is not a directory; the others only make sense
// beneath a directory (the kernel refuses them on a file rule with EINVAL).
inline constexpr std::uint64_t file_accesses =
    execute | write_file | read_file | truncate | ioctl_dev;
}  // namespace landlock_fs

// All filesystem access bits the given ABI handles (ABI 1: bits 0-12, 2: + refer,
// 3: + truncate, 5: + ioctl_dev; 0 for ABI 0).
[[nodiscard]] std::uint64_t landlock_fs_handled(int abi) noexcept;

struct LandlockSpec {
  std::uint64_t handled_fs = 0;      // filesystem accesses the ruleset restricts
  bool handle_tcp_bind = false;      // ABI >= 4
  bool handle_tcp_connect = false;   // ABI >= 4
  bool scope_abstract_unix = false;  // ABI >= 6: LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
  bool scope_signal = false;         // ABI >= 6: LANDLOCK_SCOPE_SIGNAL
};

// An open Landlock ruleset (owns its fd, O_CLOEXEC), filled in the daemon and applied by a child
// with landlock_restrict_self. Everything the ruleset handles and no rule allows is denied.
class LandlockRuleset {
 public:
  // landlock_create_ruleset for `spec`.
  // Errors: sys.unsupported when Landlock is absent or disabled, or the kernel's ABI lacks
  // something the spec asks (a filesystem bit beyond landlock_fs_handled(abi), TCP needs ABI 4,
  // scopes need ABI 6); sys.error with EINVAL when the spec handles nothing at all (the kernel
  // would refuse an empty ruleset with ENOMSG), and for any other kernel refusal.
  [[nodiscard]] static Result<LandlockRuleset> create(LandlockSpec const& spec);

  // Allows `access` beneath the file or directory open at `path_fd` (an O_PATH fd is fine; the
  // rule follows the inode, so the caller resolves the path safely before). `access` must be a
  // subset of the ruleset's handled_fs: a bit it does not handle is a bug in the caller, refused
  // with sys.error (EINVAL, as the kernel would). For a non-directory only the file accesses
  // apply (landlock_fs::file_accesses): the others are masked out rather than refused, since
  // "everything below this path" of a file is just the file. An access that is empty (after
  // masking) adds no rule and succeeds: allowing nothing is what the ruleset already does.
  // Errors: sys.error (fstat of path_fd: EBADF; landlock_add_rule: EBADF, ENOMEM, ...).
  [[nodiscard]] Result<void> allow_path(int path_fd, std::uint64_t access);

  // Allows TCP connect to / bind on `port`. Errors: sys.error with EINVAL when the ruleset does
  // not handle that access (handle_tcp_connect / handle_tcp_bind), or the kernel's refusal.
  [[nodiscard]] Result<void> allow_tcp_connect(std::uint16_t port);
  [[nodiscard]] Result<void> allow_tcp_bind(std::uint16_t port);

  [[nodiscard]] UniqueFd const& fd() const noexcept { return fd_; }
  [[nodiscard]] LandlockSpec const& spec() const noexcept { return spec_; }
  // The kernel's ABI the ruleset was created under.
  [[nodiscard]] int abi() const noexcept { return abi_; }

 private:
  LandlockRuleset(UniqueFd fd, LandlockSpec const& spec, int abi) noexcept
      : fd_(std::move(fd)), spec_(spec), abi_(abi) {}

  [[nodiscard]] Result<void> allow_port(std::uint64_t access, std::uint16_t port);

  UniqueFd fd_;
  LandlockSpec spec_;
  int abi_ = 0;
};

}  // namespace custos::sys
