// Methods whose result is ready-made JSON text (Dispatcher::add_text, host.info): the response
// line is byte-for-byte what serializing the result tree would give, and every JSON-RPC rule
// (ids, notifications, batches, access, handler failures) holds as for tree results.
#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "custos/rpc/dispatcher.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/rpc/protocol.hpp"

namespace custos::rpc {
namespace {

namespace json = boost::json;

class Peer final : public Session {
 public:
  explicit Peer(std::uint32_t uid) { peer_.uid = uid; }
  PeerCredentials const& peer() const noexcept override { return peer_; }
  bool closed() const noexcept override { return false; }
  bool notify(std::string_view, json::object) override { return true; }
  Result<std::string> add_subscription(std::function<void()>) override {
    return Error{Errc::rpc_unavailable, "not here"};
  }
  Result<void> remove_subscription(std::string const&) override { return ok(); }

 private:
  PeerCredentials peer_;
};

json::object sample_result() {
  return json::object{{"version", "0.1.0"},
                      {"nested", json::object{{"list", json::array{1, "two", nullptr, true}}}},
                      {"text", "quote \" and \\ and \n"}};
}

class TextResults : public ::testing::Test {
 protected:
  TextResults() : d_(AuthPolicy{1000, std::nullopt}) {
    auto text = std::make_shared<std::string const>(json::serialize(sample_result()));
    d_.add_text("t.info", Access::any,
                [text, this](std::shared_ptr<Session> const&, json::object const&) {
                  ++calls_;
                  return Result<std::shared_ptr<std::string const>>{text};
                });
    d_.add_text("t.admin", Access::admin,
                [text](std::shared_ptr<Session> const&, json::object const&) {
                  return Result<std::shared_ptr<std::string const>>{text};
                });
    d_.add_text("t.fails", Access::any, [](std::shared_ptr<Session> const&, json::object const&) {
      return Result<std::shared_ptr<std::string const>>{Error{Errc::internal, "no text"}};
    });
    d_.add_text("t.throws", Access::any,
                [](std::shared_ptr<Session> const&,
                   json::object const&) -> Result<std::shared_ptr<std::string const>> {
                  throw std::runtime_error("boom");
                });
    d_.add("tree.info", Access::any,
           [](std::shared_ptr<Session> const&, json::object const&, Reply const& r) {
             r(json::value(sample_result()));
           });
  }
  std::vector<std::string> run(std::shared_ptr<Session> const& s, std::string const& line) {
    std::vector<std::string> out;
    d_.handle_line(s, line, [&](std::string r) { out.push_back(std::move(r)); });
    return out;
  }
  Dispatcher d_;
  int calls_ = 0;
  std::shared_ptr<Session> admin_ = std::make_shared<Peer>(1000);
  std::shared_ptr<Session> other_ = std::make_shared<Peer>(2000);
};

TEST_F(TextResults, SameBytesAsATreeResult) {
  for (char const* id : {"1", "\"abc\"", "null", "-7", "1.5"}) {
    auto text = run(admin_, std::string{R"({"jsonrpc":"2.0","method":"t.info","id":)"} + id + "}");
    auto tree =
        run(admin_, std::string{R"({"jsonrpc":"2.0","method":"tree.info","id":)"} + id + "}");
    ASSERT_EQ(text.size(), 1U);
    ASSERT_EQ(tree.size(), 1U);
    EXPECT_EQ(text[0], tree[0]) << id;
    EXPECT_EQ(json::parse(text[0]).at("result"), json::value(sample_result()));
  }
  EXPECT_EQ(calls_, 5);
}

RC_GTEST_PROP(ResultLine, EqualsSerializingTheResponseObject, (std::string const& s, int n)) {
  json::value const id = (n % 2 == 0) ? json::value(s) : json::value(n);
  json::value const result = json::object{{"s", s}, {"n", n}, {"a", json::array{s, n}}};
  RC_ASSERT(result_line(id, json::serialize(result)) ==
            json::serialize(result_response(id, result)));
}

TEST_F(TextResults, NotificationGetsNothingBatchGetsItsEntry) {
  EXPECT_EQ(run(admin_, R"({"jsonrpc":"2.0","method":"t.info"})"), std::vector<std::string>{""});
  auto r = run(admin_,
               R"([{"jsonrpc":"2.0","method":"t.info","id":1},{"jsonrpc":"2.0","method":"t.info"},)"
               R"({"jsonrpc":"2.0","method":"tree.info","id":2}])");
  ASSERT_EQ(r.size(), 1U);
  auto v = json::parse(r[0]);
  ASSERT_TRUE(v.is_array());
  ASSERT_EQ(v.as_array().size(), 2U);
  EXPECT_EQ(v.as_array()[0].at("id").as_int64(), 1);
  EXPECT_EQ(v.as_array()[1].at("id").as_int64(), 2);
  EXPECT_EQ(v.as_array()[0].at("result"), v.as_array()[1].at("result"));
}

TEST_F(TextResults, AccessFailuresAndThrowsAreTypedErrors) {
  auto denied = json::parse(run(other_, R"({"jsonrpc":"2.0","method":"t.admin","id":1})").at(0));
  EXPECT_EQ(denied.at("error").at("data").at("code").as_string(), "auth.denied");
  auto fails = json::parse(run(admin_, R"({"jsonrpc":"2.0","method":"t.fails","id":2})").at(0));
  EXPECT_EQ(fails.at("error").at("data").at("code").as_string(), "internal.error");
  EXPECT_EQ(fails.at("id").as_int64(), 2);
  auto threw = json::parse(run(admin_, R"({"jsonrpc":"2.0","method":"t.throws","id":3})").at(0));
  EXPECT_EQ(threw.at("error").at("data").at("code").as_string(), "internal.error");
  EXPECT_NE(threw.at("error").at("message").as_string().find("boom"), std::string::npos);
  // A failing notification still owes nothing.
  EXPECT_EQ(run(admin_, R"({"jsonrpc":"2.0","method":"t.fails"})"), std::vector<std::string>{""});
  EXPECT_GE(d_.stats().errors, 3U);
}

TEST_F(TextResults, FindSeesOnlyTreeHandlers) {
  EXPECT_TRUE(d_.has("t.info"));
  EXPECT_EQ(d_.find("t.info"), nullptr);
  EXPECT_NE(d_.find("tree.info"), nullptr);
}

TEST(HostMethods, HostInfoServesTheDescribedTextOnEveryCall) {
  Dispatcher d{AuthPolicy{0, std::nullopt}};
  int described = 0;
  auto text = std::make_shared<std::string const>(R"({"version":"x","pid":1})");
  register_host_methods(d, [&] {
    ++described;
    return Result<std::shared_ptr<std::string const>>{text};
  });
  auto s = std::make_shared<Peer>(4242);  // host.info is open to every caller
  std::vector<std::string> out;
  for (int i = 0; i < 3; ++i) {
    d.handle_line(s, R"({"jsonrpc":"2.0","method":"host.info","id":9})",
                  [&](std::string r) { out.push_back(std::move(r)); });
  }
  ASSERT_EQ(out.size(), 3U);
  EXPECT_EQ(out[0], R"({"jsonrpc":"2.0","id":9,"result":{"version":"x","pid":1}})");
  EXPECT_EQ(out[1], out[0]);
  EXPECT_EQ(described, 3);
}

}  // namespace
}  // namespace custos::rpc
