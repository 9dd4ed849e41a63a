// Landlock rulesets against the real kernel: each ruleset is built in the test process (as the
// daemon does) and applied by a forked child with no_new_privs + landlock_restrict_self, which
// then tries one operation and exits with its errno (0: allowed).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "custos/sys/landlock.hpp"

#include "sys/child_util.hpp"
#include "sys/process_fixture.hpp"

namespace custos::sys {
namespace {

namespace fs = std::filesystem;
using testing::errno_of;
using testing::kChildSetupFailed;
using testing::run_in_child;

constexpr std::uint64_t kRead = landlock_fs::read_file | landlock_fs::read_dir;

// The child's status after applying `ruleset` and running `body`.
std::optional<ExitStatus> restricted(LandlockRuleset const& ruleset,
                                     std::function<int()> const& body) {
  int const fd = ruleset.fd().get();
  return run_in_child([fd, &body] {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return kChildSetupFailed;
    if (::syscall(SYS_landlock_restrict_self, fd, 0U) != 0) return kChildSetupFailed + 1;
    return body();
  });
}

int open_errno(std::string const& path, int flags) {
  int const fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

UniqueFd open_path(std::string const& path) {
  return UniqueFd(::open(path.c_str(), O_PATH | O_CLOEXEC));
}

// A TCP listener on 127.0.0.1 at a port the kernel picks.
struct Listener {
  UniqueFd fd;
  std::uint16_t port = 0;
};
Listener tcp_listener() {
  Listener l;
  l.fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (!l.fd.valid() || ::bind(l.fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(l.fd.get(), 4) != 0 ||
      ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return {};
  }
  l.port = ntohs(a.sin_port);
  return l;
}

int tcp_errno(std::uint16_t port, bool bind_instead) {
  int const s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return kChildSetupFailed;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  auto const* addr = reinterpret_cast<sockaddr const*>(&a);
  int const err = errno_of(bind_instead ? ::bind(s, addr, sizeof a) : ::connect(s, addr, sizeof a));
  ::close(s);
  return err;
}

class LandlockTest : public testing::FdLeakTest {
 protected:
  void SetUp() override {
    FdLeakTest::SetUp();
    abi_ = landlock_abi();
    if (abi_ == 0) GTEST_SKIP() << "Landlock is absent or disabled on this kernel";
    std::string tmpl = (fs::temp_directory_path() / "custos-landlock-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    for (char const* d : {"allowed", "outside", "ro", "bin"}) fs::create_directory(root_ / d);
    for (char const* f : {"allowed/a.txt", "outside/b.txt", "ro/c.txt"}) {
      std::ofstream(root_ / f) << "data\n";
    }
    fs::copy_file("/bin/true", root_ / "bin/true");
    fs::permissions(root_ / "bin/true", fs::perms::owner_all);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
    FdLeakTest::TearDown();
  }

  [[nodiscard]] std::string at(char const* rel) const { return (root_ / rel).string(); }

  // A ruleset handling every filesystem access of this ABI.
  [[nodiscard]] LandlockRuleset fs_ruleset() const {
    auto r = LandlockRuleset::create({.handled_fs = landlock_fs_handled(abi_)});
    if (!r) ADD_FAILURE() << r.error().message();
    return std::move(r).value();  // terminates the test binary on an error: a kernel refusal
  }

  void allow(LandlockRuleset& r, std::string const& path, std::uint64_t access) const {
    UniqueFd const fd = open_path(path);
    ASSERT_TRUE(fd.valid()) << path;
    auto const a = r.allow_path(fd.get(), access & r.spec().handled_fs);
    ASSERT_TRUE(a) << a.error().message();
  }

  int abi_ = 0;
  fs::path root_;
};

TEST_F(LandlockTest, HandledBitsFollowTheAbi) {
  EXPECT_EQ(landlock_fs_handled(0), 0U);
  EXPECT_EQ(landlock_fs_handled(1), 0x1fffU);
  EXPECT_EQ(landlock_fs_handled(2), 0x1fffU | landlock_fs::refer);
  EXPECT_EQ(landlock_fs_handled(3), landlock_fs_handled(2) | landlock_fs::truncate);
  EXPECT_EQ(landlock_fs_handled(4), landlock_fs_handled(3));
  EXPECT_EQ(landlock_fs_handled(5), landlock_fs_handled(4) | landlock_fs::ioctl_dev);
  EXPECT_EQ(landlock_fs_handled(7), landlock_fs_handled(5));
  EXPECT_EQ(landlock_abi(), abi_);  // cached, stable
}

TEST_F(LandlockTest, RulesetFdIsCloseOnExec) {
  auto r = fs_ruleset();
  ASSERT_TRUE(r.fd().valid());
  EXPECT_NE(::fcntl(r.fd().get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(r.abi(), abi_);
}

TEST_F(LandlockTest, ReadsOnlyBeneathAnAllowedDirectory) {
  auto r = fs_ruleset();
  allow(r, at("allowed"), kRead);
  std::string const inside = at("allowed/a.txt");
  std::string const outside = at("outside/b.txt");
  EXPECT_EQ(restricted(r, [&] { return open_errno(inside, O_RDONLY); }), ExitStatus::exited(0));
  EXPECT_EQ(restricted(r, [&] { return open_errno(outside, O_RDONLY); }),
            ExitStatus::exited(EACCES));
}

TEST_F(LandlockTest, WriteUnderReadOnlyDirectoryIsDenied) {
  auto r = fs_ruleset();
  allow(r, at("ro"), kRead);
  std::string const file = at("ro/c.txt");
  EXPECT_EQ(restricted(r, [&] { return open_errno(file, O_RDONLY); }), ExitStatus::exited(0));
  EXPECT_EQ(restricted(r, [&] { return open_errno(file, O_WRONLY); }), ExitStatus::exited(EACCES));
}

TEST_F(LandlockTest, ExecuteIsDistinctFromRead) {
  // The loader and libraries: read and execute under /usr (lib, lib64 and bin link there) and
  // /etc (ld.so.cache).
  std::uint64_t const system = kRead | landlock_fs::execute;
  std::string const prog = at("bin/true");
  auto const exec = [&] {
    char* const argv[] = {const_cast<char*>("true"), nullptr};
    char* const envp[] = {nullptr};
    ::execve(prog.c_str(), argv, envp);
    return errno;
  };
  {
    auto r = fs_ruleset();
    allow(r, "/usr", system);
    allow(r, "/etc", kRead);
    allow(r, at("bin"), kRead);
    EXPECT_EQ(restricted(r, [&] { return open_errno(prog, O_RDONLY); }), ExitStatus::exited(0));
    EXPECT_EQ(restricted(r, exec), ExitStatus::exited(EACCES));
  }
  {
    auto r = fs_ruleset();
    allow(r, "/usr", system);
    allow(r, "/etc", kRead);
    allow(r, at("bin"), kRead | landlock_fs::execute);
    EXPECT_EQ(restricted(r, exec), ExitStatus::exited(0));  // /bin/true ran and exited 0
  }
}

TEST_F(LandlockTest, CreatingAFileNeedsMakeRegNotWriteFile) {
  std::uint64_t const rw = kRead | landlock_fs::write_file;
  std::string const existing = at("allowed/a.txt");
  std::string const fresh = at("allowed/new.txt");
  {
    auto r = fs_ruleset();
    allow(r, at("allowed"), rw);
    EXPECT_EQ(restricted(r, [&] { return open_errno(existing, O_WRONLY); }), ExitStatus::exited(0));
    EXPECT_EQ(restricted(r, [&] { return open_errno(fresh, O_WRONLY | O_CREAT | O_EXCL); }),
              ExitStatus::exited(EACCES));
    EXPECT_FALSE(fs::exists(fresh));
  }
  {
    auto r = fs_ruleset();
    allow(r, at("allowed"), rw | landlock_fs::make_reg);
    EXPECT_EQ(restricted(r, [&] { return open_errno(fresh, O_WRONLY | O_CREAT | O_EXCL); }),
              ExitStatus::exited(0));
    EXPECT_TRUE(fs::exists(fresh));
  }
}

TEST_F(LandlockTest, FileRuleMasksDirectoryAccesses) {
  auto r = fs_ruleset();
  UniqueFd const file = open_path(at("outside/b.txt"));
  ASSERT_TRUE(file.valid());
  // read_dir and make_reg mean nothing on a file: masked, not refused with EINVAL.
  auto const a = r.allow_path(file.get(), kRead | landlock_fs::make_reg);
  ASSERT_TRUE(a) << a.error().message();
  // Allowing nothing adds no rule and is not an error.
  EXPECT_TRUE(r.allow_path(file.get(), 0));
  std::string const allowed = at("outside/b.txt");
  std::string const sibling = at("allowed/a.txt");
  EXPECT_EQ(restricted(r, [&] { return open_errno(allowed, O_RDONLY); }), ExitStatus::exited(0));
  EXPECT_EQ(restricted(r, [&] { return open_errno(allowed, O_WRONLY); }),
            ExitStatus::exited(EACCES));
  EXPECT_EQ(restricted(r, [&] { return open_errno(sibling, O_RDONLY); }),
            ExitStatus::exited(EACCES));
}

TEST_F(LandlockTest, RefusesWhatTheSpecOrTheAbiCannotExpress) {
  auto empty = LandlockRuleset::create({});
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, Errc::sys_error);
  EXPECT_EQ(empty.error().sys_errno, EINVAL);

  auto unknown = LandlockRuleset::create({.handled_fs = 1ULL << 40});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::sys_unsupported);

  auto r = LandlockRuleset::create({.handled_fs = kRead});
  ASSERT_TRUE(r);
  UniqueFd const dir = open_path(at("allowed"));
  auto const unhandled = r->allow_path(dir.get(), kRead | landlock_fs::write_file);
  ASSERT_FALSE(unhandled);
  EXPECT_EQ(unhandled.error().code, Errc::sys_error);
  EXPECT_EQ(unhandled.error().sys_errno, EINVAL);
  auto const bad_fd = r->allow_path(-1, kRead);
  ASSERT_FALSE(bad_fd);
  EXPECT_EQ(bad_fd.error().code, Errc::sys_error);
  EXPECT_EQ(bad_fd.error().sys_errno, EBADF);
  auto const net = r->allow_tcp_connect(80);
  ASSERT_FALSE(net);
  EXPECT_EQ(net.error().code, Errc::sys_error);
  EXPECT_EQ(net.error().sys_errno, EINVAL);
  EXPECT_FALSE(r->allow_tcp_bind(80));
}

TEST_F(LandlockTest, TcpConnectOnlyToAllowedPorts) {
  if (abi_ < 4) GTEST_SKIP() << "Landlock ABI " << abi_ << " has no TCP rules (needs 4)";
  Listener const allowed = tcp_listener();
  Listener const other = tcp_listener();
  ASSERT_TRUE(allowed.fd.valid() && other.fd.valid());
  auto r = LandlockRuleset::create({.handle_tcp_connect = true});
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(r->allow_tcp_connect(allowed.port));
  EXPECT_EQ(restricted(*r, [&] { return tcp_errno(allowed.port, false); }), ExitStatus::exited(0));
  EXPECT_EQ(restricted(*r, [&] { return tcp_errno(other.port, false); }),
            ExitStatus::exited(EACCES));
}

TEST_F(LandlockTest, TcpBindDeniedWithoutARule) {
  if (abi_ < 4) GTEST_SKIP() << "Landlock ABI " << abi_ << " has no TCP rules (needs 4)";
  Listener const busy = tcp_listener();
  ASSERT_TRUE(busy.fd.valid());
  auto denied = LandlockRuleset::create({.handle_tcp_bind = true});
  ASSERT_TRUE(denied);
  EXPECT_EQ(restricted(*denied, [&] { return tcp_errno(busy.port, true); }),
            ExitStatus::exited(EACCES));
  // With a rule, Landlock lets the bind through to the kernel, which finds the port taken.
  auto allowed = LandlockRuleset::create({.handle_tcp_bind = true});
  ASSERT_TRUE(allowed);
  ASSERT_TRUE(allowed->allow_tcp_bind(busy.port));
  EXPECT_EQ(restricted(*allowed, [&] { return tcp_errno(busy.port, true); }),
            ExitStatus::exited(EADDRINUSE));
}

TEST_F(LandlockTest, AbstractUnixScopeRefusesSocketsFromOutside) {
  if (abi_ < 6) GTEST_SKIP() << "Landlock ABI " << abi_ << " has no scopes (needs 6)";
  UniqueFd const listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string const name = "custos-landlock-test-" + std::to_string(::getpid());
  std::copy(name.begin(), name.end(), addr.sun_path + 1);  // sun_path[0] == 0: abstract
  auto const len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  auto const connect_errno = [&] {
    int const s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int const err = errno_of(::connect(s, reinterpret_cast<sockaddr const*>(&addr), len));
    ::close(s);
    return err;
  };
  auto scoped = LandlockRuleset::create({.scope_abstract_unix = true});
  ASSERT_TRUE(scoped) << scoped.error().message();
  EXPECT_EQ(restricted(*scoped, connect_errno), ExitStatus::exited(EPERM));
  auto unscoped = LandlockRuleset::create({.scope_signal = true});
  ASSERT_TRUE(unscoped);
  EXPECT_EQ(restricted(*unscoped, connect_errno), ExitStatus::exited(0));
}

TEST_F(LandlockTest, SignalScopeRefusesProcessesOutside) {
  if (abi_ < 6) GTEST_SKIP() << "Landlock ABI " << abi_ << " has no scopes (needs 6)";
  pid_t const sleeper = ::fork();
  ASSERT_GE(sleeper, 0);
  if (sleeper == 0) {
    for (;;) ::pause();
  }
  auto pfd = Pidfd::open(sleeper);
  ASSERT_TRUE(pfd);
  auto scoped = LandlockRuleset::create({.scope_signal = true});
  auto unscoped = LandlockRuleset::create({.scope_abstract_unix = true});
  ASSERT_TRUE(scoped && unscoped);
  EXPECT_EQ(restricted(*scoped, [&] { return errno_of(::kill(sleeper, SIGTERM)); }),
            ExitStatus::exited(EPERM));
  // Its own process stays reachable.
  EXPECT_EQ(restricted(*scoped, [] { return errno_of(::kill(::getpid(), 0)); }),
            ExitStatus::exited(0));
  EXPECT_EQ(restricted(*unscoped, [&] { return errno_of(::kill(sleeper, 0)); }),
            ExitStatus::exited(0));
  EXPECT_TRUE(pfd->alive());
  ASSERT_TRUE(pfd->send_signal(SIGKILL));
  auto const st = pfd->wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, ExitStatus::signaled(SIGKILL));
}

}  // namespace
}  // namespace custos::sys
