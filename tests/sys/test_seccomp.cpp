// Seccomp programs against the real kernel: a forked child sets no_new_privs, loads the program
// with the raw seccomp system call (as the staged child will) and tries one call; it exits with
// that call's errno (0: allowed), or dies of SIGSYS where the program kills.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/sys/seccomp.hpp"

#include "sys/child_util.hpp"
#include "sys/process_fixture.hpp"

extern char** environ;

namespace custos::sys {
namespace {

using testing::errno_of;
using testing::kChildSetupFailed;
using testing::run_in_child;
using Sockets = SeccompPolicy::Sockets;

std::shared_ptr<SeccompProgram const> program(SeccompPolicy const& p) {
  auto r = seccomp_program(p);
  if (!r) ADD_FAILURE() << r.error().message();
  return r ? *r : nullptr;
}

// The child's status after loading `prog` and running `body`. No core file for a SIGSYS kill.
std::optional<ExitStatus> filtered(std::shared_ptr<SeccompProgram const> const& prog,
                                   std::function<int()> const& body) {
  if (!prog) return std::nullopt;
  return run_in_child([&prog, &body] {
    rlimit const no_core{0, 0};
    if (::setrlimit(RLIMIT_CORE, &no_core) != 0) return kChildSetupFailed;
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return kChildSetupFailed;
    if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0U, prog->fprog()) != 0) {
      return kChildSetupFailed + 1;
    }
    return body();
  });
}

bool killed_by_sigsys(std::optional<ExitStatus> const& st) {
  return st && st->signal == SIGSYS;
}

// fork() in the filtered child: a grandchild that exists leaves at once; the result is the
// child's view (0 when a grandchild was created and reaped).
int try_fork() {
  pid_t const pid = ::fork();
  if (pid == 0) ::_exit(0);
  if (pid < 0) return errno;
  ::waitpid(pid, nullptr, 0);
  return 0;
}

int try_socket(int domain, int type, int protocol) {
  int const fd = ::socket(domain, type, protocol);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

TEST(SeccompProgramTest, CachedPerDistinctPolicy) {
  SeccompPolicy const a{.deny_process_creation = true};
  SeccompPolicy const b{.deny_process_creation = true, .sockets = Sockets::unix_and_tcp_only};
  auto const pa = program(a);
  auto const pb = program(b);
  ASSERT_TRUE(pa && pb);
  EXPECT_EQ(program(a), pa);
  EXPECT_EQ(program(SeccompPolicy{.deny_process_creation = true}), pa);
  EXPECT_NE(pb, pa);
  EXPECT_GT(pb->size(), pa->size());
  EXPECT_EQ(pa->fprog()->len, pa->size());
  EXPECT_EQ(pa->fprog()->filter, pa->instructions().data());
  EXPECT_LE(pb->size(), std::size_t{BPF_MAXINSNS});
}

TEST(SeccompProgramTest, AlwaysDeniedListIsDocumented) {
  auto const& names = seccomp_always_denied();
  for (char const* n : {"mount", "keyctl", "bpf", "io_uring_setup", "open_tree_attr", "reboot"}) {
    EXPECT_NE(std::find_if(names.begin(), names.end(),
                           [n](char const* x) { return std::string_view(x) == n; }),
              names.end())
        << n;
  }
  EXPECT_EQ(std::find_if(names.begin(), names.end(),
                         [](char const* x) { return std::string_view(x) == "ptrace"; }),
            names.end());
}

class SeccompTest : public testing::FdLeakTest {};

TEST_F(SeccompTest, ProcessCreationKillsThreadsWork) {
  auto const prog = program({.deny_process_creation = true});
  EXPECT_EQ(filtered(prog,
                     [] {
                       pthread_t t{};
                       int const rc = ::pthread_create(
                           &t, nullptr, [](void*) -> void* { return nullptr; }, nullptr);
                       if (rc != 0) return rc;
                       return ::pthread_join(t, nullptr);
                     }),
            ExitStatus::exited(0));
  EXPECT_TRUE(killed_by_sigsys(filtered(prog, try_fork)));
  EXPECT_TRUE(killed_by_sigsys(filtered(prog, [] {
    long const pid = ::syscall(SYS_fork);
    if (pid == 0) ::_exit(0);
    return errno_of(pid);
  })));
  EXPECT_TRUE(killed_by_sigsys(filtered(prog, [] {
    char* const argv[] = {const_cast<char*>("true"), nullptr};
    pid_t pid = 0;
    int const rc = ::posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, environ);
    if (rc == 0) ::waitpid(pid, nullptr, 0);
    return rc;
  })));
  EXPECT_EQ(filtered(prog,
                     [] {
                       clone_args args{};
                       args.exit_signal = SIGCHLD;
                       long const pid = ::syscall(SYS_clone3, &args, sizeof args);
                       if (pid == 0) ::_exit(0);
                       return errno_of(pid);
                     }),
            ExitStatus::exited(ENOSYS));
  // Without the policy, the same fork works: the kill is the filter's.
  EXPECT_EQ(filtered(program({}), try_fork), ExitStatus::exited(0));
}

TEST_F(SeccompTest, NewUserNamespaceRefused) {
  auto const prog = program({.deny_new_user_namespace = true});
  EXPECT_EQ(filtered(prog, [] { return errno_of(::unshare(CLONE_NEWUSER)); }),
            ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog,
                     [] {
                       long const pid = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
                       if (pid == 0) ::_exit(0);
                       if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
                       return errno_of(pid);
                     }),
            ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog, [] { return errno_of(::setns(-1, 0)); }), ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog,
                     [] {
                       clone_args args{};
                       args.exit_signal = SIGCHLD;
                       long const pid = ::syscall(SYS_clone3, &args, sizeof args);
                       if (pid == 0) ::_exit(0);
                       return errno_of(pid);
                     }),
            ExitStatus::exited(ENOSYS));
  // Other namespaces and plain process creation are not this policy's business.
  EXPECT_EQ(filtered(prog, try_fork), ExitStatus::exited(0));
  EXPECT_EQ(filtered(program({}), [] { return errno_of(::setns(-1, 0)); }),
            ExitStatus::exited(EBADF));
}

TEST_F(SeccompTest, OnlyUnixAndTcpSockets) {
  auto const prog = program({.sockets = Sockets::unix_and_tcp_only});
  auto const sock = [&prog](int domain, int type, int protocol) {
    return filtered(prog, [=] { return try_socket(domain, type, protocol); });
  };
  EXPECT_EQ(sock(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ExitStatus::exited(0));
  EXPECT_EQ(sock(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, IPPROTO_TCP), ExitStatus::exited(0));
  EXPECT_EQ(sock(AF_UNIX, SOCK_STREAM, 0), ExitStatus::exited(0));
  EXPECT_EQ(sock(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), ExitStatus::exited(0));
  EXPECT_NE(sock(AF_INET6, SOCK_STREAM, 0), ExitStatus::exited(EACCES));  // or EAFNOSUPPORT
  EXPECT_EQ(sock(AF_INET, SOCK_DGRAM, 0), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_INET, SOCK_RAW, IPPROTO_ICMP), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_INET, SOCK_STREAM, IPPROTO_SCTP), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_INET, SOCK_STREAM, IPPROTO_UDP), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_NETLINK, SOCK_RAW, 0), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_PACKET, SOCK_RAW, 0), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(AF_UNSPEC, SOCK_STREAM, 0), ExitStatus::exited(EACCES));
  EXPECT_EQ(sock(-1, SOCK_STREAM, 0), ExitStatus::exited(EACCES));
  auto const pair = [&prog](int domain) {
    return filtered(prog, [=] {
      int sv[2];
      if (::socketpair(domain, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return errno;
      ::close(sv[0]);
      ::close(sv[1]);
      return 0;
    });
  };
  EXPECT_EQ(pair(AF_UNIX), ExitStatus::exited(0));
  EXPECT_EQ(pair(AF_NETLINK), ExitStatus::exited(EACCES));
  // Without the restriction the kernel answers for itself (UDP works).
  EXPECT_EQ(filtered(program({}), [] { return try_socket(AF_INET, SOCK_DGRAM, 0); }),
            ExitStatus::exited(0));
}

TEST_F(SeccompTest, BindAndListenRefused) {
  auto const prog = program({.deny_bind_listen = true});
  auto const bind_unix = [](bool then_listen) {
    int const s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return kChildSetupFailed;
    // Autobind (an address of only the family) picks an unused abstract name.
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    int err = errno_of(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(sa_family_t)));
    if (then_listen) err = errno_of(::listen(s, 1));
    ::close(s);
    return err;
  };
  EXPECT_EQ(filtered(prog, [&] { return bind_unix(false); }), ExitStatus::exited(EACCES));
  EXPECT_EQ(filtered(prog, [&] { return bind_unix(true); }), ExitStatus::exited(EACCES));
  EXPECT_EQ(filtered(program({}), [&] { return bind_unix(true); }), ExitStatus::exited(0));
}

TEST_F(SeccompTest, CallsBeyondTheNamespacesAreAlwaysRefused) {
  auto const prog = program({});
  EXPECT_EQ(filtered(prog, [] { return errno_of(::mount("none", "/tmp", "tmpfs", 0, nullptr)); }),
            ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog, [] { return errno_of(::syscall(SYS_keyctl, 0, 0, 0, 0, 0)); }),
            ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog, [] { return errno_of(::syscall(SYS_bpf, 0, nullptr, 0)); }),
            ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog, [] { return errno_of(::syscall(SYS_io_uring_setup, 1, nullptr)); }),
            ExitStatus::exited(EPERM));
  EXPECT_EQ(filtered(prog, [] { return errno_of(::syscall(467, -1, nullptr, 0, nullptr, 0)); }),
            ExitStatus::exited(EPERM));  // open_tree_attr
  // ptrace stays allowed: the kernel answers (ESRCH for a pid that is not a tracee).
  EXPECT_EQ(filtered(prog, [] { return errno_of(::syscall(SYS_ptrace, PTRACE_CONT, 1, 0, 0)); }),
            ExitStatus::exited(ESRCH));
}

TEST_F(SeccompTest, OtherSyscallAbisKillTheProcess) {
  auto const prog = program({});
  // x32: the x86_64 entry with __X32_SYSCALL_BIT (0x40000000) set; getpid is 39 there.
  EXPECT_TRUE(
      killed_by_sigsys(filtered(prog, [] { return errno_of(::syscall(0x40000000L | 39)); })));
  // Without the filter the same call is the kernel's (ENOSYS where x32 is not built in).
  auto const bare = run_in_child([] {
    long const r = ::syscall(0x40000000L | 39);
    return r < 0 ? errno : 0;
  });
  EXPECT_TRUE(bare && bare->code.has_value());
}

// i386 through int 0x80 (getpid is 20 there), where the kernel has IA-32 emulation.
long int80_getpid() {
  long r = 0;
  asm volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
  return r;
}

TEST_F(SeccompTest, I386AbiKillsTheProcess) {
  auto const bare = run_in_child([] { return int80_getpid() > 0 ? 0 : 1; });
  if (bare != ExitStatus::exited(0)) GTEST_SKIP() << "no IA-32 emulation on this kernel";
  EXPECT_TRUE(killed_by_sigsys(filtered(program({}), [] { return int80_getpid() > 0 ? 0 : 1; })));
}

}  // namespace
}  // namespace custos::sys
