// The gateway through the real daemon over its real socket: a non-admin on every admin method,
// a runner starting under its grant (and a mismatch with no effect), replay, lease contention,
// a continuous stdin writer with a revoke in the middle, quiescence.
#include <atomic>
#include <grp.h>
#include <pwd.h>
#include <thread>

#include "harness.hpp"

namespace custos::e2e {
namespace {

class Gateway : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
    ::chmod(daemon_.tmp().c_str(), 0755);
    ::chmod(daemon_.state().c_str(), 0711);
  }

  json::object result_of(std::optional<json::object> const& r) {
    EXPECT_TRUE(r.has_value());
    if (!r) return {};
    EXPECT_TRUE(r->contains("result")) << json::serialize(*r);
    return r->contains("result") ? r->at("result").as_object() : json::object{};
  }

  std::uint64_t epoch(LineClient& c) {
    auto l = result_of(c.call(next_id_++, "authority.list"));
    return l.contains("epoch") ? l.at("epoch").to_number<std::uint64_t>() : 0;
  }

  json::object with_grant(json::object params, std::string const& grant, std::uint64_t ep) {
    params["authority"] = json::object{{"epoch", ep}, {"grant_id", grant}, {"lease_id", nullptr}};
    return params;
  }

  Daemon daemon_{DaemonOptions{
      {"--socket-mode", "0666"}, true, {"ASAN_OPTIONS=quarantine_size_mb=8"}, {}, {}}};
  std::int64_t next_id_ = 1;
};

TEST_F(Gateway, NonAdminOnEveryAdminMethod) {
  fs::path const sock = daemon_.socket();
  int const rc = as_user(nobody_uid(), 65534, {}, [&] {
    LineClient c{sock};
    if (!c.connected()) return 10;
    auto denied = [&](std::int64_t id, char const* m, json::object p) {
      auto r = c.call(id, m, std::move(p));
      return r && error_code_of(*r) == "auth.denied";
    };
    if (!denied(1, "authority.grant", json::object{{"principal", "uid:0"}})) return 11;
    if (!denied(2, "authority.revoke", {{"grant_id", "g1"}})) return 12;
    if (!denied(3, "lease.acquire", {{"workspace_id", "w1"}, {"holder_session", "s1"}})) return 13;
    if (!denied(4, "holder.quiescence", {{"session_id", "s1"}, {"generation", 1}})) return 14;
    // No grant named and not an admin: no implicit authority.
    if (!denied(5, "exec.start", start_params({"/bin/true"}))) return 15;
    auto list = c.call(6, "authority.list");
    if (!list || !list->contains("result")) return 16;
    if (!list->at("result").at("grants").as_array().empty()) return 17;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  // Nothing was created by any of it.
  auto c = daemon_.client();
  auto l = result_of(c.call(1, "authority.list"));
  EXPECT_EQ(l.at("epoch").to_number<std::uint64_t>(), 0U);
  auto ex = result_of(c.call(2, "exec.list"));
  EXPECT_TRUE(ex.at("executions").as_array().empty());
}

TEST_F(Gateway, RunnerStartsUnderItsGrantAndAMismatchHasNoEffect) {
  auto admin = daemon_.client();
  std::string const principal = "uid:" + std::to_string(nobody_uid());
  auto g = result_of(admin.call(next_id_++, "authority.grant", runner_grant(principal, "g-run")));
  ASSERT_TRUE(g.contains("grant"));
  fs::path const sock = daemon_.socket();
  std::string started;
  int const rc = as_user(nobody_uid(), 65534, {}, [&] {
    LineClient c{sock};
    if (!c.connected()) return 10;
    auto l = c.call(1, "authority.list");
    if (!l || !l->contains("result")) return 11;
    auto const ep = l->at("result").at("epoch").to_number<std::uint64_t>();
    if (l->at("result").at("grants").as_array().size() != 1) return 12;
    // Mismatch first: an executable outside the grant.
    auto bad =
        c.call(2, "exec.start", with_grant(start_params({"/sbin/not-granted"}), "g-run", ep));
    if (!bad || error_code_of(*bad) != "auth.executable") return 13;
    auto stale = c.call(3, "exec.start", with_grant(start_params({"/bin/true"}), "g-run", ep + 1));
    if (!stale || error_code_of(*stale) != "auth.stale_epoch") return 14;
    auto ok =
        c.call(4, "exec.start", with_grant(start_params({"/bin/sh", "-c", "exit 3"}), "g-run", ep));
    if (!ok || !ok->contains("result")) return 15;
    return 0;
  });
  ASSERT_EQ(rc, 0);
  auto ex = result_of(admin.call(next_id_++, "exec.list"));
  ASSERT_EQ(ex.at("executions").as_array().size(), 1U) << "the refused starts created nothing";
  started = std::string{ex.at("executions").as_array()[0].at("execution_id").as_string()};
  auto t = result_of(
      admin.call(next_id_++, "exec.wait", {{"execution_id", started}, {"timeout_ms", 20000}}));
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 3);
  auto l = result_of(admin.call(next_id_++, "authority.list", {{"grant_id", "g-run"}}));
  auto const& spent = l.at("grants").as_array()[0].at("spent").as_object();
  EXPECT_EQ(spent.at("executions").to_number<std::uint64_t>(), 1U);
  EXPECT_EQ(spent.at("wall_ms_reserved").to_number<std::uint64_t>(), 0U) << "settled at terminal";
}

TEST_F(Gateway, ReplayAndLeaseContentionOverTheSocket) {
  auto c = daemon_.client();
  auto p = start_params({"/bin/true"});
  auto first = result_of(c.call(next_id_++, "exec.start", p));
  ASSERT_TRUE(first.contains("execution_id"));
  auto replay = c.call(next_id_++, "exec.start", p);
  ASSERT_TRUE(replay);
  EXPECT_EQ(error_code_of(*replay), "auth.replay") << json::serialize(*replay);

  auto lease = result_of(
      c.call(next_id_++, "lease.acquire", {{"workspace_id", "w1"}, {"holder_session", "s1"}}));
  ASSERT_TRUE(lease.contains("lease_id"));
  auto again =
      c.call(next_id_++, "lease.acquire", {{"workspace_id", "w1"}, {"holder_session", "s2"}});
  ASSERT_TRUE(again);
  EXPECT_EQ(error_code_of(*again), "lease.conflict");
  // While w1 is leased even an admin's writable start needs that lease.
  auto w = start_params({"/bin/true"});
  w["plan"].as_object()["workspace"].as_object()["access"] = "writable";
  auto need = c.call(next_id_++, "exec.start", w);
  ASSERT_TRUE(need);
  EXPECT_EQ(error_code_of(*need), "auth.lease_required");
  auto withl = start_params({"/bin/true"});
  withl["plan"].as_object()["workspace"].as_object()["access"] = "writable";
  withl["authority"].as_object()["lease_id"] = lease.at("lease_id");
  EXPECT_TRUE(result_of(c.call(next_id_++, "exec.start", withl)).contains("execution_id"));
  auto rel = result_of(c.call(next_id_++, "lease.release", {{"lease_id", lease.at("lease_id")}}));
  EXPECT_TRUE(rel.contains("fenced"));
  auto ls = result_of(c.call(next_id_++, "lease.list"));
  EXPECT_TRUE(ls.at("leases").as_array().empty());
}

TEST_F(Gateway, ContinuousStdinWriterWithARevokeInTheMiddle) {
  auto admin = daemon_.client();
  ASSERT_TRUE(result_of(admin.call(next_id_++, "authority.grant", runner_grant("uid:0", "g-stdin")))
                  .contains("grant"));
  auto const log = daemon_.tmp() / "stdin.log";
  auto p =
      with_grant(start_params({"/bin/sh", "-c", "cat > " + log.native()}), "g-stdin", epoch(admin));
  auto st = result_of(admin.call(next_id_++, "exec.start", p));
  ASSERT_TRUE(st.contains("execution_id"));
  std::string const id{st.at("execution_id").as_string()};

  std::atomic<int> revoked_after{-1};  // the first line number sent after the revoke returned
  std::atomic<int> sent{0};
  std::atomic<bool> stop{false};
  std::atomic<int> accepted_after{0};
  std::thread writer([&] {
    LineClient w = daemon_.client();
    for (int i = 0; !stop && i < 100000; ++i) {
      bool const after = revoked_after.load() >= 0;
      std::string const line = std::to_string(i) + "\n";
      std::string b64;
      {
        static char const* const kAlphabet =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        std::size_t k = 0;
        while (k + 2 < line.size()) {
          unsigned v = (static_cast<unsigned char>(line[k]) << 16U) |
                       (static_cast<unsigned char>(line[k + 1]) << 8U) |
                       static_cast<unsigned char>(line[k + 2]);
          for (int s = 18; s >= 0; s -= 6) b64 += kAlphabet[(v >> static_cast<unsigned>(s)) & 63U];
          k += 3;
        }
        std::size_t const rest = line.size() - k;
        if (rest > 0) {
          unsigned v = static_cast<unsigned char>(line[k]) << 16U;
          if (rest == 2) v |= static_cast<unsigned char>(line[k + 1]) << 8U;
          b64 += kAlphabet[(v >> 18U) & 63U];
          b64 += kAlphabet[(v >> 12U) & 63U];
          b64 += rest == 2 ? kAlphabet[(v >> 6U) & 63U] : '=';
          b64 += '=';
        }
      }
      auto r = w.call(1000 + i, "exec.input", {{"execution_id", id}, {"data_b64", b64}});
      if (after && r && r->contains("result")) ++accepted_after;
      if (after && i > revoked_after.load() + 50) break;
      sent = i;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  while (sent.load() < 200) std::this_thread::sleep_for(1ms);
  auto rv = result_of(admin.call(next_id_++, "authority.revoke", {{"grant_id", "g-stdin"}}));
  revoked_after = sent.load() + 1;
  ASSERT_EQ(rv.at("fenced").as_array().size(), 1U);
  writer.join();
  stop = true;
  EXPECT_EQ(accepted_after.load(), 0);
  auto t =
      result_of(admin.call(next_id_++, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}}));
  EXPECT_EQ(t.at("trigger").as_string(), "lease_fence");
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_LT(std::stoi(line), revoked_after.load())
        << "a line sent after the revoke returned arrived";
  }
  EXPECT_GT(lines, 100);
}

TEST_F(Gateway, QuiescenceLiveThenEvidence) {
  auto c = daemon_.client();
  auto p = start_params({"/bin/sleep", "30"});
  p["identity"].as_object()["session_id"] = "holder-q";
  auto st = result_of(c.call(next_id_++, "exec.start", p));
  ASSERT_TRUE(st.contains("execution_id"));
  auto q = result_of(
      c.call(next_id_++, "holder.quiescence", {{"session_id", "holder-q"}, {"generation", 1}}));
  EXPECT_FALSE(q.at("quiescent").as_bool());
  ASSERT_EQ(q.at("blocking").as_array().size(), 1U);
  EXPECT_EQ(q.at("blocking").as_array()[0].at("reason").as_string(), "live");
  ASSERT_TRUE(
      result_of(c.call(next_id_++, "exec.cancel", {{"execution_id", st.at("execution_id")}}))
          .contains("accepted"));
  (void)result_of(c.call(next_id_++, "exec.wait",
                         {{"execution_id", st.at("execution_id")}, {"timeout_ms", 20000}}));
  auto done = result_of(
      c.call(next_id_++, "holder.quiescence", {{"session_id", "holder-q"}, {"generation", 1}}));
  EXPECT_TRUE(done.at("quiescent").as_bool()) << json::serialize(done);
  EXPECT_EQ(done.at("evidence").at("executions").as_array().size(), 1U);
}

}  // namespace
}  // namespace custos::e2e
