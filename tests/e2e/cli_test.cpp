// `custos run` and friends as a user runs them: exit codes, stdin, --pty through tmux, Ctrl-C.
#include <fstream>

#include "harness.hpp"

namespace custos::e2e {
namespace {

class Cli : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.log(); }
  CliResult cli(std::vector<std::string> args, std::string const& input = {}) {
    args.insert(args.begin(), {"--socket", daemon_.socket().native()});
    return run_cli(args, input);
  }
  Daemon daemon_;
};

TEST_F(Cli, EchoHelloStreamsAndExitsZero) {
  auto r = cli({"run", "--", "/bin/echo", "hello"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "hello\n");
  // A bare name is resolved through PATH and keeps argv[0].
  r = cli({"run", "--", "sh", "-c", "echo $0"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "sh\n");
}

TEST_F(Cli, StdoutAndStderrStaySeparate) {
  auto r = cli({"run", "--", "/bin/sh", "-c", "echo to-out; echo to-err >&2"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "to-out\n");
  EXPECT_EQ(r.err, "to-err\n");
}

TEST_F(Cli, ExitCodesPropagate) {
  EXPECT_EQ(cli({"run", "--", "/bin/sh", "-c", "exit 7"}).status, 7);
  EXPECT_EQ(cli({"run", "--", "/bin/sh", "-c", "exit 0"}).status, 0);
  // Killed by a signal: 128 + N.
  EXPECT_EQ(cli({"run", "--", "/bin/sh", "-c", "kill -TERM $$"}).status, 128 + SIGTERM);
  EXPECT_EQ(cli({"run", "--", "/bin/sh", "-c", "kill -KILL $$"}).status, 128 + SIGKILL);
  // Deadline: 124 and the classification says timed_out.
  auto t = cli({"--json", "run", "--timeout", "0.5", "--", "/bin/sleep", "30"});
  EXPECT_EQ(t.status, 124) << t.err;
  EXPECT_NE(t.out.find("\"timed_out\""), std::string::npos) << t.out;
  // An executable that the kernel refuses to exec: spawn failure, 127.
  fs::path const bogus = daemon_.tmp() / "not-a-program";
  {
    std::ofstream f(bogus);
    f << "\x7f"
         "ELF garbage";
  }
  ::chmod(bogus.c_str(), 0755);
  auto s = cli({"--json", "run", "--", bogus.native()});
  EXPECT_EQ(s.status, 127) << s.out << s.err;
  EXPECT_NE(s.out.find("spawn_failed"), std::string::npos) << s.out;
  // Not found in PATH: refused before any request, one line with the stable code.
  auto n = cli({"run", "--", "custos-no-such-program-xyz"});
  EXPECT_EQ(n.status, 65);
  EXPECT_NE(n.err.find("plan.invalid_executable"), std::string::npos) << n.err;
  // No daemon: 75 and rpc.unavailable.
  auto u = run_cli({"--socket", (daemon_.tmp() / "nope.sock").native(), "run", "--", "/bin/true"});
  EXPECT_EQ(u.status, 75);
  EXPECT_NE(u.err.find("rpc.unavailable"), std::string::npos) << u.err;
  // CUSTOS_SOCKET is honoured.
  auto e = run_cli({"run", "--", "/bin/true"}, {}, {"CUSTOS_SOCKET=" + daemon_.socket().native()});
  EXPECT_EQ(e.status, 0) << e.err;
}

TEST_F(Cli, LargeOutputArrivesCompleteAndInOrder) {
  auto r = cli({"run", "--", "/usr/bin/seq", "1", "800000"});
  EXPECT_EQ(r.status, 0) << r.err;
  std::string expect;
  for (int i = 1; i <= 800000; ++i) expect += std::to_string(i) + "\n";
  EXPECT_EQ(r.out.size(), expect.size());
  EXPECT_TRUE(r.out == expect);
}

TEST_F(Cli, StdinIsForwardedWithEof) {
  auto r = cli({"run", "--", "/bin/cat"}, "line one\nline two\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "line one\nline two\n");
  // More than the daemon's in-memory stdin queue: the CLI re-offers what was not accepted.
  std::string big;
  for (int i = 0; big.size() < 700 * 1024; ++i) big += "row " + std::to_string(i) + "\n";
  r = cli({"run", "--", "/bin/sh", "-c", "wc -c"}, big);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(std::stoul(r.out), big.size());
  // Empty stdin is an immediate EOF.
  r = cli({"run", "--", "/bin/cat"}, "");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
}

TEST_F(Cli, EnvCwdAndWorkspace) {
  // The daemon of this test runs with its own value of the inherited name.
  Daemon d{DaemonOptions{{}, true, {"CUSTOS_TEST_INHERIT=from-daemon"}, {}, {}}};
  ASSERT_TRUE(d.ready()) << d.log();
  fs::path const ws = d.tmp() / "ws";
  fs::create_directories(ws / "sub");
  auto r = run_cli(
      {"--socket", d.socket().native(), "run", "--workspace", ws.native(), "--cwd",
       (ws / "sub").native(), "--env", "FOO=bar", "--env", "CUSTOS_TEST_INHERIT", "--", "/bin/sh",
       "-c", "pwd; echo $FOO; echo $CUSTOS_TEST_INHERIT; echo ${NOT_PASSED:-unset}"},
      {}, {"CUSTOS_TEST_INHERIT=from-caller", "NOT_PASSED=x"});
  EXPECT_EQ(r.status, 0) << r.err;
  std::string const head = (ws / "sub").native() + "\nbar\n";
  ASSERT_EQ(r.out.substr(0, head.size()), head) << r.out;
  // An inherited value is the daemon's, never the caller's: authority to inherit a name is not
  // authority to choose its value (docs/authority.md). A name the plan does not mention never
  // reaches the child.
  std::string const rest = r.out.substr(head.size());
  EXPECT_EQ(rest, "from-daemon\nunset\n");
}

TEST_F(Cli, PsShowWaitCancelLogs) {
  auto r = cli({"run", "--", "/bin/sh", "-c", "echo logged-line"});
  ASSERT_EQ(r.status, 0);
  auto ps = cli({"ps"});
  EXPECT_EQ(ps.status, 0);
  EXPECT_NE(ps.out.find("ID"), std::string::npos);
  EXPECT_NE(ps.out.find("/bin/sh"), std::string::npos) << ps.out;
  EXPECT_NE(ps.out.find("exited"), std::string::npos) << ps.out;
  auto js = cli({"--json", "ps"});
  auto v = json::parse(js.out);
  std::string const id{v.at("executions").as_array().at(0).at("execution_id").as_string()};
  auto show = cli({"show", id});
  EXPECT_EQ(show.status, 0);
  EXPECT_NE(show.out.find("\"plan_digest\""), std::string::npos);
  auto logs = cli({"logs", id});
  EXPECT_EQ(logs.status, 0);
  EXPECT_EQ(logs.out, "logged-line\n");
  auto w = cli({"wait", id});
  EXPECT_EQ(w.status, 0);
  EXPECT_NE(w.out.find("\"exited\""), std::string::npos);
  auto missing = cli({"show", "ex-0000000000000000"});
  EXPECT_EQ(missing.status, 65);
  EXPECT_NE(missing.err.find("exec.not_found"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.err.find('\n'), missing.err.size() - 1) << "one line: " << missing.err;

  // cancel + logs -f on a running one.
  auto c = daemon_.client();
  auto st = c.call(1, "exec.start", start_params({"/bin/sh", "-c", "echo before; sleep 30"}));
  ASSERT_TRUE(st && st->contains("result"));
  std::string const live{st->at("result").at("execution_id").as_string()};
  ASSERT_TRUE(wait_record(
      c, live, [](json::object const& o) { return o.at("phase").as_string() == "running"; }));
  std::thread canceller([&] {
    std::this_thread::sleep_for(500ms);
    auto x = cli({"cancel", live});
    EXPECT_EQ(x.status, 0) << x.err;
    EXPECT_NE(x.out.find("cancel accepted"), std::string::npos) << x.out;
  });
  auto f = cli({"logs", "-f", live});
  canceller.join();
  EXPECT_EQ(f.status, 0);
  EXPECT_EQ(f.out, "before\n");
  auto w2 = cli({"wait", live});
  EXPECT_EQ(w2.status, 125);
}

TEST_F(Cli, DoctorWithAndWithoutDaemon) {
  auto r = cli({"doctor"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("source: the daemon"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pidfd"), std::string::npos);
  auto local = run_cli({"--socket", (daemon_.tmp() / "none.sock").native(), "doctor"});
  EXPECT_EQ(local.status, 0) << local.err;
  EXPECT_NE(local.out.find("source: a local probe"), std::string::npos) << local.out;
  EXPECT_NE(local.out.find("clone3_into_cgroup"), std::string::npos);
}

// `custos --json run <args>` in the background; once it printed "started" (the execution runs
// and the CLI streams), `sigints` SIGINTs are sent to it, 300 ms apart. Returns its exit status
// and everything it printed; a CLI still running after 60 s is killed and the status is -1.
struct Interrupted {
  int status = -1;
  std::string out;
};
Interrupted interrupt_run(std::string const& sock, std::vector<std::string> const& args,
                          int sigints) {
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return {};
  std::string const bin = binary();
  std::vector<std::string> full{bin, "--socket", sock, "--json", "run"};
  full.insert(full.end(), args.begin(), args.end());
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  Interrupted r;
  int const pidfd = pidfd_open(pid);
  char buf[4096];
  auto read_until = [&](auto done, std::chrono::steady_clock::time_point deadline) {
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_pipe[0], POLLIN, 0};
      if (::poll(&p, 1, 200) > 0) {
        ssize_t n = ::read(out_pipe[0], buf, sizeof buf);
        if (n <= 0) return true;  // the CLI closed its stdout: it is exiting
        r.out.append(buf, static_cast<std::size_t>(n));
      }
    }
    return done();
  };
  (void)read_until([&] { return r.out.find("started") != std::string::npos; },
                   std::chrono::steady_clock::now() + 20s);
  bool const started = r.out.find("started") != std::string::npos;
  for (int i = 0; started && i < sigints; ++i) {
    if (i > 0) std::this_thread::sleep_for(300ms);
    ::syscall(SYS_pidfd_send_signal, pidfd, SIGINT, nullptr, 0);
  }
  // Read to the end of its output (true at EOF), then it exits; past 60 s it is killed.
  bool const eof = read_until([] { return false; }, std::chrono::steady_clock::now() + 60s);
  pollfd p{pidfd, POLLIN, 0};
  bool const exited = eof && ::poll(&p, 1, 10000) > 0;
  if (!exited) ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(pidfd);
  ::close(out_pipe[0]);
  r.status = exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Ctrl-C (SIGINT to the CLI) cancels the execution; the CLI exits 125.
TEST_F(Cli, CtrlCCancels) {
  auto r = interrupt_run(daemon_.socket().native(),
                         {"--", "/bin/sh", "-c", "echo started; exec sleep 60"}, 1);
  EXPECT_EQ(r.status, 125) << r.out;
  EXPECT_NE(r.out.find("\"cancelled\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"user\""), std::string::npos) << r.out;
}

// A second Ctrl-C kills at once: the program ignores the graceful signal and the grace is ten
// minutes, yet the run ends cancelled, the kill in its escalation.
TEST_F(Cli, SecondCtrlCKillsNow) {
  auto r = interrupt_run(
      daemon_.socket().native(),
      {"--grace", "600", "--", "/bin/sh", "-c", "trap '' TERM; echo started; sleep 600 & wait"}, 2);
  EXPECT_EQ(r.status, 125) << r.out;
  EXPECT_NE(r.out.find("\"cancelled\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"forced\":true"), std::string::npos) << r.out;
}

// A tmux server of a test's own (`tmux -L session`), killed when this goes.
class Tmux {
 public:
  explicit Tmux(std::string session) : session_(std::move(session)) {}
  Tmux(Tmux const&) = delete;
  Tmux& operator=(Tmux const&) = delete;
  ~Tmux() { (void)run("kill-server"); }
  int run(std::string const& args) const {
    return ::system(("tmux -L " + session_ + " " + args + " >/dev/null 2>&1").c_str());
  }
  // The session's window as it shows now.
  [[nodiscard]] std::string capture() const {
    std::string out;
    FILE* p = ::popen(("tmux -L " + session_ + " capture-pane -p -t " + session_).c_str(), "r");
    if (p == nullptr) return out;
    char buf[4096];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }
  // Whether `needle` shows within `tries` looks 50 ms apart.
  [[nodiscard]] bool wait_for(std::string const& needle, int tries) const {
    for (int i = 0; i < tries; ++i) {
      if (capture().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

 private:
  std::string session_;
};

// --pty through a real terminal (tmux): raw mode, window size, resize, exit code, restore.
TEST_F(Cli, PtyThroughTmux) {
  if (::system("command -v tmux >/dev/null 2>&1") != 0) GTEST_SKIP() << "tmux not installed";
  std::string const session = "custos-e2e-" + unique_suffix();
  fs::path const rc_file = daemon_.tmp() / "rc";
  fs::path const stty_file = daemon_.tmp() / "stty";
  fs::path const script = daemon_.tmp() / "pty.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n"
      << "'" << binary() << "' --socket '" << daemon_.socket().native()
      << "' run --pty -- /bin/sh\n"
      << "echo $? > '" << rc_file.native() << "'\n"
      << "stty -a > '" << stty_file.native() << "'\n"
      << "sleep 30\n";
  }
  ::chmod(script.c_str(), 0755);
  Tmux tmux{session};
  ASSERT_EQ(tmux.run("new-session -d -x 100 -y 30 -s " + session + " " + script.native()), 0);
  tmux.run("send-keys -t " + session + " 'tty; stty size; echo mark-$((40+2))' Enter");
  ASSERT_TRUE(tmux.wait_for("mark-42", 200)) << tmux.capture();
  std::string screen = tmux.capture();
  EXPECT_NE(screen.find("/dev/pts/"), std::string::npos) << screen;
  EXPECT_NE(screen.find("30 100"), std::string::npos) << screen;
  // SIGWINCH on our side becomes exec.resize.
  tmux.run("resize-window -t " + session + " -x 120 -y 40");
  std::this_thread::sleep_for(500ms);
  tmux.run("send-keys -t " + session + " 'stty size; echo mark-$((50+3))' Enter");
  ASSERT_TRUE(tmux.wait_for("mark-53", 200)) << tmux.capture();
  EXPECT_NE(tmux.capture().find("40 120"), std::string::npos) << tmux.capture();
  tmux.run("send-keys -t " + session + " 'exit 5' Enter");
  for (int i = 0; i < 200 && !fs::exists(stty_file); ++i) std::this_thread::sleep_for(50ms);
  std::this_thread::sleep_for(100ms);
  std::ifstream rc(rc_file);
  int code = -1;
  rc >> code;
  EXPECT_EQ(code, 5);
  std::ifstream st(stty_file);
  std::stringstream ss;
  ss << st.rdbuf();
  // The local terminal is back in cooked mode.
  EXPECT_NE(ss.str().find(" icanon"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find(" echo"), std::string::npos) << ss.str();
}

// --progress on a real terminal (tmux): the status line shows elapsed time, bytes out and the
// tree's processes while the run goes on, and is gone once it ended.
TEST_F(Cli, ProgressLineOnATerminal) {
  if (::system("command -v tmux >/dev/null 2>&1") != 0) GTEST_SKIP() << "tmux not installed";
  std::string const session = "custos-e2e-" + unique_suffix();
  fs::path const script = daemon_.tmp() / "progress.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n"
      << "'" << binary() << "' --socket '" << daemon_.socket().native()
      << "' run --progress -- /bin/sh -c 'echo first; sleep 5; echo second'\n"
      << "echo rc=$?\n"
      << "sleep 30\n";
  }
  ::chmod(script.c_str(), 0755);
  Tmux tmux{session};
  ASSERT_EQ(tmux.run("new-session -d -x 100 -y 30 -s " + session + " " + script.native()), 0);
  ASSERT_TRUE(tmux.wait_for("first", 400)) << tmux.capture();
  // The sampler's reading arrives within a second or two of the start.
  ASSERT_TRUE(tmux.wait_for("processes 2", 80)) << tmux.capture();
  std::string const live = tmux.capture();
  EXPECT_NE(live.find("[custos] "), std::string::npos) << live;
  EXPECT_NE(live.find("out 6 B"), std::string::npos) << live;  // "first\n"
  ASSERT_TRUE(tmux.wait_for("rc=0", 400)) << tmux.capture();
  std::string const done = tmux.capture();
  EXPECT_NE(done.find("second"), std::string::npos) << done;
  EXPECT_EQ(done.find("[custos]"), std::string::npos) << done;  // erased at the end
}

}  // namespace
}  // namespace custos::e2e
