// Startup recovery with real processes: the identity rules (PID reuse never signalled, the boot
// fence before any lookup, the negative checks, one pidfd_open), the cleanup of gone executions
// and leftover cgroups, and adoption — a live execution re-acquired through its very pidfd and
// then supervised, cancelled, timed and closed by the manager like any other.
#include "custos/supervisor/recovery.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/core/plan_json.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/recovery.hpp"
#include "custos/supervisor/registry_sink.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/spawn.hpp"

#include "harness.hpp"
#include "registry/helpers.hpp"

namespace custos::supervisor::testing {
namespace {

using registry::BoundaryInfo;
using registry::Ownership;
using registry::OwnershipState;
using registry::Registry;
using registry::test::fake_terminal;
using registry::test::make_execution;
using registry::test::raw_exec;

constexpr char const* kOtherBoot = "00000000-0000-4000-8000-000000000000";

// A process this test started outside the registry: "a stranger" to every fabricated record,
// or the root of one when its identity is recorded.
sys::RunningChild spawn_sleeper(std::vector<std::string> env = {},
                                std::vector<std::string> argv = {"sleep", "1000"},
                                int cgroup_fd = -1) {
  sys::SpawnSpec spec;
  spec.executable = argv[0] == "sh" ? "/bin/sh" : "/bin/sleep";
  spec.argv = std::move(argv);
  spec.envp = std::move(env);
  spec.cgroup_fd = cgroup_fd;
  auto staged = sys::spawn_staged(spec);
  EXPECT_TRUE(staged) << staged.error().message();
  auto running = std::move(*staged).release();
  EXPECT_TRUE(running) << running.error().message();
  return std::move(*running);
}

// The record of an execution whose plan has these limits/escalation (JSON members of the plan).
registry::NewExecution execution_with(std::string const& id, boost::json::object extra) {
  auto ex = make_execution(id, "act-" + id);
  auto decoded = core::decode_execution(ex.plan_canonical);
  EXPECT_TRUE(decoded);
  auto plan = core::to_json(decoded->plan);
  for (auto const& kv : extra) plan.as_object()[kv.key()] = kv.value();
  auto parsed = core::parse_plan(plan);
  EXPECT_TRUE(parsed) << parsed.error().message();
  auto out = registry::make_new_execution(id, decoded->identity, *parsed);
  EXPECT_TRUE(out);
  return *out;
}

class Recovery : public SupervisorTest {
 protected:
  void SetUp() override {
    SupervisorTest::SetUp();
    auto reg = Registry::open(state_ / "registry");
    ASSERT_TRUE(reg) << reg.error().message();
    registry_ = std::move(*reg);
    sink_ = std::make_unique<RegistrySink>(*registry_, io_);
  }
  void TearDown() override {
    SupervisorTest::TearDown();
    sink_.reset();
    registry_.reset();
  }
  ExecutionManager& managed() {
    return manager(BoundaryPreference::automatic,
                   [this](ManagerConfig& c) { c.sink = sink_.get(); });
  }

  // A record in phase `phase` whose ownership slot holds `owner` (fabricated or real).
  void fabricate(std::string const& id, Ownership owner, BoundaryInfo const& boundary = {},
                 registry::NewExecution const* ex = nullptr,
                 OwnershipState state = OwnershipState::committed,
                 core::Phase phase = core::Phase::running) {
    owner.state = OwnershipState::staged;
    ASSERT_TRUE(
        registry_->record_authorized(ex != nullptr ? *ex : make_execution(id, "act-" + id)));
    ASSERT_TRUE(registry_->record_staged(id, owner, boundary));
    if (state == OwnershipState::staged) return;
    ASSERT_TRUE(registry_->record_committed(id));
    if (phase == core::Phase::starting) return;
    ASSERT_TRUE(registry_->record_phase(id, core::Phase::running));
    if (phase == core::Phase::stopping) {
      ASSERT_TRUE(registry_->record_trigger(id, core::Trigger::user));
      ASSERT_TRUE(registry_->record_phase(id, core::Phase::stopping));
    }
  }

  static RecoveredExecution* find(RecoveryReport& r, std::string const& id) {
    for (auto& e : r.executions) {
      if (e.execution_id == id) return &e;
    }
    return nullptr;
  }

  void expect_one_terminal(std::string const& id, std::string const& classification,
                           std::string const& recovery) {
    auto rec = registry_->get(id);
    ASSERT_TRUE(rec) << rec.error().message();
    EXPECT_EQ(rec->phase, core::Phase::terminal);
    ASSERT_TRUE(rec->terminal);
    EXPECT_EQ(rec->terminal->classification, classification);
    EXPECT_EQ(rec->terminal->recovery, recovery);
    auto decoded = registry::decode_terminal(*rec->terminal);
    ASSERT_TRUE(decoded) << decoded.error().message();
    EXPECT_TRUE(core::validate(*decoded));
    // In-flight output is never reported complete after a crash.
    for (auto const& [stream, acc] : decoded->output) EXPECT_FALSE(acc.complete);
    // Exactly one: a second terminal write is refused.
    auto again = registry_->record_terminal(id, fake_terminal("exited"));
    ASSERT_FALSE(again);
    EXPECT_EQ(again.error().code, Errc::registry_illegal_phase);
  }

  // Every event of `id` from seq 1 into `sink`.
  void collect(std::string const& id, Collected& sink) {
    auto s = manager_->subscribe(id, std::uint64_t{1}, [&sink](Event const& e) {
      sink.events.push_back(e);
      return true;
    });
    ASSERT_TRUE(s) << s.error().message();
    subscriptions_.push_back(*s);
  }

  std::unique_ptr<Registry> registry_;
  std::unique_ptr<RegistrySink> sink_;
};

// ---- the identity rules ----------------------------------------------------------------------

TEST_F(Recovery, PidReusedByStrangerIsNeverSignalled) {
  auto stranger = spawn_sleeper();
  // The record names the stranger's pid in this boot, but another pidfs inode: the process it
  // owned has ended and the pid was reused.
  Ownership o = registry::staged_ownership(stranger.identity());
  o.pidfs_ino += 1;
  fabricate("ex-reused", o);

  auto report = recover(*registry_);
  ASSERT_TRUE(report) << report.error().message();
  auto const* e = find(*report, "ex-reused");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  EXPECT_TRUE(e->pid_looked_up);
  EXPECT_EQ(report->pidfd_opens, 1u);
  EXPECT_FALSE(e->adopt);
  EXPECT_TRUE(stranger.pidfd().alive());  // never signalled
  expect_one_terminal("ex-reused", "recovery_indeterminate", "absent_without_terminal");
}

TEST_F(Recovery, BootIdMismatchMeansNoLookupAtAll) {
  auto stranger = spawn_sleeper();
  // Even an exact dev/ino/pid match must not be looked at across a boot fence.
  Ownership o = registry::staged_ownership(stranger.identity());
  o.boot_id = kOtherBoot;
  fabricate("ex-oldboot", o);

  auto report = recover(*registry_);
  ASSERT_TRUE(report) << report.error().message();
  auto const* e = find(*report, "ex-oldboot");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal);
  EXPECT_FALSE(e->pid_looked_up);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_TRUE(stranger.pidfd().alive());
  expect_one_terminal("ex-oldboot", "recovery_indeterminate", "absent_without_terminal");
}

TEST_F(Recovery, InjectedCurrentBootIdFencesTooAndRemovesStaleEmptyCgroupPath) {
  auto stranger = spawn_sleeper();
  // A stale cgroup path that does not exist any more counts as cleaned.
  fabricate("ex-1", registry::staged_ownership(stranger.identity()),
            {core::Boundary::cgroup, (state_ / "no-such-cgroup").string(), ""});
  RecoveryOptions opts;
  opts.boot_id = kOtherBoot;
  auto report = recover(*registry_, opts);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_EQ(report->executions.at(0).cleanup, core::Cleanup::confirmed);
  EXPECT_TRUE(stranger.pidfd().alive());
}

TEST_F(Recovery, StartTimeContradictionIsIndeterminateAndUntouched) {
  auto stranger = spawn_sleeper();
  Ownership o = registry::staged_ownership(stranger.identity());
  o.start_time_ticks += 5;  // exact pidfs match, contradicted by negative evidence
  fabricate("ex-odd", o);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  auto const* e = find(*report, "ex-odd");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::indeterminate) << e->detail;
  EXPECT_FALSE(e->adopt);
  EXPECT_TRUE(stranger.pidfd().alive());
  expect_one_terminal("ex-odd", "recovery_indeterminate", "indeterminate");
}

TEST_F(Recovery, ForeignPidNamespaceIsIndeterminateWithoutLookup) {
  auto stranger = spawn_sleeper();
  Ownership o = registry::staged_ownership(stranger.identity());
  o.pid_ns_ino = registry::current_pid_ns_ino() + 1;
  fabricate("ex-ns", o);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->executions.at(0).classification, core::RecoveryPath::indeterminate);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_TRUE(stranger.pidfd().alive());
}

TEST_F(Recovery, GoneProcessIsAbsentWithoutTerminal) {
  Ownership o;
  {
    auto child = spawn_sleeper();
    o = registry::staged_ownership(child.identity());
  }  // killed and reaped here
  fabricate("ex-gone", o);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  auto const* e = find(*report, "ex-gone");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  EXPECT_TRUE(e->pid_looked_up);
  expect_one_terminal("ex-gone", "recovery_indeterminate", "absent_without_terminal");
}

// A reference execution's root is a model in the daemon's memory: its slot is `modelled` (no
// pid, no pidfs identity), it walks the phases as any execution, and after a restart nothing of
// it can be re-acquired: no pid is looked up, and it ends absent.
TEST_F(Recovery, AModelledExecutionIsAbsentAfterARestartWithNoLookup) {
  CUSTOS_ASSERT_OK(registry_->record_authorized(make_execution("ex-model", "act-model")));
  BoundaryInfo b;
  b.kind = core::Boundary::reference;
  CUSTOS_ASSERT_OK(registry_->record_staged("ex-model", registry::modelled_ownership(), b));
  CUSTOS_ASSERT_OK(registry_->record_committed("ex-model"));
  CUSTOS_ASSERT_OK(registry_->record_phase("ex-model", core::Phase::running));
  auto stored = registry_->get("ex-model");
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->ownership.state, OwnershipState::modelled);
  EXPECT_EQ(stored->ownership.pid, 0);
  auto report = recover(*registry_);
  ASSERT_TRUE(report) << report.error().message();
  auto const* e = find(*report, "ex-model");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  EXPECT_FALSE(e->pid_looked_up);
  EXPECT_EQ(report->pidfd_opens, 0u);
  expect_one_terminal("ex-model", "recovery_indeterminate", "absent_without_terminal");
}

// A modelled slot belongs to the reference boundary only: anywhere else it is refused.
TEST_F(Recovery, AModelledSlotOutsideTheReferenceBoundaryIsRefused) {
  CUSTOS_ASSERT_OK(registry_->record_authorized(make_execution("ex-bad", "act-bad")));
  BoundaryInfo b;
  b.kind = core::Boundary::marker;
  b.marker_hex = std::string(32, 'a');
  EXPECT_FALSE(registry_->record_staged("ex-bad", registry::modelled_ownership(), b));
}

// An ungated container exec's slot is `marked`: its record holds the marker (and where to sweep
// for it), never a process identity. After a restart nothing can be re-acquired, so even a live
// process of it is ended by the marker sweep, with no pid looked up.
TEST_F(Recovery, AMarkedExecutionIsSweptNeverAdopted) {
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  auto const since = sys::boot_ticks_now();
  ASSERT_TRUE(since);
  auto child = spawn_sleeper({marker->env_entry()});
  CUSTOS_ASSERT_OK(registry_->record_authorized(make_execution("ex-marked", "act-marked")));
  CUSTOS_ASSERT_OK(registry_->record_staged(
      "ex-marked", registry::marked_ownership(*since),
      registry::boundary_info(core::Boundary::marker, "", marker->env_value())));
  CUSTOS_ASSERT_OK(registry_->record_committed("ex-marked"));
  CUSTOS_ASSERT_OK(registry_->record_phase("ex-marked", core::Phase::running));
  auto stored = registry_->get("ex-marked");
  ASSERT_TRUE(stored) << stored.error().message();
  EXPECT_EQ(stored->ownership.state, OwnershipState::marked);
  EXPECT_EQ(stored->ownership.start_time_ticks, *since);
  auto report = recover(*registry_);
  ASSERT_TRUE(report) << report.error().message();
  auto const* e = find(*report, "ex-marked");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  EXPECT_EQ(e->cleanup, core::Cleanup::confirmed) << e->detail;
  EXPECT_FALSE(e->pid_looked_up);
  EXPECT_FALSE(e->adopt.has_value());
  auto const until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (child.pidfd().alive() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(child.pidfd().alive()) << "the marked process outlived recovery";
  expect_one_terminal("ex-marked", "recovery_indeterminate", "absent_without_terminal");
}

// A marked slot belongs to the marker boundary, with a marker: anywhere else it is refused.
TEST_F(Recovery, AMarkedSlotNeedsTheMarkerBoundaryAndAMarker) {
  CUSTOS_ASSERT_OK(registry_->record_authorized(make_execution("ex-m1", "act-m1")));
  EXPECT_FALSE(registry_->record_staged(
      "ex-m1", registry::marked_ownership(1),
      registry::boundary_info(core::Boundary::cgroup, "/sys/fs/cgroup/unified/x", "")));
  CUSTOS_ASSERT_OK(registry_->record_authorized(make_execution("ex-m2", "act-m2")));
  EXPECT_FALSE(registry_->record_staged("ex-m2", registry::marked_ownership(1),
                                        registry::boundary_info(core::Boundary::marker, "", "")));
}

TEST_F(Recovery, QuarantinedAndTerminalRecordsAreNotTouched) {
  auto child = spawn_sleeper();
  fabricate("ex-q", registry::staged_ownership(child.identity()));
  ASSERT_TRUE(registry_->record_authorized(make_execution("ex-done", "act-done")));
  ASSERT_TRUE(registry_->record_phase("ex-done", core::Phase::starting));
  ASSERT_TRUE(registry_->record_terminal("ex-done", fake_terminal("spawn_failed")));
  sink_.reset();
  registry_.reset();
  raw_exec(state_ / "registry" / "registry.db",
           "UPDATE executions SET backend='x' WHERE execution_id='ex-q'");
  auto reg = Registry::open(state_ / "registry");
  ASSERT_TRUE(reg);
  registry_ = std::move(*reg);
  sink_ = std::make_unique<RegistrySink>(*registry_, io_);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  EXPECT_TRUE(report->executions.empty());
  EXPECT_EQ(report->already_terminal, 1u);
  ASSERT_EQ(report->quarantined.size(), 1u);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_TRUE(child.pidfd().alive());  // an untrusted record never authorizes a signal
}

// ---- adoption --------------------------------------------------------------------------------

// The root is re-acquired through one pidfd, which is the very process; adoption hands that
// pidfd to the manager, which supervises it from the recorded phase: exec.cancel ends it through
// the same teardown, with one terminal record reached as live_owned.
TEST_F(Recovery, LiveOwnedIsAdoptedThroughTheSamePidfdAndCancelledByTheOneTeardown) {
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  auto child = spawn_sleeper({marker->env_entry()});
  fabricate("ex-live", registry::staged_ownership(child.identity()),
            {core::Boundary::marker, "", marker->env_value()});

  auto report = recover(*registry_);
  ASSERT_TRUE(report) << report.error().message();
  auto* e = find(*report, "ex-live");
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->classification, core::RecoveryPath::live_owned) << e->detail;
  EXPECT_EQ(report->pidfd_opens, 1u);
  EXPECT_FALSE(e->terminal_written);
  ASSERT_TRUE(e->adopt);
  // The handle is the very process: same pidfs inode. Nothing acted on it.
  auto id = sys::read_identity(e->adopt->root.root);
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(id->pidfs_ino, child.identity().pidfs_ino);
  EXPECT_TRUE(child.pidfd().alive());
  EXPECT_EQ(registry_->get("ex-live")->phase, core::Phase::running);

  managed();
  auto failed = adopt_recovered(*manager_, *report, RestartPolicy::adopt);
  ASSERT_TRUE(failed.empty()) << failed[0].second.message();
  EXPECT_TRUE(e->adopted);
  EXPECT_EQ(manager_->stats().adopted, 1u);
  Collected events;
  collect("ex-live", events);
  drive([] { return false; }, 200ms);
  EXPECT_TRUE(child.pidfd().alive()) << "adoption must not stop the execution";
  auto v = manager_->get("ex-live");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->phase, core::Phase::running);
  EXPECT_EQ(v->pid, child.pid());
  ASSERT_FALSE(events.events.empty());
  EXPECT_EQ(events.events[0].seq, 1u);
  EXPECT_EQ(events.events[0].kind, "adopted");
  EXPECT_EQ(events.events[0].fields.at("output").as_string(), "not_kept");
  EXPECT_EQ(events.count("started"), 0u);
  // Nothing claimed or authorized again: the record goes on as it was.
  EXPECT_EQ(registry_->get("ex-live")->ownership.state, OwnershipState::committed);

  auto c = manager_->cancel("ex-live", core::Trigger::user, "stop");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->accepted);
  auto t = terminal("ex-live");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->classification, core::Classification::cancelled);
  EXPECT_EQ(t->recovery, core::RecoveryPath::live_owned);
  EXPECT_EQ(t->trigger, core::Trigger::user);
  EXPECT_TRUE(t->escalation.graceful_sent);
  EXPECT_EQ(t->exit.signal, SIGTERM);  // sleep dies on the plan's graceful signal
  EXPECT_EQ(t->observations.at("output"), "not_kept");
  for (auto const& [stream, acc] : t->output) EXPECT_FALSE(acc.complete);
  // Sampled while adopted (the root's memory), and timed from its original start.
  EXPECT_TRUE(t->resources.at(core::ResourceDim::memory).value.has_value());
  ASSERT_TRUE(t->resources.at(core::ResourceDim::wall).value.has_value());
  EXPECT_GE(*t->resources.at(core::ResourceDim::wall).value, 200u);
  EXPECT_FALSE(child.pidfd().alive());
  EXPECT_EQ(events.events.back().kind, "terminal");
  EXPECT_EQ(events.count("cancel_requested"), 1u);
  expect_one_terminal("ex-live", "cancelled", "live_owned");
  EXPECT_EQ(*registry::decode_terminal(*registry_->get("ex-live")->terminal), *t);
}

// restart-policy cancel: adopted, then cancelled with trigger supervisor_shutdown — the same
// teardown, not a second kill-and-wait.
TEST_F(Recovery, CancelPolicyAdoptsThenCancelsWithSupervisorShutdown) {
  auto child = spawn_sleeper();
  fabricate("ex-c", registry::staged_ownership(child.identity()));
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  managed();
  ASSERT_TRUE(adopt_recovered(*manager_, *report, RestartPolicy::cancel).empty());
  auto t = terminal("ex-c");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->classification, core::Classification::cancelled);
  EXPECT_EQ(t->trigger, core::Trigger::supervisor_shutdown);
  EXPECT_EQ(t->recovery, core::RecoveryPath::live_owned);
  EXPECT_FALSE(child.pidfd().alive());
  expect_one_terminal("ex-c", "cancelled", "live_owned");
}

// A root that ends on its own after adoption gets its exit status recorded, with no trigger.
TEST_F(Recovery, AnAdoptedRootThatExitsOnItsOwnRecordsItsStatus) {
  auto child = spawn_sleeper({}, {"sh", "-c", "sleep 0.3; exit 7"});
  fabricate("ex-exit", registry::staged_ownership(child.identity()));
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  ASSERT_EQ(report->executions.at(0).classification, core::RecoveryPath::live_owned);
  managed();
  ASSERT_TRUE(adopt_recovered(*manager_, *report, RestartPolicy::adopt).empty());
  auto t = terminal("ex-exit");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->classification, core::Classification::exited);
  EXPECT_EQ(t->exit, core::ExitStatus::exited(7));
  EXPECT_FALSE(t->trigger.has_value());
  EXPECT_EQ(t->recovery, core::RecoveryPath::live_owned);
  expect_one_terminal("ex-exit", "exited", "live_owned");
  // Ended: a later cancel is refused, no second record.
  auto late = manager_->cancel("ex-exit", core::Trigger::user, "late");
  EXPECT_FALSE(late);
}

// limits.wall_ms counts from the root's start, not from the adoption.
TEST_F(Recovery, AnAdoptedDeadlineCountsFromTheOriginalStart) {
  auto ex = execution_with("ex-late", {{"limits", boost::json::object{{"wall_ms", 1500}}},
                                       {"escalation", boost::json::object{{"grace_ms", 100}}}});
  auto child = spawn_sleeper();
  fabricate("ex-late", registry::staged_ownership(child.identity()), {}, &ex);
  std::this_thread::sleep_for(1200ms);  // most of the deadline passes before the restart
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  ASSERT_EQ(report->executions.at(0).classification, core::RecoveryPath::live_owned);
  managed();
  auto const adopted_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(adopt_recovered(*manager_, *report, RestartPolicy::adopt).empty());
  auto t = terminal("ex-late");
  ASSERT_TRUE(t);
  auto const after = std::chrono::steady_clock::now() - adopted_at;
  EXPECT_EQ(t->classification, core::Classification::timed_out);
  EXPECT_EQ(t->trigger, core::Trigger::deadline);
  // Counted from the adoption it would have taken 1500 ms more.
  EXPECT_LT(after, 1200ms);
  auto const& wall = t->resources.at(core::ResourceDim::wall);
  ASSERT_TRUE(wall.value.has_value());
  EXPECT_GE(*wall.value, 1400u);
  EXPECT_FALSE(child.pidfd().alive());
}

// The previous daemon was stopping it (trigger recorded, phase stopping): the stop goes on at
// once, the recorded trigger decides, and a new cancel is not accepted.
TEST_F(Recovery, AnExecutionAdoptedWhileStoppingIsKilledUnderItsRecordedTrigger) {
  auto child = spawn_sleeper();
  fabricate("ex-stop", registry::staged_ownership(child.identity()), {}, nullptr,
            OwnershipState::committed, core::Phase::stopping);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  managed();
  ASSERT_TRUE(adopt_recovered(*manager_, *report, RestartPolicy::adopt).empty());
  auto c = manager_->cancel("ex-stop", core::Trigger::deadline, "late");
  if (c) {
    EXPECT_FALSE(c->accepted);
    EXPECT_EQ(c->trigger, core::Trigger::user);
  }
  auto t = terminal("ex-stop");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->classification, core::Classification::cancelled);
  EXPECT_EQ(t->trigger, core::Trigger::user);
  EXPECT_TRUE(t->escalation.forced);
  EXPECT_FALSE(child.pidfd().alive());
  expect_one_terminal("ex-stop", "cancelled", "live_owned");
}

// A record still `starting` with committed ownership (the crash lost `running`): the launch
// completes as `running` on adoption, written once.
TEST_F(Recovery, ACommittedRecordStillStartingIsAdoptedRunning) {
  auto child = spawn_sleeper();
  fabricate("ex-st", registry::staged_ownership(child.identity()), {}, nullptr,
            OwnershipState::committed, core::Phase::starting);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  managed();
  ASSERT_TRUE(adopt_recovered(*manager_, *report, RestartPolicy::adopt).empty());
  EXPECT_EQ(manager_->get("ex-st")->phase, core::Phase::running);
  EXPECT_EQ(registry_->get("ex-st")->phase, core::Phase::running);
  ASSERT_TRUE(manager_->cancel("ex-st", core::Trigger::user, "stop"));
  auto t = terminal("ex-st");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->classification, core::Classification::cancelled);
  expect_one_terminal("ex-st", "cancelled", "live_owned");
}

// Only staged (the launch's commit never reached the registry): nobody was told it started, so
// it is stopped at once and ends on the spawn-failure path.
TEST_F(Recovery, AStagedOnlyRootIsStoppedAtOnceOnTheSpawnFailurePath) {
  auto child = spawn_sleeper();
  fabricate("ex-staged", registry::staged_ownership(child.identity()), {}, nullptr,
            OwnershipState::staged);
  auto report = recover(*registry_);
  ASSERT_TRUE(report);
  ASSERT_EQ(report->executions.at(0).classification, core::RecoveryPath::live_owned);
  managed();
  ASSERT_TRUE(adopt_recovered(*manager_, *report, RestartPolicy::adopt).empty());
  auto t = terminal("ex-staged");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->classification, core::Classification::cancelled);
  EXPECT_EQ(t->trigger, core::Trigger::supervisor_shutdown);
  ASSERT_TRUE(t->spawn_error.has_value());
  EXPECT_EQ(t->spawn_error->code, "barrier");
  EXPECT_FALSE(t->exit.observed());
  EXPECT_EQ(t->recovery, core::RecoveryPath::live_owned);
  EXPECT_FALSE(child.pidfd().alive());
  expect_one_terminal("ex-staged", "cancelled", "live_owned");
}

// ---- leftover cgroups --------------------------------------------------------------------------

// A sleeper started inside the cgroup at `path`.
sys::RunningChild sleeper_in(std::string const& path) {
  sys::UniqueFd cg{::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  EXPECT_TRUE(cg.valid()) << path;
  return spawn_sleeper({}, {"sleep", "1000"}, cg.get());
}

// An execution whose teardown could not empty its cgroup wrote its terminal record with the
// cleanup unconfirmed and left the cgroup (the rmdir failed). The next start kills what is left
// in it and removes it. Cgroups of ids the registry does not know, of quarantined records, and
// names that are not execution ids are left alone.
TEST_F(Recovery, ATerminalExecutionsLeftoverCgroupIsKilledAndRemovedAtTheNextStart) {
  if (!have_cgroup()) GTEST_SKIP() << "cgroup v2 is not writable here";
  std::string const done = "ex-00000000000000a1";
  std::string const unknown = "ex-00000000000000a2";
  std::string const untrusted = "ex-00000000000000a3";
  for (auto const& id : {done, untrusted}) {
    ASSERT_TRUE(registry_->record_authorized(make_execution(id, "act-" + id)));
    ASSERT_TRUE(registry_->record_phase(id, core::Phase::starting));
    ASSERT_TRUE(registry_->record_terminal(id, fake_terminal("spawn_failed")));
  }
  sink_.reset();
  registry_.reset();
  raw_exec(state_ / "registry" / "registry.db",
           "UPDATE executions SET backend='x' WHERE execution_id='" + untrusted + "'");
  auto mk = [&](std::string const& name) {
    std::string const p = cgroup_path_ + "/" + name;
    EXPECT_EQ(::mkdir(p.c_str(), 0755), 0) << p << ": " << errno;
    return p;
  };
  auto left = sleeper_in(mk(done));
  auto stranger = sleeper_in(mk(unknown));
  auto quarantined = sleeper_in(mk(untrusted));
  std::string const other = mk("not-an-execution");

  auto reg = Registry::open(state_ / "registry");
  ASSERT_TRUE(reg);
  registry_ = std::move(*reg);
  RecoveryOptions opts;
  opts.execution_cgroup_parent = cgroup_path_;
  auto report = recover(*registry_, opts);
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_TRUE(report->executions.empty());
  ASSERT_EQ(report->leftover_cgroups.size(), 1U);
  EXPECT_EQ(report->leftover_cgroups[0].execution_id, done);
  EXPECT_EQ(report->leftover_cgroups[0].cleanup, core::Cleanup::confirmed)
      << report->leftover_cgroups[0].detail;
  EXPECT_FALSE(left.pidfd().alive());
  EXPECT_FALSE(std::filesystem::exists(cgroup_path_ + "/" + done));
  // Untouched: an unknown id, a quarantined record, another name.
  EXPECT_TRUE(stranger.pidfd().alive());
  EXPECT_TRUE(quarantined.pidfd().alive());
  EXPECT_TRUE(std::filesystem::exists(cgroup_path_ + "/" + unknown));
  EXPECT_TRUE(std::filesystem::exists(cgroup_path_ + "/" + untrusted));
  EXPECT_TRUE(std::filesystem::exists(other));
  // The terminal record stays exactly as it was written.
  auto rec = registry_->get(done);
  ASSERT_TRUE(rec) << rec.error().message();
  ASSERT_TRUE(rec->terminal);
  EXPECT_EQ(rec->terminal->classification, "spawn_failed");
  // This test's own cgroups go (the fixture removes only the subtree).
  for (auto const& name : {unknown, untrusted, std::string{"not-an-execution"}}) {
    if (auto dir = sys::CgroupDir::open(cgroup_path_ + "/" + name)) {
      (void)dir->kill();
      (void)dir->wait_empty(std::chrono::seconds(5));
      (void)dir->remove();
    }
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

}  // namespace
}  // namespace custos::supervisor::testing
