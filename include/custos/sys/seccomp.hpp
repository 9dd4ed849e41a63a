// Seccomp filters for sandboxed executions, built in the daemon as plain BPF data.
//
// libseccomp compiles a policy once (per distinct policy, cached); the program is exported as
// raw instructions, so the staged child only calls prctl(PR_SET_NO_NEW_PRIVS) and
// seccomp(SECCOMP_SET_MODE_FILTER, flags, fprog()) between clone3 and execve — no libseccomp,
// no allocation there.
//
// Every program: x86_64 only. A system call made through another ABI (i386 through int 0x80,
// x32 with __X32_SYSCALL_BIT) kills the whole process (SECCOMP_RET_KILL_PROCESS), so no
// restriction below can be sidestepped by switching ABI. Unlisted calls are allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <linux/filter.h>
#include <memory>
#include <vector>

#include "custos/core/result.hpp"

namespace custos::sys {

struct SeccompPolicy {
  // Process creation refused, threads allowed: fork, vfork, and clone without CLONE_THREAD kill
  // the whole process (SECCOMP_RET_KILL_PROCESS, so the supervisor sees SIGSYS); clone3 always
  // answers ENOSYS (its flags live in memory seccomp cannot read; glibc then falls back to
  // clone, whose flags it can).
  bool deny_process_creation = false;
  // unshare/clone with CLONE_NEWUSER refused (EPERM) — the only way an unprivileged process
  // gains capabilities; setns refused (EPERM) too. clone3 answers ENOSYS whenever any clone rule
  // is needed. (With deny_process_creation a clone without CLONE_THREAD already kills, and the
  // kernel refuses CLONE_THREAD|CLONE_NEWUSER itself.)
  bool deny_new_user_namespace = false;
  enum class Sockets : std::uint8_t { any, unix_and_tcp_only };
  // unix_and_tcp_only: socket()/socketpair() allowed for AF_UNIX (any type) and
  // AF_INET/AF_INET6 with type SOCK_STREAM (SOCK_NONBLOCK|SOCK_CLOEXEC ignored) and protocol 0 or
  // IPPROTO_TCP; anything else EACCES (UDP, raw, netlink, packet, MPTCP, ...). A domain or
  // protocol with stray upper 32 bits (which the kernel would drop) is refused too.
  Sockets sockets = Sockets::any;
  // bind() and listen() refused with EACCES for every socket.
  bool deny_bind_listen = false;
  // Always refused with EPERM, whatever the policy (seccomp_always_denied() lists them):
  // calls a sandboxed program never needs that reach beyond its namespaces — keyctl, add_key,
  // request_key, bpf, perf_event_open, userfaultfd, kexec_load, kexec_file_load, init_module,
  // finit_module, delete_module, mount, umount2, pivot_root, move_mount, open_tree,
  // open_tree_attr, fsopen, fsmount, fsconfig, fspick, mount_setattr, swapon, swapoff, reboot —
  // and io_uring_setup, io_uring_enter, io_uring_register: io_uring performs socket, bind,
  // listen and more without passing through the system call filter. ptrace stays allowed
  // (debuggers within the own tree; the PID namespace confines it).
  auto operator<=>(SeccompPolicy const&) const = default;
};

// A BPF program ready for seccomp(SECCOMP_SET_MODE_FILTER). Immutable; fprog() points into the
// object, so it is neither copied nor moved (it lives behind a shared_ptr).
class SeccompProgram {
 public:
  explicit SeccompProgram(std::vector<sock_filter> instructions);
  SeccompProgram(SeccompProgram const&) = delete;
  SeccompProgram& operator=(SeccompProgram const&) = delete;

  // Points into this object; valid while it lives.
  [[nodiscard]] struct sock_fprog const* fprog() const noexcept { return &fprog_; }
  // The number of instructions.
  [[nodiscard]] std::size_t size() const noexcept { return instructions_.size(); }
  [[nodiscard]] std::vector<sock_filter> const& instructions() const noexcept {
    return instructions_;
  }

 private:
  std::vector<sock_filter> instructions_;
  sock_fprog fprog_{};
};

// The names of the calls every program refuses with EPERM (the list above), in a fixed order.
[[nodiscard]] std::vector<char const*> const& seccomp_always_denied();

// Built once per distinct policy and cached (thread-safe): the daemon launches many sandboxes
// with few policies. Errors: sys.error (a libseccomp failure, with its errno; an export that is
// not a whole number of instructions).
[[nodiscard]] Result<std::shared_ptr<SeccompProgram const>> seccomp_program(
    SeccompPolicy const& policy);

}  // namespace custos::sys
