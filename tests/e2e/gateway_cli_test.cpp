// custos grant / lease / quiescence and `custos run --grant --lease --session` against the real
// daemon, as an admin runs them on a single-user machine.
#include "harness.hpp"

namespace custos::e2e {
namespace {

class GatewayCli : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.log(); }
  CliResult cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", daemon_.socket().native()});
    return run_cli(args);
  }
  Daemon daemon_;
};

TEST_F(GatewayCli, GrantLeaseQuiescenceAndRunUnderThem) {
  std::string const me = "uid:" + std::to_string(::geteuid());
  auto add = cli({"grant",
                  "add",
                  "--id",
                  "g-cli",
                  "--principal",
                  me,
                  "--exe-prefix",
                  "/bin",
                  "--exe-prefix",
                  "/usr/bin",
                  "--workspace",
                  "wcli=/tmp:writable",
                  "--environment-id",
                  "cli",
                  "--resource-id",
                  "cli",
                  "--inherit",
                  "PATH",
                  "--budget-executions",
                  "2"});
  ASSERT_EQ(add.status, 0) << add.err;
  auto list = cli({"grant", "list"});
  EXPECT_EQ(list.status, 0) << list.err;
  EXPECT_NE(list.out.find("g-cli"), std::string::npos) << list.out;
  auto show = cli({"--json", "grant", "show", "g-cli"});
  EXPECT_EQ(show.status, 0) << show.err;
  EXPECT_NE(show.out.find(me), std::string::npos) << show.out;

  // Writable under the grant needs the lease; with it, the run goes through.
  auto nolease = cli({"run", "--grant", "g-cli", "--workspace", "/tmp", "--cwd", "/tmp",
                      "--workspace-id", "wcli", "--clean-env", "--env", "PATH", "--", "/bin/true"});
  EXPECT_EQ(nolease.status, 65) << nolease.err;
  EXPECT_NE(nolease.err.find("auth.lease_required"), std::string::npos) << nolease.err;
  auto lease = cli({"--json", "lease", "acquire", "wcli", "--session", "s-cli"});
  ASSERT_EQ(lease.status, 0) << lease.err;
  auto lv = json::parse(lease.out);
  std::string const lease_id{lv.at("lease_id").as_string()};
  auto run = cli({"run",   "--grant",     "g-cli", "--lease", lease_id, "--session",
                  "s-cli", "--workspace", "/tmp",  "--cwd",   "/tmp",   "--workspace-id",
                  "wcli",  "--clean-env", "--env", "PATH",    "--",     "/bin/sh",
                  "-c",    "exit 7"});
  EXPECT_EQ(run.status, 7) << run.err;
  auto leases = cli({"lease", "list"});
  EXPECT_NE(leases.out.find("s-cli"), std::string::npos) << leases.out;

  auto q = cli({"quiescence", "s-cli", "--generation", "0"});
  EXPECT_EQ(q.status, 0) << q.out << q.err;
  EXPECT_NE(q.out.find("quiescent"), std::string::npos) << q.out;

  auto rel = cli({"lease", "release", lease_id});
  EXPECT_EQ(rel.status, 0) << rel.err;
  auto revoke = cli({"grant", "revoke", "g-cli"});
  EXPECT_EQ(revoke.status, 0) << revoke.err;
  auto again = cli({"grant", "revoke", "g-cli"});
  EXPECT_EQ(again.status, 65) << again.err;
  EXPECT_NE(again.err.find("auth.unknown_grant"), std::string::npos) << again.err;
  auto after = cli({"run", "--grant", "g-cli", "--workspace", "/tmp", "--cwd", "/tmp",
                    "--workspace-id", "wcli", "--read-only", "--clean-env", "--", "/bin/true"});
  EXPECT_EQ(after.status, 65) << after.err;
}

TEST_F(GatewayCli, SingleUserRunNeedsNoGrant) {
  // The admin's implicit authority: a fresh install runs without any grant or lease.
  auto run = cli({"run", "--", "/bin/sh", "-c", "exit 3"});
  EXPECT_EQ(run.status, 3) << run.err;
}

}  // namespace
}  // namespace custos::e2e
