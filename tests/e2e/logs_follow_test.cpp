// `custos logs -f` follows the execution's events (exec.subscribe), not its spool files: with the
// spool switched off (output.spool_bytes = 0) a spool poller would print nothing, the follower
// prints every line, each on its own stream, and returns when the execution is terminal.
#include <chrono>

#include "harness.hpp"

namespace custos::e2e {
namespace {

class LogsFollow : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.log(); }
  CliResult cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", daemon_.socket().native()});
    return run_cli(args, {}, {}, 30s);
  }
  std::string start(std::string const& script, bool spool) {
    auto params = start_params({"/bin/sh", "-c", script});
    if (!spool) params["plan"].as_object()["output"] = json::object{{"spool_bytes", 0}};
    auto c = daemon_.client();
    auto r = c.call(1, "exec.start", std::move(params));
    if (!r || !r->contains("result")) return {};
    return std::string{r->at("result").at("execution_id").as_string()};
  }
  Daemon daemon_;
};

TEST_F(LogsFollow, PrintsLiveEventsOfARunningExecutionWithoutASpool) {
  auto const id = start("echo one; sleep 0.4; echo two >&2; sleep 0.4; echo three", false);
  ASSERT_FALSE(id.empty());
  auto const t0 = std::chrono::steady_clock::now();
  auto f = cli({"logs", "-f", id});
  auto const took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(f.out, "one\nthree\n");
  EXPECT_EQ(f.err, "two\n");
  // It returned because the execution ended, not because of a timeout of its own.
  EXPECT_LT(took, 10s);
  auto c = daemon_.client();
  auto rec = c.call(2, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(rec && rec->contains("result"));
  EXPECT_EQ(rec->at("result").at("phase").as_string(), "terminal");
  // Without -f nothing can be read back: there is no spool (what a poller would have seen).
  auto once = cli({"logs", id});
  EXPECT_EQ(once.status, 0) << once.err;
  EXPECT_EQ(once.out, "");
}

TEST_F(LogsFollow, AFinishedExecutionIsReplayedFromSeqOne) {
  auto const id = start("echo early; echo late >&2", false);
  ASSERT_FALSE(id.empty());
  auto c = daemon_.client();
  ASSERT_TRUE(c.call(2, "exec.wait", {{"execution_id", id}}));
  auto f = cli({"logs", "-f", id});
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(f.out, "early\n");
  EXPECT_EQ(f.err, "late\n");
}

TEST_F(LogsFollow, SpooledOutputIsPrintedOnceInOrder) {
  // With a spool, the events and the spool overlap; every byte still comes out exactly once.
  auto const id = start("for i in 1 2 3 4 5; do echo line$i; sleep 0.1; done", true);
  ASSERT_FALSE(id.empty());
  auto f = cli({"logs", "-f", id});
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(f.out, "line1\nline2\nline3\nline4\nline5\n");
}

TEST_F(LogsFollow, UnknownExecutionIsOneClearError) {
  auto f = cli({"logs", "-f", "ex-0000000000000000"});
  EXPECT_EQ(f.status, 65);
  EXPECT_NE(f.err.find("exec.not_found"), std::string::npos) << f.err;
}

}  // namespace
}  // namespace custos::e2e
