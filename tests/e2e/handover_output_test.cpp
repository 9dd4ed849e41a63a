// The handover keeps every byte (docs/supervisor.md, "Handover"): the old image gives each live
// execution's stdio descriptors to the new one across the execve, with where its streams, its
// input and its events stood. Programs writing through the handover lose nothing and see no
// error; input given before it still arrives; a subscriber that reconnects with from_seq gets
// every event after the last one it saw, with no gap and no repeat.
#include <algorithm>
#include <fstream>
#include <map>
#include <string>

#include "harness.hpp"

namespace custos::e2e {
namespace {

// A program whose output spans the handover: `batches` runs of seq with a pause between
// them, so it is still writing while the images change. Its whole output, for comparison.
std::vector<std::string> batch_writer(int batches, int lines, char const* pause) {
  return {"/bin/sh", "-c",
          "i=0; while [ $i -lt " + std::to_string(batches) + " ]; do seq $((i*" +
              std::to_string(lines) + ")) $((i*" + std::to_string(lines) + "+" +
              std::to_string(lines - 1) + ")); echo e$i >&2; sleep " + pause +
              "; i=$((i+1)); done"};
}

std::string batch_stdout(int batches, int lines) {
  std::string out;
  for (int i = 0; i < batches * lines; ++i) out += std::to_string(i) + "\n";
  return out;
}

std::string batch_stderr(int batches) {
  std::string out;
  for (int i = 0; i < batches; ++i) out += "e" + std::to_string(i) + "\n";
  return out;
}

std::string started_id(std::optional<json::object> const& r) {
  if (!r || !r->contains("result")) {
    ADD_FAILURE() << "exec.start: " << (r ? json::serialize(*r) : "no reply");
    return {};
  }
  return std::string{r->at("result").at("execution_id").as_string()};
}

// The events a subscription delivered, read until the connection closes or `until` arrives.
struct Collected {
  std::vector<json::object> events;
  bool closed = false;
};
Collected collect(LineClient& c, std::string const& until, std::chrono::milliseconds timeout) {
  Collected out;
  for (auto& e : c.events) {
    if (e.contains("method")) out.events.push_back(e.at("params").as_object());
  }
  c.events.clear();
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!out.events.empty() && out.events.back().at("kind").as_string() == until) return out;
    auto v = c.read_json(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    if (!v) {
      out.closed = true;
      return out;
    }
    if (v->is_object() && v->as_object().contains("method"))
      out.events.push_back(v->at("params").as_object());
  }
  return out;
}

std::string output_data(std::vector<json::object> const& events, std::string const& stream) {
  std::string out;
  for (auto const& e : events) {
    if (e.at("kind").as_string() != "output" || e.at("stream").as_string() != stream) continue;
    auto data = core::base64_decode(e.at("data_b64").as_string());
    if (data) out.append(data->begin(), data->end());
  }
  return out;
}

TEST(HandoverOutput, StreamsInputAndEventsGoOnWithNothingLost) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  constexpr int kBatches = 30;
  constexpr int kLines = 2000;
  auto const writer =
      started_id(c.call(1, "exec.start", start_params(batch_writer(kBatches, kLines, "0.1"))));
  // Input given before the handover and after it: `cat` echoes both, in order.
  auto const echo = started_id(c.call(2, "exec.start", start_params({"/bin/cat"})));
  // A terminal: its master goes across too.
  auto const tty = started_id(c.call(
      3, "exec.start",
      start_params({"/bin/sh", "-c", "for i in $(seq 1 40); do echo tty$i; sleep 0.05; done"}, {},
                   {{"mode", "pty"}})));
  ASSERT_FALSE(writer.empty() || echo.empty() || tty.empty());
  auto in1 = c.call(4, "exec.input",
                    {{"execution_id", echo}, {"data_b64", core::base64_encode("before\n")}});
  ASSERT_TRUE(in1 && in1->contains("result")) << (in1 ? json::serialize(*in1) : "");

  // A subscriber of the writer, from seq 1, reading until the handover closes its connection.
  auto sub = d.client();
  auto s = sub.call(5, "exec.subscribe", {{"execution_id", writer}, {"from_seq", 1}});
  ASSERT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "");
  std::this_thread::sleep_for(600ms);  // some batches before the handover

  auto const before = started_ns(d);
  ASSERT_TRUE(d.signal(SIGHUP));
  auto first = collect(sub, "terminal", 30s);
  ASSERT_TRUE(first.closed) << "the handover closes client connections";
  ASSERT_FALSE(first.events.empty());
  ASSERT_TRUE(await_handover(d, before)) << d.log();

  // The subscriber reconnects and resumes right after the last event it saw.
  std::uint64_t const last = first.events.back().at("seq").to_number<std::uint64_t>();
  auto sub2 = d.client();
  auto s2 = sub2.call(6, "exec.subscribe", {{"execution_id", writer}, {"from_seq", last + 1}});
  ASSERT_TRUE(s2 && s2->contains("result")) << (s2 ? json::serialize(*s2) : "") << d.log();
  EXPECT_EQ(s2->at("result").at("replay_from").to_number<std::uint64_t>(), last + 1)
      << "no event was lost: the new image retained them";
  auto second = collect(sub2, "terminal", 60s);
  ASSERT_FALSE(second.events.empty());
  EXPECT_EQ(second.events.back().at("kind").as_string(), "terminal");

  // One numbered log across both images: 1, 2, ... with no gap and no repeat, `adopted` once
  // (saying the output was kept) where the images changed.
  std::vector<json::object> all = first.events;
  all.insert(all.end(), second.events.begin(), second.events.end());
  int adopted = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].at("seq").to_number<std::uint64_t>(), i + 1) << json::serialize(all[i]);
    if (all[i].at("kind").as_string() == "adopted") {
      ++adopted;
      EXPECT_EQ(all[i].at("output").as_string(), "kept") << json::serialize(all[i]);
    }
  }
  EXPECT_EQ(adopted, 1);
  EXPECT_EQ(output_data(all, "stdout"), batch_stdout(kBatches, kLines))
      << "the events carry every byte once";

  auto c2 = d.client();
  auto in2 = c2.call(
      7, "exec.input",
      {{"execution_id", echo}, {"data_b64", core::base64_encode("after\n")}, {"eof", true}});
  ASSERT_TRUE(in2 && in2->contains("result")) << (in2 ? json::serialize(*in2) : "") << d.log();

  for (auto const& id : {writer, echo, tty}) {
    auto w = c2.call(8, "exec.wait", {{"execution_id", id}, {"timeout_ms", 30000}}, 40s);
    ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "") << d.log();
    auto const& t = w->at("result").as_object();
    EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
    EXPECT_EQ(t.at("exit").at("code").as_int64(), 0) << json::serialize(t);
    EXPECT_EQ(t.at("recovery").as_string(), "live_owned") << json::serialize(t);
    for (auto const& [stream, acc] : t.at("output").as_object()) {
      EXPECT_TRUE(acc.at("complete").as_bool()) << id << " " << stream << json::serialize(t);
      EXPECT_EQ(acc.at("dropped").as_int64(), 0) << json::serialize(t);
    }
  }
  bool complete = false;
  auto const out = output_of(c2, writer, "stdout", &complete);
  EXPECT_EQ(out.size(), batch_stdout(kBatches, kLines).size());
  EXPECT_EQ(out, batch_stdout(kBatches, kLines)) << "the spool has every byte, in order, once";
  EXPECT_TRUE(complete);
  EXPECT_EQ(output_of(c2, writer, "stderr"), batch_stderr(kBatches));
  EXPECT_EQ(output_of(c2, echo, "stdout"), "before\nafter\n");
  std::string expected_tty;
  for (int i = 1; i <= 40; ++i) expected_tty += "tty" + std::to_string(i) + "\r\n";
  EXPECT_EQ(output_of(c2, tty, "pty"), expected_tty);
}

// Failpoint builds: the new image fails its start after it adopted the executions, and the old
// one is executed again. What the new image had taken over goes back with the fallback, so the
// programs write on and read on through both changes of image with nothing lost.
TEST(HandoverOutput, AFallbackToTheOldImageKeepsTheOutputToo) {
  DaemonOptions o;
  o.env = {"CUSTOS_FAILPOINT=handover_start_fails"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  constexpr int kBatches = 20;
  constexpr int kLines = 500;
  auto const writer =
      started_id(c.call(1, "exec.start", start_params(batch_writer(kBatches, kLines, "0.1"))));
  auto const echo = started_id(c.call(2, "exec.start", start_params({"/bin/cat"})));
  ASSERT_FALSE(writer.empty() || echo.empty());
  auto in1 = c.call(3, "exec.input",
                    {{"execution_id", echo}, {"data_b64", core::base64_encode("before\n")}});
  ASSERT_TRUE(in1 && in1->contains("result")) << (in1 ? json::serialize(*in1) : "");
  std::this_thread::sleep_for(500ms);

  auto const before = started_ns(d);
  ASSERT_TRUE(d.signal(SIGHUP));
  ASSERT_TRUE(await_handover(d, before)) << d.log();
  auto c2 = d.client();
  auto h = c2.call(4, "host.info");
  ASSERT_TRUE(h && h->contains("result"));
  auto const& ho = h->at("result").at("handover");
  ASSERT_TRUE(ho.is_object()) << json::serialize(ho);
  if (!ho.at("fallback").as_bool()) GTEST_SKIP() << "not a failpoint build: the new image started";

  auto in2 = c2.call(
      5, "exec.input",
      {{"execution_id", echo}, {"data_b64", core::base64_encode("after\n")}, {"eof", true}});
  ASSERT_TRUE(in2 && in2->contains("result")) << (in2 ? json::serialize(*in2) : "") << d.log();
  for (auto const& id : {writer, echo}) {
    auto w = c2.call(6, "exec.wait", {{"execution_id", id}, {"timeout_ms", 30000}}, 40s);
    ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "") << d.log();
    auto const& t = w->at("result").as_object();
    EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
    EXPECT_EQ(t.at("exit").at("code").as_int64(), 0) << json::serialize(t);
    for (auto const& [stream, acc] : t.at("output").as_object()) {
      EXPECT_TRUE(acc.at("complete").as_bool()) << id << " " << stream << json::serialize(t);
    }
  }
  EXPECT_EQ(output_of(c2, writer, "stdout"), batch_stdout(kBatches, kLines));
  EXPECT_EQ(output_of(c2, writer, "stderr"), batch_stderr(kBatches));
  EXPECT_EQ(output_of(c2, echo, "stdout"), "before\nafter\n");
}

// A program writing until `stop` exists: batches of `lines` numbers on stdout, each followed by
// one line on stderr. Whatever it wrote, its stdout must be batch_stdout(its stderr's lines).
std::vector<std::string> writer_until(fs::path const& stop, int lines) {
  auto const l = std::to_string(lines);
  return {"/bin/sh", "-c",
          "i=0; while [ ! -e " + stop.native() + " ]; do seq $((i*" + l + ")) $((i*" + l + "+" +
              std::to_string(lines - 1) + ")); echo e$i >&2; sleep 0.5; i=$((i+1)); done"};
}

// 200 live executions writing continuously through the handover (one in four on a terminal):
// each one's byte count and content are the same on both sides, each ends with one terminal
// record, and nothing is left behind.
TEST(HandoverOutput, TwoHundredWritersLoseNoByte) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  constexpr int kExecutions = 200;
  constexpr int kLines = 100;
  TempDir flags{"/var/tmp"};
  auto const stop = flags.path() / "stop";
  auto c = d.client();
  std::map<std::string, bool> ids;  // id -> on a terminal
  for (int i = 0; i < kExecutions; ++i) {
    bool const pty = i % 4 == 3;
    auto params =
        start_params(writer_until(stop, kLines), {},
                     pty ? json::object{{"mode", "pty"}} : json::object{{"mode", "pipes"}});
    auto const id = started_id(c.call(100 + i, "exec.start", std::move(params), 30s));
    ASSERT_FALSE(id.empty()) << d.log();
    ids.emplace(id, pty);
  }
  auto const before = started_ns(d);
  ASSERT_TRUE(d.signal(SIGHUP));
  ASSERT_TRUE(await_handover(d, before)) << d.log();
  std::this_thread::sleep_for(500ms);  // writing on under the new image
  { std::ofstream{stop}; }

  auto c2 = d.client();
  int carried = 0;
  for (auto const& [id, pty] : ids) {
    auto w = c2.call(1, "exec.wait", {{"execution_id", id}, {"timeout_ms", 60000}}, 70s);
    ASSERT_TRUE(w && w->contains("result")) << id << (w ? json::serialize(*w) : "") << d.log();
    auto const& t = w->at("result").as_object();
    EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
    EXPECT_EQ(t.at("exit").at("code").as_int64(), 0) << json::serialize(t);
    auto const* rec = t.if_contains("recovery");
    if (rec != nullptr && rec->is_string() && rec->get_string() == "live_owned") ++carried;
    std::string out;
    std::string err;
    if (pty) {
      auto const all = output_of(c2, id, "pty");
      EXPECT_EQ(t.at("output").at("pty").at("observed").as_int64(),
                static_cast<std::int64_t>(all.size()));
      EXPECT_TRUE(t.at("output").at("pty").at("complete").as_bool()) << json::serialize(t);
      // A terminal merges both streams, each line ending in \r\n: split them again.
      std::size_t pos = 0;
      while (pos < all.size()) {
        auto const nl = all.find("\r\n", pos);
        auto const line = all.substr(pos, nl - pos);
        (!line.empty() && line[0] == 'e' ? err : out) += line + "\n";
        if (nl == std::string::npos) break;
        pos = nl + 2;
      }
    } else {
      out = output_of(c2, id, "stdout");
      err = output_of(c2, id, "stderr");
      EXPECT_EQ(t.at("output").at("stdout").at("observed").as_int64(),
                static_cast<std::int64_t>(out.size()))
          << json::serialize(t);
      EXPECT_TRUE(t.at("output").at("stdout").at("complete").as_bool()) << json::serialize(t);
      EXPECT_TRUE(t.at("output").at("stderr").at("complete").as_bool()) << json::serialize(t);
    }
    auto const batches = static_cast<int>(std::count(err.begin(), err.end(), '\n'));
    EXPECT_GT(batches, 0) << id;
    EXPECT_EQ(err, batch_stderr(batches)) << id;
    EXPECT_EQ(out, batch_stdout(batches, kLines)) << id << ": every byte once, in order";
  }
  EXPECT_EQ(carried, kExecutions) << "every writer was live at the handover";
}

// The resource watch goes on across a handover: the workspace's disk growth still counts from the
// launch (2 MiB before and 2 MiB after cross a 3 MiB limit, which a baseline taken again by the
// new image would not see), and the peaks sampled before (seven processes) stay in the report.
TEST(HandoverOutput, TheDiskLimitAndThePeaksGoOnAcrossAHandover) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  TempDir ws{"/var/tmp"};
  auto const gate = (ws.path() / "gate").native();
  auto p = start_params(
      {"/bin/sh", "-c",
       "for i in 1 2 3 4 5 6; do sleep 1 & done; head -c 2097152 /dev/zero > a; "
       "while [ ! -e gate ]; do sleep 0.05; done; head -c 2097152 /dev/zero > b; sleep 8"},
      {{"disk_bytes", 3 << 20}});
  p["plan"].as_object()["workspace"] =
      json::object{{"root", ws.path().native()}, {"access", "writable"}};
  auto c = d.client();
  auto const id = started_id(c.call(1, "exec.start", p));
  ASSERT_FALSE(id.empty());
  std::this_thread::sleep_for(1500ms);  // the seven processes sampled, the first 2 MiB written
  auto const before = started_ns(d);
  ASSERT_TRUE(d.signal(SIGHUP));
  ASSERT_TRUE(await_handover(d, before)) << d.log();
  { std::ofstream{gate}; }
  auto c2 = d.client();
  auto w = c2.call(2, "exec.wait", {{"execution_id", id}, {"timeout_ms", 30000}}, 40000ms);
  ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "no reply");
  auto const& t = w->at("result").as_object();
  EXPECT_EQ(t.at("classification").as_string(), "resource_limit") << json::serialize(t);
  auto const& r = t.at("resources").as_object();
  EXPECT_GE(r.at("processes").at("value").to_number<std::int64_t>(), 7) << json::serialize(r);
  EXPECT_GE(r.at("disk_bytes").at("value").to_number<std::int64_t>(), 3 << 20)
      << json::serialize(r);
}

}  // namespace
}  // namespace custos::e2e
