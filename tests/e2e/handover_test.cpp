// The handover (docs/operations.md, "Handover"): `custos daemon --reexec` or SIGHUP replaces the
// daemon's image with execve while the listening socket stays open (a client connecting in a
// tight loop is never refused) and the live executions go on under the new image (adopted,
// ended with exactly one terminal record each). A new image that fails its configuration check
// is never started; one that fails to start falls back to the old image.
#include <fstream>
#include <set>
#include <string>
#include <sys/syscall.h>

#include "harness.hpp"

namespace custos::e2e {
namespace {

// Connects to `socket` over and over until stopped, from its own thread: counts the attempts
// and every failed connect (a refusal is ECONNREFUSED, or ENOENT once the path is gone). Every
// 64th connection also asks host.info and waits for the answer, so connects queued during a
// handover are seen to be served by the next image.
class ConnectLoop {
 public:
  explicit ConnectLoop(fs::path socket) : socket_(std::move(socket)) {
    thread_ = std::thread([this] { run(); });
  }
  ConnectLoop(ConnectLoop const&) = delete;
  ConnectLoop& operator=(ConnectLoop const&) = delete;
  ~ConnectLoop() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] std::uint64_t attempts() const { return attempts_; }
  [[nodiscard]] std::uint64_t answered() const { return answered_; }
  [[nodiscard]] std::vector<int> const& failures() const { return failures_; }

 private:
  void run() {
    while (!stop_) {
      int const fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
      if (::connect(fd, reinterpret_cast<sockaddr const*>(&addr), sizeof addr) != 0) {
        failures_.push_back(errno);
      } else if (++attempts_ % 64 == 0) {
        std::string const req = R"({"jsonrpc":"2.0","id":1,"method":"host.info"})"
                                "\n";
        if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
          pollfd p{fd, POLLIN, 0};
          char buf[256];
          if (::poll(&p, 1, 20000) == 1 && ::recv(fd, buf, sizeof buf, 0) > 0) ++answered_;
        }
      }
      ::close(fd);
    }
  }

  fs::path socket_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> answered_{0};
  std::vector<int> failures_;  // read after stop()
  std::thread thread_;
};

struct HostView {
  std::int64_t pid = 0;
  std::int64_t started_ns = 0;
  json::value handover;
  json::value refused;
};

HostView host_view(Daemon const& d) {
  HostView v;
  auto c = d.client();
  auto r = c.call(1, "host.info");
  if (!r || !r->contains("result")) {
    ADD_FAILURE() << "host.info: " << (r ? json::serialize(*r) : "no reply");
    return v;
  }
  auto const& o = r->at("result").as_object();
  v.pid = o.at("pid").as_int64();
  v.started_ns = o.at("started_ns").as_int64();
  v.handover = o.at("handover");
  v.refused = o.at("handover_refused");
  return v;
}

// Polls host.info until another image serves (another start time); its view, or the last one.
HostView await_new_image(Daemon const& d, std::int64_t started_ns,
                         std::chrono::milliseconds timeout = 60s) {
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  HostView v;
  while (std::chrono::steady_clock::now() < deadline) {
    auto c = d.client();
    auto r = c.call(1, "host.info", {}, 2000ms);
    if (r && r->contains("result")) {
      auto const& o = r->at("result").as_object();
      v.pid = o.at("pid").as_int64();
      v.started_ns = o.at("started_ns").as_int64();
      v.handover = o.at("handover");
      v.refused = o.at("handover_refused");
      if (v.started_ns != started_ns) return v;
    }
    std::this_thread::sleep_for(20ms);
  }
  return v;
}

json::object wait_terminal(LineClient& c, std::string const& id) {
  auto w = c.call(900, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}}, 30000ms);
  if (!w || !w->contains("result")) {
    ADD_FAILURE() << "exec.wait " << id << ": " << (w ? json::serialize(*w) : "no reply");
    return {};
  }
  return w->at("result").as_object();
}

// Every id appears exactly once in exec.list, terminal.
void expect_one_terminal_each(LineClient& c, std::vector<std::string> const& ids) {
  auto l = c.call(800, "exec.list", {{"limit", 1000}});
  ASSERT_TRUE(l && l->contains("result")) << (l ? json::serialize(*l) : "");
  std::multiset<std::string> listed;
  for (auto const& e : l->at("result").at("executions").as_array()) {
    listed.insert(std::string{e.at("execution_id").as_string()});
    EXPECT_EQ(e.at("phase").as_string(), "terminal") << json::serialize(e);
  }
  for (auto const& id : ids) EXPECT_EQ(listed.count(id), 1U) << id;
}

TEST(Handover, ReexecKeepsTheSocketAndTheExecutions) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto const before = host_view(d);
  EXPECT_TRUE(before.handover.is_null());
  auto c = d.client();
  auto sleeper = start_execution(c, {"/bin/sleep", "60"}, true);
  // Ends only once the new image serves (a loaded machine's configuration check alone can take
  // seconds), so its exit is the new image's to observe.
  TempDir gate{"/var/tmp"};
  auto const release = (gate.path() / "release").native();
  auto ender = start_execution(
      c, {"/bin/sh", "-c", "while [ ! -e " + release + " ]; do sleep 0.05; done; exit 7"}, true);
  ASSERT_GE(sleeper.pidfd, 0);
  ASSERT_GE(ender.pidfd, 0);

  ConnectLoop loop{d.socket()};
  std::this_thread::sleep_for(100ms);
  auto const before_attempts = loop.attempts();
  auto r = run_cli({"daemon", "--state-dir", d.state().native(), "--reexec"});
  EXPECT_EQ(r.status, 0) << r.out << r.err << d.log();
  EXPECT_NE(r.out.find("handed over"), std::string::npos) << r.out;
  std::this_thread::sleep_for(200ms);
  loop.stop();
  EXPECT_TRUE(loop.failures().empty())
      << loop.failures().size() << " connects failed, the first with errno "
      << loop.failures().front() << "\n"
      << d.log();
  EXPECT_GT(loop.attempts(), before_attempts + 10) << "the loop ran across the handover";
  EXPECT_GT(loop.answered(), 0U);

  auto const after = host_view(d);
  EXPECT_EQ(after.pid, before.pid) << "the same process, another image";
  EXPECT_NE(after.started_ns, before.started_ns);
  ASSERT_TRUE(after.handover.is_object()) << json::serialize(after.handover);
  EXPECT_EQ(after.handover.at("count").as_int64(), 1);
  EXPECT_FALSE(after.handover.at("fallback").as_bool());
  EXPECT_EQ(after.handover.at("from_started_ns").as_int64(), before.started_ns);
  EXPECT_TRUE(d.alive());

  // Both executions are supervised by the new image: live, cancellable, waited for.
  auto c2 = d.client();
  auto g = c2.call(2, "exec.get", {{"execution_id", sleeper.id}});
  ASSERT_TRUE(g && g->contains("result")) << (g ? json::serialize(*g) : "");
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running") << json::serialize(*g);
  EXPECT_FALSE(g->at("result").as_object().contains("source")) << json::serialize(*g);
  EXPECT_TRUE(pid_alive(sleeper.pidfd));

  { std::ofstream{release}; }
  auto const ended = wait_terminal(c2, ender.id);
  EXPECT_EQ(ended.at("classification").as_string(), "exited") << json::serialize(ended);
  // The root is still the daemon's child after the execve: its own status, read by waitid.
  EXPECT_EQ(ended.at("exit").at("code").as_int64(), 7) << json::serialize(ended);
  EXPECT_EQ(ended.at("recovery").as_string(), "live_owned") << json::serialize(ended);

  auto cancel = c2.call(3, "exec.cancel", {{"execution_id", sleeper.id}});
  ASSERT_TRUE(cancel && cancel->contains("result")) << (cancel ? json::serialize(*cancel) : "");
  auto const cancelled = wait_terminal(c2, sleeper.id);
  EXPECT_EQ(cancelled.at("classification").as_string(), "cancelled") << json::serialize(cancelled);
  EXPECT_EQ(cancelled.at("tree").at("cleanup").as_string(), "confirmed");
  pollfd p{sleeper.pidfd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 5000), 1) << "the cancelled execution is gone";
  ::close(sleeper.pidfd);
  ::close(ender.pidfd);
  expect_one_terminal_each(c2, {sleeper.id, ender.id});
  EXPECT_NE(d.log().find("handover #1 from custos"), std::string::npos) << d.log();

  // A second handover, by SIGHUP this time, is counted on.
  ASSERT_TRUE(d.signal(SIGHUP));
  auto const third = await_new_image(d, after.started_ns);
  EXPECT_EQ(third.pid, before.pid);
  ASSERT_TRUE(third.handover.is_object()) << json::serialize(third.handover);
  EXPECT_EQ(third.handover.at("count").as_int64(), 2);

  // And the daemon still stops as ever: socket removed, exit 0. The same loop sees that stop
  // refuse its connects: it can tell a gap when there is one.
  ConnectLoop control{d.socket()};
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(d.signal(SIGTERM));
  auto st = d.wait_exit(30s);
  ASSERT_TRUE(st) << d.log();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << d.log();
  EXPECT_FALSE(fs::exists(d.socket()));
  if (!d.cgroup().empty()) {
    EXPECT_FALSE(fs::exists(d.cgroup())) << "the subtree the first image created is removed";
  }
  std::this_thread::sleep_for(50ms);
  control.stop();
  EXPECT_FALSE(control.failures().empty()) << "a stopped daemon refuses connects";
}

// Failpoint builds: the configuration check takes 1 s longer and the handover then takes 2 s
// before the execve. An execution's root ends in that window. Once the handover began it is
// still the process's unreaped child (neither its exit observer nor the orphan reaper may take it
// once the handover began): the new image adopts it and records its own exit status, never the
// absent_without_terminal of a root whose end nobody can read.
TEST(Handover, ARootThatEndsDuringTheHandoverKeepsItsExitStatus) {
  DaemonOptions o;
  o.env = {"CUSTOS_FAILPOINT=handover_slow"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  TempDir gate{"/var/tmp"};
  auto const release = (gate.path() / "release").native();
  auto ender = start_execution(
      c, {"/bin/sh", "-c", "while [ ! -e " + release + " ]; do sleep 0.02; done; exit 9"}, true);
  ASSERT_GE(ender.pidfd, 0);
  auto const before = host_view(d);
  auto const signalled = std::chrono::steady_clock::now();
  ASSERT_TRUE(d.signal(SIGHUP));
  // Released as the handover begins: the root ends while the old image checks the new one (then
  // the old image records it) or in the failpoint's 2 s before the execve. Either way its exit
  // is a status someone reads, never a zombie the orphan reaper takes.
  { std::ofstream{release}; }
  auto const after = await_new_image(d, before.started_ns);
  ASSERT_TRUE(after.handover.is_object()) << d.log();
  pollfd p{ender.pidfd, POLLIN, 0};
  bool const ended = ::poll(&p, 1, 0) == 1;
  ::close(ender.pidfd);
  if (std::chrono::steady_clock::now() - signalled < 2s) {
    GTEST_SKIP() << "not a failpoint build: the handover did not wait";
  }
  ASSERT_TRUE(ended) << "the root ended during the handover";
  auto c2 = d.client();
  auto const t = wait_terminal(c2, ender.id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t) << d.log();
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 9) << json::serialize(t);
  auto const recovery = t.at("recovery").as_string();
  EXPECT_TRUE(recovery == "live_owned" || recovery == "observed") << json::serialize(t);
  expect_one_terminal_each(c2, {ender.id});
}

// The configuration check of the new image runs beside the loop, not on it: while it runs (1 s
// longer in failpoint builds) the old image still answers every call, and the check's own child
// is not taken by the orphan reaper (the check would then fail with no status).
TEST(Handover, TheOldImageServesWhileTheNewOneIsChecked) {
#ifndef CUSTOS_FAILPOINTS
  GTEST_SKIP() << "needs a failpoint build (handover_slow makes the check last 1 s longer)";
#endif
  DaemonOptions o;
  o.env = {"CUSTOS_FAILPOINT=handover_slow"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  auto const before = host_view(d);
  ASSERT_TRUE(d.signal(SIGHUP));
  auto const deadline = std::chrono::steady_clock::now() + 10s;
  while (d.log().find("its configuration check first") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(d.log().find("its configuration check first"), std::string::npos) << d.log();
  // Three calls during the check's second, each answered by the image being checked against.
  for (int i = 0; i < 3; ++i) {
    auto c = d.client();
    auto const asked = std::chrono::steady_clock::now();
    auto r = c.call(1, "host.info", {}, 5000ms);
    ASSERT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "no reply");
    EXPECT_EQ(r->at("result").at("started_ns").as_int64(), before.started_ns)
        << "answered by the old image, during the check";
    EXPECT_LT(std::chrono::steady_clock::now() - asked, 900ms) << "the loop was not blocked";
    std::this_thread::sleep_for(100ms);
  }
  auto const after = await_new_image(d, before.started_ns);
  ASSERT_TRUE(after.handover.is_object()) << d.log();
  EXPECT_EQ(after.pid, before.pid);
  EXPECT_TRUE(after.refused.is_null()) << json::serialize(after.refused);
}

// The daemon runs from a private copy of the binary; the file at that path is then replaced by
// one that fails the configuration check. The handover is refused, nothing changes, and the
// reason is in host.info; once the path holds a good binary again, the handover goes through.
TEST(Handover, ANewImageThatFailsItsCheckIsNeverStarted) {
  TempDir bin_dir{"/var/tmp"};
  auto const path = bin_dir.path() / "custos";
  fs::copy_file(binary(), path);
  DaemonOptions o;
  o.binary = path.native();
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto sleeper = start_execution(c, {"/bin/sleep", "60"}, true);
  ASSERT_GE(sleeper.pidfd, 0);
  auto const before = host_view(d);

  // An executable that exits 1 whatever it is asked (a binary that cannot run here would do the
  // same), put there as a package upgrade replaces a file: a new inode at the path.
  auto const broken = bin_dir.path() / "broken";
  fs::copy_file("/bin/false", broken);
  fs::rename(broken, path);
  auto r = run_cli({"daemon", "--state-dir", d.state().native(), "--reexec"});
  EXPECT_EQ(r.status, 65) << r.out << r.err;
  EXPECT_NE(r.err.find("refused the configuration (exit 1)"), std::string::npos) << r.err;
  auto const refused = host_view(d);
  EXPECT_EQ(refused.started_ns, before.started_ns) << "the old image serves on";
  ASSERT_TRUE(refused.refused.is_object());
  EXPECT_NE(std::string{refused.refused.at("reason").as_string()}.find("exit 1"), std::string::npos)
      << json::serialize(refused.refused);
  auto g = c.call(2, "exec.get", {{"execution_id", sleeper.id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running");
  EXPECT_FALSE(g->at("result").as_object().contains("source"));

  auto const good = bin_dir.path() / "good";
  fs::copy_file(binary(), good);
  fs::rename(good, path);
  r = run_cli({"daemon", "--state-dir", d.state().native(), "--reexec"});
  EXPECT_EQ(r.status, 0) << r.out << r.err << d.log();
  auto const after = host_view(d);
  EXPECT_NE(after.started_ns, before.started_ns);
  EXPECT_EQ(after.pid, before.pid);

  auto c2 = d.client();
  ASSERT_TRUE(c2.call(3, "exec.cancel", {{"execution_id", sleeper.id}}));
  auto const t = wait_terminal(c2, sleeper.id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("recovery").as_string(), "live_owned") << json::serialize(t);
  ::close(sleeper.pidfd);
  expect_one_terminal_each(c2, {sleeper.id});
}

// Failpoint builds: the handed-over image fails its start (after it adopted the executions).
// The old image is executed again from the descriptor it passed, serves the same socket (still
// never refusing a connect) and adopts the executions itself; host.info says it fell back.
TEST(Handover, ANewImageThatFailsToStartFallsBackToTheOldOne) {
  DaemonOptions o;
  o.env = {"CUSTOS_FAILPOINT=handover_start_fails"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto sleeper = start_execution(c, {"/bin/sleep", "60"}, true);
  ASSERT_GE(sleeper.pidfd, 0);
  auto const before = host_view(d);

  ConnectLoop loop{d.socket()};
  ASSERT_TRUE(d.signal(SIGHUP));
  auto const after = await_new_image(d, before.started_ns);
  loop.stop();
  EXPECT_TRUE(loop.failures().empty())
      << loop.failures().size() << " connects failed, the first with errno "
      << loop.failures().front();
  EXPECT_EQ(after.pid, before.pid);
  ASSERT_TRUE(after.handover.is_object()) << json::serialize(after.handover) << d.log();
  if (!after.handover.at("fallback").as_bool()) {
    GTEST_SKIP() << "not a failpoint build: the new image started";
  }
  EXPECT_NE(std::string{after.handover.at("reason").as_string()}.find("handover_start_fails"),
            std::string::npos)
      << json::serialize(after.handover);

  auto c2 = d.client();
  auto g = c2.call(2, "exec.get", {{"execution_id", sleeper.id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running") << json::serialize(*g);
  EXPECT_FALSE(g->at("result").as_object().contains("source"));
  ASSERT_TRUE(c2.call(3, "exec.cancel", {{"execution_id", sleeper.id}}));
  auto const t = wait_terminal(c2, sleeper.id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  ::close(sleeper.pidfd);
  expect_one_terminal_each(c2, {sleeper.id});
}

}  // namespace
}  // namespace custos::e2e
