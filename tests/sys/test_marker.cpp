// The marker boundary: the real /proc with real marked trees (no cgroup), plus a fake proc tree
// for the cases the real kernel will not produce on demand.
#include <algorithm>
#include <fstream>
#include <grp.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <thread>

#include "custos/sys/identity.hpp"
#include "custos/sys/procfs.hpp"

#include "sys/cgroup_fixture.hpp"

namespace custos::sys {
namespace {

using testing::comm_of;
using testing::eventually;
using testing::FdLeakTest;
using testing::kill_and_reap;
using testing::start_shell;
using testing::TempDir;
using testing::write_text;

class MarkerTest : public FdLeakTest {};

std::vector<std::int32_t> scan_matches(Marker const& m) {
  auto r = marker_scan(m);
  if (!r) return {};
  std::vector<std::int32_t> v = r->matched;
  std::sort(v.begin(), v.end());
  return v;
}

TEST_F(MarkerTest, MarkerTextForms) {
  auto a = Marker::generate();
  auto b = Marker::generate();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(Marker::env_name(), "CUSTOS_MARKER");
  std::string const hex = a->env_value();
  ASSERT_EQ(hex.size(), 32u);
  EXPECT_TRUE(std::all_of(hex.begin(), hex.end(),
                          [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }));
  EXPECT_EQ(a->env_entry(), "CUSTOS_MARKER=" + hex);
  EXPECT_EQ(Marker::from_hex(hex).value(), *a);
  EXPECT_FALSE(Marker::from_hex(hex.substr(1)));
  std::string upper = hex;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](char c) { return c == 'a' ? 'A' : c; });
  if (upper != hex) {
    EXPECT_FALSE(Marker::from_hex(upper));
  }
  EXPECT_FALSE(Marker::from_hex(std::string(32, 'g')));
}

TEST_F(MarkerTest, EnvironMatchesWholeEntriesOnly) {
  Marker const m = Marker::generate().value();
  std::string const e = m.env_entry();
  using namespace std::string_literals;
  EXPECT_TRUE(environ_has_marker(e + "\0"s, m));
  EXPECT_TRUE(environ_has_marker("A=1\0"s + e + "\0B=2\0"s, m));
  EXPECT_TRUE(environ_has_marker("A=1\0"s + e, m)) << "last entry without its NUL";
  EXPECT_FALSE(environ_has_marker(e + "0\0"s, m)) << "a longer value is another marker";
  EXPECT_FALSE(environ_has_marker("X" + e + "\0"s, m)) << "a longer name is another variable";
  EXPECT_FALSE(environ_has_marker("A=" + e + "\0"s, m)) << "inside another variable's value";
  EXPECT_FALSE(environ_has_marker("", m));
  Marker const other = Marker::generate().value();
  EXPECT_FALSE(environ_has_marker(other.env_entry() + "\0"s, m));
}

TEST_F(MarkerTest, MountTableAndHiddenProcesses) {
  auto e = parse_mountinfo_line(
      "22 1 0:5 / /my\\040proc rw,nosuid shared:12 - proc proc rw,hidepid=invisible");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->root, "/");
  EXPECT_EQ(e->mount_point, "/my proc");
  EXPECT_EQ(e->mount_options, "rw,nosuid");
  EXPECT_EQ(e->fstype, "proc");
  EXPECT_EQ(e->source, "proc");
  EXPECT_EQ(e->super_options, "rw,hidepid=invisible");
  EXPECT_FALSE(parse_mountinfo_line("22 1 0:5 / /proc"));
  EXPECT_FALSE(parse_mountinfo_line(""));

  EXPECT_TRUE(mount_option_present("rw,nsdelegate", "nsdelegate"));
  EXPECT_TRUE(mount_option_present("rw,hidepid=2", "hidepid"));
  EXPECT_FALSE(mount_option_present("rw,nsdelegatex", "nsdelegate"));
  EXPECT_FALSE(mount_option_present("", "rw"));

  std::string const plain = "22 1 0:5 / /proc rw,nosuid - proc proc rw\n";
  EXPECT_FALSE(proc_hides_processes(plain, "/proc"));
  for (char const* opt : {"hidepid=2", "hidepid=invisible", "hidepid=4", "hidepid=ptraceable"}) {
    std::string const t = std::string("22 1 0:5 / /proc rw - proc proc rw,") + opt + ",gid=5\n";
    EXPECT_TRUE(proc_hides_processes(t, "/proc")) << opt;
    EXPECT_FALSE(proc_hides_processes(t, "/other")) << "another mount point";
  }
  // hidepid=1 only denies reading (counted as unreadable); the last mount on a point wins.
  EXPECT_FALSE(proc_hides_processes("22 1 0:5 / /proc rw - proc proc rw,hidepid=1\n", "/proc"));
  EXPECT_FALSE(
      proc_hides_processes("22 1 0:5 / /proc rw - proc proc rw,hidepid=2\n" + plain, "/proc"));
  EXPECT_TRUE(
      proc_hides_processes(plain + "23 1 0:6 / /proc rw - proc proc rw,hidepid=2\n", "/proc"));

  // This host's /proc does not hide processes, so sweeps here can be confirmed at all.
  auto root = open_dir_path("/");
  ASSERT_TRUE(root);
  auto mi = read_file_at(*root, "proc/self/mountinfo", 4 << 20);
  ASSERT_TRUE(mi);
  EXPECT_FALSE(proc_hides_processes(*mi, "/proc"));
}

// A marked tree outside any cgroup: the shell exec's a sleep, starts a setsid'd grandchild
// through a shell that exits, and a double-forked sleep. The sweep must find and kill all three.
TEST_F(MarkerTest, SweepKillsADoubleForkedMarkedTree) {
  Marker const m = Marker::generate().value();
  Pidfd root = start_shell("setsid sh -c 'sleep 300 &' ; (sleep 300 &) ; exec sleep 300",
                           {"PATH=/usr/bin:/bin", m.env_entry()});
  ASSERT_TRUE(root.valid());
  std::vector<std::int32_t> found;
  ASSERT_TRUE(eventually([&] {
    found = scan_matches(m);
    return found.size() == 3 && std::all_of(found.begin(), found.end(),
                                            [](std::int32_t p) { return comm_of(p) == "sleep"; });
  })) << "matched "
      << found.size();
  EXPECT_TRUE(std::find(found.begin(), found.end(), root.pid()) != found.end());
  std::vector<Pidfd> members;
  for (std::int32_t const pid : found) members.push_back(Pidfd::open(pid).value());

  // Processes older than the tree's root cannot descend from it (PID 1 here is unreadable even
  // to root, and without this bound would make every sweep unconfirmed).
  MarkerSweepOptions o;
  o.not_before_ticks = read_start_time(root.pid()).value();
  auto r = marker_sweep(m, o);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(r->confirmed) << "unreadable " << r->unreadable << " (first "
                            << (r->unreadable_pids.empty() ? -1 : r->unreadable_pids[0])
                            << ") remaining " << r->remaining;
  EXPECT_GE(r->signalled, 3u) << "a dying process seen again is signalled again";
  EXPECT_GE(r->rounds, 2u) << "a final scan must have found nothing";
  EXPECT_EQ(r->remaining, 0u);
  for (Pidfd const& p : members) {
    EXPECT_TRUE(eventually([&] { return !p.alive(); }, std::chrono::seconds(5)))
        << "survivor " << p.pid();
  }
  auto st = root.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->signal, SIGKILL);
  root = Pidfd();
  EXPECT_TRUE(scan_matches(m).empty());
}

// The limit of the boundary, pinned down: a process that exec's with the marker removed is
// invisible to the sweep, which then believes the tree is gone. This is why a cgroup is
// preferred, and why docs/boundaries.md says so. The test cleans it up by its own pidfd.
TEST_F(MarkerTest, AProcessThatScrubsItsEnvironmentEscapesTheSweep) {
  Marker const m = Marker::generate().value();
  std::vector<std::string> const env = {"PATH=/usr/bin:/bin", m.env_entry()};
  Pidfd scrubbed = start_shell("exec env -u CUSTOS_MARKER sleep 300", env);
  Pidfd marked = start_shell("exec sleep 300", env);
  ASSERT_TRUE(scrubbed.valid() && marked.valid());
  ASSERT_TRUE(eventually([&] {
    return comm_of(scrubbed.pid()) == "sleep" &&
           scan_matches(m) == std::vector<std::int32_t>{marked.pid()} &&
           comm_of(marked.pid()) == "sleep";
  }));

  MarkerSweepOptions o;
  o.not_before_ticks =
      std::min(read_start_time(scrubbed.pid()).value(), read_start_time(marked.pid()).value());
  auto r = marker_sweep(m, o);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_GE(r->signalled, 1u);
  EXPECT_EQ(r->remaining, 0u);
  EXPECT_TRUE(r->confirmed) << "the sweep cannot know about the scrubbed process";
  EXPECT_TRUE(scrubbed.alive()) << "the scrubbed process escaped, as documented";
  EXPECT_TRUE(scan_matches(m).empty());

  auto st = marked.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->signal, SIGKILL);
  marked = Pidfd();
  kill_and_reap(scrubbed);
}

// What a sweep run as `uid` reported, passed back over a pipe from a forked scanner.
struct ScannerReport {
  bool ran = false;
  bool confirmed = true;
  bool target_unreadable = false;  // the target pid was among the unreadable processes
  unsigned signalled = 255;
};

ScannerReport sweep_as(uid_t uid, Marker const& m, std::int32_t target) {
  std::uint64_t const not_before = read_start_time(target).value();
  ScannerReport rep;
  std::uint64_t const ns = pid_namespace_inode("self").value();
  auto pipe = make_pipe();
  EXPECT_TRUE(pipe);
  if (!pipe) return rep;
  pid_t const scanner = ::fork();
  if (scanner == 0) {
    pipe->first.reset();
    unsigned char out[4] = {0, 0, 0, 0};
    if (::setgroups(0, nullptr) == 0 && ::setresgid(uid, uid, uid) == 0 &&
        ::setresuid(uid, uid, uid) == 0) {
      MarkerSweepOptions o;
      o.pid_ns_inode = ns;
      o.max_rounds = 1;
      o.not_before_ticks = not_before;  // the target itself is not older: it must be inspected
      MarkerScanOptions so;
      so.pid_ns_inode = ns;
      so.not_before_ticks = not_before;
      auto scan = marker_scan(m, so);
      auto res = marker_sweep(m, o);
      out[0] = res && scan ? 1 : 0;
      out[1] = res && res->confirmed ? 1 : 0;
      out[2] = scan && std::find(scan->unreadable.begin(), scan->unreadable.end(), target) !=
                           scan->unreadable.end();
      out[3] = res ? static_cast<unsigned char>(std::min<std::uint32_t>(res->signalled, 255)) : 255;
    }
    (void)!::write(pipe->second.get(), out, sizeof out);
    ::_exit(0);
  }
  EXPECT_GT(scanner, 0);
  if (scanner <= 0) return rep;
  pipe->second.reset();
  auto scan_proc = Pidfd::open(scanner);
  unsigned char got[4] = {0, 1, 0, 255};
  EXPECT_EQ(::read(pipe->first.get(), got, sizeof got), 4);
  EXPECT_TRUE(scan_proc && scan_proc->wait());
  rep.ran = got[0] == 1;
  rep.confirmed = got[1] == 1;
  rep.target_unreadable = got[2] == 1;
  rep.signalled = got[3];
  return rep;
}

// A scanner that cannot read some process (here: it runs as nobody, the marked process as
// root) must never report confirmed, and must not signal what it could not verify.
TEST_F(MarkerTest, UnreadableProcessesMakeTheSweepUnconfirmed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a scanner under another uid";
  Marker const m = Marker::generate().value();
  Pidfd target = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin", m.env_entry()});
  ASSERT_TRUE(target.valid());
  ASSERT_TRUE(
      eventually([&] { return scan_matches(m) == std::vector<std::int32_t>{target.pid()}; }));
  ScannerReport const rep = sweep_as(65534, m, target.pid());
  EXPECT_TRUE(rep.ran) << "the sweep ran as nobody";
  EXPECT_FALSE(rep.confirmed) << "an unreadable process must make the result unconfirmed";
  EXPECT_TRUE(rep.target_unreadable) << "root's processes are unreadable to nobody";
  EXPECT_EQ(rep.signalled, 0u) << "nothing unverified is signalled";
  EXPECT_TRUE(target.alive());
  kill_and_reap(target);
}

// The same uid is not enough: a marked process that made itself non-dumpable (prctl
// PR_SET_DUMPABLE 0, as setuid programs and credential holders do) hides its environ from a
// scanner of its own uid. (perl is Essential on Debian; syscall 157 is prctl on x86_64.)
TEST_F(MarkerTest, NonDumpableProcessOfTheSameUidIsUnreadable) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to start processes under another uid";
#if !defined(__x86_64__)
  GTEST_SKIP() << "prctl syscall number below is x86_64's";
#endif
  if (::access("/usr/bin/setpriv", X_OK) != 0 || ::access("/usr/bin/perl", X_OK) != 0) {
    GTEST_SKIP() << "needs setpriv and perl";
  }
  Marker const m = Marker::generate().value();
  Pidfd target = start_shell(
      "exec setpriv --reuid 65534 --regid 65534 --clear-groups /usr/bin/perl -e "
      "'syscall(157, 4, 0, 0, 0, 0) == 0 or exit 3; sleep 300'",
      {"PATH=/usr/bin:/bin", m.env_entry()});
  ASSERT_TRUE(target.valid());
  // Wait until perl runs and has dropped dumpable (status shows it only indirectly: /proc files
  // of a non-dumpable process become root-owned).
  ASSERT_TRUE(eventually([&] {
    struct stat st {};
    std::string const p = "/proc/" + std::to_string(target.pid()) + "/environ";
    return comm_of(target.pid()) == "perl" && ::stat(p.c_str(), &st) == 0 && st.st_uid == 0;
  }));
  ASSERT_TRUE(target.alive());
  ScannerReport const rep = sweep_as(65534, m, target.pid());
  EXPECT_TRUE(rep.ran);
  EXPECT_FALSE(rep.confirmed);
  EXPECT_TRUE(rep.target_unreadable) << "same uid, but not dumpable";
  EXPECT_EQ(rep.signalled, 0u);
  EXPECT_TRUE(target.alive());
  kill_and_reap(target);
}

// A fake proc tree: hard links share one inode, so "same pid namespace" is the same file.
TEST_F(MarkerTest, FakeProcTreeScanAndSweep) {
  using namespace std::string_literals;
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  Marker const m = Marker::generate().value();
  std::string const root = t.path();
  auto mk = [&](std::string const& rel) {
    ASSERT_EQ(::mkdir((root + "/" + rel).c_str(), 0755), 0) << rel;
  };
  mk("self");
  mk("self/ns");
  write_text(root + "/self/ns/pid", "ns");
  auto proc = [&](std::string const& pid, bool same_ns) {
    mk(pid);
    mk(pid + "/ns");
    if (same_ns) {
      ASSERT_EQ(::link((root + "/self/ns/pid").c_str(), (root + "/" + pid + "/ns/pid").c_str()), 0);
    } else {
      write_text(root + "/" + pid + "/ns/pid", "other");
    }
  };
  proc("100", true);
  mk("100/environ");  // a directory: read() fails with EISDIR, i.e. unreadable
  proc("101", true);
  write_text(root + "/101/environ", "A=1\0"s + m.env_entry() + "\0"s);
  proc("102", false);  // marked, but in another pid namespace: never ours
  write_text(root + "/102/environ", m.env_entry() + "\0"s);
  proc("103", true);
  write_text(root + "/103/environ", m.env_entry() + "0\0"s);
  proc("104", true);
  write_text(root + "/104/environ", "B=2\0"s + m.env_entry());
  proc("106", true);  // unreadable, but older than the execution: skipped when that is known
  mk("106/environ");
  write_text(root + "/106/stat", "106 (a b) c) S 1 1 1 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 500 0 0\n");
  mk("105");  // vanished mid-scan: no ns, no environ -> gone, not unreadable
  mk("abc");

  MarkerScanOptions so;
  so.proc_root = root;
  auto scan = marker_scan(m, so);
  ASSERT_TRUE(scan) << scan.error().message();
  std::vector<std::int32_t> matched = scan->matched;
  std::sort(matched.begin(), matched.end());
  EXPECT_EQ(matched, (std::vector<std::int32_t>{101, 104}));
  std::vector<std::int32_t> unreadable = scan->unreadable;
  std::sort(unreadable.begin(), unreadable.end());
  EXPECT_EQ(unreadable, (std::vector<std::int32_t>{100, 106}));
  EXPECT_EQ(scan->scanned, 7u);

  so.not_before_ticks = 501;  // 106 started at tick 500
  auto bounded = marker_scan(m, so);
  ASSERT_TRUE(bounded);
  EXPECT_EQ(bounded->unreadable, std::vector<std::int32_t>{100});
  EXPECT_EQ(bounded->older, 1u);
  so.not_before_ticks = 500;  // same tick: not provably older, so inspected
  EXPECT_EQ(marker_scan(m, so).value().older, 0u);

  // The fake tree's pids are not pids of this namespace: scanned, never signalled through.
  MarkerSweepOptions wo;
  wo.proc_root = root;
  wo.not_before_ticks = 501;
  auto sweep = marker_sweep(m, wo);
  ASSERT_TRUE(sweep) << sweep.error().message();
  EXPECT_FALSE(sweep->confirmed);
  EXPECT_EQ(sweep->signalled, 0u);
  EXPECT_EQ(sweep->remaining, 2u);
  EXPECT_EQ(sweep->unreadable, 1u);
  EXPECT_EQ(sweep->unreadable_pids, std::vector<std::int32_t>{100});
  EXPECT_EQ(sweep->rounds, 1u);

  // Long environments are streamed: a marker straddling the reader's 16 KiB chunks is found, and
  // an environment beyond max_environ_bytes counts as unreadable rather than unmarked.
  for (std::size_t const pad : {16384u - 5u, 16384u - 20u, 40000u}) {
    TempDir big;
    std::string const b = big.path();
    ASSERT_EQ(::mkdir((b + "/self").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((b + "/self/ns").c_str(), 0755), 0);
    write_text(b + "/self/ns/pid", "ns");
    ASSERT_EQ(::mkdir((b + "/7").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((b + "/7/ns").c_str(), 0755), 0);
    ASSERT_EQ(::link((b + "/self/ns/pid").c_str(), (b + "/7/ns/pid").c_str()), 0);
    write_text(b + "/7/environ", "P=" + std::string(pad, 'x') + "\0"s + m.env_entry() + "\0Z=1\0"s);
    MarkerScanOptions bo;
    bo.proc_root = b;
    EXPECT_EQ(marker_scan(m, bo).value().matched, std::vector<std::int32_t>{7}) << "pad " << pad;
    bo.max_environ_bytes = 1000;
    auto capped = marker_scan(m, bo).value();
    EXPECT_TRUE(capped.matched.empty());
    EXPECT_EQ(capped.unreadable, std::vector<std::int32_t>{7}) << "pad " << pad;
  }

  // Only the unreadable entry left: still unconfirmed.
  ASSERT_EQ(::unlink((root + "/101/environ").c_str()), 0);
  ASSERT_EQ(::unlink((root + "/104/environ").c_str()), 0);
  auto again = marker_sweep(m, wo);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->confirmed);
  EXPECT_EQ(again->remaining, 0u);

  // A proc root that cannot be listed is an error, not an empty (confirmed) scan.
  MarkerSweepOptions missing;
  missing.proc_root = root + "/does-not-exist";
  missing.pid_ns_inode = 1;
  auto bad = marker_sweep(m, missing);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::procfs_failed);
}

// ---- start-time cache and multi-marker sweeps -------------------------------------------------

std::uint64_t proc_dir_inode(std::int32_t pid) {
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

// clone3 with set_tid: a new process at exactly `pid` (root in the initial pid namespace may ask
// for a pid), which exec's `sleep 300` with `env`. Returns an invalid Pidfd and sets `err` when
// the kernel refuses (EEXIST: the pid was taken meanwhile).
Pidfd spawn_at_pid(std::int32_t pid, std::vector<std::string> const& env, int& err) {
  struct {
    std::uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
  } args{};
  std::vector<char*> envp;
  for (auto const& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  char const* argv[] = {"sleep", "300", nullptr};
  int pidfd = -1;
  pid_t want = pid;
  args.flags = 0x00001000;  // CLONE_PIDFD
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  args.set_tid = reinterpret_cast<std::uint64_t>(&want);
  args.set_tid_size = 1;
  long const r = ::syscall(SYS_clone3, &args, sizeof args);
  if (r == 0) {
    ::syscall(SYS_execve, "/bin/sleep", argv, envp.data());
    ::syscall(SYS_exit_group, 127);
  }
  if (r < 0) {
    err = errno;
    return Pidfd();
  }
  return Pidfd::adopt(UniqueFd(pidfd), static_cast<std::int32_t>(r));
}

// The cache keys start times by (pid, inode of /proc/<pid>): a process that takes over the pid
// of an old, cached one must not inherit its start time — it is younger than the root and its
// environ must be read.
TEST_F(MarkerTest, StartTimeCacheNeverHidesARecycledPid) {
  Marker const m = Marker::generate().value();
  Pidfd old_proc = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin"});
  ASSERT_TRUE(old_proc.valid());
  std::this_thread::sleep_for(std::chrono::milliseconds(40));  // start times count 10 ms ticks
  Pidfd root = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin"});
  ASSERT_TRUE(root.valid());
  std::uint64_t const root_ticks = read_start_time(root.pid()).value();
  std::int32_t const pid = old_proc.pid();
  ASSERT_TRUE(eventually([&] { return comm_of(pid) == "sleep"; }));
  ProcStartCache cache;
  MarkerScanOptions so;
  so.not_before_ticks = root_ticks;
  so.cache = &cache;
  // procfs numbers a /proc/<pid> inode when it instantiates it: if the kernel evicted it between
  // the scan's readdir and this stat, the same live process shows a new number (the cache then
  // misses and re-reads, which is safe). Scan and look again until both saw the same inode.
  std::uint64_t old_inode = 0;
  ProcStartCache::Entry const* e = nullptr;
  for (int attempt = 0; attempt < 5 && e == nullptr; ++attempt) {
    auto first = marker_scan(m, so);
    ASSERT_TRUE(first) << first.error().message();
    old_inode = proc_dir_inode(pid);
    ASSERT_NE(old_inode, 0u);
    e = cache.find(pid, old_inode);
  }
  ASSERT_NE(e, nullptr) << "the old process is cached";
  EXPECT_LT(e->start_ticks, root_ticks);

  // The old process goes; a marked one is born at its pid, after the root.
  kill_and_reap(old_proc);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int err = 0;
  Pidfd reborn = spawn_at_pid(pid, {"PATH=/usr/bin:/bin", m.env_entry()}, err);
  if (!reborn.valid()) {
    kill_and_reap(root);
    if (err == EEXIST) GTEST_SKIP() << "pid " << pid << " was taken by another process meanwhile";
    FAIL() << "clone3 with set_tid: " << std::strerror(err);
  }
  ASSERT_TRUE(eventually([&] { return comm_of(pid) == "sleep"; }));
  EXPECT_NE(proc_dir_inode(pid), old_inode) << "procfs gives the new process a new inode";

  auto second = marker_scan(m, so);
  ASSERT_TRUE(second) << second.error().message();
  EXPECT_EQ(second->matched, std::vector<std::int32_t>{pid}) << "the recycled pid was inspected";
  EXPECT_EQ(cache.find(pid, old_inode), nullptr);

  kill_and_reap(reborn);
  kill_and_reap(root);
}

// A second pass answers the start times of processes it already saw from the cache instead of
// reading /proc/<pid>/stat again; a fake (non-procfs) tree is never cached.
TEST_F(MarkerTest, StartTimeCacheServesRepeatedPasses) {
  Marker const m = Marker::generate().value();
  ProcStartCache cache;
  MarkerScanOptions so;
  so.not_before_ticks = read_start_time(static_cast<std::int32_t>(::getpid())).value();
  so.cache = &cache;
  auto first = marker_scan(m, so);
  ASSERT_TRUE(first);
  auto const after_first = cache.stats();
  EXPECT_GT(after_first.stat_reads, 0u);
  EXPECT_GT(after_first.entries, 0u);
  auto second = marker_scan(m, so);
  ASSERT_TRUE(second);
  auto const after_second = cache.stats();
  EXPECT_GT(after_second.hits, after_first.hits);
  // Only processes born between the two passes (other work on this host) need a read.
  EXPECT_LT(after_second.stat_reads - after_first.stat_reads, second->scanned / 2)
      << "scanned " << second->scanned;
  EXPECT_EQ(second->older, first->older) << "the cache dates processes as the stat files do";

  // Idle longer than the trust window: the cache starts over rather than trusting old entries.
  ProcStartCache short_lived(std::chrono::milliseconds(0));
  so.cache = &short_lived;
  ASSERT_TRUE(marker_scan(m, so));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(marker_scan(m, so));
  EXPECT_EQ(short_lived.stats().hits, 0u);

  // A fake tree: the cache is left alone (its inode numbers may be reused at once).
  TempDir dir;
  std::string const root = dir.path();
  ASSERT_EQ(::mkdir((root + "/self").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/self/ns").c_str(), 0755), 0);
  write_text(root + "/self/ns/pid", "ns");
  ASSERT_EQ(::mkdir((root + "/9").c_str(), 0755), 0);
  write_text(root + "/9/stat", "9 (x) S 1 1 1 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 500 0 0\n");
  ProcStartCache fake_cache;
  MarkerScanOptions fo;
  fo.proc_root = root;
  fo.not_before_ticks = 1000;
  fo.cache = &fake_cache;
  auto fake = marker_scan(m, fo);
  ASSERT_TRUE(fake);
  EXPECT_EQ(fake->older, 1u);
  EXPECT_EQ(fake_cache.stats().entries, 0u);
  EXPECT_EQ(fake_cache.stats().stat_reads, 0u);
}

// The cache holds /proc open across passes and rewinds it: a process born after one pass is
// listed, dated and matched by the next, through a scan and through the sweeper alike.
TEST_F(MarkerTest, HeldProcDirectorySeesProcessesBornBetweenPasses) {
  Marker const m = Marker::generate().value();
  std::uint64_t const not_before = read_start_time(static_cast<std::int32_t>(::getpid())).value();
  ProcStartCache cache;
  MarkerScanOptions so;
  so.not_before_ticks = not_before;
  so.cache = &cache;
  auto before = marker_scan(m, so);
  ASSERT_TRUE(before) << before.error().message();
  EXPECT_TRUE(before->matched.empty());
  int const held = cache.proc_dir("/proc");
  ASSERT_GE(held, 0) << "/proc is a procfs: the cache keeps it open";
  EXPECT_EQ(cache.proc_dir("/proc"), held) << "the same descriptor serves the next pass";

  Pidfd root = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin", m.env_entry()});
  ASSERT_TRUE(root.valid());
  ASSERT_TRUE(eventually([&] {
    auto r = marker_scan(m, so);
    return r && r->matched.size() == 1 && r->matched.front() == root.pid();
  }));
  EXPECT_EQ(cache.proc_dir("/proc"), held);

  MarkerSweeper sweeper;
  ASSERT_TRUE(
      sweeper.enqueue({MarkerSweepTarget{Marker::generate().value(), not_before}, nullptr}));
  sweeper.run_pending();  // a first pass with nothing to find opens and keeps /proc
  std::optional<Result<MarkerSweepResult>> got;
  ASSERT_TRUE(sweeper.enqueue(
      {MarkerSweepTarget{m, not_before}, [&got](Result<MarkerSweepResult> r) { got = r; }}));
  sweeper.run_pending();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(*got) << got->error().message();
  EXPECT_EQ((*got)->signalled, 1u);
  EXPECT_TRUE((*got)->confirmed);
  EXPECT_TRUE(root.wait());
  root = Pidfd();

  cache.drop_proc_dir();
  auto after = marker_scan(m, so);
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->matched.empty());
}

// read_shown_file_at returns what read_file_at returns: whole kernel files in one read, and a
// file longer than one buffer still whole.
TEST_F(MarkerTest, ShownFileReadIsTheWholeFile) {
  auto proc = open_dir_path("/proc/self");
  ASSERT_TRUE(proc);
  auto shown = read_shown_file_at(*proc, "stat");
  ASSERT_TRUE(shown) << shown.error().message();
  EXPECT_EQ(shown->back(), '\n');
  auto const whole = read_file_at(*proc, "stat");
  ASSERT_TRUE(whole);
  // The values move (times), the fields do not.
  EXPECT_EQ(std::count(shown->begin(), shown->end(), ' '),
            std::count(whole->begin(), whole->end(), ' '));

  TempDir dir;
  std::string big(10000, 'x');
  big[4095] = 'a';
  big[4096] = 'b';
  write_text(dir.path() + "/big", big);
  auto d = open_dir_path(dir.path());
  ASSERT_TRUE(d);
  EXPECT_EQ(read_shown_file_at(*d, "big").value(), big);
  auto missing = read_shown_file_at(*d, "missing");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().sys_errno, ENOENT);
}

// Several markers in one set of passes: each gets what its own sweep would report.
TEST_F(MarkerTest, SweepManyServesEveryMarkerInSharedPasses) {
  Marker const a = Marker::generate().value();
  Marker const b = Marker::generate().value();
  Marker const absent = Marker::generate().value();
  Pidfd root_a =
      start_shell("(sleep 300 &) ; exec sleep 300", {"PATH=/usr/bin:/bin", a.env_entry()});
  Pidfd root_b = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin", b.env_entry()});
  ASSERT_TRUE(root_a.valid() && root_b.valid());
  ASSERT_TRUE(eventually([&] {
    auto sa = marker_scan(a);
    auto sb = marker_scan(b);
    return sa && sb && sa->matched.size() == 2 && sb->matched.size() == 1 &&
           comm_of(root_a.pid()) == "sleep" && comm_of(root_b.pid()) == "sleep";
  }));
  std::vector<Pidfd> members;
  for (auto pid : marker_scan(a).value().matched) members.push_back(Pidfd::open(pid).value());

  std::uint64_t const ta = read_start_time(root_a.pid()).value();
  std::uint64_t const tb = read_start_time(root_b.pid()).value();
  std::vector<MarkerSweepTarget> const targets{{a, ta}, {b, tb}, {absent, ta}};
  ProcStartCache cache;
  MarkerSweepOptions o;
  o.cache = &cache;
  auto r = marker_sweep_many(targets, o);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ(r->size(), 3u);
  auto const& ra = (*r)[0];
  auto const& rb = (*r)[1];
  auto const& rc = (*r)[2];
  EXPECT_TRUE(ra.confirmed) << "unreadable " << ra.unreadable << " remaining " << ra.remaining;
  EXPECT_TRUE(rb.confirmed) << "unreadable " << rb.unreadable << " remaining " << rb.remaining;
  EXPECT_TRUE(rc.confirmed) << "unreadable " << rc.unreadable << " remaining " << rc.remaining;
  EXPECT_GE(ra.signalled, 2u);
  EXPECT_GE(rb.signalled, 1u);
  EXPECT_EQ(rc.signalled, 0u);
  EXPECT_GE(ra.rounds, 2u);
  EXPECT_GE(rb.rounds, 2u);
  EXPECT_EQ(rc.rounds, 1u) << "a marker with nothing to kill is done after one pass";
  for (auto& p : members) {
    EXPECT_TRUE(eventually([&] { return !p.alive(); })) << "pid " << p.pid();
  }
  EXPECT_TRUE(eventually([&] { return !root_b.alive(); }));
  EXPECT_TRUE(root_a.wait());
  EXPECT_TRUE(root_b.wait());
  root_a = Pidfd();
  root_b = Pidfd();
  EXPECT_TRUE(marker_scan(a).value().matched.empty());
  EXPECT_TRUE(marker_scan(b).value().matched.empty());
}

// Requests queued before a run are served together by one sweep, each with its own result.
TEST_F(MarkerTest, SweeperBatchesQueuedRequests) {
  Marker const live = Marker::generate().value();
  Pidfd root = start_shell("exec sleep 300", {"PATH=/usr/bin:/bin", live.env_entry()});
  ASSERT_TRUE(root.valid());
  ASSERT_TRUE(eventually([&] { return scan_matches(live).size() == 1; }));
  std::uint64_t const t = read_start_time(root.pid()).value();

  MarkerSweeper sweeper;
  std::vector<std::optional<Result<MarkerSweepResult>>> got(3);
  std::vector<Marker> markers{live, Marker::generate().value(), Marker::generate().value()};
  for (std::size_t i = 0; i < markers.size(); ++i) {
    bool const must_schedule = sweeper.enqueue(
        {MarkerSweepTarget{markers[i], t}, [&got, i](Result<MarkerSweepResult> r) { got[i] = r; }});
    EXPECT_EQ(must_schedule, i == 0) << "only the first request schedules a run";
  }
  sweeper.run_pending();
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    ASSERT_TRUE(*got[i]) << got[i]->error().message();
    EXPECT_TRUE((*got[i])->confirmed) << i;
    EXPECT_EQ((*got[i])->signalled, i == 0 ? 1u : 0u) << i;
  }
  auto const st = sweeper.stats();
  EXPECT_EQ(st.sweeps, 1u);
  EXPECT_EQ(st.requests, 3u);
  EXPECT_GT(st.cache.entries, 0u);
  EXPECT_TRUE(root.wait());
  root = Pidfd();
  // The run is over: the next request schedules a new one.
  EXPECT_TRUE(sweeper.enqueue({MarkerSweepTarget{live, t}, nullptr}));
  sweeper.run_pending();
  EXPECT_EQ(sweeper.stats().sweeps, 2u);
}

// The sweeper reads the mount table only when it changed; a remount of its proc root with
// hidepid must still be noticed by the very next sweep.
TEST_F(MarkerTest, SweeperNoticesARemountThatHidesProcesses) {
  TempDir dir;
  std::string const root = dir.path();
  if (::mount("proc", root.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount a proc instance: " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } const unmount{root};
  MarkerSweepOptions o;
  o.proc_root = root;
  MarkerSweeper sweeper(o);
  auto sweep = [&] {
    std::optional<Result<MarkerSweepResult>> got;
    // A fresh marker, dated now: nothing can carry it, nothing older is read.
    MarkerSweepTarget t{Marker::generate().value(),
                        read_start_time(static_cast<std::int32_t>(::getpid())).value()};
    (void)sweeper.enqueue({t, [&got](Result<MarkerSweepResult> r) { got = std::move(r); }});
    sweeper.run_pending();
    EXPECT_TRUE(got && *got);
    return got && *got ? (*got)->proc_hides_processes : false;
  };
  EXPECT_FALSE(sweep());
  EXPECT_FALSE(sweep()) << "unchanged table, cached answer";
  ASSERT_EQ(::mount(nullptr, root.c_str(), nullptr, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                    "hidepid=invisible"),
            0)
      << std::strerror(errno);
  EXPECT_TRUE(sweep()) << "the remount was noticed";
  ASSERT_EQ(::mount(nullptr, root.c_str(), nullptr, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                    "hidepid=0"),
            0)
      << std::strerror(errno);
  EXPECT_FALSE(sweep());
}

// An unreadable process fails the sweep only if it stays unreadable: a pass whose only fault was
// an unreadable process is repeated (at most twice more) before the result counts, so a process
// caught for a moment mid-execve by a neighbour's launch does not make a clean teardown
// `unconfirmed`, while one that stays unreadable still does.
TEST_F(MarkerTest, TransientlyUnreadableProcessIsLookedAtAgain) {
  using namespace std::string_literals;
  auto fake_tree = [](std::string const& root) {
    ASSERT_EQ(::mkdir((root + "/self").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((root + "/self/ns").c_str(), 0755), 0);
    write_text(root + "/self/ns/pid", "ns");
    ASSERT_EQ(::mkdir((root + "/200").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((root + "/200/ns").c_str(), 0755), 0);
    ASSERT_EQ(::link((root + "/self/ns/pid").c_str(), (root + "/200/ns/pid").c_str()), 0);
    ASSERT_EQ(::mkdir((root + "/200/environ").c_str(), 0755), 0);  // EISDIR: unreadable
  };
  Marker const m = Marker::generate().value();
  {
    TempDir t;
    fake_tree(t.path());
    MarkerSweepOptions o;
    o.proc_root = t.path();
    o.round_pause = std::chrono::milliseconds(1);
    auto r = marker_sweep(m, o);
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_FALSE(r->confirmed) << "still unreadable after the retries";
    EXPECT_EQ(r->unreadable_pids, std::vector<std::int32_t>{200});
    EXPECT_EQ(r->rounds, 3u) << "one pass and two retries, no more";
  }
  {
    TempDir t;
    std::string const root = t.path();
    fake_tree(root);
    MarkerSweepOptions o;
    o.proc_root = root;
    o.round_pause = std::chrono::milliseconds(600);
    // The entry becomes readable (and unmarked) while the sweep pauses after its first pass.
    std::thread fixer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      ASSERT_EQ(::rmdir((root + "/200/environ").c_str()), 0);
      write_text(root + "/200/environ", "A=1\0"s);
    });
    auto r = marker_sweep(m, o);
    fixer.join();
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_TRUE(r->confirmed) << "unreadable " << r->unreadable << " after " << r->rounds;
    EXPECT_EQ(r->unreadable, 0u);
  }
}

}  // namespace
}  // namespace custos::sys
