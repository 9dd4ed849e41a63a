// Tree sampling against real busy processes (with and without a cgroup), and the disk walk on a
// real directory tree with symlink loops and hard links.
#include <fcntl.h>
#include <fstream>
#include <sys/stat.h>

#include "custos/sys/sampler.hpp"

#include "sys/cgroup_fixture.hpp"

namespace custos::sys {
namespace {

using testing::CgroupTest;
using testing::eventually;
using testing::FdLeakTest;
using testing::kill_and_reap;
using testing::start_shell;
using testing::TempDir;
using testing::write_text;

class SamplerTest : public FdLeakTest {};
class SamplerCgroupTest : public CgroupTest {};

TEST_F(SamplerTest, FidelityWireStrings) {
  EXPECT_EQ(fidelity_wire(Fidelity::hard), "hard");
  EXPECT_EQ(fidelity_wire(Fidelity::sampled), "sampled");
  EXPECT_EQ(fidelity_wire(Fidelity::unavailable), "unavailable");
}

TEST_F(SamplerTest, BusyTreeWithoutCgroupIsSampledFromProc) {
  // A busy shell with one sleeping child: the walk must find the child through task/*/children.
  Pidfd busy = start_shell("sleep 300 & while :; do :; done", {"PATH=/usr/bin:/bin"});
  ASSERT_TRUE(busy.valid());
  TreeUsage u;
  ASSERT_TRUE(eventually([&] {
    auto r = sample_tree(nullptr, {busy.pid()});
    if (!r) return false;
    u = *r;
    return u.cpu_ms.value > 0 && u.processes.value == 2;
  })) << "cpu_ms "
      << u.cpu_ms.value << " processes " << u.processes.value;
  EXPECT_EQ(u.source, SampleSource::procfs);
  EXPECT_EQ(u.cpu_ms.fidelity, Fidelity::sampled);
  EXPECT_GT(u.rss_bytes.value, 0u);
  EXPECT_EQ(u.rss_bytes.fidelity, Fidelity::sampled);
  EXPECT_EQ(u.processes.fidelity, Fidelity::sampled);
  EXPECT_GE(u.open_fds.value, 3u) << "stdin, stdout, stderr at least";
  EXPECT_EQ(u.open_fds.fidelity, Fidelity::sampled);
  EXPECT_EQ(u.unreadable, 0u);

  // Clean up by pidfd only: find the sleeping child, pin it, then kill the shell and the child.
  std::vector<std::int32_t> kids;
  {
    std::ifstream in("/proc/" + std::to_string(busy.pid()) + "/task/" + std::to_string(busy.pid()) +
                     "/children");
    std::int32_t k = 0;
    while (in >> k) kids.push_back(k);
  }
  ASSERT_EQ(kids.size(), 1u);
  Pidfd kid = Pidfd::open(kids[0]).value();
  kill_and_reap(busy);
  // Now an orphan (reparented away): kill it through its pidfd and wait until it has exited.
  ASSERT_TRUE(kid.send_signal(SIGKILL));
  EXPECT_TRUE(eventually([&] { return !kid.alive(); }));
}

TEST_F(SamplerTest, NothingToMeasureIsUnavailableNotZero) {
  // pid 0 and a negative pid never name a process; no sum is a measurement.
  auto r = sample_tree(nullptr, {});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->cpu_ms.fidelity, Fidelity::unavailable);
  EXPECT_EQ(r->rss_bytes.fidelity, Fidelity::unavailable);
  EXPECT_EQ(r->open_fds.fidelity, Fidelity::unavailable);
  EXPECT_EQ(r->processes.fidelity, Fidelity::unavailable);

  // An exited, unreaped process (zombie) is not a live process.
  Pidfd zombie = start_shell("exit 0", {});
  ASSERT_TRUE(zombie.valid());
  ASSERT_TRUE(eventually([&] { return !zombie.alive(); }));
  auto z = sample_tree(nullptr, {zombie.pid()});
  ASSERT_TRUE(z);
  EXPECT_EQ(z->processes.value, 0u);
  ASSERT_TRUE(zombie.wait());
  zombie = Pidfd();

  // An exited (reaped) process: counted as zero live processes, sums unavailable.
  Pidfd gone = start_shell("exit 0", {});
  ASSERT_TRUE(gone.valid());
  std::int32_t const pid = gone.pid();
  ASSERT_TRUE(gone.wait());
  auto after = sample_tree(nullptr, {pid});
  ASSERT_TRUE(after);
  EXPECT_EQ(after->processes.value, 0u);
  EXPECT_EQ(after->cpu_ms.fidelity, Fidelity::unavailable);

  SampleOptions bad;
  bad.proc_root = "/nonexistent-proc";
  auto err = sample_tree(nullptr, {1}, bad);
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().code, Errc::procfs_failed);
}

TEST_F(SamplerCgroupTest, BusyTreeInACgroupUsesTheCgroupCounters) {
  Pidfd busy = start_shell("(setsid sleep 300 &) ; while :; do :; done", {"PATH=/usr/bin:/bin"},
                           procs_path());
  ASSERT_TRUE(busy.valid());
  TreeUsage u;
  ASSERT_TRUE(eventually([&] {
    auto r = sample_tree(&cg_, {});
    if (!r) return false;
    u = *r;
    return u.cpu_ms.value > 0 && u.processes.value == 2;
  })) << "cpu_ms "
      << u.cpu_ms.value << " processes " << u.processes.value;
  EXPECT_EQ(u.source, SampleSource::cgroup);
  EXPECT_EQ(u.cpu_ms.fidelity, Fidelity::sampled);
  auto const have = cg_.controllers().value();
  // Without the memory controller the rss is a /proc sum; with it, memory.current.
  EXPECT_GT(u.rss_bytes.value, 0u);
  EXPECT_EQ(u.rss_bytes.fidelity, Fidelity::sampled);
  EXPECT_GE(u.open_fds.value, 3u);
  EXPECT_EQ(u.open_fds.fidelity, Fidelity::sampled);
  // cgroup cpu includes everything the tree ever ran, so it never goes down.
  auto later = sample_tree(&cg_, {});
  ASSERT_TRUE(later);
  EXPECT_GE(later->cpu_ms.value, u.cpu_ms.value);

  ASSERT_TRUE(cg_.kill());
  ASSERT_TRUE(busy.wait());
  busy = Pidfd();
  ASSERT_TRUE(cg_.wait_empty(std::chrono::seconds(10)));
  auto empty = sample_tree(&cg_, {});
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->processes.value, 0u);
  EXPECT_EQ(empty->processes.fidelity, Fidelity::sampled) << "an empty cgroup is a measurement";
  EXPECT_GE(empty->cpu_ms.value, u.cpu_ms.value) << "cpu of exited members is kept";
}

class DiskWalkTest : public FdLeakTest {};

TEST_F(DiskWalkTest, CountsWithoutFollowingSymlinksAndTerminatesOnLoops) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  std::string const r = t.path();
  write_text(r + "/a.txt", std::string(1000, 'a'));
  ASSERT_EQ(::mkdir((r + "/sub").c_str(), 0755), 0);
  write_text(r + "/sub/b.txt", std::string(5000, 'b'));
  ASSERT_EQ(::link((r + "/a.txt").c_str(), (r + "/sub/hard").c_str()), 0);
  ASSERT_EQ(::symlink("..", (r + "/sub/up").c_str()), 0);   // a loop if followed
  ASSERT_EQ(::symlink("self", (r + "/self").c_str()), 0);   // a link to itself
  ASSERT_EQ(::symlink("/", (r + "/sub/root").c_str()), 0);  // the whole machine if followed
  ASSERT_EQ(::mkdir((r + "/sub/deep").c_str(), 0755), 0);

  UniqueFd root(::open(r.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  auto du = walk_disk_usage(root, 1000);
  ASSERT_TRUE(du) << du.error().message();
  // a.txt sub self | sub/b.txt sub/hard sub/up sub/root sub/deep
  EXPECT_EQ(du->entries, 8u);
  EXPECT_EQ(du->apparent_bytes, 6000u) << "the hard link is counted once";
  EXPECT_GT(du->bytes, 0u);
  EXPECT_FALSE(du->truncated);
  EXPECT_EQ(du->unreadable, 0u);
  EXPECT_EQ(du->other_device, 0u);
  EXPECT_GE(::fcntl(root.get(), F_GETFD), 0) << "the caller's fd stays usable";

  auto few = walk_disk_usage(root, 3);
  ASSERT_TRUE(few);
  EXPECT_EQ(few->entries, 3u);
  EXPECT_TRUE(few->truncated);

  auto shallow = walk_disk_usage(root, 1000, 1);
  ASSERT_TRUE(shallow);
  EXPECT_EQ(shallow->entries, 3u) << "sub is counted but not entered";
  EXPECT_TRUE(shallow->truncated);
  EXPECT_EQ(shallow->apparent_bytes, 1000u);

  UniqueFd file(::open((r + "/a.txt").c_str(), O_RDONLY | O_CLOEXEC));
  auto notdir = walk_disk_usage(file, 10);
  ASSERT_FALSE(notdir);
  EXPECT_EQ(notdir.error().code, Errc::sys_error);
  EXPECT_EQ(notdir.error().sys_errno, ENOTDIR);
}

}  // namespace
}  // namespace custos::sys
