// systemd integration without systemd: a datagram socket stands in for NOTIFY_SOCKET, and a
// listening socket passed as fd 3 with LISTEN_FDS/LISTEN_PID is what socket activation looks like.
// Also the connection and subscription limits.
#include <fstream>
#include <sstream>
#include <sys/socket.h>

#include "harness.hpp"

namespace custos::e2e {
namespace {

std::vector<std::string> read_notifications(int fd, std::chrono::milliseconds timeout,
                                            std::string const& until) {
  std::vector<std::string> out;
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) continue;
    out.emplace_back(buf, static_cast<std::size_t>(n));
    if (out.back().find(until) != std::string::npos) break;
  }
  return out;
}

bool contains(std::vector<std::string> const& v, std::string const& needle) {
  for (auto const& s : v) {
    if (s.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(Systemd, NotifiesReadyStatusAndStopping) {
  TempDir dir;
  fs::path const notify = dir.path() / "notify";
  int nfd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(nfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  pid_t pid = Daemon::spawn(
      {binary(), "daemon", "--state-dir", (dir.path() / "st").native(), "--boundary", "marker",
       "--log-file", (dir.path() / "log").native(), "--no-socket-activation"},
      {"NOTIFY_SOCKET=" + notify.native()});
  int pidfd = pidfd_open(pid);
  auto msgs = read_notifications(nfd, 20s, "READY=1");
  EXPECT_TRUE(contains(msgs, "READY=1"));
  EXPECT_TRUE(contains(msgs, "STATUS=serving on " + (dir.path() / "st" / "custos.sock").native()));
  EXPECT_TRUE(contains(msgs, "MAINPID=" + std::to_string(pid)));
  ::syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0);
  msgs = read_notifications(nfd, 20s, "STOPPING=1");
  EXPECT_TRUE(contains(msgs, "STOPPING=1"));
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ::close(pidfd);
  ::close(nfd);
}

TEST(Systemd, ServesAnActivatedSocket) {
  TempDir dir;
  fs::path const sock = dir.path() / "activated.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM, 0);  // inherited across exec on purpose (fd 3)
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  // A client may connect before the daemon even runs: the kernel queues it.
  LineClient early{sock};
  ASSERT_TRUE(early.connected());
  std::string const bin = binary();
  std::string const state = (dir.path() / "st").native();
  std::string const log = (dir.path() / "log").native();
  pid_t pid = ::fork();
  if (pid == 0) {
    if (lfd != 3) {
      ::dup2(lfd, 3);
      ::close(lfd);
    }
    std::string const lp = "LISTEN_PID=" + std::to_string(::getpid());
    ::putenv(const_cast<char*>(lp.c_str()));
    ::putenv(const_cast<char*>("LISTEN_FDS=1"));
    int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 0);
    ::execl(bin.c_str(), bin.c_str(), "daemon", "--state-dir", state.c_str(), "--boundary",
            "marker", "--log-file", log.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(lfd);
  int pidfd = pidfd_open(pid);
  auto r = early.call(1, "host.info", {}, 20000ms);
  ASSERT_TRUE(r && r->contains("result"));
  EXPECT_FALSE(fs::exists(state + "/custos.sock")) << "an activated daemon binds nothing itself";
  ::syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(pidfd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The socket belongs to systemd (here: the test): the daemon does not unlink it.
  EXPECT_TRUE(fs::exists(sock));
}

// The shipped units parse and reference an existing binary (systemd-analyze needs no running
// systemd for this).
TEST(Packaging, UnitsVerify) {
  if (::system("command -v systemd-analyze >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "systemd-analyze not installed";
  }
  TempDir dir;
  for (char const* unit : {"custos.service", "custos.socket"}) {
    std::ifstream in(std::string{CUSTOS_SOURCE_DIR} + "/packaging/" + unit);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    // Every command line names the binary (ExecStart=, ExecReload=).
    for (auto at = text.find("/usr/bin/custos"); at != std::string::npos;
         at = text.find("/usr/bin/custos", at + binary().size())) {
      text.replace(at, 15, binary());
    }
    std::ofstream out(dir.path() / unit);
    out << text;
  }
  std::string const cmd = "SYSTEMD_LOG_LEVEL=warning systemd-analyze verify '" +
                          (dir.path() / "custos.socket").native() + "' '" +
                          (dir.path() / "custos.service").native() + "' 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int const rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << out;
}

TEST(Limits, ConnectionsBeyondTheLimitAreRefused) {
  DaemonOptions o;
  o.extra_args = {"--max-connections", "3"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  std::this_thread::sleep_for(100ms);  // the readiness probe's connection is gone by now
  std::vector<LineClient> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(d.client());
    auto r = held.back().call(i, "host.info");
    ASSERT_TRUE(r && r->contains("result"));
  }
  auto extra = d.client();
  auto v = extra.read_json(5000ms);
  ASSERT_TRUE(v);
  EXPECT_EQ(error_code_of(v->as_object()), "rpc.overloaded");
  EXPECT_TRUE(extra.closed_by_peer());
  held.pop_back();
  std::this_thread::sleep_for(200ms);
  auto again = d.client();
  auto r = again.call(9, "host.info");
  ASSERT_TRUE(r && r->contains("result")) << "a freed slot is usable again";
}

TEST(Limits, SubscriptionsPerConnection) {
  DaemonOptions o;
  o.extra_args = {"--max-subscriptions", "2"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto s = c.call(1, "exec.start", start_params({"/bin/sleep", "30"}));
  ASSERT_TRUE(s && s->contains("result"));
  std::string const id{s->at("result").at("execution_id").as_string()};
  auto a = c.call(2, "exec.subscribe", {{"execution_id", id}});
  auto b = c.call(3, "exec.subscribe", {{"execution_id", id}});
  auto x = c.call(4, "exec.subscribe", {{"execution_id", id}});
  ASSERT_TRUE(a && b && x);
  EXPECT_TRUE(a->contains("result"));
  EXPECT_TRUE(b->contains("result"));
  EXPECT_EQ(error_code_of(*x), "rpc.subscription_limit");
  auto u = c.call(5, "exec.unsubscribe", {{"subscription", a->at("result").at("subscription")}});
  ASSERT_TRUE(u && u->contains("result"));
  auto y = c.call(6, "exec.subscribe", {{"execution_id", id}});
  ASSERT_TRUE(y && y->contains("result"));
  // Another connection cannot remove this connection's subscription.
  auto other = d.client();
  auto z =
      other.call(1, "exec.unsubscribe", {{"subscription", b->at("result").at("subscription")}});
  ASSERT_TRUE(z);
  EXPECT_EQ(error_code_of(*z), "rpc.subscription_not_found");
  (void)c.call(7, "exec.cancel", {{"execution_id", id}});
  auto w = c.call(8, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}});
  ASSERT_TRUE(w && w->contains("result"));
}

}  // namespace
}  // namespace custos::e2e
