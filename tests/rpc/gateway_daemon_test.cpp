// The gateway's visibility and revoke/start race through the real daemon over its real socket:
// two non-root uids see only their own executions, and a revoke racing a start on two truly
// concurrent connections never leaves a launch running under revoked authority.
#include <algorithm>
#include <barrier>
#include <grp.h>
#include <iostream>
#include <random>
#include <thread>

#include "e2e/harness.hpp"

namespace custos::e2e {
namespace {

class DaemonGateway : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as other uids";
    ::chmod(daemon_.tmp().c_str(), 0755);
    ::chmod(daemon_.state().c_str(), 0711);
  }

  static json::object with_grant(json::object params, std::string const& grant,
                                 std::uint64_t epoch) {
    params["authority"] =
        json::object{{"epoch", epoch}, {"grant_id", grant}, {"lease_id", nullptr}};
    return params;
  }

  json::object result_of(std::optional<json::object> const& r) {
    EXPECT_TRUE(r.has_value());
    if (!r) return {};
    EXPECT_TRUE(r->contains("result")) << json::serialize(*r);
    return r->contains("result") ? r->at("result").as_object() : json::object{};
  }

  Daemon daemon_{DaemonOptions{
      {"--socket-mode", "0666"}, true, {"ASAN_OPTIONS=quarantine_size_mb=8"}, {}, {}}};
  std::int64_t next_id_ = 1;
};

// exec.list for a non-admin is its own executions; every read or control of another uid's
// execution is auth.denied (the answer an unknown id gets too); admins see both.
TEST_F(DaemonGateway, TwoNonRootRunnersSeeOnlyTheirOwnExecutions) {
  auto admin = daemon_.client();
  constexpr uid_t kA = 4201;
  constexpr uid_t kB = 4202;
  ASSERT_TRUE(result_of(admin.call(next_id_++, "authority.grant", runner_grant("uid:4201", "g-a")))
                  .contains("grant"));
  ASSERT_TRUE(result_of(admin.call(next_id_++, "authority.grant", runner_grant("uid:4202", "g-b")))
                  .contains("grant"));
  fs::path const sock = daemon_.socket();
  auto start_as = [&](uid_t uid, char const* grant) {
    return as_user_output(uid, uid, {}, [&](std::string& out) {
      LineClient c{sock};
      if (!c.connected()) return 10;
      auto l = c.call(1, "authority.list");
      if (!l || !l->contains("result")) return 11;
      auto const ep = l->at("result").at("epoch").to_number<std::uint64_t>();
      auto st = c.call(2, "exec.start", with_grant(start_params({"/bin/sleep", "30"}), grant, ep));
      if (!st || !st->contains("result")) return 12;
      out = std::string{st->at("result").at("execution_id").as_string()};
      return 0;
    });
  };
  auto [rc_a, id_a] = start_as(kA, "g-a");
  ASSERT_EQ(rc_a, 0);
  auto [rc_b, id_b] = start_as(kB, "g-b");
  ASSERT_EQ(rc_b, 0);
  ASSERT_FALSE(id_a.empty());
  ASSERT_FALSE(id_b.empty());

  auto sees_only_own = [&](uid_t uid, std::string const& own, std::string const& other) {
    return as_user_output(uid, uid, {}, [&](std::string& why) {
      LineClient c{sock};
      if (!c.connected()) return 10;
      auto list = c.call(1, "exec.list");
      if (!list || !list->contains("result")) {
        why = list ? json::serialize(*list) : "no answer";
        return 11;
      }
      auto const& ex = list->at("result").at("executions").as_array();
      if (ex.size() != 1 || ex[0].at("execution_id").as_string() != own) {
        why = json::serialize(*list);
        return 12;
      }
      // Filters still apply within one's own executions.
      auto none = c.call(2, "exec.list", {{"session_id", "no-such-session"}});
      if (!none || !none->contains("result") ||
          !none->at("result").at("executions").as_array().empty()) {
        return 13;
      }
      if (auto g = c.call(3, "exec.get", {{"execution_id", own}}); !g || !g->contains("result"))
        return 14;
      std::int64_t rid = 10;
      for (auto const& [method, params] : std::vector<std::pair<char const*, json::object>>{
               {"exec.get", {{"execution_id", other}}},
               {"exec.output", {{"execution_id", other}, {"stream", "stdout"}}},
               {"exec.subscribe", {{"execution_id", other}}},
               {"exec.wait", {{"execution_id", other}, {"timeout_ms", 10}}},
               {"exec.cancel", {{"execution_id", other}}},
               {"exec.input", {{"execution_id", other}, {"eof", true}}},
               {"exec.get", {{"execution_id", "ex-0000000000000000"}}}}) {
        auto r = c.call(rid++, method, params);
        if (!r || error_code_of(*r) != "auth.denied") {
          why = std::string{method} + ": " + (r ? json::serialize(*r) : "no answer");
          return 20;
        }
      }
      return 0;
    });
  };
  auto [rc1, why1] = sees_only_own(kA, id_a, id_b);
  EXPECT_EQ(rc1, 0) << why1;
  auto [rc2, why2] = sees_only_own(kB, id_b, id_a);
  EXPECT_EQ(rc2, 0) << why2;

  auto all = result_of(admin.call(next_id_++, "exec.list"));
  EXPECT_EQ(all.at("executions").as_array().size(), 2U);
  // Nobody else's execution was touched by the refused calls.
  for (auto const& id : {id_a, id_b}) {
    auto v = result_of(admin.call(next_id_++, "exec.get", {{"execution_id", id}}));
    EXPECT_EQ(v.at("phase").as_string(), "running") << id;
    ASSERT_TRUE(admin.call(next_id_++, "exec.cancel", {{"execution_id", id}}));
    auto t = result_of(
        admin.call(next_id_++, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}}, 25s));
    EXPECT_TRUE(t.contains("classification")) << id;
  }
}

// One connection revokes while another starts under the grant being revoked, on two threads
// released together, many rounds. Each round: either the start failed with no effect (typed
// auth error, budget unchanged, no execution of that round exists) or it started and the revoke
// fenced it (terminal trigger lease_fence) — never a launch left running under revoked
// authority.
TEST_F(DaemonGateway, ConcurrentRevokeAndStartOnTwoConnections) {
  LineClient revoker = daemon_.client();
  LineClient runner = daemon_.client();
  LineClient checker = daemon_.client();
  constexpr int kRounds = 40;
  std::mt19937 rng(20261129);
  int started = 0;
  int refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::string const gid = "race-" + std::to_string(round);
    std::string const session = "race-session-" + std::to_string(round);
    auto g = result_of(checker.call(next_id_++, "authority.grant", runner_grant("uid:0", gid)));
    ASSERT_TRUE(g.contains("epoch")) << round;
    auto const epoch = g.at("epoch").to_number<std::uint64_t>();
    auto params = with_grant(start_params({"/bin/sleep", "30"}), gid, epoch);
    params["identity"].as_object()["session_id"] = session;
    // Jitter within the window where both requests are in flight, on either side.
    auto const jitter = std::chrono::microseconds(rng() % 1500);
    bool const delay_start = rng() % 2 == 0;

    std::barrier sync(2);
    std::optional<json::object> start_reply;
    std::optional<json::object> revoke_reply;
    std::int64_t const start_id = next_id_++;
    std::int64_t const revoke_id = next_id_++;
    std::thread t_start([&] {
      sync.arrive_and_wait();
      if (delay_start) std::this_thread::sleep_for(jitter);
      start_reply = runner.call(start_id, "exec.start", params);
    });
    std::thread t_revoke([&] {
      sync.arrive_and_wait();
      if (!delay_start) std::this_thread::sleep_for(jitter);
      revoke_reply = revoker.call(revoke_id, "authority.revoke", {{"grant_id", gid}});
    });
    t_start.join();
    t_revoke.join();
    ASSERT_TRUE(start_reply.has_value()) << round;
    ASSERT_TRUE(revoke_reply.has_value() && revoke_reply->contains("result")) << round;

    if (start_reply->contains("result")) {
      ++started;
      std::string const id{start_reply->at("result").at("execution_id").as_string()};
      // The start committed before the revoke, so the revoke fenced it.
      auto const& fenced = revoke_reply->at("result").at("fenced").as_array();
      EXPECT_NE(std::find(fenced.begin(), fenced.end(), json::value(id)), fenced.end())
          << round << ": started " << id << " but the revoke did not fence it";
      auto t = result_of(checker.call(next_id_++, "exec.wait",
                                      {{"execution_id", id}, {"timeout_ms", 20000}}, 25s));
      ASSERT_TRUE(t.contains("trigger")) << round << ": " << json::serialize(t);
      EXPECT_EQ(t.at("trigger"), json::value("lease_fence")) << round;
    } else {
      ++refused;
      std::string const code = error_code_of(*start_reply);
      EXPECT_EQ(code.rfind("auth.", 0), 0U) << round << ": " << json::serialize(*start_reply);
      // No effect: no execution of this round, nothing spent from the grant.
      auto ex = result_of(checker.call(next_id_++, "exec.list", {{"session_id", session}}));
      EXPECT_TRUE(ex.at("executions").as_array().empty()) << round;
      auto l = result_of(checker.call(next_id_++, "authority.list", {{"grant_id", gid}}));
      ASSERT_EQ(l.at("grants").as_array().size(), 1U) << round;
      auto const& spent = l.at("grants").as_array()[0].at("spent").as_object();
      EXPECT_EQ(spent.at("executions").to_number<std::uint64_t>(), 0U) << round;
    }
  }
  EXPECT_EQ(started + refused, kRounds);
  // Whatever the interleaving, nothing is left running.
  auto live = result_of(checker.call(next_id_++, "exec.list", {{"phase", "running"}}));
  EXPECT_TRUE(live.at("executions").as_array().empty()) << json::serialize(live);
  std::cout << "[ rounds   ] started then fenced: " << started << ", refused: " << refused << "\n";
}

}  // namespace
}  // namespace custos::e2e
