// The resource sampler: an overrun of a plan limit cancels with trigger resource_limit, and every
// dimension ends up in the terminal record with its fidelity.
#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

TEST_F(SupervisorTest, ProcessCountOverrunCancelsWithResourceLimit) {
  manager();
  auto p = sh("i=0; while [ $i -lt 40 ]; do sleep 100 & i=$((i+1)); done; wait");
  p.limits.processes = 10;
  auto st = start(p);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::resource_limit);
  EXPECT_EQ(rec->trigger, core::Trigger::resource_limit);
  auto const& procs = rec->resources.at(core::ResourceDim::processes);
  ASSERT_TRUE(procs.value.has_value());
  EXPECT_GT(*procs.value, 10U);
  EXPECT_EQ(procs.limit, 10U);
  EXPECT_NE(procs.fidelity, core::Fidelity::unavailable);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
}

TEST_F(SupervisorTest, CpuOverrunCancelsWithResourceLimit) {
  manager();
  auto p = sh("while :; do :; done");
  p.limits.cpu_ms = 150;
  auto st = start(p);
  auto rec = terminal(st.execution_id, 30s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::resource_limit);
  auto const& cpu = rec->resources.at(core::ResourceDim::cpu);
  ASSERT_TRUE(cpu.value.has_value());
  EXPECT_GT(*cpu.value, 150U);
  EXPECT_EQ(cpu.fidelity, core::Fidelity::sampled);
}

TEST_F(SupervisorTest, WorkspaceDiskGrowthOverrunCancels) {
  manager();
  // Pre-existing content is the baseline, not growth.
  {
    std::FILE* f = std::fopen((workspace_ / "old.bin").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::vector<char> block(1 << 20, 'o');
    std::fwrite(block.data(), 1, block.size(), f);
    std::fclose(f);
  }
  auto p = sh("head -c 3000000 /dev/urandom > grown.bin; sync; sleep 100");
  p.workspace.access = core::WorkspaceAccess::writable;  // a read-only one is read-only
  p.limits.disk_bytes = 1000000;
  auto st = start(p);
  auto rec = terminal(st.execution_id, 30s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::resource_limit);
  auto const& disk = rec->resources.at(core::ResourceDim::disk);
  ASSERT_TRUE(disk.value.has_value());
  EXPECT_GE(*disk.value, 1000000U);
  EXPECT_LT(*disk.value, 3000000U + (1U << 20U));
}

TEST_F(SupervisorTest, EveryDimensionIsReportedWithItsFidelity) {
  manager();
  auto st = start(sh("sleep 0.2; echo done"));
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  for (std::size_t i = 0; i < core::kResourceDimCount; ++i) {
    auto const& d = rec->resources.dims[i];
    if (d.value) {
      EXPECT_NE(d.fidelity, core::Fidelity::unavailable) << i;
    } else {
      EXPECT_EQ(d.fidelity, core::Fidelity::unavailable) << i;
    }
  }
  auto const& out = rec->resources.at(core::ResourceDim::output);
  EXPECT_EQ(out.value, 5U);
  EXPECT_EQ(out.fidelity, core::Fidelity::hard);
  EXPECT_TRUE(rec->resources.at(core::ResourceDim::wall).value.has_value());
  EXPECT_EQ(rec->resources.at(core::ResourceDim::concurrency).value, 1U);
}

TEST_F(SupervisorTest, CgroupOrphansAreReapedAndAttributed) {
  if (!have_cgroup()) GTEST_SKIP() << "no writable cgroup v2 directory";
  manager(BoundaryPreference::cgroup, [](ManagerConfig& c) {
    // Reaping only when the test asks, so the zombies are still there to attribute.
    c.reap_interval = std::chrono::hours(1);
  });
  auto p = sh("( sleep 100 & ) ; ( setsid sleep 100 & ) ; sleep 100");
  auto st = start(p);
  drive([] { return false; }, 100ms);
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  EXPECT_FALSE(zombie_children().empty());
  manager_->reap_orphans_now();
  EXPECT_TRUE(zombie_children().empty());
  EXPECT_GE(manager_->stats().orphans_reaped, 2U);
  EXPECT_EQ(manager_->stats().orphans_attributed, manager_->stats().orphans_reaped);
  auto view = manager_->get(st.execution_id);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->orphans_reaped, manager_->stats().orphans_attributed);
}

TEST_F(SupervisorTest, ShutdownCancelEndsEveryExecution) {
  manager();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(start(plan({"/bin/sleep", "100"})).execution_id);
  bool done = false;
  manager_->shutdown(ShutdownPolicy::cancel, 5s, [&] { done = true; });
  ASSERT_TRUE(drive([&] { return done; }, 10s));
  for (auto const& id : ids) {
    auto v = manager_->get(id);
    ASSERT_TRUE(v);
    ASSERT_TRUE(v->terminal.has_value());
    EXPECT_EQ(v->terminal->classification, core::Classification::cancelled);
    EXPECT_EQ(v->terminal->trigger, core::Trigger::supervisor_shutdown);
  }
  auto refused = start_with_test_permit(*manager_, request(plan({"/bin/true"})));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Errc::daemon_shutting_down);
}

TEST_F(SupervisorTest, ShutdownDetachLeavesProcessesRunning) {
  manager();
  Collected c;
  auto st = start(sh("echo $$; exec sleep 100"), &c);
  ASSERT_TRUE(drive([&] { return !c.stream_text("stdout").empty(); }, 5s));
  auto fd = sys::Pidfd::open(st.pid);
  ASSERT_TRUE(fd);
  bool done = false;
  manager_->shutdown(ShutdownPolicy::detach, 5s, [&] { done = true; });
  ASSERT_TRUE(drive([&] { return done; }, 5s));
  drive([] { return false; }, 50ms);
  EXPECT_TRUE(fd->alive());  // nothing was signalled: the next daemon start recovers it
  // Clean up what this test started, as recovery would.
  ASSERT_TRUE(fd->send_signal(SIGKILL));
  EXPECT_TRUE(fd->wait());
  manager_.reset();
  if (!cgroup_path_.empty()) {
    // The detached execution's cgroup stays for recovery; remove it here.
    std::error_code ec;
    for (auto const& e : std::filesystem::directory_iterator(cgroup_path_, ec)) {
      if (e.is_directory()) {
        for (int i = 0; i < 100 && ::rmdir(e.path().c_str()) != 0; ++i)
          std::this_thread::sleep_for(10ms);
      }
    }
  }
}

}  // namespace
}  // namespace custos::supervisor::testing
