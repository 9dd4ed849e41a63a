// Strict parameter handling of exec.list cursors and exec.cancel reasons over the real socket.
#include <string>

#include "harness.hpp"

namespace custos::e2e {
namespace {

class ExecParams : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.log(); }
  Daemon daemon_;
};

TEST_F(ExecParams, ListCursorIsStrictDecimal) {
  auto c = daemon_.client();
  std::int64_t id = 1;
  for (char const* bad : {"-1", "abc", "", " 1", "+1", "1x", "18446744073709551616", "0x10"}) {
    auto r = c.call(id++, "exec.list", {{"cursor", bad}});
    ASSERT_TRUE(r) << bad;
    EXPECT_EQ(error_number_of(*r), -32602) << bad << ": " << json::serialize(*r);
    EXPECT_EQ(error_code_of(*r), "rpc.invalid_params") << bad;
    auto const& diags = r->at("error").at("data").at("detail").at("diagnostics").as_array();
    ASSERT_EQ(diags.size(), 1U) << bad;
    EXPECT_EQ(diags[0].at("pointer").as_string(), "/cursor");
  }
  for (char const* good : {"0", "7", "18446744073709551615"}) {
    auto r = c.call(id++, "exec.list", {{"cursor", good}});
    ASSERT_TRUE(r) << good;
    ASSERT_TRUE(r->contains("result")) << good << ": " << json::serialize(*r);
    EXPECT_TRUE(r->at("result").at("executions").as_array().empty());
  }
}

TEST_F(ExecParams, LongCancelReasonIsCutAtACodePointBoundary) {
  auto c = daemon_.client();
  auto s = c.call(1, "exec.start", start_params({"/bin/sleep", "30"}));
  ASSERT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "no reply");
  std::string const id{s->at("result").at("execution_id").as_string()};
  // 1 + 600 * 2 bytes: byte 1024 would fall inside the 512th "é".
  std::string reason = "a";
  for (int i = 0; i < 600; ++i) reason += "\xc3\xa9";
  auto x = c.call(2, "exec.cancel", {{"execution_id", id}, {"reason", reason}});
  ASSERT_TRUE(x && x->contains("result")) << (x ? json::serialize(*x) : "");
  auto t = c.call(3, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}});
  ASSERT_TRUE(t && t->contains("result"));
  // The recorded cancel_requested event carries the stored reason; a split sequence would make
  // the event line invalid JSON for this client.
  auto sub = c.call(4, "exec.subscribe", {{"execution_id", id}, {"from_seq", 1}});
  ASSERT_TRUE(sub && sub->contains("result")) << (sub ? json::serialize(*sub) : "");
  std::optional<std::string> seen;
  auto const deadline = std::chrono::steady_clock::now() + 10s;
  std::size_t idx = 0;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    if (idx >= c.events.size()) {
      auto v = c.read_json(2000ms);
      ASSERT_TRUE(v) << "an event line was not valid JSON or none came";
      if (v->is_object()) c.events.push_back(v->as_object());
      continue;
    }
    auto const& ev = c.events[idx++];
    auto const* params = ev.if_contains("params");
    if (params == nullptr) continue;
    auto const& p = params->as_object();
    if (p.at("kind").as_string() != "cancel_requested") continue;
    seen = std::string{p.at("reason").as_string()};
  }
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->size(), 1023U);
  EXPECT_EQ(*seen, reason.substr(0, 1023));
}

}  // namespace
}  // namespace custos::e2e
