// Owning the whole tree: setsid and double-forked descendants, TERM-ignoring trees, a fork
// storm, descendants holding stdout, stopped and ptraced processes — with the cgroup boundary
// and again with the marker boundary forced on. Every test checks the processes it saw are gone.
#include <algorithm>
#include <sys/ptrace.h>
#include <sys/syscall.h>

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

std::size_t lines(std::string const& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

class TreeTest : public SupervisorTest, public ::testing::WithParamInterface<BoundaryPreference> {
 protected:
  void SetUp() override {
    SupervisorTest::SetUp();
    if (GetParam() == BoundaryPreference::cgroup && !have_cgroup()) {
      GTEST_SKIP() << "no writable cgroup v2 directory on this host";
    }
    manager(GetParam());
  }
  Boundary expected() const {
    return GetParam() == BoundaryPreference::cgroup ? Boundary::cgroup : Boundary::marker;
  }
  // Every pid the test saw is dead (its pidfd reports exit).
  static void expect_all_dead(std::vector<sys::Pidfd> const& fds) {
    for (auto const& fd : fds) EXPECT_FALSE(fd.alive()) << "survivor pid " << fd.pid();
  }
};

TEST_P(TreeTest, SetsidAndDoubleForkedDescendantsAreKilled) {
  Collected c;
  auto st = start(sh("sleep 100 & echo $!; setsid sleep 100 & echo $!; "
                     "( sleep 100 & echo $! ) ; ( setsid sh -c 'sleep 100 & echo $!' & ) ; "
                     "sleep 100"),
                  &c);
  EXPECT_EQ(st.boundary, expected());
  ASSERT_TRUE(drive([&] { return lines(c.stream_text("stdout")) >= 4; }, 10s));
  auto fds = pidfds_from(c.stream_text("stdout"));
  ASSERT_EQ(fds.size(), 4U);
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  EXPECT_EQ(rec->tree.boundary, expected());
  expect_all_dead(fds);
}

TEST_P(TreeTest, TermIgnoringTreeIsForced) {
  Collected c;
  auto p =
      sh("trap '' TERM; sleep 100 & echo $!; setsid sleep 100 & echo $!; "
         "echo ready; while :; do sleep 1; done");
  p.escalation.grace_ms = 200;
  auto st = start(p, &c);
  ASSERT_TRUE(
      drive([&] { return c.stream_text("stdout").find("ready") != std::string::npos; }, 10s));
  auto fds = pidfds_from(c.stream_text("stdout"));
  ASSERT_EQ(fds.size(), 2U);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_TRUE(rec->escalation.graceful_sent);
  EXPECT_TRUE(rec->escalation.forced);
  EXPECT_EQ(rec->exit.signal, SIGKILL);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  expect_all_dead(fds);
}

TEST_P(TreeTest, ForkStormOf500IsReaped) {
  Collected c;
  auto p = sh("i=0; while [ $i -lt 500 ]; do sleep 100 & i=$((i+1)); done; echo ready; wait");
  p.limits.processes = 1024;
  p.escalation.grace_ms = 100;
  auto st = start(p, &c);
  ASSERT_TRUE(
      drive([&] { return c.stream_text("stdout").find("ready") != std::string::npos; }, 60s));
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "storm over")->accepted);
  auto rec = terminal(st.execution_id, 60s);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  // Killed descendants reparent to this process (subreaper); the manager reaps them.
  EXPECT_TRUE(drive([&] { return zombie_children().empty(); }, 10s))
      << zombie_children().size() << " zombies left";
}

TEST_P(TreeTest, DescendantsHoldingStdoutAfterRootExitAreKilledAfterDrain) {
  Collected c;
  auto st = start(sh("sleep 100 & echo $!; setsid sleep 100 & echo $!; exit 7"), &c);
  auto t0 = std::chrono::steady_clock::now();
  auto rec = terminal(st.execution_id, 15s);
  ASSERT_TRUE(rec);
  auto elapsed = std::chrono::steady_clock::now() - t0;
  // Closed after the bounded drain (300 ms here), not after the descendants' 100 s.
  EXPECT_LT(elapsed, 5s);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->exit.code, 7);
  EXPECT_TRUE(rec->escalation.forced);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  EXPECT_TRUE(rec->output.at(core::Stream::stdout_stream).complete);
  auto fds = pidfds_from(c.stream_text("stdout"));
  // The pids may already be reaped (then pidfd_open fails and nothing is left to check).
  expect_all_dead(fds);
}

TEST_P(TreeTest, StoppedProcessIsKilled) {
  Collected c;
  auto p = sh("echo ready; kill -STOP $$; sleep 100");
  p.escalation.grace_ms = 100;
  auto st = start(p, &c);
  ASSERT_TRUE(
      drive([&] { return c.stream_text("stdout").find("ready") != std::string::npos; }, 10s));
  drive([] { return false; }, 50ms);
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_TRUE(rec->escalation.forced);
  EXPECT_EQ(rec->exit.signal, SIGKILL);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
}

TEST_P(TreeTest, PtracedProcessIsKilled) {
  Collected c;
  auto p = plan({"/bin/sleep", "100"});
  p.escalation.grace_ms = 100;
  auto st = start(p, &c);
  ASSERT_GT(st.pid, 0);
  // A tracer that seizes the root and never resumes it: SIGTERM leaves the root in a
  // signal-delivery stop; only the forced kill ends it.
  pid_t const target = st.pid;
  pid_t tracer = ::fork();
  ASSERT_GE(tracer, 0);
  if (tracer == 0) {
    if (::ptrace(PTRACE_SEIZE, target, nullptr, nullptr) != 0) ::_exit(2);
    for (;;) {
      int status = 0;
      pid_t const r = ::waitpid(target, &status, __WALL);
      if (r < 0 || WIFEXITED(status) || WIFSIGNALED(status)) ::_exit(0);
    }
  }
  auto tracer_fd = sys::Pidfd::open(tracer);
  ASSERT_TRUE(tracer_fd);
  drive([] { return false; }, 100ms);
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_TRUE(rec->escalation.forced);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  // The tracer exits once its tracee is gone; collect it.
  (void)tracer_fd->send_signal(SIGKILL);
  (void)tracer_fd->wait();
}

INSTANTIATE_TEST_SUITE_P(Boundaries, TreeTest,
                         ::testing::Values(BoundaryPreference::cgroup, BoundaryPreference::marker),
                         [](::testing::TestParamInfo<BoundaryPreference> const& p) {
                           return p.param == BoundaryPreference::cgroup ? "cgroup" : "marker";
                         });

// ------------------------------------------------------------------ boundary-specific escapes

TEST_F(SupervisorTest, MarkerBoundaryProcessThatScrubsItsEnvironmentIsUnconfirmed) {
  manager(BoundaryPreference::marker);
  Collected c;
  // The root exits only once `env` has exec'd sleep without the marker (a process still marked
  // at sweep time is rightly killed).
  auto st = start(sh(unmarked_escapee_script()), &c);
  EXPECT_EQ(st.boundary, Boundary::marker);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  auto fds = pidfds_from(c.stream_text("stdout"));
  ASSERT_EQ(fds.size(), 1U);
  // The sweep cannot see it, so the record must not claim the tree is gone.
  EXPECT_TRUE(fds[0].alive());
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::unconfirmed);
  EXPECT_EQ(rec->tree.boundary, Boundary::marker);
  EXPECT_EQ(rec->tree.containment, core::Containment::escapable);
  // Clean up our own escapee through the pidfd opened while it was ours.
  ASSERT_TRUE(fds[0].send_signal(SIGKILL));
  EXPECT_TRUE(drive([&] { return !fds[0].alive(); }, 5s));
  manager_->reap_orphans_now();
}

TEST_F(SupervisorTest, CgroupBoundaryCatchesEnvironmentScrubber) {
  if (!have_cgroup()) GTEST_SKIP() << "no writable cgroup v2 directory";
  manager(BoundaryPreference::cgroup);
  Collected c;
  auto st = start(sh("env -u CUSTOS_MARKER setsid sleep 100 </dev/null >/dev/null 2>&1 & echo $!; "
                     "sleep 0.3; exit 0"),
                  &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  auto fds = pidfds_from(c.stream_text("stdout"));
  for (auto const& fd : fds) EXPECT_FALSE(fd.alive());
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  EXPECT_TRUE(rec->escalation.forced);
}

TEST_F(SupervisorTest, RootProcessLeavingItsCgroupIsCaughtByTheFinalMarkerSweep) {
  if (!have_cgroup() || ::geteuid() != 0) GTEST_SKIP() << "needs root and a writable cgroup";
  // A sibling test cgroup to escape into (never the machine's own cgroups).
  std::string const escape = cgroup_path_ + "-escape";
  ASSERT_EQ(::mkdir(escape.c_str(), 0755), 0);
  manager(BoundaryPreference::cgroup);
  Collected c;
  auto st = start(sh("sh -c 'echo $$ > " + escape +
                     "/cgroup.procs; echo $$; exec sleep 100' & "
                     "sleep 100"),
                  &c);
  ASSERT_TRUE(drive([&] { return lines(c.stream_text("stdout")) >= 1; }, 10s));
  auto fds = pidfds_from(c.stream_text("stdout"));
  ASSERT_EQ(fds.size(), 1U);
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  // Root on a mount without nsdelegate: containment is escapable, and the escapee kept its
  // marker, so the final sweep killed it.
  if (!manager_->config().nsdelegate) {
    EXPECT_EQ(rec->tree.containment, core::Containment::escapable);
  }
  EXPECT_FALSE(fds[0].alive());
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  for (int i = 0; i < 100 && ::rmdir(escape.c_str()) != 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(std::filesystem::exists(escape));
}

TEST_F(SupervisorTest, UnprivilegedExecutionInCgroupIsKernelEnforced) {
  if (!have_cgroup() || ::geteuid() != 0) GTEST_SKIP() << "needs root and a writable cgroup";
  manager(BoundaryPreference::cgroup);
  Collected c;
  auto p = plan({"/usr/bin/id", "-u"});
  p.user = core::UserSpec{65534, 65534, {}};
  auto st = start(p, &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  EXPECT_EQ(c.stream_text("stdout"), "65534\n");
  EXPECT_EQ(rec->tree.containment, core::Containment::kernel_enforced);
}

TEST_F(SupervisorTest, NonRootCallerCannotNameAnotherUser) {
  manager();
  auto req = request(plan({"/bin/true"}));
  req.caller.uid = 1000;
  req.caller.gid = 1000;
  req.plan.user = core::UserSpec{0, 0, {}};
  auto r = start_with_test_permit(*manager_, std::move(req));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::auth_user);
}

TEST_F(SupervisorTest, OrphansAreReapedNoZombieAccumulates) {
  manager(BoundaryPreference::marker);
  auto st = start(sh("( sleep 0.1 & ) ; ( setsid sleep 0.1 & ) ; exit 0"));
  ASSERT_TRUE(terminal(st.execution_id));
  // The orphans were killed at teardown and reparented here; the periodic reaper collects them.
  EXPECT_TRUE(drive([&] { return zombie_children().empty(); }, 5s));
}

// Teardowns that end together share their final /proc sweeps (one multi-marker pass), and each
// execution still gets its own verdict: every root escaped its cgroup (root, no nsdelegate)
// keeping its marker, and every one of them is found and killed by the final sweep.
TEST_F(SupervisorTest, ConcurrentTeardownsShareFinalSweepsAndCatchEveryEscapee) {
  if (!have_cgroup() || ::geteuid() != 0) GTEST_SKIP() << "needs root and a writable cgroup";
  std::string const escape = cgroup_path_ + "-escape";
  ASSERT_EQ(::mkdir(escape.c_str(), 0755), 0);
  manager(BoundaryPreference::cgroup);
  constexpr int kExecutions = 8;
  std::vector<Collected> out(kExecutions);
  std::vector<StartResult> started;
  for (int i = 0; i < kExecutions; ++i) {
    started.push_back(start(
        sh("sh -c 'echo $$ > " + escape + "/cgroup.procs; echo $$; exec sleep 100' & sleep 100"),
        &out[static_cast<std::size_t>(i)]));
  }
  std::vector<sys::Pidfd> escapees;
  for (int i = 0; i < kExecutions; ++i) {
    auto& c = out[static_cast<std::size_t>(i)];
    ASSERT_TRUE(drive([&] { return lines(c.stream_text("stdout")) >= 1; }, 10s)) << i;
    auto fds = pidfds_from(c.stream_text("stdout"));
    ASSERT_EQ(fds.size(), 1U) << i;
    escapees.push_back(std::move(fds[0]));
  }
  auto const before = manager_->stats();
  for (auto const& st : started) {
    ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  }
  for (auto const& st : started) {
    auto rec = terminal(st.execution_id);
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  }
  for (auto const& fd : escapees) EXPECT_FALSE(fd.alive()) << "escapee pid " << fd.pid();
  auto const after = manager_->stats();
  EXPECT_EQ(after.final_sweep_requests - before.final_sweep_requests,
            static_cast<std::uint64_t>(kExecutions));
  EXPECT_GE(after.final_sweeps - before.final_sweeps, 1U);
  EXPECT_LE(after.final_sweeps - before.final_sweeps, static_cast<std::uint64_t>(kExecutions));
  for (int i = 0; i < 100 && ::rmdir(escape.c_str()) != 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(std::filesystem::exists(escape));
}

}  // namespace
}  // namespace custos::supervisor::testing
