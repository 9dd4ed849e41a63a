// A recovered live_owned execution stays controllable: the daemon is SIGKILLed by a failpoint
// while its execution runs, restarts with the keep_running policy, leaves the tree running, and
// exec.cancel then kills the whole tree through the execution's cgroup and recovered pidfd and
// writes exactly one terminal record that says how it was reached (recovery live_owned).
#include <cstdio>
#include <fcntl.h>
#include <fstream>
#include <set>
#include <string>
#include <sys/syscall.h>
#include <sys/utsname.h>

#include "custos/registry/failpoint.hpp"

#include "harness.hpp"

namespace custos::e2e {
namespace {

// Every pid in the cgroup tree below `root` (recursively).
std::set<pid_t> pids_below(fs::path const& root) {
  std::set<pid_t> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() != "cgroup.procs") continue;
    std::ifstream in(it->path());
    pid_t pid = 0;
    while (in >> pid) out.insert(pid);
  }
  return out;
}

// PIDFD_GET_INFO reports a reaped process's exit status (PIDFD_INFO_EXIT) from Linux 6.15.
bool kernel_at_least(int major, int minor) {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int ma = 0, mi = 0;
  if (std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

// Options of a daemon that keeps executions running across restarts and is SIGKILLed by a
// failpoint inside exec.start, right after `running` reached the registry. Recovery's and
// exec.cancel's writes fire no failpoint, so the restarted daemon (same environment) is not
// stopped by it; it launches nothing new.
DaemonOptions keep_running_crashing() {
  DaemonOptions o;
  o.extra_args = {"--restart-policy", "keep_running"};
  o.env = {"CUSTOS_FAILPOINT=while_running"};
  return o;
}

// Starts `argv` on such a daemon, checks that the daemon died of SIGKILL without answering, and
// returns the pids the crash left in the daemon's cgroup subtree (polled until there are two).
::testing::AssertionResult crash_inside_start(Daemon& d, std::vector<std::string> const& argv,
                                              std::set<pid_t>& pids) {
  {
    auto c = d.client();
    auto r = c.call(1, "exec.start", start_params(argv), 5000ms);
    if (r && r->contains("result"))
      return ::testing::AssertionFailure() << "exec.start answered: " << json::serialize(*r);
  }
  auto status = d.wait_exit(30s);
  if (!status) return ::testing::AssertionFailure() << "the daemon did not exit";
  if (!WIFSIGNALED(*status) || WTERMSIG(*status) != SIGKILL)
    return ::testing::AssertionFailure() << "the daemon ended with status " << *status;
  for (int i = 0; i < 200 && pids.size() < 2; ++i) {
    pids = pids_below(d.cgroup());
    std::this_thread::sleep_for(10ms);
  }
  return ::testing::AssertionSuccess();
}

// The one execution host.info lists as kept running after a restart, into `id`.
::testing::AssertionResult only_kept(LineClient& c, std::string& id) {
  auto h = c.call(2, "host.info");
  if (!h || !h->contains("result")) return ::testing::AssertionFailure() << "host.info failed";
  auto const& registry = h->at("result").at("registry");
  auto const& kept = registry.at("kept_running").as_array();
  if (kept.size() != 1U) {
    return ::testing::AssertionFailure() << "kept_running: " << json::serialize(registry);
  }
  id = std::string{kept[0].as_string()};
  return ::testing::AssertionSuccess();
}

TEST(RecoveryControl, KeptRunningExecutionIsCancelledThroughItsRecoveredPidfd) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "failpoints are compiled in dev builds only";
  Daemon d{keep_running_crashing()};
  ASSERT_TRUE(d.ready()) << d.log();
  if (d.cgroup().empty()) GTEST_SKIP() << "needs the cgroup v2 boundary";

  // The tree the crash left behind, held by pidfd (the shell forks its background sleep).
  std::set<pid_t> pids;
  ASSERT_TRUE(crash_inside_start(d, {"/bin/sh", "-c", "sleep 1000 & exec sleep 1000"}, pids));
  ASSERT_EQ(pids.size(), 2U) << "the execution's tree: a shell and its background sleep";
  std::vector<int> tree;
  for (pid_t p : pids) {
    int fd = pidfd_open(p);
    ASSERT_GE(fd, 0) << p;
    tree.push_back(fd);
  }

  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  std::string id;
  ASSERT_TRUE(only_kept(c, id));
  std::this_thread::sleep_for(200ms);
  for (int fd : tree) EXPECT_TRUE(pid_alive(fd)) << "keep_running must leave the tree running";

  // Not terminal yet: exec.wait cannot wait for it (the manager does not hold it).
  auto g = c.call(3, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(g && g->contains("result")) << (g ? json::serialize(*g) : "");
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running") << json::serialize(*g);

  auto x = c.call(4, "exec.cancel", {{"execution_id", id}}, 20000ms);
  ASSERT_TRUE(x && x->contains("result")) << (x ? json::serialize(*x) : "no reply");
  EXPECT_TRUE(x->at("result").at("accepted").as_bool());
  EXPECT_EQ(x->at("result").at("trigger").as_string(), "user");

  // Zero survivors: every process of the tree ended, the execution's cgroup is gone.
  for (int fd : tree) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 5000), 1) << "a process of the recovered tree survived exec.cancel";
    ::close(fd);
  }
  EXPECT_TRUE(pids_below(d.cgroup()).empty());

  // Exactly one terminal record, reached through recovery.
  auto rec = c.call(5, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(rec && rec->contains("result")) << (rec ? json::serialize(*rec) : "");
  auto const& r = rec->at("result").as_object();
  EXPECT_EQ(r.at("phase").as_string(), "terminal");
  auto const& t = r.at("terminal").as_object();
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("recovery").as_string(), "live_owned") << json::serialize(t);
  EXPECT_EQ(t.at("trigger").as_string(), "user") << json::serialize(t);
  auto w = c.call(6, "exec.wait", {{"execution_id", id}, {"timeout_ms", 1000}});
  ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "");
  EXPECT_EQ(w->at("result").at("classification").as_string(), "cancelled");

  // No longer kept: a second cancel cannot produce a second terminal record.
  auto again = c.call(7, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->contains("result") && again->at("result").at("accepted").as_bool())
      << json::serialize(*again);
  auto rec2 = c.call(8, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(rec2 && rec2->contains("result"));
  EXPECT_EQ(json::serialize(rec2->at("result").at("terminal")), json::serialize(r.at("terminal")));

  // And a later restart finds nothing left to recover.
  ASSERT_TRUE(d.signal(SIGTERM));
  ASSERT_TRUE(d.wait_exit(30s));
  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  auto c2 = d.client();
  auto h2 = c2.call(9, "host.info");
  ASSERT_TRUE(h2 && h2->contains("result"));
  EXPECT_TRUE(h2->at("result").at("registry").at("kept_running").as_array().empty());
}

// The same restart, and the kept execution's root then exits on its own: the daemon watches the
// recovered pidfd, kills what the root left behind and records the root's exit status, with no
// call from anyone (before, the record stayed non-terminal until a cancel or the next start).
TEST(RecoveryControl, KeptRunningExecutionThatEndsOnItsOwnGetsItsTerminalRecord) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "failpoints are compiled in dev builds only";
  Daemon d{keep_running_crashing()};
  ASSERT_TRUE(d.ready()) << d.log();
  if (d.cgroup().empty()) GTEST_SKIP() << "needs the cgroup v2 boundary";
  std::string const go = (d.tmp() / "go").string();
  std::set<pid_t> pids;
  ASSERT_TRUE(crash_inside_start(
      d, {"/bin/sh", "-c", "sleep 1000 & while [ ! -e '" + go + "' ]; do sleep 0.02; done; exit 7"},
      pids));
  ASSERT_GE(pids.size(), 2U) << "the execution's tree: a shell and its background sleep";
  std::vector<int> tree;
  for (pid_t p : pids) {
    int fd = pidfd_open(p);
    if (fd >= 0) tree.push_back(fd);  // a short-lived `sleep 0.02` may be gone already
  }

  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  std::string id;
  ASSERT_TRUE(only_kept(c, id));
  auto g = c.call(3, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running") << json::serialize(*g);

  { std::ofstream{go}; }
  json::object rec;
  for (int i = 0; i < 500; ++i) {
    auto r = c.call(4, "exec.get", {{"execution_id", id}});
    ASSERT_TRUE(r && r->contains("result"));
    rec = r->at("result").as_object();
    if (rec.at("phase").as_string() == "terminal") break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(rec.at("phase").as_string(), "terminal") << json::serialize(rec) << d.log();
  auto const& t = rec.at("terminal").as_object();
  // The root is not the daemon's child: its status comes from PIDFD_GET_INFO after init reaped
  // it, which kernels before 6.15 cannot report.
  if (kernel_at_least(6, 15)) {
    EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
    ASSERT_TRUE(t.at("exit").at("code").is_int64()) << json::serialize(t);
    EXPECT_EQ(t.at("exit").at("code").as_int64(), 7) << json::serialize(t);
    EXPECT_EQ(t.at("recovery").as_string(), "live_owned") << json::serialize(t);
  } else {
    EXPECT_EQ(t.at("classification").as_string(), "recovery_indeterminate") << json::serialize(t);
  }
  EXPECT_FALSE(t.contains("trigger") && !t.at("trigger").is_null()) << json::serialize(t);
  // The background sleep the root left behind was killed with the execution's cgroup.
  for (int fd : tree) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 5000), 1) << "a process of the kept tree survived its root";
    ::close(fd);
  }
  EXPECT_TRUE(pids_below(d.cgroup()).empty());
  // Ended: a cancel now cannot produce a second terminal record.
  auto x = c.call(5, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(x);
  EXPECT_FALSE(x->contains("result") && x->at("result").at("accepted").as_bool())
      << json::serialize(*x);
  auto again = c.call(6, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(again && again->contains("result"));
  EXPECT_EQ(json::serialize(again->at("result").at("terminal")), json::serialize(t));
}

// The daemon is SIGKILLed inside exec.start after the launch created the execution's cgroup and
// its child (at the barrier) but before the staged write that records them. The record names no
// cgroup yet, so the restarted daemon finds it by the execution's id under its subtree: the
// record ends absent_without_terminal and the cgroup is gone (before, it stayed forever).
TEST(RecoveryControl, ACgroupCreatedBeforeTheStagedWriteIsRemovedAtTheNextStart) {
  if (!registry::kFailpointsCompiled) GTEST_SKIP() << "failpoints are compiled in dev builds only";
  DaemonOptions o;
  o.env = {"CUSTOS_FAILPOINT=before_staged"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  if (d.cgroup().empty()) GTEST_SKIP() << "needs the cgroup v2 boundary";
  auto cgroups_below = [&] {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto const& e : fs::directory_iterator(d.cgroup(), ec)) {
      if (e.is_directory()) out.push_back(e.path().filename().string());
    }
    return out;
  };
  std::string const ran = (d.tmp() / "ran").string();
  {
    auto c = d.client();
    auto r =
        c.call(1, "exec.start", start_params({"/bin/sh", "-c", "touch '" + ran + "'"}), 5000ms);
    ASSERT_FALSE(r && r->contains("result")) << "exec.start answered: " << json::serialize(*r);
  }
  auto status = d.wait_exit(30s);
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  auto const left = cgroups_below();
  ASSERT_EQ(left.size(), 1U) << "the crash should leave the execution's cgroup";

  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  EXPECT_TRUE(cgroups_below().empty()) << "left: " << left[0];
  EXPECT_FALSE(fs::exists(ran)) << "the target ran although its ownership was never recorded";
  auto c = d.client();
  auto g = c.call(2, "exec.get", {{"execution_id", left[0]}});
  ASSERT_TRUE(g && g->contains("result")) << (g ? json::serialize(*g) : "");
  auto const& r = g->at("result").as_object();
  EXPECT_EQ(r.at("phase").as_string(), "terminal") << json::serialize(r);
  auto const& t = r.at("terminal").as_object();
  EXPECT_EQ(t.at("recovery").as_string(), "absent_without_terminal") << json::serialize(t);
  EXPECT_EQ(t.at("classification").as_string(), "recovery_indeterminate") << json::serialize(t);
}

// What a teardown that could not empty its cgroup leaves: a terminal record, and the execution's
// cgroup under the subtree with a process still in it (here the test puts one there while the
// daemon is down). The next start kills it, removes the cgroup, and says so in host.info and
// `custos doctor`; the terminal record is not rewritten.
TEST(RecoveryControl, ALeftoverCgroupOfATerminalExecutionIsCleanedAtTheNextStart) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  if (d.cgroup().empty()) GTEST_SKIP() << "needs the cgroup v2 boundary";
  std::string id;
  json::value terminal;
  {
    auto c = d.client();
    auto r = c.call(1, "exec.start", start_params({"/bin/true"}));
    ASSERT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "");
    id = std::string{r->at("result").at("execution_id").as_string()};
    auto w = c.call(2, "exec.wait", {{"execution_id", id}, {"timeout_ms", 10000}}, 15000ms);
    ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "");
    terminal = w->at("result");
  }
  ASSERT_TRUE(d.signal(SIGTERM));
  ASSERT_TRUE(d.wait_exit(30s));

  // The daemon removed the subtree it had created; a teardown that failed would have left both.
  if (!fs::exists(d.cgroup())) {
    ASSERT_EQ(::mkdir(d.cgroup().c_str(), 0755), 0) << errno;
  }
  fs::path const cg = fs::path{d.cgroup()} / id;
  ASSERT_EQ(::mkdir(cg.c_str(), 0755), 0) << errno;
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  pid_t const pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Into the cgroup first, then the long sleep.
    std::ofstream procs(cg / "cgroup.procs");
    procs << ::getpid() << std::flush;
    if (!procs) ::_exit(3);
    (void)::write(ready[1], "x", 1);
    ::execl("/bin/sleep", "sleep", "1000", static_cast<char*>(nullptr));
    ::_exit(4);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the stand-in did not enter the cgroup";
  ::close(ready[0]);
  int const fd = pidfd_open(pid);
  ASSERT_GE(fd, 0);

  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 5000), 1) << "the process left in the cgroup survived the restart";
  ::close(fd);
  (void)::waitpid(pid, nullptr, 0);
  EXPECT_FALSE(fs::exists(cg));
  auto c = d.client();
  auto h = c.call(3, "host.info");
  ASSERT_TRUE(h && h->contains("result"));
  auto const& left = h->at("result").at("registry").at("leftover_cgroups").as_array();
  ASSERT_EQ(left.size(), 1U) << json::serialize(left);
  EXPECT_EQ(left[0].at("execution_id").as_string(), id);
  EXPECT_EQ(left[0].at("cleanup").as_string(), "confirmed") << json::serialize(left);
  auto w = c.call(4, "exec.wait", {{"execution_id", id}, {"timeout_ms", 1000}});
  ASSERT_TRUE(w && w->contains("result"));
  EXPECT_EQ(json::serialize(w->at("result")), json::serialize(terminal));
  auto doc = run_cli({"--socket", d.socket().native(), "doctor"});
  EXPECT_NE(doc.out.find("leftover cgroup of " + id + ": removed"), std::string::npos) << doc.out;
}

}  // namespace
}  // namespace custos::e2e
