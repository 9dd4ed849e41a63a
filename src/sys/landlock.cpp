#include "custos/sys/landlock.hpp"

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <string>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace custos::sys {
namespace {

// The kernel's UAPI (include/uapi/linux/landlock.h), spelled here so an older installed header
// does not limit what the daemon can ask of a newer kernel.
struct RulesetAttr {
  std::uint64_t handled_access_fs;
  std::uint64_t handled_access_net;  // ABI 4
  std::uint64_t scoped;              // ABI 6
};
struct __attribute__((packed)) PathBeneathAttr {
  std::uint64_t allowed_access;
  std::int32_t parent_fd;
};
struct NetPortAttr {
  std::uint64_t allowed_access;
  std::uint64_t port;
};
constexpr unsigned kCreateRulesetVersion = 1U << 0;
constexpr int kRulePathBeneath = 1;
constexpr int kRuleNetPort = 2;
constexpr std::uint64_t kNetBindTcp = 1ULL << 0;
constexpr std::uint64_t kNetConnectTcp = 1ULL << 1;
constexpr std::uint64_t kScopeAbstractUnix = 1ULL << 0;
constexpr std::uint64_t kScopeSignal = 1ULL << 1;
constexpr int kAbiNet = 4;
constexpr int kAbiScope = 6;

std::string hex(std::uint64_t bits) {
  char buf[16];
  auto const end = std::to_chars(buf, buf + sizeof buf, bits, 16).ptr;
  return "0x" + std::string(buf, end);
}

}  // namespace

int landlock_abi() noexcept {
  static int const abi = [] {
    long const v = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
    return v > 0 ? static_cast<int>(v) : 0;
  }();
  return abi;
}

std::uint64_t landlock_fs_handled(int abi) noexcept {
  if (abi <= 0) return 0;
  std::uint64_t bits = (1ULL << 13) - 1;  // ABI 1: execute .. make_sym
  if (abi >= 2) bits |= landlock_fs::refer;
  if (abi >= 3) bits |= landlock_fs::truncate;
  if (abi >= 5) bits |= landlock_fs::ioctl_dev;
  return bits;
}

Result<LandlockRuleset> LandlockRuleset::create(LandlockSpec const& spec) {
  int const abi = landlock_abi();
  if (abi == 0) return Error(Errc::sys_unsupported, "Landlock is absent or disabled", ENOSYS);
  if (std::uint64_t const extra = spec.handled_fs & ~landlock_fs_handled(abi); extra != 0) {
    return Error(Errc::sys_unsupported, "Landlock ABI " + std::to_string(abi) +
                                            " does not handle filesystem access " + hex(extra));
  }
  bool const net = spec.handle_tcp_bind || spec.handle_tcp_connect;
  if (net && abi < kAbiNet) {
    return Error(Errc::sys_unsupported,
                 "Landlock ABI " + std::to_string(abi) + " cannot restrict TCP (needs ABI 4)");
  }
  bool const scoped = spec.scope_abstract_unix || spec.scope_signal;
  if (scoped && abi < kAbiScope) {
    return Error(Errc::sys_unsupported,
                 "Landlock ABI " + std::to_string(abi) + " has no scopes (needs ABI 6)");
  }
  if (spec.handled_fs == 0 && !net && !scoped) {
    return Error(Errc::sys_error, "Landlock ruleset that handles nothing", EINVAL);
  }

  RulesetAttr attr{};
  attr.handled_access_fs = spec.handled_fs;
  attr.handled_access_net =
      (spec.handle_tcp_bind ? kNetBindTcp : 0) | (spec.handle_tcp_connect ? kNetConnectTcp : 0);
  attr.scoped =
      (spec.scope_abstract_unix ? kScopeAbstractUnix : 0) | (spec.scope_signal ? kScopeSignal : 0);
  // The size passed is the shortest that carries every field in use: an older kernel accepts a
  // larger struct only when the unknown tail is zero, and a shorter one is always understood.
  std::size_t size = sizeof attr.handled_access_fs;
  if (net) size = offsetof(RulesetAttr, handled_access_net) + sizeof attr.handled_access_net;
  if (scoped) size = sizeof attr;
  long const fd = ::syscall(SYS_landlock_create_ruleset, &attr, size, 0U);
  if (fd < 0) {
    int const err = errno;
    if (err == ENOSYS || err == EOPNOTSUPP) {
      return Error(Errc::sys_unsupported, "landlock_create_ruleset", err);
    }
    return Error(Errc::sys_error, "landlock_create_ruleset", err);
  }
  return LandlockRuleset(UniqueFd(static_cast<int>(fd)), spec, abi);
}

Result<void> LandlockRuleset::allow_path(int path_fd, std::uint64_t access) {
  if (std::uint64_t const extra = access & ~spec_.handled_fs; extra != 0) {
    return Error(Errc::sys_error,
                 "Landlock path rule allows access the ruleset does not handle: " + hex(extra),
                 EINVAL);
  }
  struct stat st {};
  if (::fstat(path_fd, &st) != 0) return Error(Errc::sys_error, "fstat of a Landlock path", errno);
  if (!S_ISDIR(st.st_mode)) access &= landlock_fs::file_accesses;
  if (access == 0) return ok();
  PathBeneathAttr const attr{access, path_fd};
  if (::syscall(SYS_landlock_add_rule, fd_.get(), kRulePathBeneath, &attr, 0U) != 0) {
    return Error(Errc::sys_error, "landlock_add_rule(path_beneath, " + hex(access) + ")", errno);
  }
  return ok();
}

Result<void> LandlockRuleset::allow_tcp_connect(std::uint16_t port) {
  if (!spec_.handle_tcp_connect) {
    return Error(Errc::sys_error, "Landlock ruleset does not handle TCP connect", EINVAL);
  }
  return allow_port(kNetConnectTcp, port);
}

Result<void> LandlockRuleset::allow_tcp_bind(std::uint16_t port) {
  if (!spec_.handle_tcp_bind) {
    return Error(Errc::sys_error, "Landlock ruleset does not handle TCP bind", EINVAL);
  }
  return allow_port(kNetBindTcp, port);
}

Result<void> LandlockRuleset::allow_port(std::uint64_t access, std::uint16_t port) {
  NetPortAttr const attr{access, port};
  if (::syscall(SYS_landlock_add_rule, fd_.get(), kRuleNetPort, &attr, 0U) != 0) {
    return Error(Errc::sys_error, "landlock_add_rule(net_port " + std::to_string(port) + ")",
                 errno);
  }
  return ok();
}

}  // namespace custos::sys
