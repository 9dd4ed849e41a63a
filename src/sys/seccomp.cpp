#include "custos/sys/seccomp.hpp"

#include <seccomp.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <netinet/in.h>
#include <sched.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "custos/sys/unique_fd.hpp"

namespace custos::sys {
namespace {

// open_tree_attr (Linux 6.15) is newer than libseccomp 2.5 knows: its x86_64 number.
constexpr int kOpenTreeAttrX86_64 = 467;

struct DeniedCall {
  char const* name;
  int nr;
};

std::vector<DeniedCall> const& always_denied_calls() {
  static std::vector<DeniedCall> const calls = {
      {"keyctl", SCMP_SYS(keyctl)},
      {"add_key", SCMP_SYS(add_key)},
      {"request_key", SCMP_SYS(request_key)},
      {"bpf", SCMP_SYS(bpf)},
      {"perf_event_open", SCMP_SYS(perf_event_open)},
      {"userfaultfd", SCMP_SYS(userfaultfd)},
      {"kexec_load", SCMP_SYS(kexec_load)},
      {"kexec_file_load", SCMP_SYS(kexec_file_load)},
      {"init_module", SCMP_SYS(init_module)},
      {"finit_module", SCMP_SYS(finit_module)},
      {"delete_module", SCMP_SYS(delete_module)},
      {"mount", SCMP_SYS(mount)},
      {"umount2", SCMP_SYS(umount2)},
      {"pivot_root", SCMP_SYS(pivot_root)},
      {"move_mount", SCMP_SYS(move_mount)},
      {"open_tree", SCMP_SYS(open_tree)},
      {"open_tree_attr", kOpenTreeAttrX86_64},
      {"fsopen", SCMP_SYS(fsopen)},
      {"fsmount", SCMP_SYS(fsmount)},
      {"fsconfig", SCMP_SYS(fsconfig)},
      {"fspick", SCMP_SYS(fspick)},
      {"mount_setattr", SCMP_SYS(mount_setattr)},
      {"swapon", SCMP_SYS(swapon)},
      {"swapoff", SCMP_SYS(swapoff)},
      {"reboot", SCMP_SYS(reboot)},
      {"io_uring_setup", SCMP_SYS(io_uring_setup)},
      {"io_uring_enter", SCMP_SYS(io_uring_enter)},
      {"io_uring_register", SCMP_SYS(io_uring_register)},
  };
  return calls;
}

// The filter context, released on every path.
class Filter {
 public:
  Filter() : ctx_(::seccomp_init(SCMP_ACT_ALLOW)) {}
  ~Filter() {
    if (ctx_ != nullptr) ::seccomp_release(ctx_);
  }
  Filter(Filter const&) = delete;
  Filter& operator=(Filter const&) = delete;
  [[nodiscard]] scmp_filter_ctx get() const noexcept { return ctx_; }

 private:
  scmp_filter_ctx ctx_;
};

// libseccomp returns -errno.
Result<void> check(int rc, std::string const& what) {
  if (rc < 0) return Error(Errc::sys_error, "libseccomp: " + what, -rc);
  return ok();
}

template <typename... Cmp>
Result<void> rule(Filter const& f, std::uint32_t action, int nr, std::string const& what,
                  Cmp... cmp) {
  return check(::seccomp_rule_add(f.get(), action, nr, sizeof...(Cmp), cmp...), what);
}

Result<void> add_process_rules(Filter const& f, SeccompPolicy const& p) {
  if (p.deny_process_creation) {
    CUSTOS_TRYV(rule(f, SCMP_ACT_KILL_PROCESS, SCMP_SYS(fork), "fork"));
    CUSTOS_TRYV(rule(f, SCMP_ACT_KILL_PROCESS, SCMP_SYS(vfork), "vfork"));
    // The kernel reads clone's flags as their low 32 bits.
    CUSTOS_TRYV(rule(f, SCMP_ACT_KILL_PROCESS, SCMP_SYS(clone), "clone without CLONE_THREAD",
                     SCMP_A0_32(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)));
  } else if (p.deny_new_user_namespace) {
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), "clone with CLONE_NEWUSER",
                     SCMP_A0_32(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)));
  }
  if (p.deny_process_creation || p.deny_new_user_namespace) {
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), "clone3"));
  }
  if (p.deny_new_user_namespace) {
    // unshare's flags are a full unsigned long: a high bit is EINVAL, so the 64-bit mask is exact.
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), "unshare with CLONE_NEWUSER",
                     SCMP_A0_64(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)));
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), "setns"));
  }
  return ok();
}

// socket(domain, type, protocol) and socketpair(...) outside AF_UNIX and TCP: the default action
// is allow, so the refusal is written as rules that match exactly the complement (all of them
// EACCES, so overlaps cannot conflict). The kernel reads the three as ints, libseccomp compares
// 64 bits: a value with upper bits set matches a "greater than" rule and is refused, which only
// errs on the side of refusal (glibc passes ints sign-extended, so real callers never do).
Result<void> add_socket_rules(Filter const& f, int nr, std::string const& name) {
  auto const deny = SCMP_ACT_ERRNO(EACCES);
  // Domains other than AF_UNIX (1), AF_INET (2), AF_INET6 (10).
  static_assert(AF_UNIX == 1 && AF_INET == 2 && AF_INET6 == 10);
  CUSTOS_TRYV(rule(f, deny, nr, name + " domain 0", SCMP_A0_32(SCMP_CMP_EQ, 0)));
  for (std::uint32_t d = 3; d < 10; ++d) {
    CUSTOS_TRYV(rule(f, deny, nr, name + " domain", SCMP_A0_32(SCMP_CMP_EQ, d)));
  }
  CUSTOS_TRYV(rule(f, deny, nr, name + " domain > AF_INET6", SCMP_A0_32(SCMP_CMP_GT, 10)));
  for (std::uint32_t const family : {std::uint32_t{AF_INET}, std::uint32_t{AF_INET6}}) {
    // The type is the low 4 bits (SOCK_TYPE_MASK); any other flag than SOCK_NONBLOCK and
    // SOCK_CLOEXEC is EINVAL in the kernel, so only the type needs checking.
    for (std::uint32_t type = 0; type < 16; ++type) {
      if (type == SOCK_STREAM) continue;
      CUSTOS_TRYV(rule(f, deny, nr, name + " inet type", SCMP_A0_32(SCMP_CMP_EQ, family),
                       SCMP_A1_32(SCMP_CMP_MASKED_EQ, 0xf, type)));
    }
    // Protocols other than 0 and IPPROTO_TCP (6): 1..5 and above 6.
    static_assert(IPPROTO_TCP == 6);
    for (std::uint32_t proto = 1; proto < IPPROTO_TCP; ++proto) {
      CUSTOS_TRYV(rule(f, deny, nr, name + " inet protocol", SCMP_A0_32(SCMP_CMP_EQ, family),
                       SCMP_A2_32(SCMP_CMP_EQ, proto)));
    }
    CUSTOS_TRYV(rule(f, deny, nr, name + " inet protocol", SCMP_A0_32(SCMP_CMP_EQ, family),
                     SCMP_A2_32(SCMP_CMP_GT, IPPROTO_TCP)));
  }
  return ok();
}

Result<std::vector<sock_filter>> export_bpf(Filter const& f) {
  int const raw = ::memfd_create("custos-seccomp", MFD_CLOEXEC);
  if (raw < 0) return Error(Errc::sys_error, "memfd_create for the seccomp export", errno);
  UniqueFd const memfd(raw);
  CUSTOS_TRYV(check(::seccomp_export_bpf(f.get(), memfd.get()), "seccomp_export_bpf"));
  off_t const end = ::lseek(memfd.get(), 0, SEEK_END);
  if (end < 0) return Error(Errc::sys_error, "lseek on the seccomp export", errno);
  auto const bytes = static_cast<std::size_t>(end);
  if (bytes == 0 || bytes % sizeof(sock_filter) != 0) {
    return Error(Errc::sys_error,
                 "seccomp export of " + std::to_string(bytes) + " bytes is not a BPF program");
  }
  std::vector<sock_filter> out(bytes / sizeof(sock_filter));
  auto* dst = reinterpret_cast<char*>(out.data());
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t const n = ::pread(memfd.get(), dst + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error(Errc::sys_error, "reading the seccomp export", errno);
    if (n == 0) return Error(Errc::sys_error, "seccomp export shorter than announced");
    done += static_cast<std::size_t>(n);
  }
  return out;
}

Result<std::vector<sock_filter>> build(SeccompPolicy const& p) {
  Filter const f;
  if (f.get() == nullptr) return Error(Errc::sys_error, "libseccomp: seccomp_init", ENOMEM);
  // Only the native architecture (x86_64) is in the filter; every other ABI, x32 included, takes
  // the bad-architecture action.
  CUSTOS_TRYV(check(::seccomp_attr_set(f.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS),
                    "bad-architecture action"));
  for (auto const& call : always_denied_calls()) {
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(EPERM), call.nr, call.name));
  }
  CUSTOS_TRYV(add_process_rules(f, p));
  if (p.sockets == SeccompPolicy::Sockets::unix_and_tcp_only) {
    CUSTOS_TRYV(add_socket_rules(f, SCMP_SYS(socket), "socket"));
    CUSTOS_TRYV(add_socket_rules(f, SCMP_SYS(socketpair), "socketpair"));
  }
  if (p.deny_bind_listen) {
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(bind), "bind"));
    CUSTOS_TRYV(rule(f, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(listen), "listen"));
  }
  return export_bpf(f);
}

}  // namespace

SeccompProgram::SeccompProgram(std::vector<sock_filter> instructions)
    : instructions_(std::move(instructions)) {
  fprog_.len = static_cast<unsigned short>(instructions_.size());
  fprog_.filter = instructions_.data();
}

std::vector<char const*> const& seccomp_always_denied() {
  static std::vector<char const*> const names = [] {
    std::vector<char const*> out;
    for (auto const& call : always_denied_calls()) out.push_back(call.name);
    return out;
  }();
  return names;
}

Result<std::shared_ptr<SeccompProgram const>> seccomp_program(SeccompPolicy const& policy) {
  // Never evicted: four switches make at most 16 distinct policies. Built under the lock, so a
  // policy is compiled once even when several launches ask for it at the same moment.
  static std::mutex mutex;
  static std::map<SeccompPolicy, std::shared_ptr<SeccompProgram const>> cache;
  std::lock_guard const lock(mutex);
  if (auto const it = cache.find(policy); it != cache.end()) return it->second;
  auto instructions = CUSTOS_TRY(build(policy));
  // BPF programs are limited to BPF_MAXINSNS (4096) instructions; sock_fprog.len is 16 bits.
  if (instructions.size() > BPF_MAXINSNS) {
    return Error(Errc::sys_error,
                 "seccomp program of " + std::to_string(instructions.size()) + " instructions");
  }
  auto program = std::make_shared<SeccompProgram const>(std::move(instructions));
  cache.emplace(policy, program);
  return program;
}

}  // namespace custos::sys
