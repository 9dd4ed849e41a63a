// An idle execution must cost the daemon at most 32 KiB: buffers are allocated when data flows,
// not up front. Measured as live heap bytes (the allocator's own count), which is what grows the
// daemon's RSS per execution; pipe buffers live in the kernel, not in the daemon.
#include <cstddef>
#include <filesystem>
#include <malloc.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUSTOS_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define CUSTOS_TEST_ASAN 1
#endif
#if defined(CUSTOS_TEST_ASAN)
// From the sanitizer runtime (its header is not shipped with every compiler package).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

std::size_t heap_in_use() {
#if defined(CUSTOS_TEST_ASAN)
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

TEST_F(SupervisorTest, IdleExecutionsCostAtMost32KiBEach) {
  manager();
  constexpr int kCount = 100;
  // Warm up once so lazily built process-wide state (the reactor, the shared read buffer) is
  // not charged to the measured executions.
  {
    auto st = start(plan({"/bin/sh", "-c", "echo warm"}));
    ASSERT_TRUE(terminal(st.execution_id));
  }
  drive([] { return false; }, 50ms);
  std::size_t const before = heap_in_use();
  std::vector<std::string> ids;
  for (int i = 0; i < kCount; ++i) {
    auto p = plan({"/bin/sleep", "100"});
    auto st = start(p);
    ASSERT_FALSE(st.execution_id.empty());
    ids.push_back(st.execution_id);
  }
  drive([] { return false; }, 300ms);  // several sampler ticks
  std::size_t const after = heap_in_use();
  double const per = (static_cast<double>(after) - static_cast<double>(before)) / kCount;
  RecordProperty("heap_bytes_per_idle_execution", static_cast<int>(per));
  std::printf("heap per idle execution: %.0f bytes\n", per);
  EXPECT_LE(per, 32.0 * 1024.0);

  bool done = false;
  manager_->shutdown(ShutdownPolicy::cancel, 20s, [&] { done = true; });
  ASSERT_TRUE(drive([&] { return done; }, 30s));
  for (auto const& id : ids) {
    auto v = manager_->get(id);
    ASSERT_TRUE(v);
    ASSERT_TRUE(v->terminal.has_value());
    EXPECT_EQ(v->terminal->tree.cleanup, core::Cleanup::confirmed) << detail(id);
  }
}

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] auto const& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A terminal execution kept in the history holds no descriptor: its pidfd, cgroup directory,
// pipes, PTY and workspace fd are all released when it closes.
TEST_F(SupervisorTest, TerminalExecutionsInTheHistoryHoldNoDescriptors) {
  manager();
  {
    auto st = start(plan({"/bin/true"}));  // warm-up: the manager's own lazily opened fds
    ASSERT_TRUE(terminal(st.execution_id));
  }
  drive([] { return false; }, 50ms);
  std::size_t const before = open_fds();
  constexpr int kCount = 40;
  for (int i = 0; i < kCount; ++i) {
    auto st = start(plan({"/bin/true"}));
    ASSERT_TRUE(terminal(st.execution_id)) << detail(st.execution_id);
  }
  drive([] { return false; }, 50ms);
  EXPECT_EQ(manager_->list({}).size(), static_cast<std::size_t>(kCount + 1)) << "all kept";
  std::size_t const after = open_fds();
  // A few descriptors of process-wide state may come and go; one per execution may not.
  EXPECT_LT(after, before + kCount / 4) << "before " << before << ", after " << after;
}

}  // namespace
}  // namespace custos::supervisor::testing
