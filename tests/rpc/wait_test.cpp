// exec.wait's cancel handle: ExecutionManager::unwait frees a pending wait (its callback and
// timer) at once, and the rpc layer withdraws a connection's waits when the connection closes,
// so thousands of abandoned waits on a long-running execution leave nothing behind. Real
// manager, real process, the real rpc Server on a real Unix socket.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <vector>

#include "custos/rpc/dispatcher.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/rpc/server.hpp"

#include "supervisor/harness.hpp"
#include "support/launch_permit_minter.hpp"

namespace custos::rpc {
namespace {

using namespace std::chrono_literals;
using supervisor::testing::SupervisorTest;

class WaitTest : public SupervisorTest {
 protected:
  std::string sleeper() {
    auto st = start(plan({"/bin/sleep", "60"}));
    return st.execution_id;
  }
  void finish(std::string const& id) {
    (void)manager_->cancel(id, core::Trigger::user, "test done");
    ASSERT_TRUE(terminal(id));
  }
};

TEST_F(WaitTest, UnwaitFreesTheWaitAndItsCallbackNeverRuns) {
  manager();
  std::string const id = sleeper();
  int answered = 0;
  auto token = std::make_shared<int>(0);  // its use_count shows how many callbacks are held
  std::vector<supervisor::WaitHandle> handles;
  for (int i = 0; i < 5000; ++i) {
    handles.push_back(manager_->wait(id, std::nullopt, [&answered, token](auto) { ++answered; }));
  }
  EXPECT_EQ(manager_->stats().pending_waits, 5000U);
  EXPECT_EQ(token.use_count(), 5001);
  for (auto const& h : handles) manager_->unwait(h);
  EXPECT_EQ(manager_->stats().pending_waits, 0U);
  EXPECT_EQ(token.use_count(), 1) << "a withdrawn wait still holds its callback";
  manager_->unwait(handles.front());  // twice: a no-op

  // A timed-out wait is answered once and removed.
  std::optional<Result<core::TerminalRecord>> timed;
  (void)manager_->wait(id, 30ms, [&](Result<core::TerminalRecord> r) { timed = std::move(r); });
  EXPECT_EQ(manager_->stats().pending_waits, 1U);
  ASSERT_TRUE(drive([&] { return timed.has_value(); }, 5s));
  ASSERT_FALSE(timed->has_value());
  EXPECT_EQ(timed->error().code, Errc::exec_wait_timeout);
  EXPECT_EQ(manager_->stats().pending_waits, 0U);

  // A kept wait is still answered with the terminal record.
  std::optional<Result<core::TerminalRecord>> kept;
  (void)manager_->wait(id, std::nullopt,
                       [&](Result<core::TerminalRecord> r) { kept = std::move(r); });
  finish(id);
  ASSERT_TRUE(drive([&] { return kept.has_value(); }, 5s));
  EXPECT_TRUE(kept->has_value());
  EXPECT_EQ(answered, 0);
  EXPECT_EQ(manager_->stats().pending_waits, 0U);
}

int connect_unix(std::string const& path) {
  int const fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr const*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST_F(WaitTest, AbandonedRpcWaitsAreWithdrawnWhenTheirConnectionCloses) {
  manager();
  std::string const id = sleeper();
  Dispatcher d(AuthPolicy{static_cast<std::uint32_t>(::geteuid()), std::nullopt});
  register_exec_methods(d, *manager_, nullptr);
  {
    Server server(io_, d, ServerLimits{});
    std::string const sock = (state_ / "rpc.sock").string();
    ASSERT_TRUE(server.listen(sock, 0600).has_value());
    std::string const line = R"({"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{)"
                             R"("execution_id":")" +
                             id + "\"}}\n";
    constexpr int kBatch = 200;
    constexpr int kRounds = 10;  // 2000 abandoned waits in all
    for (int round = 0; round < kRounds; ++round) {
      std::vector<int> fds;
      for (int i = 0; i < kBatch; ++i) {
        int const fd = connect_unix(sock);
        ASSERT_GE(fd, 0) << std::strerror(errno);
        ASSERT_EQ(::send(fd, line.data(), line.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(line.size()));
        fds.push_back(fd);
      }
      // Every call reached the manager (so the count below can only fall by withdrawal).
      ASSERT_TRUE(drive([&] { return manager_->stats().pending_waits == kBatch; }, 20s))
          << "round " << round << ": " << manager_->stats().pending_waits << " pending";
      for (int fd : fds) ::close(fd);
      ASSERT_TRUE(drive([&] { return manager_->stats().pending_waits == 0; }, 20s))
          << "round " << round << ": " << manager_->stats().pending_waits
          << " waits of closed connections are still held";
    }
    ASSERT_TRUE(drive([&] { return server.stats().open == 0; }, 10s));
    // A connection that stays is still answered when the execution ends.
    int const fd = connect_unix(sock);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, line.data(), line.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(line.size()));
    ASSERT_TRUE(drive([&] { return manager_->stats().pending_waits == 1; }, 10s));
    finish(id);
    std::string got;
    ASSERT_TRUE(drive(
        [&] {
          char buf[4096];
          ssize_t const n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
          if (n > 0) got.append(buf, static_cast<std::size_t>(n));
          return got.find('\n') != std::string::npos;
        },
        10s));
    EXPECT_NE(got.find("\"result\""), std::string::npos) << got;
    EXPECT_EQ(manager_->stats().pending_waits, 0U);
    ::close(fd);
  }
}

}  // namespace
}  // namespace custos::rpc
