// The CLI across a daemon handover (docs/cli.md, "Reconnecting"): SIGHUP makes the daemon
// re-execute itself and close every client connection; `custos run`, `custos logs -f` and
// `custos wait` connect again, resume the execution's events from the seq after the last one
// they saw, and report the terminal result exactly once, with the right exit code.
//
// The handover keeps a native execution's pipes (docs/operations.md, "Handover"): no line printed
// after the reconnect repeats one printed before, and none is lost
// (GaplessOutputAcrossAHandover).
#include <cstdlib>
#include <map>
#include <string>

#include "harness.hpp"

namespace custos::e2e {
namespace {

constexpr char const* kLines = "for i in $(seq 1 30); do echo line $i; sleep 0.1; done";

// Sends SIGHUP to the daemon after `delay`, from its own thread (the test's thread is blocked in
// the CLI it runs meanwhile).
class HangUpLater {
 public:
  HangUpLater(Daemon& d, std::chrono::milliseconds delay)
      : thread_([&d, delay, this] {
          std::this_thread::sleep_for(delay);
          sent_ = d.signal(SIGHUP);
        }) {}
  HangUpLater(HangUpLater const&) = delete;
  HangUpLater& operator=(HangUpLater const&) = delete;
  ~HangUpLater() { join(); }
  bool join() {
    if (thread_.joinable()) thread_.join();
    return sent_;
  }

 private:
  std::atomic<bool> sent_{false};
  std::thread thread_;
};

// "line N" lines of `out` and how often each came; any other line is counted under "".
std::map<std::string, int> line_counts(std::string const& out) {
  std::map<std::string, int> counts;
  std::size_t pos = 0;
  while (pos < out.size()) {
    auto nl = out.find('\n', pos);
    if (nl == std::string::npos) nl = out.size();
    std::string line = out.substr(pos, nl - pos);
    ++counts[line.starts_with("line ") ? line : std::string{}];
    pos = nl + 1;
  }
  return counts;
}

std::size_t count_of(std::string const& s, std::string const& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

class Reconnect : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.log(); }

  CliResult cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", daemon_.socket().native()});
    return run_cli(args, {}, {}, 25s);
  }

  // `custos run --json` of kLines with a SIGHUP to the daemon 1.2 s into it.
  CliResult run_across_handover() {
    HangUpLater hup{daemon_, 1200ms};
    auto r = cli({"--json", "run", "--workspace", "/tmp", "--cwd", "/tmp", "--read-only", "--",
                  "/bin/sh", "-c", kLines});
    EXPECT_TRUE(hup.join());
    expect_handed_over();
    return r;
  }

  void expect_handed_over() {
    for (int i = 0; i < 200; ++i) {
      auto c = daemon_.client();
      auto r = c.call(1, "host.info", {}, 2000ms);
      if (r && r->contains("result") && r->at("result").at("handover").is_object()) {
        EXPECT_EQ(r->at("result").at("handover").at("count").as_int64(), 1);
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "the daemon did not hand over\n" << daemon_.log();
  }

  Daemon daemon_;
};

TEST_F(Reconnect, RunReportsItsResultOnceAcrossAHandover) {
  auto const t0 = std::chrono::steady_clock::now();
  auto r = run_across_handover();
  auto const took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.status, 0) << r.out << r.err << daemon_.log();
  // --json prints the terminal result after the output: once.
  EXPECT_EQ(count_of(r.out, "\"classification\""), 1U) << r.out;
  EXPECT_NE(r.out.find("\"classification\":\"exited\""), std::string::npos) << r.out;
  // The run was under way at the handover: it printed before, and lasted past it.
  EXPECT_NE(r.out.find("line 1\n"), std::string::npos) << r.out;
  EXPECT_GT(took, 1200ms);
  for (auto const& [line, n] : line_counts(r.out)) {
    if (!line.empty()) {
      EXPECT_EQ(n, 1) << line << " printed " << n << " times\n" << r.out;
    }
  }
}

TEST_F(Reconnect, GaplessOutputAcrossAHandover) {
  auto r = run_across_handover();
  EXPECT_EQ(r.status, 0) << r.err;
  std::string expected;
  for (int i = 1; i <= 30; ++i) expected += "line " + std::to_string(i) + "\n";
  EXPECT_EQ(r.out.substr(0, r.out.find('{')), expected) << r.err;
}

TEST_F(Reconnect, LogsFollowEndsOnceAcrossAHandover) {
  auto params = start_params({"/bin/sh", "-c", kLines});
  auto c = daemon_.client();
  auto s = c.call(1, "exec.start", std::move(params));
  ASSERT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "no reply");
  std::string const id{s->at("result").at("execution_id").as_string()};
  HangUpLater hup{daemon_, 1200ms};
  auto const t0 = std::chrono::steady_clock::now();
  auto f = cli({"logs", "-f", id});
  auto const took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(hup.join());
  expect_handed_over();
  EXPECT_EQ(f.status, 0) << f.out << f.err << daemon_.log();
  EXPECT_GT(took, 1200ms) << "it followed across the handover";
  EXPECT_NE(f.out.find("line 1\n"), std::string::npos) << f.out;
  for (auto const& [line, n] : line_counts(f.out)) {
    EXPECT_FALSE(line.empty()) << f.out;
    EXPECT_EQ(n, 1) << line << " printed " << n << " times\n" << f.out;
  }
  // It returned at the execution's end.
  auto c2 = daemon_.client();
  auto rec = c2.call(2, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(rec && rec->contains("result"));
  EXPECT_EQ(rec->at("result").at("phase").as_string(), "terminal");
}

TEST_F(Reconnect, WaitAnswersAcrossAHandover) {
  auto params = start_params({"/bin/sh", "-c", "sleep 2; exit 3"});
  auto c = daemon_.client();
  auto s = c.call(1, "exec.start", std::move(params));
  ASSERT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "no reply");
  std::string const id{s->at("result").at("execution_id").as_string()};
  HangUpLater hup{daemon_, 700ms};
  auto w = cli({"--json", "wait", id});
  EXPECT_TRUE(hup.join());
  expect_handed_over();
  EXPECT_EQ(w.status, 3) << w.out << w.err << daemon_.log();
  EXPECT_EQ(count_of(w.out, "\"classification\""), 1U) << w.out;
}

}  // namespace
}  // namespace custos::e2e
