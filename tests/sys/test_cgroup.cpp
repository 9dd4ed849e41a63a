// cgroup v2 shell against the real kernel (a cgroup per test under the v2 mount) and against fake
// mount tables and a fake cgroup directory for the parsing logic.
#include <algorithm>
#include <linux/magic.h>
#include <set>
#include <sys/statfs.h>
#include <sys/vfs.h>

#include "custos/sys/cgroup.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/procfs.hpp"

#include "sys/cgroup_fixture.hpp"

namespace custos::sys {
namespace {

using testing::CgroupTest;
using testing::comm_of;
using testing::eventually;
using testing::FdLeakTest;
using testing::kill_and_reap;
using testing::start_shell;
using testing::TempDir;
using testing::write_text;

class MountinfoTest : public FdLeakTest {};

TEST_F(MountinfoTest, RealTableNamesACgroup2Filesystem) {
  auto m = find_cgroup2_mount();
  if (!m && m.error().code == Errc::cgroup_unavailable) GTEST_SKIP() << "host has no cgroup2 mount";
  ASSERT_TRUE(m) << m.error().message();
  struct statfs sf {};
  ASSERT_EQ(::statfs(m->path.c_str(), &sf), 0);
  EXPECT_EQ(static_cast<unsigned long>(sf.f_type), static_cast<unsigned long>(CGROUP2_SUPER_MAGIC));
}

TEST_F(MountinfoTest, FakeTables) {
  struct Case {
    char const* name;
    std::string table;
    std::optional<CgroupMount> want;
    Errc err = Errc::internal;
  };
  std::string const hybrid =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  std::string const systemd =
      "25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n";
  std::string const escaped =
      "40 1 0:40 / /mnt/my\\040cgroups rw shared:1 master:2 - cgroup2 none rw\n";
  std::vector<Case> const cases = {
      {"hybrid", hybrid, CgroupMount{"/sys/fs/cgroup/unified", false}},
      {"systemd", systemd, CgroupMount{"/sys/fs/cgroup", true}},
      {"escaped", escaped, CgroupMount{"/mnt/my cgroups", false}},
      {"first wins", systemd + hybrid, CgroupMount{"/sys/fs/cgroup", true}},
      {"v1 only", "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", std::nullopt,
       Errc::cgroup_unavailable},
      {"empty", "", std::nullopt, Errc::cgroup_unavailable},
      {"malformed", "41 31 - cgroup2 x\n", std::nullopt, Errc::cgroup_failed},
  };
  for (auto const& c : cases) {
    auto got = parse_cgroup2_mount(c.table);
    if (c.want) {
      ASSERT_TRUE(got) << c.name << ": " << got.error().message();
      EXPECT_EQ(got->path, c.want->path) << c.name;
      EXPECT_EQ(got->nsdelegate, c.want->nsdelegate) << c.name;
    } else {
      ASSERT_FALSE(got) << c.name;
      EXPECT_EQ(got.error().code, c.err) << c.name;
    }
  }
}

TEST_F(MountinfoTest, OwnCgroupLine) {
  EXPECT_EQ(parse_own_cgroup("4:memory:/x\n0::/\n").value(), "/");
  EXPECT_EQ(parse_own_cgroup("0::/system.slice/custos.service\n").value(),
            "/system.slice/custos.service");
  auto none = parse_own_cgroup("4:memory:/x\n1:cpu:/\n");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::cgroup_unavailable);
  auto bad = parse_own_cgroup("0::relative\n");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::cgroup_failed);

  auto real = own_cgroup();
  if (!real && real.error().code == Errc::cgroup_unavailable) GTEST_SKIP() << "no v2 hierarchy";
  ASSERT_TRUE(real) << real.error().message();
  EXPECT_EQ(real->front(), '/');
}

// The file logic of CgroupDir on a plain directory that looks like a cgroup.
TEST_F(MountinfoTest, FakeCgroupDirectoryLimitsAndStats) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  write_text(dir.path() + "/cgroup.controllers", "memory pids\n");
  write_text(dir.path() + "/cgroup.events", "populated 1\nfrozen 0\n");
  write_text(dir.path() + "/cpu.stat",
             "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n");
  write_text(dir.path() + "/memory.current", "4096\n");
  write_text(dir.path() + "/memory.max", "max\n");
  write_text(dir.path() + "/pids.current", "3\n");
  write_text(dir.path() + "/pids.max", "10\n");
  write_text(dir.path() + "/cgroup.procs", "10\n20\n30\n");
  auto cg = CgroupDir::open(dir.path() + "/");
  ASSERT_TRUE(cg) << cg.error().message();
  EXPECT_EQ(cg->path(), dir.path());

  EXPECT_EQ(cg->controllers().value(), (std::set<std::string>{"memory", "pids"}));
  EXPECT_TRUE(cg->populated().value());
  EXPECT_EQ(cg->procs().value(), (std::vector<std::int32_t>{10, 20, 30}));

  ASSERT_TRUE(cg->set_memory_max(1 << 20));
  EXPECT_EQ(read_file_at(cg->fd(), "memory.max").value(), "1048576");
  ASSERT_TRUE(cg->set_pids_max(64));
  EXPECT_EQ(read_file_at(cg->fd(), "pids.max").value(), "64");
  auto cpu = cg->set_cpu_max(50000, 100000);
  ASSERT_FALSE(cpu);
  EXPECT_EQ(cpu.error().code, Errc::sys_unsupported);
  auto enable = cg->enable_controllers({"cpu"});
  ASSERT_FALSE(enable);
  EXPECT_EQ(enable.error().code, Errc::sys_unsupported);

  auto st = cg->stats();
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->cpu_usage_usec, 2500000u);
  EXPECT_EQ(st->memory_current, 4096u);
  EXPECT_EQ(st->memory_max, 1048576u);  // written above
  EXPECT_EQ(st->pids_current, 3u);
  EXPECT_EQ(st->pids_max, 64u);
  EXPECT_EQ(st->memory_peak, std::nullopt);  // absent file stays absent, never 0
  EXPECT_EQ(st->populated, true);

  // A bad child name never reaches mkdirat.
  for (std::string const bad : {"", ".", "..", "a/b"}) {
    auto c = CgroupDir::create(*cg, bad);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().sys_errno, EINVAL);
  }
}

class CgroupKernelTest : public CgroupTest {};

// The tree of the issue: a setsid'd shell inside the cgroup that starts a setsid'd sleep, a
// double-forked sleep (its parent exits, it reparents away) and a setsid'd double fork.
// killpg misses all of these; cgroup.kill must leave zero survivors.
TEST_F(CgroupKernelTest, KillLeavesNoSurvivorOfADoubleForkedTree) {
  EXPECT_FALSE(cg_.populated().value());
  Pidfd root = start_shell(
      "setsid sleep 300 & (sleep 300 &) ; (setsid sh -c 'sleep 300 &' &) ; exec sleep 300",
      {"PATH=/usr/bin:/bin"}, procs_path());
  ASSERT_TRUE(root.valid());
  // Four sleeps in the end: the shell itself (exec), the setsid one, and two double-forked.
  // Transient subshells come and go meanwhile, so wait for a snapshot of exactly four sleeps.
  std::vector<std::int32_t> snapshot;
  ASSERT_TRUE(eventually([&] {
    auto p = cg_.procs();
    if (!p || p->size() != 4) return false;
    snapshot = *p;
    return std::all_of(snapshot.begin(), snapshot.end(),
                       [](std::int32_t q) { return comm_of(q) == "sleep"; });
  }));
  EXPECT_TRUE(cg_.populated().value());
  std::vector<Pidfd> members;
  for (std::int32_t const pid : snapshot) {
    auto p = Pidfd::open(pid);
    ASSERT_TRUE(p) << pid;
    members.push_back(std::move(*p));
  }
  ASSERT_EQ(members.size(), 4u);

  ASSERT_TRUE(cg_.kill());
  auto empty = cg_.wait_empty(std::chrono::seconds(10));
  ASSERT_TRUE(empty) << empty.error().message();
  EXPECT_FALSE(cg_.populated().value());
  EXPECT_TRUE(cg_.procs().value().empty());
  for (Pidfd const& m : members) EXPECT_FALSE(m.alive()) << "survivor pid " << m.pid();

  auto st = root.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->signal, SIGKILL);
  root = Pidfd();
  // The directory goes away with remove(); TearDown then has nothing to do for it.
  ASSERT_TRUE(cg_.remove());
  struct stat sb {};
  EXPECT_NE(::stat(cg_.path().c_str(), &sb), 0);
  EXPECT_TRUE(cg_.remove()) << "removing twice is not an error";
}

TEST_F(CgroupKernelTest, WaitEmptyWakesWhenTheLastProcessExits) {
  Pidfd child = start_shell("exec sleep 0.3", {"PATH=/usr/bin:/bin"}, procs_path());
  ASSERT_TRUE(child.valid());
  ASSERT_TRUE(eventually([&] {
    auto p = cg_.populated();
    return p && *p;
  }));
  auto const t0 = std::chrono::steady_clock::now();
  auto empty = cg_.wait_empty(std::chrono::seconds(10));
  auto const waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(empty) << empty.error().message();
  EXPECT_LT(waited, std::chrono::seconds(5));
  auto st = child.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 0);
  child = Pidfd();
}

TEST_F(CgroupKernelTest, WaitEmptyTimesOutAndRemoveRefusesWhilePopulated) {
  Pidfd child = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin"}, procs_path());
  ASSERT_TRUE(child.valid());
  ASSERT_TRUE(eventually([&] {
    auto p = cg_.populated();
    return p && *p;
  }));
  auto const t0 = std::chrono::steady_clock::now();
  auto empty = cg_.wait_empty(std::chrono::milliseconds(150));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, Errc::cleanup_unconfirmed);
  EXPECT_EQ(empty.error().sys_errno, ETIMEDOUT);

  auto rm = cg_.remove();
  ASSERT_FALSE(rm);
  EXPECT_EQ(rm.error().code, Errc::cgroup_failed);
  EXPECT_EQ(rm.error().sys_errno, EBUSY);
  kill_and_reap(child);
}

TEST_F(CgroupKernelTest, AttachMovesAProcessAndProcsListsIt) {
  auto sub = CgroupDir::create(cg_, "a");
  ASSERT_TRUE(sub) << sub.error().message();
  extra_.push_back(std::move(*sub));
  CgroupDir const& a = extra_.back();
  Pidfd child = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin"}, procs_path());
  ASSERT_TRUE(child.valid());
  ASSERT_TRUE(eventually([&] {
    auto p = cg_.procs();
    return p && p->size() == 1;
  }));
  ASSERT_TRUE(a.attach(child.pid()));
  EXPECT_EQ(a.procs().value(), std::vector<std::int32_t>{child.pid()});
  EXPECT_TRUE(cg_.procs().value().empty());
  EXPECT_TRUE(cg_.populated().value()) << "populated covers the subtree";
  EXPECT_EQ(cg_.tree_procs().value(), std::vector<std::int32_t>{child.pid()})
      << "tree_procs walks children";
  EXPECT_TRUE(cg_.tree_procs(0).value().empty()) << "bounded";
  // A cgroup with a child cgroup cannot be removed, even when it holds no process itself.
  auto rm = cg_.remove();
  ASSERT_FALSE(rm);
  EXPECT_EQ(rm.error().sys_errno, EBUSY);
  // cgroup.kill on the parent reaches the process in the child cgroup.
  ASSERT_TRUE(cg_.kill());
  auto st = child.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->signal, SIGKILL);
  child = Pidfd();
  ASSERT_TRUE(a.wait_empty(std::chrono::seconds(10)));
}

// On these hosts no controller is enabled below the v2 root, so every limit is refused with
// sys.unsupported; on a host that has them the same calls must succeed.
TEST_F(CgroupKernelTest, LimitsOnlyWhereTheControllerIsEnabled) {
  std::set<std::string> const have = cg_.controllers().value();
  auto mem = cg_.set_memory_max(64u << 20);
  auto pids = cg_.set_pids_max(128);
  auto cpu = cg_.set_cpu_max(50000, 100000);
  auto check = [&](char const* name, Result<void> const& r) {
    if (have.contains(name)) {
      EXPECT_TRUE(r) << name << ": " << r.error().message();
    } else {
      ASSERT_FALSE(r) << name;
      EXPECT_EQ(r.error().code, Errc::sys_unsupported) << name;
    }
  };
  check("memory", mem);
  check("pids", pids);
  check("cpu", cpu);
  auto st = cg_.stats();
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_TRUE(st->cpu_usage_usec.has_value()) << "cpu.stat is core on v2";
  EXPECT_EQ(st->populated, false);
  if (!have.contains("memory")) {
    EXPECT_FALSE(st->memory_current.has_value());
  }
  if (!have.contains("pids")) {
    EXPECT_FALSE(st->pids_current.has_value());
  }
}

// The documented limit of the cgroup boundary (docs/boundaries.md): without nsdelegate, a root
// process can leave its execution's cgroup even from inside its own cgroup namespace. The cgroup
// teardown then misses it, and the final marker sweep is what catches it.
TEST_F(CgroupKernelTest, RootEscapeFromACgroupNamespaceIsCaughtByTheFinalMarkerSweep) {
  if (::geteuid() != 0) GTEST_SKIP() << "the escape needs root";
  if (::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "no unshare(1)";
  auto mount = find_cgroup2_mount().value();
  if (mount.nsdelegate) GTEST_SKIP() << "nsdelegate: the kernel forbids this escape here";
  auto made_a = CgroupDir::create(cg_, "execution");
  auto made_b = CgroupDir::create(cg_, "elsewhere");
  ASSERT_TRUE(made_a && made_b);
  extra_.push_back(std::move(*made_a));
  extra_.push_back(std::move(*made_b));
  CgroupDir const& exec_cg = extra_[0];
  CgroupDir const& other = extra_[1];

  Marker const m = Marker::generate().value();
  std::string const script =
      "exec unshare --cgroup sh -c 'echo $$ > " + other.path() + "/cgroup.procs && exec sleep 300'";
  Pidfd child =
      start_shell(script, {"PATH=/usr/bin:/bin", m.env_entry()}, exec_cg.path() + "/cgroup.procs");
  ASSERT_TRUE(child.valid());
  ASSERT_TRUE(eventually([&] {
    auto p = other.procs();
    return p && p->size() == 1;
  })) << "the process moved itself out";
  EXPECT_EQ(other.procs().value(), std::vector<std::int32_t>{child.pid()});

  // Teardown of the execution's cgroup: it is empty, yet the process lives on.
  ASSERT_TRUE(exec_cg.kill());
  ASSERT_TRUE(exec_cg.wait_empty(std::chrono::seconds(5)));
  EXPECT_TRUE(child.alive()) << "cgroup.kill could not reach it";

  // The final marker sweep still finds it by its environment.
  MarkerSweepOptions o;
  o.not_before_ticks = read_start_time(child.pid()).value();
  auto r = marker_sweep(m, o);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_GE(r->signalled, 1u);
  EXPECT_TRUE(r->confirmed);
  auto st = child.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->signal, SIGKILL);
  child = Pidfd();
}

TEST_F(CgroupKernelTest, PrepareExecutionRootReportsWhatExecutionsReallyGet) {
  std::set<std::string> const wanted = {"cpu", "memory", "pids"};
  auto root = prepare_execution_root(cg_.path(), wanted);
  ASSERT_TRUE(root) << root.error().message();
  EXPECT_EQ(root->dir.path(), cg_.path() + "/executions");
  EXPECT_FALSE(root->moved_self) << "the test runner is not in this cgroup, so it never moves";
  std::set<std::string> const offered = cg_.controllers().value();
  for (std::string const& c : root->controllers) {
    EXPECT_TRUE(wanted.contains(c) && offered.contains(c)) << c;
  }
  if (offered.empty()) {
    EXPECT_TRUE(root->controllers.empty()) << "nothing to enable on this host";
  }
  // Idempotent: a second call (daemon restart) opens the same subtree.
  auto again = prepare_execution_root(cg_.path(), wanted);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again->dir.path(), root->dir.path());
  again->dir = CgroupDir();
  extra_.push_back(std::move(root->dir));

  auto missing = prepare_execution_root(cg_.path() + "/no-such-cgroup");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::cgroup_unavailable);
}

// v2 forbids renaming cgroups, but a cgroup can be removed by someone else and another one made
// under the same name; remove() must then leave the newcomer alone.
TEST_F(CgroupKernelTest, RemoveNeverTakesADifferentCgroupAtTheSamePath) {
  auto made = CgroupDir::create(cg_, "x");
  ASSERT_TRUE(made);
  CgroupDir const x = std::move(*made);
  ASSERT_EQ(::rmdir((cg_.path() + "/x").c_str()), 0);  // removed behind our back
  auto other = CgroupDir::create(cg_, "x");            // a different cgroup at the same path
  ASSERT_TRUE(other);
  extra_.push_back(std::move(*other));
  auto rm = x.remove();
  ASSERT_FALSE(rm);
  EXPECT_EQ(rm.error().sys_errno, ESTALE);
  struct stat st {};
  EXPECT_EQ(::stat((cg_.path() + "/x").c_str(), &st), 0) << "the other cgroup is untouched";
}

TEST_F(CgroupKernelTest, EnsureSubtreeCreatesThenReopens) {
  auto first = ensure_subtree(cg_, "executions", {"memory", "pids"});
  ASSERT_TRUE(first) << first.error().message();
  auto again = ensure_subtree(cg_, "executions");
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(first->path(), again->path());
  struct stat a {};
  struct stat b {};
  ASSERT_EQ(::fstat(first->fd().get(), &a), 0);
  ASSERT_EQ(::fstat(again->fd().get(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  auto dup = CgroupDir::create(cg_, "executions");
  ASSERT_FALSE(dup);
  EXPECT_EQ(dup.error().sys_errno, EEXIST);
  *again = CgroupDir();
  extra_.push_back(std::move(*first));
}

}  // namespace
}  // namespace custos::sys
