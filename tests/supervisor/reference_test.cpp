// The reference backend through the same supervisor as native executions: the scripted model's
// events, accounting, limits, escalation and terminal record, and its determinism.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

namespace script = core::script;

std::vector<std::uint8_t> bytes(std::string const& s) {
  return {s.begin(), s.end()};
}

class ReferenceTest : public SupervisorTest {
 protected:
  core::ExecutionPlan model(std::vector<core::ScriptStep> steps) {
    auto p = plan({"/bin/true"});
    p.backend.kind = core::BackendKind::reference;
    p.backend.script = core::ReferenceScript{std::move(steps)};
    return p;
  }
  std::vector<std::string> kinds(Collected const& c) {
    std::vector<std::string> k;
    for (auto const& e : c.events) k.push_back(e.kind);
    return k;
  }
};

TEST_F(ReferenceTest, WritesAndExitCodeWalkTheNativeLifecycle) {
  manager();
  Collected c;
  auto st = start(
      model({script::Write{core::ScriptStream::stdout_stream, bytes("out")},
             script::Write{core::ScriptStream::stderr_stream, bytes("err")}, script::Exit{3}}),
      &c);
  EXPECT_EQ(st.boundary, core::Boundary::reference);
  EXPECT_EQ(st.pid, 0);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->exit.code, 3);
  EXPECT_EQ(rec->tree.boundary, core::Boundary::reference);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed);
  EXPECT_EQ(rec->observations.at("model"), "reference");
  EXPECT_EQ(rec->observations.at("steps_run"), "3");
  EXPECT_EQ(c.stream_text("stdout"), "out");
  EXPECT_EQ(c.stream_text("stderr"), "err");
  EXPECT_EQ(kinds(c), (std::vector<std::string>{"started", "output", "output", "exited",
                                                "input_closed", "closed", "terminal"}));
}

TEST_F(ReferenceTest, TheSameScriptGivesTheSameEventsAndTerminal) {
  manager();
  auto const steps = std::vector<core::ScriptStep>{
      script::Write{core::ScriptStream::stdout_stream, std::vector<std::uint8_t>(200000, 'x')},
      script::Spawn{2}, script::Use{7, 1 << 20, std::nullopt, 9}, script::Sleep{5},
      script::Signal{11}};
  std::vector<std::vector<std::string>> seen;
  std::vector<core::TerminalRecord> records;
  for (int i = 0; i < 3; ++i) {
    Collected c;
    auto p = model(steps);
    p.output.chunk_bytes = 4096;
    auto st = start(std::move(p), &c);
    auto rec = terminal(st.execution_id);
    ASSERT_TRUE(rec);
    seen.push_back(kinds(c));
    // Wall time is the daemon's clock: the one field that may differ.
    rec->resources.at(core::ResourceDim::wall).value.reset();
    records.push_back(*rec);
  }
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[1], seen[2]);
  EXPECT_EQ(records[0], records[1]);
  EXPECT_EQ(records[1], records[2]);
  auto const& r = records[0];
  EXPECT_EQ(r.classification, core::Classification::signaled);
  EXPECT_EQ(r.exit.signal, 11);
  // The descendants outlived the root: the kill stage ended them.
  EXPECT_TRUE(r.escalation.forced);
  EXPECT_EQ(r.resources.at(core::ResourceDim::processes).value, 3U);
  EXPECT_EQ(r.resources.at(core::ResourceDim::cpu).value, 7U);
  EXPECT_EQ(r.resources.at(core::ResourceDim::memory).value, 1U << 20);
  EXPECT_EQ(r.resources.at(core::ResourceDim::descriptors).value, 9U);
  EXPECT_EQ(r.output.at(core::Stream::stdout_stream).observed, 200000U);
  // 200000 bytes in 4096-byte chunks: 49 output events, every time.
  EXPECT_EQ(std::count(seen[0].begin(), seen[0].end(), "output"), 49);
}

TEST_F(ReferenceTest, AnIgnoredGracefulSignalIsForcedAfterTheGrace) {
  manager();
  Collected c;
  auto p = model({script::Ignore{15}, script::Sleep{60000}});
  p.escalation.grace_ms = 50;
  auto st = start(std::move(p), &c);
  ASSERT_TRUE(drive([&] { return c.count("started") > 0; }, 5s));
  drive([] { return false; }, 20ms);  // the model reaches its sleep
  auto cancelled = manager_->cancel(st.execution_id, core::Trigger::user, "test");
  ASSERT_TRUE(cancelled && cancelled->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->exit.signal, SIGKILL);
  EXPECT_TRUE(rec->escalation.graceful_sent);
  EXPECT_TRUE(rec->escalation.forced);
  EXPECT_EQ(rec->observations.at("signals_ignored"), "1");
}

TEST_F(ReferenceTest, AGracefulSignalEndsAModelThatDoesNotIgnoreIt) {
  manager();
  Collected c;
  auto st = start(model({script::Sleep{60000}}), &c);
  ASSERT_TRUE(drive([&] { return c.count("started") > 0; }, 5s));
  auto cancelled = manager_->cancel(st.execution_id, core::Trigger::user, "test");
  ASSERT_TRUE(cancelled && cancelled->accepted);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->exit.signal, SIGTERM);
  EXPECT_TRUE(rec->escalation.graceful_sent);
  EXPECT_FALSE(rec->escalation.forced);
}

TEST_F(ReferenceTest, ADeadlineEndsASleepingModel) {
  manager();
  auto p = model({script::Sleep{60000}});
  p.limits.wall_ms = 50;
  auto st = start(std::move(p));
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::timed_out);
  EXPECT_EQ(rec->trigger, core::Trigger::deadline);
}

TEST_F(ReferenceTest, SpawningPastTheProcessLimitIsAResourceLimitAtOnce) {
  manager();
  Collected c;
  auto p = model({script::Spawn{10}, script::Sleep{60000}});
  p.limits.processes = 4;
  auto st = start(std::move(p), &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::resource_limit);
  EXPECT_EQ(rec->resources.at(core::ResourceDim::processes).value, 11U);
  EXPECT_EQ(c.count("limit"), 1U);
}

TEST_F(ReferenceTest, OutputLimitTruncatesAtTheExactByteAndKeepsRunning) {
  manager();
  Collected c;
  auto p = model(
      {script::Write{core::ScriptStream::stdout_stream, bytes("0123456789")}, script::Exit{0}});
  p.limits.output_bytes = 4;
  auto st = start(std::move(p), &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(c.stream_text("stdout"), "0123");
  auto const& out = rec->output.at(core::Stream::stdout_stream);
  EXPECT_EQ(out.observed, 10U);
  EXPECT_EQ(out.retained, 4U);
  EXPECT_FALSE(out.complete);
}

TEST_F(ReferenceTest, ReadStdinWaitsForItsBytesOrTheEnd) {
  manager();
  Collected c;
  auto st = start(
      model({script::ReadStdin{4}, script::Write{core::ScriptStream::stdout_stream, bytes("got")},
             script::ReadStdin{100}, script::Exit{0}}),
      &c);
  ASSERT_TRUE(drive([&] { return c.count("started") > 0; }, 5s));
  drive([] { return false; }, 20ms);
  EXPECT_TRUE(c.stream_text("stdout").empty()) << "wrote before its read was satisfied";
  auto in = bytes("abcd");
  ASSERT_TRUE(manager_->input(st.execution_id, in, false));
  ASSERT_TRUE(drive([&] { return c.stream_text("stdout") == "got"; }, 5s));
  EXPECT_EQ(c.count("exited"), 0U) << "the second read waits for its bytes or the end";
  ASSERT_TRUE(manager_->input(st.execution_id, {}, true));
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  EXPECT_EQ(rec->observations.at("stdin_read"), "4");
}

TEST_F(ReferenceTest, PtyModeWritesBothStreamsToTheTerminal) {
  manager();
  Collected c;
  auto p = model({script::Write{core::ScriptStream::stdout_stream, bytes("a")},
                  script::Write{core::ScriptStream::stderr_stream, bytes("b")}});
  p.io.mode = core::IoMode::pty;
  p.io.rows = 24;
  p.io.cols = 80;
  auto st = start(std::move(p), &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(c.stream_text("pty"), "ab");
  EXPECT_EQ(rec->output.size(), 1U);
  EXPECT_EQ(rec->exit.code, 0);
}

}  // namespace
}  // namespace custos::supervisor::testing
