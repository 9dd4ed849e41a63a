// The daemon process: socket safety, authorization by kernel credentials, signals.
#include <grp.h>
#include <pwd.h>
#include <sys/prctl.h>

#include "harness.hpp"

namespace custos::e2e {
namespace {

TEST(DaemonAuth, OtherUidMayOnlyCallHostInfo) {
  DaemonOptions o;
  o.extra_args = {"--socket-mode", "0666"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  // The state dir is 0700: let the other user traverse to the socket (the mode is 0666).
  ::chmod(d.tmp().c_str(), 0755);
  ::chmod(d.state().c_str(), 0711);
  fs::path const sock = d.socket();
  int const rc = as_user(nobody_uid(), 65534, {}, [&] {
    LineClient c{sock};
    if (!c.connected()) return 10;
    auto info = c.call(1, "host.info");
    if (!info || !info->contains("result")) return 11;
    // exec.list is open to everyone but shows a non-admin only its own executions (none).
    auto own = c.call(4, "exec.list");
    if (!own || !own->contains("result") ||
        !own->at("result").at("executions").as_array().empty()) {
      return 17;
    }
    auto denied = c.call(2, "holder.quiescence", {{"session_id", "s1"}, {"generation", 1}});
    if (!denied) return 12;
    if (error_code_of(*denied) != "auth.denied") return 13;
    if (error_number_of(*denied) != -32006) return 14;
    auto const& data = denied->at("error").at("data").as_object();
    if (data.at("recovery").as_string() != "caller_correction") return 15;
    // Launching is never open to an arbitrary local user (with the gateway: not without a
    // grant naming them).
    auto start = c.call(3, "exec.start", start_params({"/bin/true"}));
    if (!start || start->contains("result")) return 16;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  // Root (the daemon's own uid here) may call it.
  auto c = d.client();
  auto r = c.call(1, "exec.list");
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->contains("result")) << json::serialize(*r);
}

TEST(DaemonAuth, AdminGroupMembersMayCallEverything) {
  gid_t const admin_gid = 4242;
  DaemonOptions o;
  o.extra_args = {"--socket-mode", "0666", "--admin-group", std::to_string(admin_gid)};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  ::chmod(d.tmp().c_str(), 0755);
  ::chmod(d.state().c_str(), 0711);
  fs::path const sock = d.socket();
  auto probe = [&] {
    LineClient c{sock};
    if (!c.connected()) return 10;
    // An admin-only question (a quiescence scan for any holder).
    auto r = c.call(1, "holder.quiescence", {{"session_id", "s1"}, {"generation", 1}});
    if (!r) return 11;
    if (r->contains("result")) return 0;
    return error_code_of(*r) == "auth.denied" ? 20 : 12;
  };
  // Supplementary membership counts, read from the caller's /proc at accept time.
  EXPECT_EQ(as_user(nobody_uid(), 65534, {admin_gid}, probe), 0);
  // Primary group counts too.
  EXPECT_EQ(as_user(nobody_uid(), admin_gid, {}, probe), 0);
  // Without it: denied.
  EXPECT_EQ(as_user(nobody_uid(), 65534, {}, probe), 20);
}

TEST(DaemonSocket, LiveSocketIsNeverTakenOver) {
  Daemon first;
  ASSERT_TRUE(first.ready()) << first.log();
  // Same socket, different state dir: the socket lock refuses the second daemon.
  TempDir other;
  auto r = run_cli(
      {"daemon", "--state-dir", (other.path() / "s").native(), "--socket", first.socket().native(),
       "--boundary", "marker", "--log-target", "console", "--no-socket-activation"},
      {}, {}, 20s);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("rpc.unavailable"), std::string::npos) << r.err;
  // Same state dir: the state lock refuses.
  r = run_cli({"daemon", "--state-dir", first.state().native(), "--boundary", "marker",
               "--log-target", "console", "--no-socket-activation"},
              {}, {}, 20s);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("registry.locked"), std::string::npos) << r.err;
  // And the first one still answers.
  auto c = first.client();
  auto info = c.call(1, "host.info");
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->contains("result"));
}

TEST(DaemonSocket, StaleSocketIsReplacedAndForeignFileKept) {
  TempDir dir;
  fs::path const state = dir.path() / "state";
  fs::create_directories(state);
  fs::path const sock = state / "custos.sock";
  {
    // A socket nobody listens on any more (bound, then closed).
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
  }
  ASSERT_TRUE(fs::is_socket(sock));
  pid_t pid =
      Daemon::spawn({binary(), "daemon", "--state-dir", state.native(), "--boundary", "marker",
                     "--log-file", (dir.path() / "log").native(), "--no-socket-activation"});
  int pidfd = pidfd_open(pid);
  bool served = false;
  for (int i = 0; i < 200 && !served; ++i) {
    LineClient c{sock};
    if (c.connected()) {
      auto r = c.call(1, "host.info");
      served = r && r->contains("result");
    }
    if (!served) std::this_thread::sleep_for(25ms);
  }
  EXPECT_TRUE(served);
  ::syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(pidfd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(fs::exists(sock)) << "a clean stop removes its socket";

  // A regular file where the socket should be is not ours to delete.
  {
    std::ofstream f(sock);
    f << "precious";
  }
  auto r = run_cli({"daemon", "--state-dir", state.native(), "--boundary", "marker", "--log-target",
                    "console", "--no-socket-activation"},
                   {}, {}, 20s);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not a socket"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_regular_file(sock));
}

TEST(DaemonSocket, SocketModeIs0660ByDefault) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  struct stat st {};
  ASSERT_EQ(::stat(d.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660U);
}

TEST(DaemonSignals, SigtermStopsCleanlyAndRemovesOwnSubtree) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  if (!d.cgroup().empty()) {
    EXPECT_TRUE(fs::exists(d.cgroup()));
  }
  ASSERT_TRUE(d.signal(SIGTERM));
  auto st = d.wait_exit(20s);
  ASSERT_TRUE(st);
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << *st;
  EXPECT_FALSE(fs::exists(d.socket()));
  if (!d.cgroup().empty()) {
    EXPECT_FALSE(fs::exists(d.cgroup())) << d.log();
  }
}

// SIGUSR1 reopens the log (logrotate's postrotate); SIGHUP is the handover (handover_test.cpp).
TEST(DaemonSignals, Sigusr1KeepsServingAndReopensTheLog) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto const started = [&] {
    auto c = d.client();
    auto r = c.call(1, "host.info");
    return r && r->contains("result") ? r->at("result").at("started_ns").as_int64() : 0;
  };
  auto const before = started();
  fs::path const log = d.tmp() / "daemon.log";
  fs::rename(log, d.tmp() / "daemon.log.1");  // what logrotate does
  ASSERT_TRUE(d.signal(SIGUSR1));
  for (int i = 0; i < 100 && !fs::exists(log); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(fs::exists(log)) << "SIGUSR1 reopened the log file at its configured path";
  EXPECT_EQ(started(), before) << "the same image serves on: no handover";
}

TEST(DaemonConfig, ConfigFileKeysApply) {
  TempDir dir;
  fs::path const state = dir.path() / "st";
  fs::path const sock = dir.path() / "other.sock";
  fs::path const conf = dir.path() / "custos.toml";
  {
    std::ofstream f(conf);
    f << "[daemon]\nstate-dir = \"" << state.native() << "\"\nsocket = \"" << sock.native()
      << "\"\nboundary = \"marker\"\nmax-line-bytes = 2048\nlog-file = \""
      << (dir.path() / "log").native() << "\"\nno-socket-activation = true\n";
  }
  pid_t pid = Daemon::spawn({binary(), "daemon", "--config", conf.native()});
  int pidfd = pidfd_open(pid);
  bool served = false;
  std::optional<json::object> big;
  for (int i = 0; i < 200 && !served; ++i) {
    LineClient c{sock};
    if (c.connected()) {
      auto r = c.call(1, "host.info");
      served = r && r->contains("result");
      if (served) {
        EXPECT_EQ(r->at("result").at("default_boundary").as_string(), "marker");
        std::string line = R"({"jsonrpc":"2.0","method":"host.info","params":{"p":")" +
                           std::string(3000, 'z') + R"("},"id":2})";
        c.send_line(line);
        auto v = c.read_json();
        if (v) big = v->as_object();
      }
    }
    if (!served) std::this_thread::sleep_for(25ms);
  }
  EXPECT_TRUE(served);
  ASSERT_TRUE(big);
  EXPECT_EQ(error_code_of(*big), "rpc.line_too_long");
  EXPECT_TRUE(fs::exists(state / "custos.lock"));
  ::syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(pidfd);
}

}  // namespace
}  // namespace custos::e2e
