// EventLog and base64: pure pieces of the supervisor, tested without processes.
#include "custos/supervisor/event_log.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "custos/core/base64.hpp"

namespace custos::supervisor {
namespace {

std::vector<std::uint8_t> bytes(std::string const& s) {
  return {s.begin(), s.end()};
}

TEST(EventLog, SeqStartsAtOneAndHasNoGaps) {
  EventLog log("ex-1", "sha256:aa", 100, 1 << 20);
  std::vector<std::uint64_t> seen;
  auto sub = log.subscribe(std::nullopt, [&](Event const& e) {
    seen.push_back(e.seq);
    EXPECT_EQ(e.plan_digest, "sha256:aa");
    EXPECT_EQ(e.execution_id, "ex-1");
    return true;
  });
  EXPECT_FALSE(sub.dropped);
  for (int i = 0; i < 10; ++i) log.append("output", {}, bytes("x"));
  ASSERT_EQ(seen.size(), 10U);
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i + 1);
  EXPECT_EQ(log.last_seq(), 10U);
}

TEST(EventLog, RetentionBoundedByCountAndBytesAndReplayFromSeq) {
  EventLog log("ex-1", "d", 5, 8);
  for (int i = 0; i < 10; ++i) log.append("output", {}, bytes("ab"));
  // 8 bytes of data at most: 4 events of 2 bytes.
  EXPECT_EQ(log.retained_count(), 4U);
  EXPECT_LE(log.retained_data_bytes(), 8U);
  EXPECT_EQ(log.first_retained_seq(), 7U);

  std::vector<std::uint64_t> seen;
  auto sub = log.subscribe(std::uint64_t{2}, [&](Event const& e) {
    seen.push_back(e.seq);
    return true;
  });
  // Older events are gone: replay starts at the first retained one and says so.
  EXPECT_EQ(sub.replay_from, 7U);
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{7, 8, 9, 10}));

  seen.clear();
  auto later = log.subscribe(std::uint64_t{9}, [&](Event const& e) {
    seen.push_back(e.seq);
    return true;
  });
  EXPECT_EQ(later.replay_from, 9U);
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{9, 10}));
}

TEST(EventLog, SinkReturningFalseIsDroppedAndReported) {
  EventLog log("ex-1", "d", 100, 1 << 20);
  int slow_calls = 0;
  int good_calls = 0;
  auto slow = log.subscribe(std::nullopt, [&](Event const&) {
    ++slow_calls;
    return slow_calls < 3;
  });
  auto good = log.subscribe(std::nullopt, [&](Event const&) {
    ++good_calls;
    return true;
  });
  std::vector<std::uint64_t> dropped_total;
  for (int i = 0; i < 5; ++i) {
    auto d = log.append("output", {}, bytes("y"));
    dropped_total.insert(dropped_total.end(), d.begin(), d.end());
  }
  EXPECT_EQ(slow_calls, 3);
  EXPECT_EQ(good_calls, 5);
  EXPECT_EQ(dropped_total, std::vector<std::uint64_t>{slow.id});
  EXPECT_EQ(log.subscriber_count(), 1U);
  EXPECT_TRUE(log.unsubscribe(good.id));
  EXPECT_FALSE(log.unsubscribe(good.id));
}

TEST(EventLog, SinkMayUnsubscribeItselfWhileCalled) {
  EventLog log("ex-1", "d", 100, 1 << 20);
  std::uint64_t self_id = 0;
  int calls = 0;
  auto s = log.subscribe(std::nullopt, [&](Event const&) {
    ++calls;
    log.unsubscribe(self_id);
    return true;
  });
  self_id = s.id;
  log.append("started", {});
  log.append("exited", {});
  EXPECT_EQ(calls, 1);
}

TEST(EventLog, ToJsonCarriesBase64DataForOutputOnly) {
  EventLog log("ex-9", "sha256:bb", 10, 100);
  Event got;
  (void)log.subscribe(std::nullopt, [&](Event const& e) {
    got = e;
    return true;
  });
  boost::json::object f;
  f["stream"] = "stdout";
  log.append("output", f, std::vector<std::uint8_t>{0x00, 0xff, 0x41});
  auto j = got.to_json();
  EXPECT_EQ(j.at("kind").as_string(), "output");
  EXPECT_EQ(j.at("seq").as_uint64(), 1U);
  EXPECT_EQ(j.at("execution_id").as_string(), "ex-9");
  EXPECT_EQ(j.at("stream").as_string(), "stdout");
  EXPECT_EQ(j.at("data_b64").as_string(), "AP9B");
}

TEST(Base64, RoundTripsEveryLengthAndByte) {
  std::vector<std::uint8_t> all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<std::uint8_t>(i));
  for (std::size_t len = 0; len <= all.size(); len += 7) {
    std::vector<std::uint8_t> part(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(len));
    auto enc = custos::core::base64_encode(part);
    EXPECT_EQ(enc.size() % 4, 0U);
    auto dec = custos::core::base64_decode(enc);
    ASSERT_TRUE(dec.has_value());
    EXPECT_EQ(*dec, part);
  }
  EXPECT_EQ(custos::core::base64_encode(bytes("foobar")), "Zm9vYmFy");
  EXPECT_EQ(custos::core::base64_encode(bytes("fo")), "Zm8=");
  EXPECT_FALSE(custos::core::base64_decode("Zm9").has_value());
  EXPECT_FALSE(custos::core::base64_decode("Zm=v").has_value());
  EXPECT_FALSE(custos::core::base64_decode("Z!9v").has_value());
}

}  // namespace
}  // namespace custos::supervisor
