// rpc building blocks without a socket: base64, the error object shape, the admin rule, and the
// dispatcher's JSON-RPC rules with an in-process session.
#include "custos/rpc/protocol.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "custos/core/base64.hpp"
#include "custos/rpc/dispatcher.hpp"

namespace custos::rpc {
namespace {

namespace json = boost::json;

TEST(Base64, KnownVectors) {
  // RFC 4648 §10.
  EXPECT_EQ(custos::core::base64_encode(std::string_view{""}), "");
  EXPECT_EQ(custos::core::base64_encode(std::string_view{"f"}), "Zg==");
  EXPECT_EQ(custos::core::base64_encode(std::string_view{"fo"}), "Zm8=");
  EXPECT_EQ(custos::core::base64_encode(std::string_view{"foo"}), "Zm9v");
  EXPECT_EQ(custos::core::base64_encode(std::string_view{"foob"}), "Zm9vYg==");
  EXPECT_EQ(custos::core::base64_encode(std::string_view{"fooba"}), "Zm9vYmE=");
  EXPECT_EQ(custos::core::base64_encode(std::string_view{"foobar"}), "Zm9vYmFy");
}

TEST(Base64, RejectsMalformed) {
  for (char const* bad : {"Zg=", "Zg===", "Z===", "Zm9v!A==", "=Zm9", "Zg==Zg==", "Zm 9v"}) {
    EXPECT_FALSE(custos::core::base64_decode(bad).has_value()) << bad;
  }
}

RC_GTEST_PROP(Base64, RoundTrips, (std::vector<std::uint8_t> const& bytes)) {
  auto text = custos::core::base64_encode(bytes);
  RC_ASSERT(text.size() % 4 == 0);
  auto back = custos::core::base64_decode(text);
  RC_ASSERT(back.has_value());
  RC_ASSERT(*back == bytes);
}

TEST(ErrorObject, CarriesStableCodeRecoveryAndDiagnostics) {
  auto e = Error::from_diagnostics({{Errc::plan_invalid_cwd, "/plan/cwd", "escapes"},
                                    {Errc::plan_empty_argv, "/plan/command/argv", "empty"}});
  auto o = error_object(e);
  EXPECT_EQ(o.at("code").as_int64(), -32001);
  auto const& data = o.at("data").as_object();
  EXPECT_EQ(data.at("code").as_string(), "plan.invalid");
  EXPECT_EQ(data.at("recovery").as_string(), "caller_correction");
  EXPECT_EQ(data.at("detail").at("diagnostics").as_array().size(), 2U);
  // And back, as the CLI reads it.
  auto back = error_from_object(o);
  EXPECT_EQ(back.code, Errc::plan_invalid);
  ASSERT_EQ(back.diagnostics.size(), 2U);
  EXPECT_EQ(back.diagnostics[0].code, Errc::plan_invalid_cwd);
  EXPECT_EQ(back.diagnostics[0].pointer, "/plan/cwd");
}

TEST(ErrorObject, SandboxUnsupportedCarriesEveryMissingControl) {
  Error e{Errc::sandbox_unsupported, "the native backend cannot enforce on this host"};
  e.missing = {"filesystem.mount_namespace", "network.none", "process.pid_namespace"};
  auto o = error_object(e);
  auto const& data = o.at("data").as_object();
  EXPECT_EQ(data.at("code").as_string(), "sandbox.unsupported");
  EXPECT_EQ(o.at("code").as_int64(), -32007);
  EXPECT_EQ(
      data.at("detail").at("missing"),
      json::parse(R"(["filesystem.mount_namespace", "network.none", "process.pid_namespace"])"));
  auto back = error_from_object(o);
  EXPECT_EQ(back.code, Errc::sandbox_unsupported);
  EXPECT_EQ(back.missing, e.missing);
  // No list, no member.
  EXPECT_FALSE(error_object(Error{Errc::sandbox_invalid, "x"})
                   .at("data")
                   .at("detail")
                   .as_object()
                   .contains("missing"));
}

TEST(ErrorObject, NumbersByLayerAndReservedCodes) {
  EXPECT_EQ(application_code(Errc::exec_not_found), -32002);
  EXPECT_EQ(application_code(Errc::spawn_failed), -32003);
  EXPECT_EQ(application_code(Errc::registry_locked), -32004);
  EXPECT_EQ(application_code(Errc::rpc_overloaded), -32005);
  EXPECT_EQ(application_code(Errc::auth_denied), -32006);
  EXPECT_EQ(application_code(Errc::sandbox_unsupported), -32007);
  EXPECT_EQ(application_code(Errc::engine_failed), -32008);
  EXPECT_EQ(application_code(Errc::internal), -32009);
  EXPECT_EQ(error_object(Error{Errc::rpc_parse_error}).at("code").as_int64(), kParseError);
  EXPECT_EQ(error_object(Error{Errc::rpc_line_too_long}).at("code").as_int64(), kInvalidRequest);
  EXPECT_EQ(error_object(Error{Errc::rpc_method_not_found}).at("code").as_int64(), kMethodNotFound);
  EXPECT_EQ(error_object(Error{Errc::rpc_invalid_params}).at("code").as_int64(), kInvalidParams);
  for (auto code : all_errcs()) {
    auto n = error_object(Error{code}).at("code").as_int64();
    EXPECT_TRUE((n <= -32000 && n >= -32099) || n == kParseError || n == kInvalidRequest ||
                n == kMethodNotFound || n == kInvalidParams)
        << errc_wire(code);
  }
}

TEST(AuthPolicy, RootOwnUidAndAdminGroup) {
  AuthPolicy p{1000, 4242};
  EXPECT_TRUE(p.is_admin({0, 0, 1, {}, false}));
  EXPECT_TRUE(p.is_admin({1000, 1000, 1, {}, false}));
  EXPECT_TRUE(p.is_admin({2000, 4242, 1, {}, false}));
  EXPECT_TRUE(p.is_admin({2000, 2000, 1, {10, 4242}, false}));
  EXPECT_FALSE(p.is_admin({2000, 2000, 1, {10}, false}));
  AuthPolicy none{1000, std::nullopt};
  EXPECT_FALSE(none.is_admin({2000, 4242, 1, {4242}, false}));
}

// A connection as the dispatcher sees it, in memory.
class MemorySession final : public Session {
 public:
  explicit MemorySession(PeerCredentials p) : peer_(std::move(p)) {}
  PeerCredentials const& peer() const noexcept override { return peer_; }
  bool closed() const noexcept override { return false; }
  bool notify(std::string_view, json::object) override { return true; }
  Result<std::string> add_subscription(std::function<void()>) override {
    return std::string{"sub-1"};
  }
  Result<void> remove_subscription(std::string const&) override { return ok(); }

 private:
  PeerCredentials peer_;
};

class DispatcherRules : public ::testing::Test {
 protected:
  DispatcherRules() : d_(AuthPolicy{1000, std::nullopt}) {
    d_.add(
        "open.echo", Access::any,
        [](std::shared_ptr<Session> const&, json::object const& p, Reply r) { r(json::value(p)); });
    d_.add("admin.later", Access::admin,
           [this](std::shared_ptr<Session> const&, json::object const&, Reply r) {
             later_.push_back(std::move(r));
           });
    d_.add("open.throws", Access::any,
           [](std::shared_ptr<Session> const&, json::object const&, Reply) {
             throw std::runtime_error("boom");
           });
  }
  std::vector<std::string> run(std::shared_ptr<Session> const& s, std::string const& line) {
    std::vector<std::string> out;
    d_.handle_line(s, line, [&](std::string r) { out.push_back(std::move(r)); });
    return out;
  }
  Dispatcher d_;
  std::vector<Reply> later_;
  std::shared_ptr<Session> admin_ =
      std::make_shared<MemorySession>(PeerCredentials{1000, 1000, 1, {}, false});
  std::shared_ptr<Session> other_ =
      std::make_shared<MemorySession>(PeerCredentials{2000, 2000, 2, {}, false});
};

TEST_F(DispatcherRules, EmitIsCalledExactlyOnceEvenForNotifications) {
  EXPECT_EQ(run(admin_, R"({"jsonrpc":"2.0","method":"open.echo"})"), std::vector<std::string>{""});
  auto r = run(admin_, R"({"jsonrpc":"2.0","method":"open.echo","params":{"a":1},"id":"x"})");
  ASSERT_EQ(r.size(), 1U);
  EXPECT_EQ(json::parse(r[0]).at("result").at("a").as_int64(), 1);
}

TEST_F(DispatcherRules, BatchWaitsForItsSlowestCall) {
  std::vector<std::string> out;
  d_.handle_line(
      admin_,
      R"([{"jsonrpc":"2.0","method":"admin.later","id":1},{"jsonrpc":"2.0","method":"open.echo","id":2}])",
      [&](std::string r) { out.push_back(std::move(r)); });
  EXPECT_TRUE(out.empty());
  ASSERT_EQ(later_.size(), 1U);
  later_[0](json::value("done"));
  later_[0](json::value("twice"));  // a second completion is ignored
  ASSERT_EQ(out.size(), 1U);
  auto arr = json::parse(out[0]).as_array();
  ASSERT_EQ(arr.size(), 2U);
  EXPECT_EQ(arr[0].at("id").as_int64(), 1);  // request order, not completion order
  EXPECT_EQ(arr[0].at("result").as_string(), "done");
}

TEST_F(DispatcherRules, AdminMethodsDeniedToOthers) {
  auto r = run(other_, R"({"jsonrpc":"2.0","method":"admin.later","id":1})");
  ASSERT_EQ(r.size(), 1U);
  auto o = json::parse(r[0]).as_object();
  EXPECT_EQ(o.at("error").at("data").at("code").as_string(), "auth.denied");
  EXPECT_EQ(d_.stats().denied, 1U);
  EXPECT_TRUE(later_.empty());
}

TEST_F(DispatcherRules, HandlerExceptionBecomesInternalError) {
  auto r = run(admin_, R"({"jsonrpc":"2.0","method":"open.throws","id":1})");
  ASSERT_EQ(r.size(), 1U);
  EXPECT_EQ(json::parse(r[0]).at("error").at("data").at("code").as_string(), "internal.error");
}

// A completion that runs later, outside the handler call, and whose forwarding throws: the
// exception must not unwind into the caller of the completion (io_context::run() in the
// daemon); the call is answered with internal.error instead.
TEST_F(DispatcherRules, LateCompletionThatThrowsBecomesInternalError) {
  std::vector<std::string> out;
  int calls = 0;
  d_.handle_line(admin_, R"({"jsonrpc":"2.0","method":"admin.later","id":9})", [&](std::string r) {
    if (++calls == 1) throw std::runtime_error("transport refused the reply");
    out.push_back(std::move(r));
  });
  ASSERT_EQ(later_.size(), 1U);
  EXPECT_NO_THROW(later_[0](json::value("done")));
  ASSERT_EQ(out.size(), 1U);
  auto o = json::parse(out[0]).as_object();
  EXPECT_EQ(o.at("id").as_int64(), 9);
  EXPECT_EQ(o.at("error").at("data").at("code").as_string(), "internal.error");
}

TEST_F(DispatcherRules, BatchCapAndAdmittedCount) {
  d_.set_max_batch_entries(3);
  std::string const one = R"({"jsonrpc":"2.0","method":"open.echo","id":1})";
  std::vector<std::size_t> admitted;
  std::vector<std::string> out;
  auto send = [&](std::string const& line) {
    d_.handle_line(
        admin_, line, [&](std::string r) { out.push_back(std::move(r)); },
        [&](std::size_t n) { admitted.push_back(n); });
  };
  send("[" + one + "," + one + "," + one + "]");
  send("[" + one + "," + one + "," + one + "," + one + "]");
  send(one);
  ASSERT_EQ(out.size(), 3U);
  EXPECT_TRUE(json::parse(out[0]).is_array());
  auto refused = json::parse(out[1]);
  ASSERT_TRUE(refused.is_object());
  EXPECT_EQ(refused.at("error").at("code").as_int64(), -32600);
  EXPECT_EQ(admitted, (std::vector<std::size_t>{3, 1}));  // the refused batch admitted nothing
}

TEST_F(DispatcherRules, DuplicateMemberIsParseErrorWithPointer) {
  auto r = run(admin_, R"({"jsonrpc":"2.0","method":"open.echo","params":{"a":1,"a":2},"id":1})");
  ASSERT_EQ(r.size(), 1U);
  auto o = json::parse(r[0]).as_object();
  EXPECT_EQ(o.at("error").at("code").as_int64(), -32700);
  EXPECT_EQ(o.at("error").at("data").at("detail").at("diagnostics").at(0).at("pointer").as_string(),
            "/params/a");
}

// add_call handlers learn how they were called (exec.start with `subscribe` refuses batches and
// notifications on it), and outside a batch their Reply has emitted the response line before it
// returns, so anything they send afterwards follows the answer.
TEST_F(DispatcherRules, CallHandlerSeesBatchAndNotificationAndEmitsBeforeReplyReturns) {
  std::vector<CallInfo> seen;
  std::vector<std::string> out;
  std::vector<std::size_t> emitted_when_replied;
  d_.add_call(
      "open.call", Access::any,
      [&](std::shared_ptr<Session> const&, json::object const&, CallInfo const& call, Reply r) {
        seen.push_back(call);
        r(json::value(json::object{}));
        emitted_when_replied.push_back(out.size());
      });
  EXPECT_EQ(d_.find("open.call"), nullptr);
  EXPECT_TRUE(d_.has("open.call"));
  auto line = [&](std::string const& l) {
    d_.handle_line(admin_, l, [&](std::string r) { out.push_back(std::move(r)); });
  };
  line(R"({"jsonrpc":"2.0","method":"open.call","id":1})");
  line(R"({"jsonrpc":"2.0","method":"open.call"})");
  line(R"([{"jsonrpc":"2.0","method":"open.call","id":2},{"jsonrpc":"2.0","method":"open.call"}])");
  ASSERT_EQ(seen.size(), 4U);
  EXPECT_FALSE(seen[0].in_batch);
  EXPECT_FALSE(seen[0].notification);
  EXPECT_FALSE(seen[1].in_batch);
  EXPECT_TRUE(seen[1].notification);
  EXPECT_TRUE(seen[2].in_batch);
  EXPECT_FALSE(seen[2].notification);
  EXPECT_TRUE(seen[3].in_batch);
  EXPECT_TRUE(seen[3].notification);
  // A single call's line (and a notification's empty one) was emitted inside the Reply; a batch
  // entry's only once the whole batch was done.
  ASSERT_EQ(emitted_when_replied.size(), 4U);
  EXPECT_EQ(emitted_when_replied[0], 1U);
  EXPECT_EQ(emitted_when_replied[1], 2U);
  EXPECT_EQ(emitted_when_replied[2], 2U);
  EXPECT_EQ(emitted_when_replied[3], 3U);
  ASSERT_EQ(out.size(), 3U);
  EXPECT_EQ(json::parse(out[0]).at("id").as_int64(), 1);
  EXPECT_EQ(out[1], "");
  EXPECT_EQ(json::parse(out[2]).as_array().size(), 1U);
}

}  // namespace
}  // namespace custos::rpc
