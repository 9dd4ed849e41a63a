#include <chrono>
#include <fcntl.h>
#include <poll.h>
#include <string>
#include <unistd.h>

#include "custos/sys/pty.hpp"
#include "custos/sys/spawn.hpp"

#include "sys/process_fixture.hpp"
#include "sys/process_util.hpp"

namespace custos::sys {
namespace {

using testing::FdLeakTest;
using testing::simple_spec;

class PtyTest : public FdLeakTest {};

// Reads the (non-blocking) master until `needle` has appeared, EIO/EOF, or the deadline.
bool read_until(UniqueFd const& master, std::string& seen, std::string const& needle,
                std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  char buf[1024];
  while (seen.find(needle) == std::string::npos) {
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{master.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t const n = ::read(master.get(), buf, sizeof buf);
    if (n > 0) {
      seen.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      return seen.find(needle) != std::string::npos;  // EIO: every slave user is gone
    }
  }
  return true;
}

TEST_F(PtyTest, OpenSetsSizeAndNonBlockingMaster) {
  auto pty = Pty::open(24, 80);
  ASSERT_TRUE(pty) << pty.error().message();
  EXPECT_TRUE(::fcntl(pty->master().get(), F_GETFL) & O_NONBLOCK);
  EXPECT_EQ(::fcntl(pty->master().get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(::fcntl(pty->slave().get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_TRUE(::isatty(pty->slave().get()));
  auto sz = pty->size();
  ASSERT_TRUE(sz);
  EXPECT_EQ(*sz, (WindowSize{24, 80}));
  ASSERT_TRUE(pty->resize(50, 132));
  EXPECT_EQ(*pty->size(), (WindowSize{50, 132}));
  auto bad = pty->resize(0, 10);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::pty_failed);
  auto bad_open = Pty::open(0, 80);
  ASSERT_FALSE(bad_open);
  EXPECT_EQ(bad_open.error().code, Errc::pty_failed);
}

TEST_F(PtyTest, ChildHasControllingTtyAndSeesResize) {
  auto pty = Pty::open(24, 80);
  ASSERT_TRUE(pty) << pty.error().message();
  // Field 7 of /proc/self/stat is tty_nr: non-zero only with a controlling terminal.
  auto spec = simple_spec("/bin/sh", {"sh", "-c",
                                      "test -t 0 && test -t 1 && echo istty; "
                                      "read a b c d e f g rest < /proc/$$/stat; echo ctty=$g; "
                                      "stty size; read x; stty size"});
  spec.pty_slave_fd = pty->slave().get();
  auto staged = spawn_staged(spec);
  ASSERT_TRUE(staged) << staged.error().message();
  pty->close_slave();
  auto running = std::move(*staged).release();
  ASSERT_TRUE(running) << running.error().message();

  std::string seen;
  ASSERT_TRUE(read_until(pty->master(), seen, "24 80")) << seen;
  EXPECT_NE(seen.find("istty"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("ctty=0\r"), std::string::npos) << seen;
  EXPECT_NE(seen.find("ctty="), std::string::npos) << seen;

  ASSERT_TRUE(pty->resize(40, 100));
  ASSERT_EQ(::write(pty->master().get(), "go\n", 3), 3);
  EXPECT_TRUE(read_until(pty->master(), seen, "40 100")) << seen;
  auto st = running->pidfd().wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, ExitStatus::exited(0));
}

}  // namespace
}  // namespace custos::sys
