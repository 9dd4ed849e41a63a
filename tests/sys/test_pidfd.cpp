#include <chrono>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "custos/sys/pidfd.hpp"
#include "custos/sys/unique_fd.hpp"

#include "sys/process_fixture.hpp"

namespace custos::sys {
namespace {

using testing::FdLeakTest;

class UniqueFdTest : public FdLeakTest {};
class PidfdTest : public FdLeakTest {};
class ExitStatusTest : public FdLeakTest {};

// A child made with plain fork() so these tests exercise Pidfd independently of spawn.
pid_t fork_child(int code, bool pause_first) {
  pid_t const pid = ::fork();
  if (pid == 0) {
    if (pause_first) ::pause();
    ::_exit(code);
  }
  return pid;
}

TEST_F(UniqueFdTest, ClosesOnDestructionAndMoves) {
  int raw = -1;
  {
    auto p = make_pipe();
    ASSERT_TRUE(p);
    raw = p->first.get();
    EXPECT_TRUE(p->first.valid());
    EXPECT_EQ(::fcntl(raw, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    UniqueFd moved = std::move(p->first);
    EXPECT_FALSE(
        p->first.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
    EXPECT_EQ(moved.get(), raw);
    UniqueFd assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.get(), raw);
    EXPECT_EQ(::fcntl(raw, F_GETFD) >= 0, true);
  }
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(UniqueFdTest, ReleaseHandsOverAndDupIsCloexec) {
  auto p = make_pipe(O_NONBLOCK);
  ASSERT_TRUE(p);
  EXPECT_TRUE(::fcntl(p->first.get(), F_GETFL) & O_NONBLOCK);
  auto d = p->second.dup();
  ASSERT_TRUE(d);
  EXPECT_NE(d->get(), p->second.get());
  EXPECT_EQ(::fcntl(d->get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  int const raw = p->first.release();
  EXPECT_FALSE(p->first.valid());
  EXPECT_GE(::fcntl(raw, F_GETFD), 0);
  ::close(raw);
}

TEST_F(PidfdTest, WaitReportsExitCode) {
  pid_t const pid = fork_child(7, false);
  ASSERT_GT(pid, 0);
  auto pfd = Pidfd::open(pid);
  ASSERT_TRUE(pfd) << pfd.error().message();
  EXPECT_EQ(pfd->pid(), pid);
  EXPECT_EQ(::fcntl(pfd->fd().get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto st = pfd->wait();
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(*st, ExitStatus::exited(7));
  // Remembered: a second wait does not turn into ECHILD.
  auto again = pfd->try_wait();
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, ExitStatus::exited(7));
  EXPECT_FALSE(pfd->alive());
}

TEST_F(PidfdTest, SignalThenTryWaitAndExitInfo) {
  pid_t const pid = fork_child(0, true);
  ASSERT_GT(pid, 0);
  auto pfd = Pidfd::open(pid);
  ASSERT_TRUE(pfd);
  EXPECT_TRUE(pfd->alive());
  auto none = pfd->try_wait();
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
  // A running process has no exit info yet.
  auto info_running = pfd->get_exit_info();
  if (!info_running && info_running.error().code == Errc::sys_unsupported) {
    ::kill(pid, SIGKILL);
    ASSERT_TRUE(pfd->wait());
    GTEST_SKIP() << "PIDFD_GET_INFO not available";
  }
  ASSERT_TRUE(info_running) << info_running.error().message();
  EXPECT_FALSE(info_running->has_value());

  auto sent = pfd->send_signal(SIGTERM);
  ASSERT_TRUE(sent);
  EXPECT_TRUE(*sent);
  // Exit info is published only after reaping; a zombie has none.
  for (int i = 0; i < 200 && pfd->alive(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(pfd->alive());
  auto zombie_info = pfd->get_exit_info();
  ASSERT_TRUE(zombie_info);
  EXPECT_FALSE(zombie_info->has_value());

  auto st = pfd->wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, ExitStatus::signaled(SIGTERM));
  auto info = pfd->get_exit_info();
  ASSERT_TRUE(info) << info.error().message();
  ASSERT_TRUE(info->has_value());
  EXPECT_EQ(**info, ExitStatus::signaled(SIGTERM));

  // After reaping, a signal reports "not delivered" instead of failing.
  auto late = pfd->send_signal(SIGKILL);
  ASSERT_TRUE(late);
  EXPECT_FALSE(*late);
}

TEST_F(PidfdTest, PeekReadsTheExitWithoutReaping) {
  pid_t const pid = fork_child(9, false);
  ASSERT_GT(pid, 0);
  auto pfd = Pidfd::open(pid);
  ASSERT_TRUE(pfd);
  for (int i = 0; i < 400 && pfd->alive(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_FALSE(pfd->alive());
  auto first = pfd->peek_exit();
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(**first, ExitStatus::exited(9));
  // Not reaped: still there to be read again, and for the owner's own wait.
  auto second = pfd->peek_exit();
  ASSERT_TRUE(second && second->has_value());
  EXPECT_EQ(**second, ExitStatus::exited(9));
  auto st = pfd->wait();
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(*st, ExitStatus::exited(9));
  // After the owner reaped it, the remembered status (no ECHILD).
  auto after = pfd->peek_exit();
  ASSERT_TRUE(after && after->has_value());
  EXPECT_EQ(**after, ExitStatus::exited(9));
}

TEST_F(PidfdTest, OpenMissingProcessFails) {
  pid_t const pid = fork_child(0, false);
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  auto pfd = Pidfd::open(pid);
  ASSERT_FALSE(pfd);
  EXPECT_EQ(pfd.error().code, Errc::pidfd_failed);
  EXPECT_EQ(pfd.error().sys_errno, ESRCH);
  auto bad = Pidfd::open(0);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::pidfd_failed);
}

TEST_F(PidfdTest, WaitOnNonChildIsAnError) {
  // This process is alive and not its own child: waitid must refuse with ECHILD. (Our own pid
  // rather than our parent's: tests never touch processes they did not start.)
  auto pfd = Pidfd::open(static_cast<std::int32_t>(::getpid()));
  ASSERT_TRUE(pfd);
  auto st = pfd->try_wait();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::pidfd_failed);
  EXPECT_EQ(st.error().sys_errno, ECHILD);
}

TEST_F(ExitStatusTest, FromWaitStatus) {
  EXPECT_EQ(exit_status_from_wait(3 << 8), ExitStatus::exited(3));
  EXPECT_EQ(exit_status_from_wait(SIGKILL), ExitStatus::signaled(SIGKILL));
  EXPECT_EQ(exit_status_from_wait(SIGSEGV | 0x80), ExitStatus::signaled(SIGSEGV, true));
}

}  // namespace
}  // namespace custos::sys
