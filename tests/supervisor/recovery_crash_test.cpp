// Crash recovery end to end: a forked "daemon" opens the registry, launches a real process tree
// (a shell with a background child) into a per-execution cgroup or under a marker, and is killed
// with SIGKILL by a failpoint at one step. The test then reopens the registry, recovers, adopts
// what is still alive into a real ExecutionManager (writing through the registry's sink) and
// checks the classification, exactly one terminal record, zero surviving processes, and that the
// claim can never be consumed again — with the restart policy cancel (adopted, then cancelled
// through the one teardown), with adopt and exec.cancel, and with a root that ends on its own.
#include <boost/asio/io_context.hpp>
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
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/recovery.hpp"
#include "custos/supervisor/registry_sink.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/spawn.hpp"

#include "registry/helpers.hpp"

namespace custos::supervisor::testing {
namespace {

using namespace std::chrono_literals;
using registry::BoundaryInfo;
using registry::kFailpointEnv;
using registry::kFailpointsCompiled;
using registry::OwnershipState;
using registry::Registry;
using registry::staged_ownership;
using registry::terminal_blob;
using registry::WriteMode;
using registry::test::fake_terminal;
using registry::test::make_execution;
using registry::test::TempDir;

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

class RecoveryCrash : public ::testing::TestWithParam<CrashCase> {
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
    if (manager_) {
      if (manager_->live_count() > 0) {
        ADD_FAILURE() << manager_->live_count() << " adopted executions still live at teardown";
        bool done = false;
        manager_->shutdown(ShutdownPolicy::cancel, 5s, [&] { done = true; });
        drive([&] { return done; }, 10s);
      }
      manager_.reset();
    }
    sink_.reset();
    reg_.reset();
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

  // The restarted "daemon": the registry reopened, recovered as the daemon does (its subtree as
  // the cgroup parent), and what is alive adopted by a manager writing through the registry's
  // sink, under `policy`.
  ::testing::AssertionResult restart(RestartPolicy policy, RecoveryReport& report) {
    auto reg = Registry::open(t_.state());
    if (!reg) return ::testing::AssertionFailure() << reg.error().message();
    reg_ = std::move(*reg);
    RecoveryOptions options;
    options.execution_cgroup_parent = parent_cg_;
    auto r = recover(*reg_, options);
    if (!r) return ::testing::AssertionFailure() << r.error().message();
    report = std::move(*r);
    sink_ = std::make_unique<RegistrySink>(*reg_, io_);
    ManagerConfig cfg;
    cfg.state_dir = t_.path() / "manager";
    cfg.reap_interval = 100ms;
    cfg.sample_interval = 50ms;
    cfg.sink = sink_.get();
    manager_ = std::make_unique<ExecutionManager>(io_, std::move(cfg));
    auto failed = adopt_recovered(*manager_, report, policy);
    if (!failed.empty()) {
      return ::testing::AssertionFailure()
             << failed[0].first << " not adopted: " << failed[0].second.message();
    }
    return ::testing::AssertionSuccess();
  }

  bool drive(std::function<bool()> const& pred, std::chrono::milliseconds timeout) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      if (io_.stopped()) io_.restart();
      io_.run_for(5ms);
    }
    return true;
  }

  // The adopted execution's terminal record, as waiters get it.
  std::optional<core::TerminalRecord> terminal(std::string const& id,
                                               std::chrono::milliseconds timeout = 20s) {
    std::optional<Result<core::TerminalRecord>> got;
    manager_->wait(id, timeout, [&](Result<core::TerminalRecord> r) { got = std::move(r); });
    drive([&] { return got.has_value(); }, timeout + 5s);
    if (!got || !*got) {
      ADD_FAILURE() << "no terminal record for " << id
                    << (got ? ": " + got->error().message() : std::string{});
      return std::nullopt;
    }
    return **got;
  }

  TempDir t_;
  std::string parent_cg_;
  std::string exec_cg_;
  boost::asio::io_context io_;
  std::unique_ptr<Registry> reg_;
  std::unique_ptr<RegistrySink> sink_;
  std::unique_ptr<ExecutionManager> manager_;
};

// restart-policy cancel: whatever is alive is adopted, then cancelled through the one teardown.
TEST_P(RecoveryCrash, RecoversExactlyOnceWithNoSurvivors) {
  auto const& param = GetParam();
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);

  ASSERT_TRUE(crash(*marker));
  std::vector<sys::Pidfd> const tree = marked(*marker);

  RecoveryReport report;
  ASSERT_TRUE(restart(RestartPolicy::cancel, report));
  std::optional<core::TerminalRecord> adopted_end;
  if (!report.executions.empty() && report.executions[0].adopted) {
    adopted_end = terminal(kId);
    ASSERT_TRUE(adopted_end);
  }
  reap_all();

  // Zero survivors: every process of the tree has exited, none carries the marker any more.
  for (auto const& p : tree) EXPECT_FALSE(p.alive()) << "pid " << p.pid() << " survived";
  // Scan as recovery does: processes older than the execution's root cannot carry its marker.
  sys::MarkerScanOptions scan_opts;
  if (auto stored = reg_->get(kId); stored && stored->ownership.start_time_ticks != 0) {
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
  auto retry = reg_->consume_claim(kAction, "proc-1", "ex-retry");
  ASSERT_FALSE(retry);
  EXPECT_EQ(retry.error().code, Errc::registry_claim_consumed);

  if (param.point == "after_claim" && param.mode == Mode::gateway) {
    // The claim was committed alone: the record never was. The claim is an orphan, kept.
    EXPECT_TRUE(report.executions.empty());
    ASSERT_EQ(report.orphan_claims.size(), 1u);
    EXPECT_EQ(report.orphan_claims[0].execution_id, kId);
    EXPECT_TRUE(tree.empty());
    return;
  }
  if (param.point == "after_claim" || param.point == "before_staged") {
    // Claim and record were one transaction: the record exists, nothing was ever staged (before
    // staged: the child was at its barrier, in the cgroup, when the crash came; it ran nothing
    // and its marker was never in an environment anyone could read).
    EXPECT_TRUE(report.orphan_claims.empty());
    EXPECT_TRUE(tree.empty());
    ASSERT_EQ(report.executions.size(), 1u);
    EXPECT_EQ(report.executions[0].classification, core::RecoveryPath::absent_without_terminal);
    EXPECT_TRUE(report.executions[0].terminal_written);
    EXPECT_EQ(report.executions[0].cleanup, core::Cleanup::confirmed)
        << report.executions[0].detail;
    auto rec = reg_->get(kId);
    ASSERT_TRUE(rec && rec->terminal);
    EXPECT_EQ(rec->terminal->classification, "recovery_indeterminate");
    EXPECT_EQ(rec->ownership.state, OwnershipState::unassigned);
    return;
  }

  ASSERT_EQ(report.executions.size(), 1u);
  auto const& e = report.executions[0];
  std::set<core::RecoveryPath> allowed;
  std::set<std::string> classifications;
  if (param.point == "after_staged") {
    // The child was at its barrier: the program never ran. Either it already noticed the
    // barrier closing and exited, or recovery found it alive and its adopter stopped it.
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
  // Exactly one of the two ends it: recovery itself (gone), or the adopter's teardown (alive).
  EXPECT_NE(e.terminal_written, e.adopted) << e.detail;
  EXPECT_EQ(e.adopted, e.classification == core::RecoveryPath::live_owned);
  // Cleanup is confirmed exactly when nothing younger than the root could hide from the final
  // sweep; an unreadable environment of such a process keeps it honest-unconfirmed.
  core::Cleanup const cleanup = adopted_end ? adopted_end->tree.cleanup : e.cleanup;
  std::string const detail = adopted_end ? std::string{} : e.detail;
  if (after->unreadable.empty()) {
    EXPECT_EQ(cleanup, core::Cleanup::confirmed) << detail;
  } else {
    EXPECT_EQ(cleanup, core::Cleanup::unconfirmed) << detail;
  }

  auto rec = reg_->get(kId);
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  ASSERT_TRUE(rec->terminal);
  EXPECT_TRUE(classifications.count(rec->terminal->classification))
      << rec->terminal->classification;
  EXPECT_EQ(rec->terminal->recovery, core::recovery_path_wire(e.classification));
  auto decoded = registry::decode_terminal(*rec->terminal);
  ASSERT_TRUE(decoded) << decoded.error().message();
  for (auto const& [stream, acc] : decoded->output) EXPECT_FALSE(acc.complete);
  if (adopted_end) {
    EXPECT_EQ(*decoded, *adopted_end);
    // The trigger the previous daemon recorded decides; else the restart policy's.
    EXPECT_EQ(decoded->trigger, param.point == "while_stopping"
                                    ? core::Trigger::user
                                    : core::Trigger::supervisor_shutdown);
    EXPECT_EQ(decoded->observations.at("output"), "not_kept");
  }
  auto again_terminal = reg_->record_terminal(kId, fake_terminal());
  ASSERT_FALSE(again_terminal);
  EXPECT_EQ(again_terminal.error().code, Errc::registry_illegal_phase);

  // A second recovery (another restart) finds nothing left to do.
  auto again = recover(*reg_);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->executions.empty());
  EXPECT_EQ(again->already_terminal, 1u);
}

// restart-policy adopt: the re-acquired execution goes on running, supervised; exec.cancel then
// ends the whole tree through the one teardown and one terminal record is written.
class RecoveryAdopted : public RecoveryCrash {};

TEST_P(RecoveryAdopted, CancelThroughTheManagerEndsTheTreeOnce) {
  auto const& param = GetParam();
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  ASSERT_TRUE(crash(*marker));
  std::vector<sys::Pidfd> const tree = marked(*marker);
  ASSERT_FALSE(tree.empty());

  RecoveryReport report;
  ASSERT_TRUE(restart(RestartPolicy::adopt, report));
  ASSERT_EQ(report.executions.size(), 1U);
  ASSERT_TRUE(report.executions[0].adopted) << report.executions[0].detail;
  bool const stopping = param.point == "while_stopping";
  if (!stopping) {
    drive([] { return false; }, 100ms);
    for (auto const& p : tree) EXPECT_TRUE(p.alive()) << "adoption killed pid " << p.pid();
    EXPECT_EQ(manager_->get(kId)->phase, core::Phase::running);
    EXPECT_FALSE(reg_->get(kId)->terminal);
  }

  auto c = manager_->cancel(kId, core::Trigger::user, "stop");
  ASSERT_TRUE(c) << c.error().message();
  // The previous daemon recorded `user` first when it crashed while stopping: still `user`, but
  // not accepted from this call.
  EXPECT_EQ(c->accepted, !stopping);
  EXPECT_EQ(c->trigger, core::Trigger::user);
  auto t = terminal(kId);
  ASSERT_TRUE(t);
  reap_all();
  EXPECT_EQ(t->classification, core::Classification::cancelled);
  EXPECT_EQ(t->recovery, core::RecoveryPath::live_owned);
  for (auto const& p : tree) EXPECT_FALSE(p.alive()) << "pid " << p.pid() << " survived";
  if (!exec_cg_.empty()) {
    EXPECT_FALSE(std::filesystem::exists(exec_cg_));
  }
  auto rec = reg_->get(kId);
  ASSERT_TRUE(rec && rec->terminal);
  EXPECT_EQ(rec->terminal->recovery, "live_owned");
  auto late = manager_->cancel(kId, core::Trigger::user, "again");
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, Errc::exec_not_running);
  auto second = reg_->record_terminal(kId, fake_terminal());
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Errc::registry_illegal_phase);
}

INSTANTIATE_TEST_SUITE_P(Failpoints, RecoveryAdopted,
                         ::testing::Values(CrashCase{"while_running", true, Mode::deferred},
                                           CrashCase{"while_running", false, Mode::immediate},
                                           CrashCase{"while_stopping", true, Mode::immediate},
                                           CrashCase{"while_stopping", false, Mode::deferred}),
                         case_name);

// Adopted, and the root then ends on its own: its exit status is recorded with no trigger, and
// what it left behind is killed by the teardown that follows every root's exit.
class RecoveryAdoptedExit : public RecoveryCrash {};

TEST_P(RecoveryAdoptedExit, RootThatEndsOnItsOwnIsFinishedWithItsExitStatus) {
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  std::string const go = (t_.state() / "go").string();
  // A background child that would outlive the root, and a root that exits 7 once told to.
  std::string const script =
      "sleep 1000 & while [ ! -e '" + go + "' ]; do sleep 0.02; done; exit 7";
  ASSERT_TRUE(crash(*marker, script));
  std::vector<sys::Pidfd> const tree = marked(*marker);
  ASSERT_GE(tree.size(), 2U);

  RecoveryReport report;
  ASSERT_TRUE(restart(RestartPolicy::adopt, report));
  ASSERT_TRUE(report.executions.at(0).adopted);
  drive([] { return false; }, 100ms);
  EXPECT_EQ(manager_->get(kId)->phase, core::Phase::running);
  EXPECT_FALSE(reg_->get(kId)->terminal);

  { std::ofstream{go}; }
  auto t = terminal(kId);
  ASSERT_TRUE(t);
  reap_all();
  EXPECT_EQ(t->recovery, core::RecoveryPath::live_owned);
  EXPECT_FALSE(t->trigger.has_value());
  // The fixture makes this test process the subreaper that inherits the root, so the status is
  // read with waitid (the e2e test covers PIDFD_GET_INFO, with init as the parent).
  EXPECT_EQ(t->classification, core::Classification::exited);
  EXPECT_EQ(t->exit, core::ExitStatus::exited(7));
  // What the root left behind was killed: zero survivors, the cgroup removed.
  EXPECT_TRUE(t->escalation.forced) << "the background child was killed";
  for (auto const& q : tree) EXPECT_FALSE(q.alive()) << "pid " << q.pid() << " survived";
  if (!exec_cg_.empty()) {
    EXPECT_FALSE(std::filesystem::exists(exec_cg_));
  }
  auto rec = reg_->get(kId);
  ASSERT_TRUE(rec && rec->terminal);
  EXPECT_EQ(rec->phase, core::Phase::terminal);
  auto late = manager_->cancel(kId, core::Trigger::user, "late");
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, Errc::exec_not_running);
  auto second = reg_->record_terminal(kId, fake_terminal());
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Errc::registry_illegal_phase);
}

INSTANTIATE_TEST_SUITE_P(Failpoints, RecoveryAdoptedExit,
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

INSTANTIATE_TEST_SUITE_P(Failpoints, RecoveryCrash, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace custos::supervisor::testing
