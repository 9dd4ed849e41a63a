// Recovery with real processes: PID reuse never signalled, boot fence before any lookup,
// negative checks, live re-acquisition through the same pidfd, restart policy.
#include "custos/registry/recovery.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/registry/ownership.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/spawn.hpp"

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

constexpr char const* kOtherBoot = "00000000-0000-4000-8000-000000000000";

// A process this test started outside the registry: "a stranger" to every fabricated record.
sys::RunningChild spawn_sleeper(std::vector<std::string> env = {}) {
  sys::SpawnSpec spec;
  spec.executable = "/bin/sleep";
  spec.argv = {"sleep", "1000"};
  spec.envp = std::move(env);
  auto staged = sys::spawn_staged(spec);
  EXPECT_TRUE(staged) << staged.error().message();
  auto running = std::move(*staged).release();
  EXPECT_TRUE(running) << running.error().message();
  return std::move(*running);
}

// Creates a running execution whose ownership slot holds `owner` (fabricated or real).
void fabricate_running(Registry& reg, std::string const& id, Ownership owner,
                       BoundaryInfo const& boundary = {}) {
  owner.state = OwnershipState::staged;
  CUSTOS_ASSERT_OK(reg.record_authorized(make_execution(id, "act-" + id)));
  CUSTOS_ASSERT_OK(reg.record_staged(id, owner, boundary));
  CUSTOS_ASSERT_OK(reg.record_committed(id));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::running));
}

RecoveredExecution const* find(RecoveryReport const& r, std::string const& id) {
  for (auto const& e : r.executions) {
    if (e.execution_id == id) return &e;
  }
  return nullptr;
}

void expect_one_terminal(Registry& reg, std::string const& id, std::string const& classification,
                         std::string const& recovery) {
  auto rec = reg.get(id);
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  ASSERT_TRUE(rec->terminal);
  EXPECT_EQ(rec->terminal->classification, classification);
  EXPECT_EQ(rec->terminal->recovery, recovery);
  auto decoded = decode_terminal(*rec->terminal);
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_TRUE(core::validate(*decoded));
  // In-flight output is never reported complete after a crash.
  for (auto const& [stream, acc] : decoded->output) EXPECT_FALSE(acc.complete);
  // Exactly one: a second terminal write is refused.
  CUSTOS_EXPECT_ERRC(reg.record_terminal(id, fake_terminal("exited")),
                     Errc::registry_illegal_phase);
}

TEST(RegistryRecovery, PidReusedByStrangerIsNeverSignalled) {
  TempDir t;
  auto stranger = spawn_sleeper();
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  // The record names the stranger's pid in this boot, but another pidfs inode: the process it
  // owned has ended and the pid was reused.
  Ownership o = staged_ownership(stranger.identity());
  o.pidfs_ino += 1;
  fabricate_running(**reg, "ex-reused", o);

  RecoveryOptions opts;
  auto report = recover(**reg, opts);
  ASSERT_TRUE(report) << report.error().message();
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report, opts));
  auto const* e = find(*report, "ex-reused");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  EXPECT_TRUE(e->pid_looked_up);
  EXPECT_EQ(report->pidfd_opens, 1u);
  EXPECT_FALSE(e->pidfd);
  EXPECT_TRUE(stranger.pidfd().alive());  // never signalled
  expect_one_terminal(**reg, "ex-reused", "recovery_indeterminate", "absent_without_terminal");
}

// A reference execution's root is a model in the daemon's memory: its slot is `modelled` (no
// pid, no pidfs identity), it walks the phases as any execution, survives a reopen, and after a
// restart nothing of it can be re-acquired: no pid is looked up, and it ends absent.
TEST(RegistryRecovery, AModelledExecutionIsAbsentAfterARestartWithNoLookup) {
  TempDir t;
  {
    auto reg = Registry::open(t.state());
    ASSERT_TRUE(reg);
    CUSTOS_ASSERT_OK((*reg)->record_authorized(make_execution("ex-model", "act-model")));
    BoundaryInfo b;
    b.kind = core::Boundary::reference;
    CUSTOS_ASSERT_OK((*reg)->record_staged("ex-model", modelled_ownership(), b));
    CUSTOS_ASSERT_OK((*reg)->record_committed("ex-model"));
    CUSTOS_ASSERT_OK((*reg)->record_phase("ex-model", core::Phase::running));
    auto rec = (*reg)->get("ex-model");
    ASSERT_TRUE(rec) << rec.error().message();
    EXPECT_EQ(rec->ownership.state, OwnershipState::modelled);
    EXPECT_EQ(rec->ownership.pid, 0);
  }
  auto reg = Registry::open(t.state());  // validated again on reopen (checksum, phase rules)
  ASSERT_TRUE(reg) << reg.error().message();
  auto report = recover(**reg);
  ASSERT_TRUE(report) << report.error().message();
  auto const* e = find(*report, "ex-model");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  EXPECT_FALSE(e->pid_looked_up);
  EXPECT_EQ(report->pidfd_opens, 0u);
  expect_one_terminal(**reg, "ex-model", "recovery_indeterminate", "absent_without_terminal");
}

// A modelled slot belongs to the reference boundary only: anywhere else it is refused.
TEST(RegistryRecovery, AModelledSlotOutsideTheReferenceBoundaryIsRefused) {
  TempDir t;
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK((*reg)->record_authorized(make_execution("ex-bad", "act-bad")));
  BoundaryInfo b;
  b.kind = core::Boundary::marker;
  b.marker_hex = std::string(32, 'a');
  EXPECT_FALSE((*reg)->record_staged("ex-bad", modelled_ownership(), b));
}

TEST(RegistryRecovery, BootIdMismatchMeansNoLookupAtAll) {
  TempDir t;
  auto stranger = spawn_sleeper();
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  // Even an exact dev/ino/pid match must not be looked at across a boot fence.
  Ownership o = staged_ownership(stranger.identity());
  o.boot_id = kOtherBoot;
  fabricate_running(**reg, "ex-oldboot", o);

  auto report = recover(**reg);
  ASSERT_TRUE(report) << report.error().message();
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report));
  auto const* e = find(*report, "ex-oldboot");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal);
  EXPECT_FALSE(e->pid_looked_up);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_TRUE(stranger.pidfd().alive());
  expect_one_terminal(**reg, "ex-oldboot", "recovery_indeterminate", "absent_without_terminal");
}

TEST(RegistryRecovery, InjectedCurrentBootIdFencesTooAndRemovesStaleEmptyCgroupPath) {
  TempDir t;
  auto stranger = spawn_sleeper();
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  // A stale cgroup path that does not exist any more counts as cleaned.
  fabricate_running(**reg, "ex-1", staged_ownership(stranger.identity()),
                    {core::Boundary::cgroup, (t.path() / "no-such-cgroup").string(), ""});
  RecoveryOptions opts;
  opts.boot_id = kOtherBoot;
  auto report = recover(**reg, opts);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_EQ(report->executions.at(0).cleanup, core::Cleanup::confirmed);
  EXPECT_TRUE(stranger.pidfd().alive());
}

TEST(RegistryRecovery, StartTimeContradictionIsIndeterminateAndUntouched) {
  TempDir t;
  auto stranger = spawn_sleeper();
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  Ownership o = staged_ownership(stranger.identity());
  o.start_time_ticks += 5;  // exact pidfs match, contradicted by negative evidence
  fabricate_running(**reg, "ex-odd", o);
  auto report = recover(**reg);
  ASSERT_TRUE(report);
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report));
  auto const* e = find(*report, "ex-odd");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->classification, core::RecoveryPath::indeterminate) << e->detail;
  EXPECT_FALSE(e->pidfd);
  EXPECT_TRUE(stranger.pidfd().alive());
  expect_one_terminal(**reg, "ex-odd", "recovery_indeterminate", "indeterminate");
}

TEST(RegistryRecovery, ForeignPidNamespaceIsIndeterminateWithoutLookup) {
  TempDir t;
  auto stranger = spawn_sleeper();
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  Ownership o = staged_ownership(stranger.identity());
  o.pid_ns_ino = current_pid_ns_ino() + 1;
  fabricate_running(**reg, "ex-ns", o);
  auto report = recover(**reg);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->executions.at(0).classification, core::RecoveryPath::indeterminate);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_TRUE(stranger.pidfd().alive());
}

TEST(RegistryRecovery, GoneProcessIsAbsentWithoutTerminal) {
  TempDir t;
  Ownership o;
  {
    auto child = spawn_sleeper();
    o = staged_ownership(child.identity());
  }  // killed and reaped here
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  fabricate_running(**reg, "ex-gone", o);
  auto report = recover(**reg);
  ASSERT_TRUE(report);
  auto const* e = find(*report, "ex-gone");
  EXPECT_EQ(e->classification, core::RecoveryPath::absent_without_terminal) << e->detail;
  expect_one_terminal(**reg, "ex-gone", "recovery_indeterminate", "absent_without_terminal");
}

TEST(RegistryRecovery, LiveOwnedKeepsTheSamePidfdThenCancelAndReap) {
  TempDir t;
  auto child = spawn_sleeper();
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  fabricate_running(**reg, "ex-live", staged_ownership(child.identity()));

  RecoveryOptions keep;
  keep.policy = RestartPolicy::keep_running;
  auto report = recover(**reg, keep);
  ASSERT_TRUE(report);
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report, keep));
  auto* e = &report->executions.at(0);
  ASSERT_EQ(e->classification, core::RecoveryPath::live_owned) << e->detail;
  ASSERT_TRUE(e->pidfd);
  EXPECT_FALSE(e->terminal_written);
  // The returned handle is the very process: same pidfs inode.
  auto id = sys::read_identity(*e->pidfd);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->pidfs_ino, child.identity().pidfs_ino);
  EXPECT_TRUE(child.pidfd().alive());
  EXPECT_EQ((*reg)->get("ex-live")->phase, core::Phase::running);

  // Default policy: cancel and reap through that pidfd.
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report));
  EXPECT_TRUE(e->terminal_written);
  EXPECT_EQ(e->cleanup, core::Cleanup::confirmed) << e->detail;
  EXPECT_FALSE(child.pidfd().alive());
  auto status = child.pidfd().wait();
  ASSERT_TRUE(status);
  EXPECT_EQ(status->signal, SIGKILL);
  expect_one_terminal(**reg, "ex-live", "cancelled", "live_owned");
  auto term = decode_terminal(*(*reg)->get("ex-live")->terminal);
  EXPECT_EQ(term->trigger, core::Trigger::supervisor_shutdown);
  EXPECT_EQ(term->exit.signal, SIGKILL);
}

TEST(RegistryRecovery, QuarantinedAndTerminalRecordsAreNotTouched) {
  TempDir t;
  auto child = spawn_sleeper();
  {
    auto reg = Registry::open(t.state());
    ASSERT_TRUE(reg);
    fabricate_running(**reg, "ex-q", staged_ownership(child.identity()));
    CUSTOS_ASSERT_OK((*reg)->record_authorized(make_execution("ex-done", "act-done")));
    CUSTOS_ASSERT_OK((*reg)->record_phase("ex-done", core::Phase::starting));
    CUSTOS_ASSERT_OK((*reg)->record_terminal("ex-done", fake_terminal("spawn_failed")));
  }
  raw_exec(t.db(), "UPDATE executions SET backend='x' WHERE execution_id='ex-q'");
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  auto report = recover(**reg);
  ASSERT_TRUE(report);
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report));
  EXPECT_TRUE(report->executions.empty());
  EXPECT_EQ(report->already_terminal, 1u);
  ASSERT_EQ(report->quarantined.size(), 1u);
  EXPECT_EQ(report->pidfd_opens, 0u);
  EXPECT_TRUE(child.pidfd().alive());  // an untrusted record never authorizes a signal
}

// A test's own cgroup beneath the v2 mount, standing in for the daemon's subtree; whatever is
// left in it is killed and removed at the end.
class TestSubtree {
 public:
  TestSubtree() {
    auto mount = sys::find_cgroup2_mount();
    if (!mount) return;
    static int n = 0;
    std::string const path = mount->path + "/custos-test-recovery-" + std::to_string(::getpid()) +
                             "-" + std::to_string(n++);
    if (::mkdir(path.c_str(), 0755) == 0) path_ = path;
  }
  ~TestSubtree() {
    if (path_.empty()) return;
    std::error_code ec;
    for (auto const& e : std::filesystem::directory_iterator(path_, ec)) {
      if (!e.is_directory()) continue;
      if (auto dir = sys::CgroupDir::open(e.path().string()); dir) {
        (void)dir->kill();
        (void)dir->wait_empty(std::chrono::seconds(5));
        (void)dir->remove();
      }
    }
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    (void)::rmdir(path_.c_str());
  }
  TestSubtree(TestSubtree const&) = delete;
  TestSubtree& operator=(TestSubtree const&) = delete;
  [[nodiscard]] std::string const& path() const { return path_; }
  // <subtree>/<name>, created.
  [[nodiscard]] std::string child(std::string const& name) const {
    std::string const p = path_ + "/" + name;
    EXPECT_EQ(::mkdir(p.c_str(), 0755), 0) << p << ": " << errno;
    return p;
  }

 private:
  std::string path_;
};

// A sleeper started inside the cgroup at `path`.
sys::RunningChild sleeper_in(std::string const& path) {
  sys::UniqueFd cg{::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  EXPECT_TRUE(cg.valid()) << path;
  sys::SpawnSpec spec;
  spec.executable = "/bin/sleep";
  spec.argv = {"sleep", "1000"};
  spec.cgroup_fd = cg.get();
  auto staged = sys::spawn_staged(spec);
  EXPECT_TRUE(staged) << staged.error().message();
  auto running = std::move(*staged).release();
  EXPECT_TRUE(running) << running.error().message();
  return std::move(*running);
}

// An execution whose teardown could not empty its cgroup wrote its terminal record with the
// cleanup unconfirmed and left the cgroup (the rmdir failed). The next start kills what is left
// in it and removes it. Cgroups of ids the registry does not know, of quarantined records, and
// names that are not execution ids are left alone.
TEST(RegistryRecovery, ATerminalExecutionsLeftoverCgroupIsKilledAndRemovedAtTheNextStart) {
  TestSubtree sub;
  if (sub.path().empty()) GTEST_SKIP() << "cgroup v2 is not writable here";
  TempDir t;
  std::string const done = "ex-00000000000000a1";
  std::string const unknown = "ex-00000000000000a2";
  std::string const untrusted = "ex-00000000000000a3";
  {
    auto reg = Registry::open(t.state());
    ASSERT_TRUE(reg);
    for (auto const& id : {done, untrusted}) {
      CUSTOS_ASSERT_OK((*reg)->record_authorized(make_execution(id, "act-" + id)));
      CUSTOS_ASSERT_OK((*reg)->record_phase(id, core::Phase::starting));
      CUSTOS_ASSERT_OK((*reg)->record_terminal(id, fake_terminal("spawn_failed")));
    }
  }
  raw_exec(t.db(), "UPDATE executions SET backend='x' WHERE execution_id='" + untrusted + "'");
  auto left = sleeper_in(sub.child(done));
  auto stranger = sleeper_in(sub.child(unknown));
  auto quarantined = sleeper_in(sub.child(untrusted));
  std::string const other = sub.child("not-an-execution");

  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  RecoveryOptions opts;
  opts.execution_cgroup_parent = sub.path();
  auto report = recover(**reg, opts);
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_TRUE(report->executions.empty());
  ASSERT_EQ(report->leftover_cgroups.size(), 1U);
  EXPECT_EQ(report->leftover_cgroups[0].execution_id, done);
  EXPECT_EQ(report->leftover_cgroups[0].cleanup, core::Cleanup::confirmed)
      << report->leftover_cgroups[0].detail;
  EXPECT_FALSE(left.pidfd().alive());
  EXPECT_FALSE(std::filesystem::exists(sub.path() + "/" + done));
  // Untouched: an unknown id, a quarantined record, another name.
  EXPECT_TRUE(stranger.pidfd().alive());
  EXPECT_TRUE(quarantined.pidfd().alive());
  EXPECT_TRUE(std::filesystem::exists(sub.path() + "/" + unknown));
  EXPECT_TRUE(std::filesystem::exists(sub.path() + "/" + untrusted));
  EXPECT_TRUE(std::filesystem::exists(other));
  // The terminal record stays exactly as it was written.
  auto rec = (*reg)->get(done);
  ASSERT_TRUE(rec) << rec.error().message();
  ASSERT_TRUE(rec->terminal);
  EXPECT_EQ(rec->terminal->classification, "spawn_failed");
}

}  // namespace
}  // namespace custos::registry::test
