// A subscriber that reads nothing until its execution has ended: the events beyond its budget
// are dropped, but the terminal event is always queued, so it learns that the stream ended and,
// from `dropped` and the seq gap on that event, exactly what it lost (docs/api.md).
#include "harness.hpp"

namespace custos::e2e {
namespace {

TEST(SlowSubscriber, TerminalEventArrivesWithTheDropCount) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  // ~24 MiB of output: far beyond the 1 MiB event budget of the never-reading connection.
  auto r = c.call(1, "exec.start", start_params({"/bin/sh", "-c", "head -c 25000000 /dev/zero"}));
  ASSERT_TRUE(r && r->contains("result"));
  std::string const id{r->at("result").at("execution_id").as_string()};
  auto slow = d.client();
  ASSERT_TRUE(slow.send_line(json::serialize(
      json::object{{"jsonrpc", "2.0"},
                   {"id", 1},
                   {"method", "exec.subscribe"},
                   {"params", json::object{{"execution_id", id}, {"from_seq", 1}}}})));
  auto w = c.call(2, "exec.wait", {{"execution_id", id}}, 60000ms);
  ASSERT_TRUE(w && w->contains("result"));

  std::uint64_t first_seq = 0, last_seq = 0, gaps = 0, dropped_total = 0, delivered = 0;
  std::optional<json::object> terminal;
  for (;;) {
    auto v = slow.read_json(3000ms);
    if (!v) break;
    auto const& o = v->as_object();
    if (!o.contains("method")) continue;
    auto const& p = o.at("params").as_object();
    auto const seq = p.at("seq").to_number<std::uint64_t>();
    if (first_seq == 0) first_seq = seq;
    ++delivered;
    if (last_seq != 0 && seq != last_seq + 1) ++gaps;
    if (auto const* dr = p.if_contains("dropped")) dropped_total += dr->to_number<std::uint64_t>();
    last_seq = seq;
    if (p.at("kind").as_string() == "terminal") {
      terminal = p;
      break;
    }
  }
  ASSERT_TRUE(terminal) << "the terminal event never reached the slow subscriber";
  EXPECT_EQ(terminal->at("execution_id").as_string(), id);
  ASSERT_TRUE(terminal->contains("dropped"));
  EXPECT_GT(terminal->at("dropped").to_number<std::uint64_t>(), 0U);
  EXPECT_GT(gaps, 0U);
  // The count is exact: every seq from the first delivered one to the terminal one was either
  // delivered or counted in a `dropped`.
  EXPECT_EQ(delivered + dropped_total, last_seq - first_seq + 1);
}

TEST(SlowSubscriber, HalfClosedSubscriberIsClosedAfterItsTerminalEvent) {
  // A client that subscribes and then shuts down its sending side still gets every event; once
  // the subscription has ended with the terminal event and nothing is left to send, the daemon
  // closes the connection (it does not linger until the idle timeout).
  Daemon d{DaemonOptions{{"--idle-timeout-ms", "30000"}, true, {}, {}, {}}};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto r = c.call(1, "exec.start", start_params({"/bin/sh", "-c", "echo hi; sleep 0.3"}));
  ASSERT_TRUE(r && r->contains("result"));
  std::string const id{r->at("result").at("execution_id").as_string()};
  auto sub = d.client();
  ASSERT_TRUE(sub.send_line(json::serialize(
      json::object{{"jsonrpc", "2.0"},
                   {"id", 1},
                   {"method", "exec.subscribe"},
                   {"params", json::object{{"execution_id", id}, {"from_seq", 1}}}})));
  sub.shutdown_write();
  bool replied = false, terminal = false;
  while (!terminal) {
    auto v = sub.read_json(10000ms);
    ASSERT_TRUE(v) << "the connection ended before the terminal event";
    auto const& o = v->as_object();
    if (o.contains("result")) replied = true;
    if (o.contains("method") && o.at("params").at("kind").as_string() == "terminal")
      terminal = true;
  }
  EXPECT_TRUE(replied);
  auto const t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(sub.closed_by_peer(5000ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

}  // namespace
}  // namespace custos::e2e
