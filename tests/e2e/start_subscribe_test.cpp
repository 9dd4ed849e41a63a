// exec.start with `subscribe: true` (docs/api.md): one request for a whole run. The answer comes
// first on the connection, then every exec.event of the execution from seq 1, terminal last; a
// connection that goes away drops its subscription and nothing else.
#include <map>
#include <set>

#include "custos/core/base64.hpp"

#include "harness.hpp"

namespace custos::e2e {
namespace {

class StartSubscribe : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.log(); }
  Daemon daemon_;
};

json::object subscribed(json::object params) {
  params["subscribe"] = true;
  return params;
}

std::string request_line(std::int64_t id, std::string_view method, json::object params) {
  return json::serialize(json::object{
      {"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}});
}

// What one subscribed start delivered, line by line, in the order the lines arrived.
struct Stream {
  std::optional<json::object> answer;        // the start's response
  std::size_t lines_before_answer = 0;       // any line at all that came before it
  std::vector<json::object> events;          // exec.event params, in arrival order
  std::map<std::string, std::string> bytes;  // decoded output per stream
  bool terminal = false;
};

// Reads the answer to request `id` (unless the caller read it already: `answer`) and then the
// events up to the terminal one.
Stream read_stream(LineClient& c, std::int64_t id, std::optional<json::object> answer = {},
                   std::chrono::milliseconds timeout = 30s) {
  Stream s;
  s.answer = std::move(answer);
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (!s.terminal && std::chrono::steady_clock::now() < deadline) {
    auto v = c.read_json(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    if (!v) break;
    auto& o = v->as_object();
    if (auto const* rid = o.if_contains("id"); rid != nullptr) {
      if (rid->is_int64() && rid->get_int64() == id) {
        s.answer = std::move(o);
        if (!s.answer->contains("result")) break;  // refused: no events follow
      }
      continue;
    }
    if (!s.answer) {
      ++s.lines_before_answer;
      continue;
    }
    auto const& p = o.at("params").as_object();
    if (p.at("kind").as_string() == "output") {
      auto data = core::base64_decode(p.at("data_b64").as_string());
      if (data) s.bytes[std::string{p.at("stream").as_string()}].append(data->begin(), data->end());
    }
    if (p.at("kind").as_string() == "terminal") s.terminal = true;
    s.events.push_back(p);
  }
  return s;
}

// Every event belongs to `sub` and `id`, seq runs 1, 2, ... without a gap, terminal is last.
void expect_complete_sequence(Stream const& s, std::string const& id, std::string const& sub) {
  ASSERT_FALSE(s.events.empty());
  std::uint64_t expect = 1;
  for (auto const& ev : s.events) {
    EXPECT_EQ(ev.at("subscription").as_string(), sub);
    EXPECT_EQ(ev.at("execution_id").as_string(), id);
    EXPECT_EQ(ev.at("seq").to_number<std::uint64_t>(), expect) << json::serialize(ev);
    EXPECT_FALSE(ev.contains("dropped")) << json::serialize(ev);
    ++expect;
  }
  EXPECT_EQ(s.events.back().at("kind").as_string(), "terminal");
}

TEST_F(StartSubscribe, AnswerFirstThenEverySeqFromOneToTerminal) {
  auto c = daemon_.client();
  ASSERT_TRUE(c.send_line(request_line(
      7, "exec.start",
      subscribed(
          start_params({"/bin/sh", "-c", "printf 'one\\ntwo\\n'; printf err >&2; exit 3"})))));
  auto s = read_stream(c, 7);
  ASSERT_TRUE(s.answer) << "no answer";
  ASSERT_TRUE(s.answer->contains("result")) << json::serialize(*s.answer);
  EXPECT_EQ(s.lines_before_answer, 0U);
  auto const& r = s.answer->at("result").as_object();
  std::string const id{r.at("execution_id").as_string()};
  ASSERT_TRUE(r.at("subscription").is_string()) << json::serialize(r);
  std::string const sub{r.at("subscription").as_string()};
  EXPECT_EQ(r.at("replay_from").to_number<std::uint64_t>(), 1U);
  EXPECT_GT(r.at("pid").to_number<std::int64_t>(), 0);
  ASSERT_TRUE(s.terminal) << "the stream did not reach its terminal event";
  expect_complete_sequence(s, id, sub);
  EXPECT_EQ(s.events.front().at("kind").as_string(), "started");
  EXPECT_EQ(s.bytes["stdout"], "one\ntwo\n");
  EXPECT_EQ(s.bytes["stderr"], "err");
  auto const& t = s.events.back().at("terminal").as_object();
  EXPECT_EQ(t.at("classification").as_string(), "exited");
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 3);

  // The subscription ended with the terminal event: nothing more comes, and it is gone.
  EXPECT_FALSE(c.read_line(300ms)) << "a line after the terminal event";
  auto u = c.call(8, "exec.unsubscribe", {{"subscription", sub}});
  ASSERT_TRUE(u);
  EXPECT_EQ(error_code_of(*u), "rpc.subscription_not_found") << json::serialize(*u);
  // The plan digest does not depend on `subscribe`: the dry run of the same request without it
  // gives the one the start answered.
  auto same = start_params({"/bin/true"});
  auto chk_plain = c.call(9, "exec.check", same);
  auto chk_sub = c.call(10, "exec.check", subscribed(same));
  ASSERT_TRUE(chk_plain && chk_plain->contains("result"));
  ASSERT_TRUE(chk_sub && chk_sub->contains("result")) << json::serialize(*chk_sub);
  EXPECT_EQ(chk_plain->at("result").at("plan_digest"), chk_sub->at("result").at("plan_digest"));
  auto started = c.call(11, "exec.start", subscribed(same));
  ASSERT_TRUE(started && started->contains("result")) << json::serialize(*started);
  EXPECT_EQ(started->at("result").at("plan_digest"), chk_plain->at("result").at("plan_digest"));
}

// The ordering bites: at the moment a start is answered its `started` event already exists (and
// a program that writes at once may have output events too), so an implementation that
// subscribed before answering, or answered after the replay, would put an event first.
TEST_F(StartSubscribe, FirstLineIsTheAnswerEvenWhenTheProgramWritesAtOnce) {
  for (int i = 0; i < 5; ++i) {
    auto c = daemon_.client();
    ASSERT_TRUE(c.send_line(
        request_line(1, "exec.start", subscribed(start_params({"/bin/echo", "immediate"})))));
    auto first = c.read_json(10s);
    ASSERT_TRUE(first) << "no line";
    auto const& o = first->as_object();
    ASSERT_TRUE(o.contains("id")) << "an event came before the answer: " << json::serialize(o);
    ASSERT_TRUE(o.contains("result")) << json::serialize(o);
    std::string const sub{o.at("result").at("subscription").as_string()};
    auto s = read_stream(c, 1, o);
    EXPECT_EQ(s.lines_before_answer, 0U);
    ASSERT_TRUE(s.terminal);
    expect_complete_sequence(s, std::string{o.at("result").at("execution_id").as_string()}, sub);
    EXPECT_EQ(s.bytes["stdout"], "immediate\n");
  }
}

TEST_F(StartSubscribe, OutputBytesEqualWhatTheProgramWrote) {
  // ~590 KB on stdout and a little on stderr, read by a client that keeps up; the default
  // retention (1 MiB per stream) keeps all of it, so nothing is evicted before the answer.
  auto c = daemon_.client();
  ASSERT_TRUE(c.send_line(
      request_line(3, "exec.start",
                   subscribed(start_params({"/bin/sh", "-c", "seq 1 100000; echo done >&2"})))));
  auto s = read_stream(c, 3);
  ASSERT_TRUE(s.answer && s.answer->contains("result"));
  EXPECT_EQ(s.lines_before_answer, 0U);
  ASSERT_TRUE(s.terminal);
  auto const& r = s.answer->at("result").as_object();
  expect_complete_sequence(s, std::string{r.at("execution_id").as_string()},
                           std::string{r.at("subscription").as_string()});
  std::string expected;
  for (int i = 1; i <= 100000; ++i) expected += std::to_string(i) + "\n";
  EXPECT_EQ(s.bytes["stdout"].size(), expected.size());
  EXPECT_TRUE(s.bytes["stdout"] == expected) << "stdout differs from what the program wrote";
  EXPECT_EQ(s.bytes["stderr"], "done\n");
  auto const& t = s.events.back().at("terminal").as_object();
  EXPECT_EQ(t.at("output").at("stdout").at("observed").to_number<std::uint64_t>(), expected.size());
  EXPECT_TRUE(t.at("output").at("stdout").at("complete").as_bool());
}

TEST_F(StartSubscribe, SpawnFailureStreamsToItsTerminal) {
  fs::path const bogus = daemon_.tmp() / "not-a-program";
  {
    std::ofstream f(bogus);
    f << "\x7f"
         "ELF garbage";
  }
  ::chmod(bogus.c_str(), 0755);
  auto c = daemon_.client();
  ASSERT_TRUE(
      c.send_line(request_line(4, "exec.start", subscribed(start_params({bogus.native()})))));
  auto s = read_stream(c, 4);
  ASSERT_TRUE(s.answer && s.answer->contains("result"))
      << (s.answer ? json::serialize(*s.answer) : "");
  EXPECT_EQ(s.lines_before_answer, 0U);
  auto const& r = s.answer->at("result").as_object();
  EXPECT_EQ(r.at("phase").as_string(), "terminal");
  EXPECT_EQ(r.at("pid").to_number<std::int64_t>(), 0);
  ASSERT_TRUE(r.at("subscription").is_string()) << json::serialize(r);
  ASSERT_TRUE(s.terminal) << "no terminal event after a spawn failure";
  expect_complete_sequence(s, std::string{r.at("execution_id").as_string()},
                           std::string{r.at("subscription").as_string()});
  EXPECT_EQ(s.events.back().at("terminal").at("classification").as_string(), "spawn_failed");
  EXPECT_FALSE(c.read_line(300ms)) << "a line after the terminal event";
}

// The execution of `session` on this daemon, found from another connection.
std::optional<std::string> execution_of(LineClient& c, std::string const& session) {
  for (int i = 0; i < 250; ++i) {
    auto l = c.call(900 + i, "exec.list", {{"session_id", session}});
    if (l && l->contains("result")) {
      auto const& ex = l->at("result").at("executions").as_array();
      if (!ex.empty()) return std::string{ex.front().at("execution_id").as_string()};
    }
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

TEST_F(StartSubscribe, DisconnectMidRunLeavesTheExecutionToItsOwnTerminal) {
  auto other = daemon_.client();
  std::string id;
  {
    auto c = daemon_.client();
    ASSERT_TRUE(c.send_line(request_line(
        1, "exec.start",
        subscribed(start_params({"/bin/sh", "-c", "echo a; sleep 1; echo b; exit 7"})))));
    auto first = c.read_json(10s);
    ASSERT_TRUE(first && first->as_object().contains("result"));
    id = std::string{first->at("result").at("execution_id").as_string()};
    // The connection closes here, mid-run.
  }
  std::this_thread::sleep_for(100ms);
  auto g = other.call(2, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running") << json::serialize(*g);
  auto done = wait_record(other, id, [](json::object const& x) { return x.contains("terminal"); });
  ASSERT_TRUE(done && done->contains("terminal"));
  auto const& t = done->at("terminal").as_object();
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 7);
  EXPECT_TRUE(t.at("trigger").is_null()) << json::serialize(t);
  // Its output was not lost with the subscriber: the spool has both lines.
  auto o = other.call(3, "exec.output", {{"execution_id", id}, {"stream", "stdout"}});
  ASSERT_TRUE(o && o->contains("result"));
  EXPECT_EQ(o->at("result").at("data_b64").as_string(), "YQpiCg==");  // "a\nb\n"
}

TEST_F(StartSubscribe, DisconnectBeforeTheAnswerLeavesTheExecutionAlone) {
  // The subscription slot is taken before the start; the connection is gone before the answer.
  auto params = start_params({"/bin/sh", "-c", "sleep 0.5; exit 5"});
  std::string const session = "s-gone-" + unique_suffix();
  params["identity"].as_object()["session_id"] = session;
  {
    auto c = daemon_.client();
    ASSERT_TRUE(c.send_line(request_line(1, "exec.start", subscribed(std::move(params)))));
  }
  auto other = daemon_.client();
  auto id = execution_of(other, session);
  ASSERT_TRUE(id) << "the start did not happen";
  auto done = wait_record(other, *id, [](json::object const& x) { return x.contains("terminal"); });
  ASSERT_TRUE(done && done->contains("terminal"));
  EXPECT_EQ(done->at("terminal").at("classification").as_string(), "exited");
  EXPECT_EQ(done->at("terminal").at("exit").at("code").as_int64(), 5);
  EXPECT_TRUE(daemon_.alive());
}

TEST_F(StartSubscribe, UnsubscribeStopsTheEventsNotTheExecution) {
  auto c = daemon_.client();
  ASSERT_TRUE(c.send_line(request_line(
      1, "exec.start",
      subscribed(
          start_params({"/bin/sh", "-c",
                        "i=0; while [ $i -lt 15 ]; do echo $i; sleep 0.05; i=$((i+1)); done"})))));
  auto first = c.read_json(10s);
  ASSERT_TRUE(first && first->as_object().contains("result")) << json::serialize(*first);
  std::string const id{first->at("result").at("execution_id").as_string()};
  std::string const sub{first->at("result").at("subscription").as_string()};
  auto u = c.call(2, "exec.unsubscribe", {{"subscription", sub}});
  ASSERT_TRUE(u && u->contains("result")) << (u ? json::serialize(*u) : "");
  c.events.clear();  // events queued before the unsubscribe answer may precede it
  auto w = c.call(3, "exec.wait", {{"execution_id", id}}, 20000ms);
  ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "");
  EXPECT_EQ(w->at("result").at("classification").as_string(), "exited");
  EXPECT_EQ(w->at("result").at("exit").at("code").as_int64(), 0);
  EXPECT_TRUE(c.events.empty()) << c.events.size() << " events after exec.unsubscribe answered: "
                                << json::serialize(c.events.front());
  EXPECT_FALSE(c.read_line(300ms));
}

TEST_F(StartSubscribe, RefusedInsideABatchAndAsANotificationWithNoEffect) {
  std::string const session = "s-batch-" + unique_suffix();
  auto with_session = [&](json::object p) {
    p["identity"].as_object()["session_id"] = session;
    return subscribed(std::move(p));
  };
  auto c = daemon_.client();
  json::array batch{json::object{{"jsonrpc", "2.0"},
                                 {"id", 1},
                                 {"method", "exec.start"},
                                 {"params", with_session(start_params({"/bin/true"}))}},
                    json::object{{"jsonrpc", "2.0"},
                                 {"id", 2},
                                 {"method", "exec.check"},
                                 {"params", with_session(start_params({"/bin/true"}))}}};
  ASSERT_TRUE(c.send_line(json::serialize(batch)));
  auto answer = c.read_json(10s);
  ASSERT_TRUE(answer && answer->is_array()) << (answer ? json::serialize(*answer) : "no answer");
  auto const& arr = answer->as_array();
  ASSERT_EQ(arr.size(), 2U);
  auto const& refused = arr[0].as_object();
  EXPECT_EQ(error_code_of(refused), "rpc.invalid_params") << json::serialize(refused);
  EXPECT_EQ(error_number_of(refused), -32602);
  auto const& diags = refused.at("error").at("data").at("detail").at("diagnostics").as_array();
  ASSERT_EQ(diags.size(), 1U);
  EXPECT_EQ(diags[0].at("pointer").as_string(), "/subscribe");
  // The dry run accepts and ignores the flag, in a batch as anywhere.
  EXPECT_TRUE(arr[1].as_object().contains("result")) << json::serialize(arr[1]);

  // As a notification: nobody would hear the answer that must precede the events.
  json::object note{{"jsonrpc", "2.0"},
                    {"method", "exec.start"},
                    {"params", with_session(start_params({"/bin/true"}))}};
  ASSERT_TRUE(c.send_line(json::serialize(note)));
  // A wrong type is refused the same way, with its pointer, by exec.start and exec.check.
  for (char const* method : {"exec.start", "exec.check"}) {
    auto p = start_params({"/bin/true"});
    p["identity"].as_object()["session_id"] = session;
    p["subscribe"] = "yes";
    auto r = c.call(3, method, std::move(p));
    ASSERT_TRUE(r);
    EXPECT_EQ(error_code_of(*r), "rpc.invalid_params") << method << json::serialize(*r);
    EXPECT_EQ(
        r->at("error").at("data").at("detail").at("diagnostics").at(0).at("pointer").as_string(),
        "/subscribe");
  }
  std::this_thread::sleep_for(300ms);
  auto l = c.call(4, "exec.list", {{"session_id", session}});
  ASSERT_TRUE(l && l->contains("result"));
  EXPECT_TRUE(l->at("result").at("executions").as_array().empty())
      << "a refused start had an effect: " << json::serialize(*l);
}

TEST_F(StartSubscribe, NeverReadingSubscriberGetsTheAnswerFirstAndTheTerminalWithItsDropCount) {
  // The same bounds as exec.subscribe (tests/e2e/slow_subscriber_test.cpp): ~24 MiB of output
  // to a connection that reads nothing until the execution has ended.
  auto slow = daemon_.client();
  std::string const session = "s-slow-" + unique_suffix();
  auto params = start_params({"/bin/sh", "-c", "head -c 25000000 /dev/zero"});
  params["identity"].as_object()["session_id"] = session;
  ASSERT_TRUE(slow.send_line(request_line(1, "exec.start", subscribed(std::move(params)))));
  auto other = daemon_.client();
  auto id = execution_of(other, session);
  ASSERT_TRUE(id);
  auto w = other.call(2, "exec.wait", {{"execution_id", *id}}, 60000ms);
  ASSERT_TRUE(w && w->contains("result"));

  auto first = slow.read_json(10s);
  ASSERT_TRUE(first && first->as_object().contains("result"))
      << (first ? json::serialize(*first) : "no line");
  auto const replay_from = first->at("result").at("replay_from").to_number<std::uint64_t>();
  std::uint64_t first_seq = 0, last_seq = 0, dropped_total = 0, delivered = 0;
  bool terminal = false;
  while (!terminal) {
    auto v = slow.read_json(5000ms);
    ASSERT_TRUE(v) << "the stream ended before its terminal event";
    auto const& p = v->at("params").as_object();
    auto const seq = p.at("seq").to_number<std::uint64_t>();
    if (first_seq == 0) first_seq = seq;
    ++delivered;
    if (auto const* dr = p.if_contains("dropped")) dropped_total += dr->to_number<std::uint64_t>();
    last_seq = seq;
    terminal = p.at("kind").as_string() == "terminal";
  }
  EXPECT_EQ(first_seq, replay_from);
  EXPECT_GT(dropped_total, 0U);
  EXPECT_EQ(delivered + dropped_total, last_seq - first_seq + 1);
}

}  // namespace
}  // namespace custos::e2e
