// The ownership sink's order and its failures: a failure before the barrier is released means
// no user code ran; a failure after it stops the execution as supervisor_failed.
#include <algorithm>
#include <map>

#include "custos/sys/identity.hpp"

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

class ScriptedSink final : public OwnershipSink {
 public:
  std::vector<std::string> calls;
  std::string fail_at;  // name of the call that fails
  std::optional<sys::PidfsIdentity> staged;

  Result<> step(std::string name) {
    calls.push_back(name);
    if (name == fail_at) return Error(Errc::registry_io, "scripted failure at " + name);
    return ok();
  }
  // Each completion comes at once, as the OwnershipSink contract allows.
  void record_authorized_async(std::string const&, core::ExecutionIdentity const&,
                               core::ExecutionPlan const&, std::string const& digest,
                               std::function<void(Result<>)> done) override {
    EXPECT_EQ(digest.rfind("sha256:", 0), 0U);
    done(step("authorized"));
  }
  void record_staged_async(std::string const&, sys::PidfsIdentity const& id,
                           StagedBoundary const& boundary,
                           std::function<void(Result<>)> done) override {
    EXPECT_EQ(boundary.marker_value.size(), 32U);
    staged = id;
    done(step("staged"));
  }
  void when_durable(std::string const&, std::function<void(Result<>)> done) override {
    done(step("durable"));
  }
  void record_committed_async(std::string const&, std::function<void(Result<>)> done) override {
    done(step("committed"));
  }
  Result<> record_phase(std::string const&, core::Phase p) override {
    return step("phase:" + std::string{core::phase_wire(p)});
  }
  Result<> record_trigger(std::string const&, core::Trigger t) override {
    return step("trigger:" + std::string{core::trigger_wire(t)});
  }
  Result<> record_output(std::string const&, StreamId s, core::StreamAccounting const&) override {
    return step("output:" + std::string{core::stream_wire(s)});
  }
  void record_terminal_async(std::string const&, core::TerminalRecord const& r,
                             std::function<void(Result<>)> done) override {
    done(step("terminal:" + std::string{core::classification_wire(r.classification)}));
  }
};

class SinkTest : public SupervisorTest {
 protected:
  ScriptedSink sink_;
  ExecutionManager& managed() {
    return manager(BoundaryPreference::automatic, [this](ManagerConfig& c) { c.sink = &sink_; });
  }

  // The sink call `fail_at` fails between the child's creation and its barrier release: the
  // launch ends spawn_failed with `code`, no user code ran, and the staged child was killed
  // and reaped at its barrier.
  void expect_killed_at_barrier(std::string const& fail_at, std::string const& code) {
    managed();
    sink_.fail_at = fail_at;
    auto st = start(sh("touch ran"));
    EXPECT_EQ(st.phase, core::Phase::terminal);
    auto rec = terminal(st.execution_id);
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
    ASSERT_TRUE(rec->spawn_error);
    EXPECT_EQ(rec->spawn_error->code, code);
    drive([] { return false; }, 100ms);
    EXPECT_FALSE(std::filesystem::exists(workspace_ / "ran"));
    ASSERT_TRUE(sink_.staged.has_value());
    if (auto fd = sys::Pidfd::open(sink_.staged->pid)) {
      // The pid exists again only if someone else reused it: never our staged child.
      auto t = sys::read_start_time(sink_.staged->pid);
      if (t) {
        EXPECT_NE(*t, sink_.staged->start_time_ticks);
      }
    }
    EXPECT_EQ(std::count(sink_.calls.begin(), sink_.calls.end(), "committed"), 0);
    EXPECT_EQ(sink_.calls.back(), "terminal:spawn_failed");
  }
};

TEST_F(SinkTest, CallsComeInLifecycleOrder) {
  managed();
  auto st = start(sh("exit 0"));
  ASSERT_TRUE(terminal(st.execution_id));
  std::vector<std::string> const want = {"authorized",    "phase:starting", "staged",
                                         "durable",       "committed",      "phase:running",
                                         "phase:exited",  "phase:closed",   "output:stdout",
                                         "output:stderr", "terminal:exited"};
  EXPECT_EQ(sink_.calls, want);
  ASSERT_TRUE(sink_.staged.has_value());
  EXPECT_EQ(sink_.staged->pid, st.pid);
  EXPECT_FALSE(sink_.staged->boot_id.empty());
}

TEST_F(SinkTest, CancelRecordsTriggerBeforeStopping) {
  managed();
  auto st = start(plan({"/bin/sleep", "100"}));
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "x")->accepted);
  ASSERT_TRUE(terminal(st.execution_id));
  auto it = std::find(sink_.calls.begin(), sink_.calls.end(), "trigger:user");
  ASSERT_NE(it, sink_.calls.end());
  EXPECT_EQ(*(it + 1), "phase:stopping");
  EXPECT_EQ(sink_.calls.back(), "terminal:cancelled");
}

TEST_F(SinkTest, AuthorizedFailureLaunchesNothing) {
  managed();
  sink_.fail_at = "authorized";
  auto r = start_with_test_permit(*manager_, request(sh("touch ran")));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::registry_io);
  EXPECT_TRUE(manager_->list({}).empty());
  EXPECT_FALSE(std::filesystem::exists(workspace_ / "ran"));
}

TEST_F(SinkTest, StagedFailureMeansNoUserCodeRan) {
  expect_killed_at_barrier("staged", "record_staged");
}

// The claim may be committed without its fsync (group durability): when the sink cannot make it
// durable, the staged child never runs the target.
TEST_F(SinkTest, DurabilityFailureMeansNoUserCodeRan) {
  expect_killed_at_barrier("durable", "durability");
}

// A launch that fails before its child exists still waits for the claim's durability before
// its outcome (the terminal record, and so the caller's answer) is produced.
TEST_F(SinkTest, EarlySpawnFailureIsReportedOnlyAfterDurability) {
  managed();
  auto p = sh("touch ran");
  p.workspace.root = (workspace_ / "missing-workspace").string();
  auto st = start(p);
  EXPECT_EQ(st.phase, core::Phase::terminal);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
  auto durable = std::find(sink_.calls.begin(), sink_.calls.end(), "durable");
  auto term = std::find(sink_.calls.begin(), sink_.calls.end(), "terminal:spawn_failed");
  ASSERT_NE(durable, sink_.calls.end());
  ASSERT_NE(term, sink_.calls.end());
  EXPECT_LT(durable, term);
}

TEST_F(SinkTest, CommittedFailureStopsAsSupervisorFailed) {
  managed();
  sink_.fail_at = "committed";
  auto st = start(plan({"/bin/sleep", "100"}));
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::supervisor_failed);
  EXPECT_EQ(rec->trigger, core::Trigger::backend_failure);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  auto v = manager_->get(st.execution_id);
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->sink_error.has_value());
}

TEST_F(SupervisorTest, SixteenConcurrentExecutionsAllCloseWithTheirOwnOutput) {
  manager();
  std::vector<std::pair<std::string, std::unique_ptr<Collected>>> runs;
  for (int i = 0; i < 16; ++i) {
    auto c = std::make_unique<Collected>();
    // Each waits for its stdin to end, so all sixteen are live together however long the
    // launches take (each launch runs the loop until it is answered, as the daemon's does).
    auto st = start(sh("printf 'run-" + std::to_string(i) + "'; cat >/dev/null"), c.get());
    runs.emplace_back(st.execution_id, std::move(c));
  }
  EXPECT_EQ(manager_->live_count(), 16U);
  for (auto const& [id, collected] : runs) {
    auto r = manager_->input(id, {}, /*eof=*/true);
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message());
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    auto rec = terminal(runs[i].first);
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->exit.code, 0);
    EXPECT_EQ(runs[i].second->stream_text("stdout"), "run-" + std::to_string(i));
  }
  EXPECT_EQ(manager_->live_count(), 0U);
}

}  // namespace
}  // namespace custos::supervisor::testing
