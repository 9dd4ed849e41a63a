#include <algorithm>
#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>

#include "custos/sys/spawn.hpp"
#include "custos/sys/subreaper.hpp"

#include "sys/process_fixture.hpp"
#include "sys/process_util.hpp"

namespace custos::sys {
namespace {

using testing::FdLeakTest;
using testing::read_until_eof;
using testing::simple_spec;

class SubreaperTest : public FdLeakTest {
 protected:
  void SetUp() override {
    FdLeakTest::SetUp();
    // Process-wide and harmless for the rest of the test binary: every other test waits for its
    // own children through their pidfds.
    ASSERT_TRUE(become_child_subreaper());
    auto is = is_child_subreaper();
    ASSERT_TRUE(is);
    ASSERT_TRUE(*is);
  }
};

// Launches sh that backgrounds `(sleep S; exit 5)` and prints its pid, then exits with 0.
struct Orphaning {
  RunningChild root;
  std::int32_t orphan_pid;
};

Result<Orphaning> launch_orphaning(char const* sleep_s) {
  auto pipe = CUSTOS_TRY(make_pipe());
  auto spec = simple_spec(
      "/bin/sh", {"sh", "-c", std::string("(sleep ") + sleep_s + "; exit 5) >/dev/null & echo $!"});
  spec.stdout_fd = pipe.second.get();
  auto staged = CUSTOS_TRY(spawn_staged(spec));
  pipe.second.reset();
  auto running = CUSTOS_TRY(std::move(staged).release());
  std::string const out = read_until_eof(pipe.first);
  return Orphaning{std::move(running), static_cast<std::int32_t>(std::stol(out))};
}

std::optional<ReapedOrphan> wait_for_orphan(std::int32_t orphan, std::int32_t direct) {
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto const& r : reap_orphans([direct](std::int32_t pid) { return pid == direct; })) {
      if (r.pid == orphan) return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

TEST_F(SubreaperTest, OrphanedGrandchildIsReapedAndReported) {
  auto o = launch_orphaning("0.2");
  ASSERT_TRUE(o) << o.error().message();
  std::int32_t const direct = o->root.pid();
  auto st = o->root.pidfd().wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, ExitStatus::exited(0));
  auto reaped = wait_for_orphan(o->orphan_pid, direct);
  ASSERT_TRUE(reaped) << "orphan " << o->orphan_pid << " never reaped";
  EXPECT_EQ(reaped->status, ExitStatus::exited(5));
}

TEST_F(SubreaperTest, DirectChildZombieIsLeftToItsPidfd) {
  // The root exits at once and stays an unreaped zombie while the orphan behind it exits:
  // the orphan must still be found, and the root left for its own pidfd.
  auto o = launch_orphaning("0.2");
  ASSERT_TRUE(o) << o.error().message();
  std::int32_t const direct = o->root.pid();
  for (int i = 0; i < 500 && o->root.pidfd().alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(o->root.pidfd().alive());
  auto reaped = wait_for_orphan(o->orphan_pid, direct);
  ASSERT_TRUE(reaped) << "orphan " << o->orphan_pid << " never reaped";
  EXPECT_EQ(reaped->status, ExitStatus::exited(5));
  auto st = o->root.pidfd().try_wait();
  ASSERT_TRUE(st) << st.error().message();
  ASSERT_TRUE(st->has_value());
  EXPECT_EQ(**st, ExitStatus::exited(0));
}

TEST_F(SubreaperTest, OwnChildrenAreListedZombiesIncluded) {
  // One child still running, one exited and not yet reaped: both are ours and both are listed
  // (the orphan pass finds its candidates there, without reading any other process).
  auto running = spawn_staged(simple_spec("/bin/sleep", {"sleep", "5"}));
  ASSERT_TRUE(running) << running.error().message();
  auto live = std::move(*running).release();
  ASSERT_TRUE(live) << live.error().message();
  auto staged = spawn_staged(simple_spec("/bin/true", {"true"}));
  ASSERT_TRUE(staged) << staged.error().message();
  auto done = std::move(*staged).release();
  ASSERT_TRUE(done) << done.error().message();
  for (int i = 0; i < 500 && done->pidfd().alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(done->pidfd().alive());
  auto kids = list_own_children();
  ASSERT_TRUE(kids) << kids.error().message();
  EXPECT_NE(std::find(kids->begin(), kids->end(), live->pid()), kids->end());
  EXPECT_NE(std::find(kids->begin(), kids->end(), done->pid()), kids->end());
  EXPECT_EQ(std::find(kids->begin(), kids->end(), static_cast<std::int32_t>(::getpid())),
            kids->end());
  // The zombie is left to its pidfd by a pass that is told it is direct.
  std::int32_t const zombie = done->pid();
  for (auto const& r :
       reap_orphans([&](std::int32_t pid) { return pid == zombie || pid == live->pid(); })) {
    EXPECT_NE(r.pid, zombie);
  }
  auto st = done->pidfd().try_wait();
  ASSERT_TRUE(st) << st.error().message();
  ASSERT_TRUE(st->has_value());
  ASSERT_TRUE(live->pidfd().send_signal(SIGKILL));
  ASSERT_TRUE(live->pidfd().wait());
}

TEST_F(SubreaperTest, OrphanIsShownToTheHookBeforeItIsReaped) {
  auto o = launch_orphaning("0.1");
  ASSERT_TRUE(o) << o.error().message();
  std::int32_t const direct = o->root.pid();
  ASSERT_TRUE(o->root.pidfd().wait());
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool seen_as_zombie = false;
  bool reaped = false;
  while (!reaped && std::chrono::steady_clock::now() < deadline) {
    auto out = reap_orphans([direct](std::int32_t pid) { return pid == direct; }, 1024,
                            [&](std::int32_t pid) {
                              if (pid != o->orphan_pid) return;
                              // Not yet reaped: still a zombie (state Z) in /proc.
                              std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
                              std::string line;
                              std::getline(in, line);
                              auto const close = line.rfind(')');
                              seen_as_zombie = close != std::string::npos &&
                                               close + 2 < line.size() && line[close + 2] == 'Z';
                            });
    for (auto const& r : out) reaped = reaped || r.pid == o->orphan_pid;
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(reaped);
  EXPECT_TRUE(seen_as_zombie);
}

}  // namespace
}  // namespace custos::sys
