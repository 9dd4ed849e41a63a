// Crash recovery end to end: a forked "daemon" opens the registry, launches a real process tree
// (a shell with a background child) into a per-execution cgroup or under a marker, and is killed
// with SIGKILL by a failpoint at one step. The test then reopens the registry, recovers, applies
// the default restart policy, and checks the classification, exactly one terminal record, zero
// surviving processes, and that the claim can never be consumed again.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <fstream>
#include <poll.h>
#include <set>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/recovery.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/spawn.hpp"

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

constexpr char const* kId = "ex-crash";
constexpr char const* kAction = "act-crash";

// How the "daemon" writes:
//   immediate  every write committed before the call returns (a sink without an event loop);
//   deferred   as supervisor::RegistrySink with a loop: starting, committed, stopping, exited,
//              closed and the output accounting are queued and committed by the next immediate
//              write or flush (the end of the loop turn), so a crash can hit with writes queued;
//   gateway    the gateway's shape: the claim in its own FULL transaction, then the record.
enum class Mode : std::uint8_t { immediate, deferred, gateway };

// The daemon's launch path, step by step, as the supervisor drives it through the registry.
// Runs in a forked child; every failure exits with a distinct code, success with 0 (a failpoint
// SIGKILLs it somewhere on the way).
// The tree the crashing daemon launches unless told otherwise: a shell and a background child.
constexpr char const* kTreeScript = "sleep 1000 & exec sleep 1000";

[[noreturn]] void crashing_daemon(std::filesystem::path const& state, std::string const& point,
                                  std::string const& cgroup_path, sys::Marker const& marker,
                                  Mode mode, std::string const& script) {
  ::setenv(std::string{kFailpointEnv}.c_str(), point.c_str(), 1);
  auto reg = Registry::open(state);
  if (!reg) ::_exit(20);
  Registry& r = **reg;
  WriteMode const later = mode == Mode::deferred ? WriteMode::deferred : WriteMode::now;
  if (mode == Mode::gateway) {
    if (!r.consume_claim(kAction, "proc-1", kId)) ::_exit(21);
    if (!r.create_execution(make_execution(kId, kAction))) ::_exit(21);
  } else {
    if (!r.record_authorized(make_execution(kId, kAction))) ::_exit(21);
  }
  if (!r.record_phase(kId, core::Phase::starting, later)) ::_exit(21);
  sys::UniqueFd cg;
  if (!cgroup_path.empty()) {
    cg.reset(::open(cgroup_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!cg.valid()) ::_exit(22);
  }
  sys::SpawnSpec spec;
  spec.executable = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.envp = {"PATH=/usr/bin:/bin", marker.env_entry()};
  spec.cgroup_fd = cg.get();
  auto staged = sys::spawn_staged(spec);
  if (!staged) ::_exit(23);
  BoundaryInfo const b{cgroup_path.empty() ? core::Boundary::marker : core::Boundary::cgroup,
                       cgroup_path, marker.env_value()};
  if (!r.record_staged(kId, staged_ownership(staged->identity()), b)) ::_exit(24);
  auto running = std::move(*staged).release();
  if (!running) ::_exit(25);
  if (!r.record_committed(kId, later)) ::_exit(26);
  if (!r.record_phase(kId, core::Phase::running)) ::_exit(27);
  // Let the shell fork its background child, so the tree holds two processes.
  for (int i = 0; i < 200; ++i) {
    auto scan = sys::marker_scan(marker);
    if (scan && scan->matched.size() >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!r.record_trigger(kId, core::Trigger::user)) ::_exit(28);
  if (!r.record_phase(kId, core::Phase::stopping, later)) ::_exit(29);
  // Stop the tree as the supervisor does, then reap the root.
  if (!cgroup_path.empty()) {
    auto dir = sys::CgroupDir::open(cgroup_path);
    if (!dir || !dir->kill() || !dir->wait_empty(std::chrono::seconds(5))) ::_exit(30);
  } else {
    sys::MarkerSweepOptions so;
    auto swept = sys::marker_sweep(marker, so);
    // remaining, not confirmed: a process whose environ nobody may read (PID 1 here) makes
    // every sweep unconfirmed without being part of this tree.
    if (!swept || swept->remaining != 0) ::_exit(31);
  }
  auto st = running->pidfd().wait();
  if (!st) ::_exit(32);
  if (!r.record_phase(kId, core::Phase::exited, later)) ::_exit(33);
  // The loop turn that saw the exit ends: the queued writes are committed (the failpoint
  // flush_with_writes_queued crashes right before).
  if (!r.flush()) ::_exit(38);
  if (!r.record_phase(kId, core::Phase::closed, later)) ::_exit(34);
  core::StreamAccounting const none{};
  if (!r.record_output(kId, 0, none, later) || !r.record_output(kId, 1, none, later)) ::_exit(39);
  auto term = core::make_terminal_record(
      core::ClassifyInput{core::ExitStatus::signaled(SIGKILL), false, core::Trigger::user,
                          core::Cleanup::confirmed, false, core::RecoveryPath::observed},
      std::nullopt);
  if (!term) ::_exit(35);
  term->output[core::Stream::stdout_stream] = {};
  term->output[core::Stream::stderr_stream] = {};
  auto blob = terminal_blob(*term);
  if (!blob) ::_exit(36);
  if (!r.record_terminal(kId, *blob)) ::_exit(37);
  if (r.take_deferred_error(kId)) ::_exit(40);
  ::_exit(0);
}

struct CrashCase {
  std::string point;
  bool cgroup;
  Mode mode = Mode::immediate;
};

std::string case_name(::testing::TestParamInfo<CrashCase> const& info) {
  return info.param.point + (info.param.cgroup ? "_cgroup" : "_marker") +
         (info.param.mode == Mode::deferred  ? "_deferred"
          : info.param.mode == Mode::gateway ? "_gateway"
                                             : "");
}

class RegistryCrash : public ::testing::TestWithParam<CrashCase> {
 protected:
  void SetUp() override {
    if (!kFailpointsCompiled) {
      GTEST_SKIP() << "failpoints are compiled only with CUSTOS_FAILPOINTS";
    }
    // Like the daemon: orphans of the crashed "daemon" come to us, so nothing escapes to init
    // and every zombie is reaped here.
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    if (GetParam().cgroup) {
      auto mount = sys::find_cgroup2_mount();
      if (!mount) {
        GTEST_SKIP() << "no cgroup2 mount: " << mount.error().message();
      }
      static int n = 0;
      parent_cg_ = mount->path + "/custos-test-registry-" + std::to_string(::getpid()) + "-" +
                   std::to_string(n++);
      if (::mkdir(parent_cg_.c_str(), 0755) != 0) {
        int const err = errno;
        parent_cg_.clear();
        GTEST_SKIP() << "cgroup v2 not writable here (errno " << err << ")";
      }
      exec_cg_ = parent_cg_ + "/" + kId;
      ASSERT_EQ(::mkdir(exec_cg_.c_str(), 0755), 0);
    }
  }

  void TearDown() override {
    reap_all();
    if (!exec_cg_.empty()) {
      if (auto dir = sys::CgroupDir::open(exec_cg_); dir) {
        (void)dir->kill();
        (void)dir->wait_empty(std::chrono::seconds(5));
        (void)dir->remove();
      }
    }
    reap_all();
    if (!parent_cg_.empty()) {
      EXPECT_EQ(::rmdir(parent_cg_.c_str()), 0) << errno;
    }
    (void)::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

  static void reap_all() {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }

  // Runs crashing_daemon (this case's failpoint and mode, `script` as the execution) in a child
  // and checks that the failpoint SIGKILLed it.
  ::testing::AssertionResult crash(sys::Marker const& marker,
                                   std::string const& script = kTreeScript) {
    auto const& param = GetParam();
    pid_t const daemon = ::fork();
    if (daemon < 0) return ::testing::AssertionFailure() << "fork: " << errno;
    if (daemon == 0) crashing_daemon(t_.state(), param.point, exec_cg_, marker, param.mode, script);
    int status = 0;
    if (::waitpid(daemon, &status, 0) != daemon) return ::testing::AssertionFailure() << "waitpid";
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
      return ::testing::AssertionFailure() << "the daemon was not killed by failpoint "
                                           << param.point << " (status " << status << ")";
    }
    return ::testing::AssertionSuccess();
  }

  // What the crash left behind: processes carrying the execution's marker, held by pidfd so a
  // survivor check cannot be fooled by a recycled pid.
  static std::vector<sys::Pidfd> marked(sys::Marker const& marker) {
    std::vector<sys::Pidfd> tree;
    if (auto scan = sys::marker_scan(marker); scan) {
      for (auto pid : scan->matched) {
        if (auto fd = sys::Pidfd::open(pid); fd) tree.push_back(std::move(*fd));
      }
    }
    return tree;
  }

  // The registry reopened after the crash, recovered with keep_running, and the execution it
  // re-acquired handed to KeptExecutions.
  struct KeptAfterCrash {
    std::unique_ptr<Registry> reg;
    std::optional<KeptExecutions> kept;
  };
  ::testing::AssertionResult keep_running(KeptAfterCrash& out) {
    auto reg = Registry::open(t_.state());
    if (!reg) return ::testing::AssertionFailure() << reg.error().message();
    out.reg = std::move(*reg);
    RecoveryOptions o;
    o.policy = RestartPolicy::keep_running;
    auto report = recover(*out.reg, o);
    if (!report) return ::testing::AssertionFailure() << report.error().message();
    if (auto r = apply_restart_policy(*out.reg, *report, o); !r)
      return ::testing::AssertionFailure() << r.error().message();
    out.kept.emplace(*out.reg, *report, o);
    return ::testing::AssertionSuccess();
  }

  TempDir t_;
  std::string parent_cg_;
  std::string exec_cg_;
};

TEST_P(RegistryCrash, RecoversExactlyOnceWithNoSurvivors) {
  auto const& param = GetParam();
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);

  ASSERT_TRUE(crash(*marker));
  std::vector<sys::Pidfd> const tree = marked(*marker);

  auto reg = Registry::open(t_.state());
  ASSERT_TRUE(reg) << reg.error().message();
  RecoveryOptions options;
  options.execution_cgroup_parent = parent_cg_;  // as the daemon passes its subtree
  auto report = recover(**reg, options);
  ASSERT_TRUE(report) << report.error().message();
  CUSTOS_ASSERT_OK(apply_restart_policy(**reg, *report, options));
  reap_all();

  // Zero survivors: every process of the tree has exited, none carries the marker any more.
  for (auto const& p : tree) EXPECT_FALSE(p.alive()) << "pid " << p.pid() << " survived";
  // Scan as recovery does: processes older than the execution's root cannot carry its marker.
  sys::MarkerScanOptions scan_opts;
  if (auto stored = (*reg)->get(kId); stored && stored->ownership.start_time_ticks != 0) {
    scan_opts.not_before_ticks = stored->ownership.start_time_ticks;
  }
  auto after = sys::marker_scan(*marker, scan_opts);
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->matched.empty());
  // Also when the record does not name it yet (after_claim, before_staged: its launch created
  // it, the staged write that records it never came). Only a claim without a record (the
  // gateway's shape, crashed in between) leaves nothing to find it by; the daemon creates no
  // cgroup before the record exists, the test did.
  if (!exec_cg_.empty() && !(param.point == "after_claim" && param.mode == Mode::gateway)) {
    EXPECT_FALSE(std::filesystem::exists(exec_cg_)) << "the execution cgroup was not removed";
  }

  // The claim is consumed forever, whatever happened.
  CUSTOS_EXPECT_ERRC((*reg)->consume_claim(kAction, "proc-1", "ex-retry"),
                     Errc::registry_claim_consumed);

  if (param.point == "after_claim" && param.mode == Mode::gateway) {
    // The claim was committed alone: the record never was. The claim is an orphan, kept.
    EXPECT_TRUE(report->executions.empty());
    ASSERT_EQ(report->orphan_claims.size(), 1u);
    EXPECT_EQ(report->orphan_claims[0].execution_id, kId);
    EXPECT_TRUE(tree.empty());
    return;
  }
  if (param.point == "after_claim" || param.point == "before_staged") {
    // Claim and record were one transaction: the record exists, nothing was ever staged (before
    // staged: the child was at its barrier, in the cgroup, when the crash came; it ran nothing
    // and its marker was never in an environment anyone could read).
    EXPECT_TRUE(report->orphan_claims.empty());
    EXPECT_TRUE(tree.empty());
    ASSERT_EQ(report->executions.size(), 1u);
    EXPECT_EQ(report->executions[0].classification, core::RecoveryPath::absent_without_terminal);
    EXPECT_TRUE(report->executions[0].terminal_written);
    EXPECT_EQ(report->executions[0].cleanup, core::Cleanup::confirmed)
        << report->executions[0].detail;
    auto rec = (*reg)->get(kId);
    ASSERT_TRUE(rec && rec->terminal);
    EXPECT_EQ(rec->terminal->classification, "recovery_indeterminate");
    EXPECT_EQ(rec->ownership.state, OwnershipState::unassigned);
    return;
  }

  ASSERT_EQ(report->executions.size(), 1u);
  auto const& e = report->executions[0];
  std::set<core::RecoveryPath> allowed;
  std::set<std::string> classifications;
  if (param.point == "after_staged") {
    // The child was at its barrier: the program never ran. Either it already noticed the
    // barrier closing and exited, or recovery found it alive and killed it.
    allowed = {core::RecoveryPath::live_owned, core::RecoveryPath::absent_without_terminal};
    classifications = {"cancelled", "recovery_indeterminate"};
  } else if (param.point == "before_terminal" || param.point == "flush_with_writes_queued") {
    // The tree had been stopped and reaped; only the terminal record (and, deferred, the
    // queued phase writes) was lost.
    allowed = {core::RecoveryPath::absent_without_terminal};
    classifications = {"recovery_indeterminate"};
  } else {
    allowed = {core::RecoveryPath::live_owned};
    classifications = {"cancelled"};
  }
  EXPECT_TRUE(allowed.count(e.classification))
      << param.point << ": " << core::recovery_path_wire(e.classification) << " (" << e.detail
      << ")";
  EXPECT_TRUE(e.terminal_written);
  // Cleanup is confirmed exactly when nothing younger than the root could hide from the final
  // sweep; an unreadable environment of such a process keeps it honest-unconfirmed.
  if (after->unreadable.empty()) {
    EXPECT_EQ(e.cleanup, core::Cleanup::confirmed) << e.detail;
  } else {
    EXPECT_EQ(e.cleanup, core::Cleanup::unconfirmed) << e.detail;
    EXPECT_NE(e.detail.find("unreadable"), std::string::npos) << e.detail;
  }

  auto rec = (*reg)->get(kId);
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  ASSERT_TRUE(rec->terminal);
  EXPECT_TRUE(classifications.count(rec->terminal->classification))
      << rec->terminal->classification;
  EXPECT_EQ(rec->terminal->recovery, core::recovery_path_wire(e.classification));
  auto decoded = decode_terminal(*rec->terminal);
  ASSERT_TRUE(decoded) << decoded.error().message();
  for (auto const& [stream, acc] : decoded->output) EXPECT_FALSE(acc.complete);
  CUSTOS_EXPECT_ERRC((*reg)->record_terminal(kId, fake_terminal()), Errc::registry_illegal_phase);

  // A second recovery (another restart) finds nothing left to do.
  auto again = recover(**reg);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->executions.empty());
  EXPECT_EQ(again->already_terminal, 1u);
}

// keep_running: the re-acquired execution is left running, then KeptExecutions::cancel kills
// the whole tree through its cgroup / recovered pidfd and writes exactly one terminal record.
class RegistryKept : public RegistryCrash {};

TEST_P(RegistryKept, CancelThroughTheRecoveredPidfdEndsTheTreeOnce) {
  auto const& param = GetParam();
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  ASSERT_TRUE(crash(*marker));
  std::vector<sys::Pidfd> const tree = marked(*marker);
  ASSERT_FALSE(tree.empty());

  KeptAfterCrash k;
  ASSERT_TRUE(keep_running(k));
  auto* reg = &k.reg;
  KeptExecutions& kept = *k.kept;
  ASSERT_TRUE(kept.contains(kId));
  EXPECT_EQ(kept.ids(), std::vector<std::string>{kId});
  for (auto const& p : tree) EXPECT_TRUE(p.alive()) << "keep_running killed pid " << p.pid();
  EXPECT_FALSE((*reg)->get(kId)->terminal);

  auto c = kept.cancel(kId, core::Trigger::user);
  ASSERT_TRUE(c) << c.error().message();
  reap_all();
  // The previous daemon recorded `user` first when it crashed while stopping: still `user`, but
  // not accepted from this call.
  EXPECT_EQ(c->accepted, param.point != "while_stopping");
  EXPECT_EQ(c->trigger, core::Trigger::user);
  ASSERT_TRUE(c->terminal.has_value());
  EXPECT_EQ(c->terminal->classification, core::Classification::cancelled);
  EXPECT_EQ(c->terminal->recovery, core::RecoveryPath::live_owned);
  for (auto const& p : tree) EXPECT_FALSE(p.alive()) << "pid " << p.pid() << " survived";
  if (!exec_cg_.empty()) {
    EXPECT_FALSE(std::filesystem::exists(exec_cg_));
  }
  auto rec = (*reg)->get(kId);
  ASSERT_TRUE(rec && rec->terminal);
  EXPECT_EQ(rec->terminal->recovery, "live_owned");
  EXPECT_FALSE(kept.contains(kId));
  CUSTOS_EXPECT_ERRC(kept.cancel(kId, core::Trigger::user), Errc::exec_not_found);
  CUSTOS_EXPECT_ERRC((*reg)->record_terminal(kId, fake_terminal()), Errc::registry_illegal_phase);
}

INSTANTIATE_TEST_SUITE_P(Failpoints, RegistryKept,
                         ::testing::Values(CrashCase{"while_running", true, Mode::deferred},
                                           CrashCase{"while_running", false, Mode::immediate},
                                           CrashCase{"while_stopping", true, Mode::immediate},
                                           CrashCase{"while_stopping", false, Mode::deferred}),
                         case_name);

// keep_running, and the kept execution's root then ends on its own: the owner sees its pidfd
// become readable and KeptExecutions::finish_exited kills what is left of the tree and writes
// exactly one terminal record with the root's exit status and no trigger.
class RegistryKeptExit : public RegistryCrash {};

TEST_P(RegistryKeptExit, RootThatEndsOnItsOwnIsFinishedWithItsExitStatus) {
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  std::string const go = (t_.state() / "go").string();
  // A background child that would outlive the root, and a root that exits 7 once told to.
  std::string const script =
      "sleep 1000 & while [ ! -e '" + go + "' ]; do sleep 0.02; done; exit 7";
  ASSERT_TRUE(crash(*marker, script));
  std::vector<sys::Pidfd> const tree = marked(*marker);
  ASSERT_GE(tree.size(), 2U);

  KeptAfterCrash k;
  ASSERT_TRUE(keep_running(k));
  auto* reg = &k.reg;
  KeptExecutions& kept = *k.kept;
  ASSERT_TRUE(kept.contains(kId));
  // Still running: nothing to finish yet, and nothing was written.
  CUSTOS_EXPECT_ERRC(kept.finish_exited(kId), Errc::exec_not_running);
  EXPECT_FALSE((*reg)->get(kId)->terminal);
  auto watch = kept.watch_fd(kId);
  ASSERT_TRUE(watch) << watch.error().message();
  pollfd p{watch->get(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "the pidfd is readable while the root runs";

  { std::ofstream{go}; }
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the root did not exit";
  // A cancel that comes after the exit is not accepted, records no trigger and writes nothing:
  // the exit decided the outcome.
  auto late = kept.cancel(kId, core::Trigger::user);
  ASSERT_TRUE(late) << late.error().message();
  EXPECT_FALSE(late->accepted);
  EXPECT_FALSE(late->trigger.has_value());
  EXPECT_FALSE(late->terminal.has_value());
  EXPECT_FALSE((*reg)->get(kId)->terminal);
  EXPECT_FALSE((*reg)->get(kId)->trigger);
  ASSERT_TRUE(kept.contains(kId));
  EXPECT_TRUE(kept.exit_observable(kId));
  auto f = kept.finish_exited(kId);
  ASSERT_TRUE(f) << f.error().message();
  reap_all();
  EXPECT_EQ(f->terminal.recovery, core::RecoveryPath::live_owned) << f->detail;
  EXPECT_FALSE(f->terminal.trigger.has_value());
  // The fixture makes this test process the subreaper that inherits the root, so the status is
  // read with waitid without reaping it (the e2e test covers PIDFD_GET_INFO, with init as the
  // parent).
  EXPECT_EQ(f->terminal.classification, core::Classification::exited) << f->detail;
  EXPECT_EQ(f->terminal.exit, core::ExitStatus::exited(7)) << f->detail;
  // What the root left behind was killed: zero survivors, the cgroup removed.
  for (auto const& q : tree) EXPECT_FALSE(q.alive()) << "pid " << q.pid() << " survived";
  if (!exec_cg_.empty()) {
    EXPECT_TRUE(f->terminal.escalation.forced) << "the background child was killed";
    EXPECT_FALSE(std::filesystem::exists(exec_cg_));
  }
  auto rec = (*reg)->get(kId);
  ASSERT_TRUE(rec && rec->terminal);
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  EXPECT_FALSE(kept.contains(kId));
  CUSTOS_EXPECT_ERRC(kept.finish_exited(kId), Errc::exec_not_found);
  CUSTOS_EXPECT_ERRC(kept.cancel(kId, core::Trigger::user), Errc::exec_not_found);
  CUSTOS_EXPECT_ERRC((*reg)->record_terminal(kId, fake_terminal()), Errc::registry_illegal_phase);
}

INSTANTIATE_TEST_SUITE_P(Failpoints, RegistryKeptExit,
                         ::testing::Values(CrashCase{"while_running", true, Mode::immediate},
                                           CrashCase{"while_running", false, Mode::deferred}),
                         case_name);

std::vector<CrashCase> all_cases() {
  std::vector<CrashCase> out;
  for (Mode mode : {Mode::immediate, Mode::deferred}) {
    for (bool cg : {true, false}) {
      for (char const* p :
           {"after_claim", "before_staged", "after_staged", "after_committed", "while_running",
            "while_stopping", "flush_with_writes_queued", "before_terminal"}) {
        // Nothing is ever queued when every write is immediate: that flush is a no-op.
        if (mode == Mode::immediate && std::string_view{p} == "flush_with_writes_queued") continue;
        out.push_back(CrashCase{p, cg, mode});
      }
    }
  }
  out.push_back(CrashCase{"after_claim", false, Mode::gateway});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Failpoints, RegistryCrash, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace custos::registry::test
