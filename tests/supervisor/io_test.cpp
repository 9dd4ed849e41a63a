// Bounded I/O: output floods against each limit with exact accounting, bounded stdin, PTY
// resize allowed/refused, and a terminal nobody reads that must not block cancellation.
#include <algorithm>
#include <fcntl.h>

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

std::uint64_t output_bytes_in_events(Collected const& c, std::string_view stream) {
  return c.stream_text(stream).size();
}

TEST_F(SupervisorTest, OutputBytesLimitTruncatesWithExactAccounting) {
  manager();
  Collected c;
  auto p = plan({"/usr/bin/head", "-c", "1000000", "/dev/zero"});
  p.limits.output_bytes = 100000;
  p.output.on_limit = core::OnLimit::truncate;
  auto st = start(p, &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->exit.code, 0);
  auto const& a = rec->output.at(core::Stream::stdout_stream);
  EXPECT_EQ(a.observed, 1000000U);
  EXPECT_EQ(a.retained, 100000U);
  EXPECT_EQ(a.dropped, 900000U);
  EXPECT_FALSE(a.complete);
  EXPECT_EQ(output_bytes_in_events(c, "stdout"), 100000U);
  EXPECT_GE(c.count("limit"), 1U);
  auto out = manager_->output(st.execution_id, core::Stream::stdout_stream, 0, 1 << 20);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->data.size(), 100000U);
  EXPECT_FALSE(out->complete);
  EXPECT_TRUE(out->eof);
  EXPECT_EQ(rec->resources.at(core::ResourceDim::output).value, 1000000U);
}

TEST_F(SupervisorTest, SpoolBytesLimitTruncatesPerStream) {
  manager();
  Collected c;
  auto p = sh("head -c 300000 /dev/zero; head -c 1000 /dev/zero >&2");
  p.limits.output_bytes = std::nullopt;
  p.output.spool_bytes = 50000;
  auto st = start(p, &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  auto const& o = rec->output.at(core::Stream::stdout_stream);
  EXPECT_EQ(o.observed, 300000U);
  EXPECT_EQ(o.retained, 50000U);
  EXPECT_EQ(o.dropped, 250000U);
  EXPECT_FALSE(o.complete);
  auto const& e = rec->output.at(core::Stream::stderr_stream);
  EXPECT_EQ(e, (core::StreamAccounting{1000, 1000, 0, true}));
  // Live events still carried everything within output_bytes (here unlimited), each at its
  // offset in the stream.
  EXPECT_EQ(output_bytes_in_events(c, "stdout"), 300000U);
  std::uint64_t at = 0;
  for (auto const& ev : c.events) {
    if (ev.kind != "output" || ev.fields.at("stream").as_string() != "stdout") continue;
    EXPECT_EQ(ev.fields.at("offset").to_number<std::uint64_t>(), at);
    at += ev.data.size();
  }
}

TEST_F(SupervisorTest, OutputLimitWithCancelPolicyStopsTheFlood) {
  manager();
  auto p = plan({"/usr/bin/yes"});
  p.limits.output_bytes = 100000;
  p.output.on_limit = core::OnLimit::cancel;
  auto st = start(p);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::output_limit);
  EXPECT_EQ(rec->trigger, core::Trigger::output_limit);
  auto const& a = rec->output.at(core::Stream::stdout_stream);
  EXPECT_EQ(a.retained, 100000U);
  EXPECT_GT(a.observed, 100000U);
  EXPECT_EQ(a.observed, a.retained + a.dropped);
  EXPECT_FALSE(a.complete);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
}

TEST_F(SupervisorTest, ChunkAndMaxEventsBounds) {
  manager();
  Collected c;
  auto p = plan({"/usr/bin/head", "-c", "50000", "/dev/zero"});
  p.output.chunk_bytes = 1000;
  p.output.max_events = 5;
  auto st = start(p, &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  std::size_t outputs = 0;
  for (auto const& e : c.events) {
    if (e.kind != "output") continue;
    ++outputs;
    EXPECT_LE(e.data.size(), 1000U);
  }
  EXPECT_EQ(outputs, 5U);
  bool reported = false;
  for (auto const& e : c.events) {
    if (e.kind == "limit" && e.fields.at("limit").as_string() == "max_events") reported = true;
  }
  EXPECT_TRUE(reported);
  // The spool still holds everything: suppressed events drop nothing.
  EXPECT_EQ(rec->output.at(core::Stream::stdout_stream),
            (core::StreamAccounting{50000, 50000, 0, true}));
  auto out = manager_->output(st.execution_id, core::Stream::stdout_stream, 49000, 5000);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->data.size(), 1000U);
  EXPECT_TRUE(out->eof);
}

TEST_F(SupervisorTest, RetainedEventReplayIsBoundedButSeqKeepsCounting) {
  manager();
  auto p = plan({"/usr/bin/head", "-c", "200000", "/dev/zero"});
  p.output.chunk_bytes = 1000;
  p.output.retained_bytes = 10000;
  auto st = start(p);
  ASSERT_TRUE(terminal(st.execution_id));
  Collected late;
  auto h = manager_->subscribe(st.execution_id, std::uint64_t{1}, [&](Event const& e) {
    late.events.push_back(e);
    return true;
  });
  ASSERT_TRUE(h);
  EXPECT_GT(h->replay_from, 1U);
  std::uint64_t data = 0;
  for (std::size_t i = 0; i < late.events.size(); ++i) {
    data += late.events[i].data.size();
    if (i > 0) {
      EXPECT_EQ(late.events[i].seq, late.events[i - 1].seq + 1);
    }
  }
  EXPECT_LE(data, 10000U + 1000U);
  EXPECT_EQ(late.events.back().kind, "terminal");
}

TEST_F(SupervisorTest, StdinIsBoundedAndEofCloses) {
  manager();
  Collected c;
  auto p = plan({"/bin/cat"});
  p.limits.stdin_bytes = 10;
  auto st = start(p, &c);
  std::vector<std::uint8_t> five{'a', 'b', 0, 'd', 0xff};
  auto r1 = manager_->input(st.execution_id, five, false);
  ASSERT_TRUE(r1);
  EXPECT_EQ(*r1, 5U);
  std::vector<std::uint8_t> six(6, 'x');
  auto r2 = manager_->input(st.execution_id, six, false);
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().code, Errc::exec_input_limit);
  auto r3 = manager_->input(st.execution_id, five, true);
  ASSERT_TRUE(r3);
  EXPECT_EQ(*r3, 5U);
  auto r4 = manager_->input(st.execution_id, {}, false);
  ASSERT_FALSE(r4);
  EXPECT_EQ(r4.error().code, Errc::exec_input_closed);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  std::string expected{'a', 'b', '\0', 'd', '\xff', 'a', 'b', '\0', 'd', '\xff'};
  EXPECT_EQ(c.stream_text("stdout"), expected);
  EXPECT_EQ(c.count("input_closed"), 1U);
}

TEST_F(SupervisorTest, StdinQueueIsBoundedInMemory) {
  manager(BoundaryPreference::automatic, [](ManagerConfig& cfg) { cfg.stdin_queue_bytes = 4096; });
  // The child does not read for a while: the pipe (64 KiB) fills, then the queue (4 KiB).
  auto p = sh("sleep 0.5; cat >/dev/null");
  p.limits.stdin_bytes = 1 << 20;
  auto st = start(p);
  std::vector<std::uint8_t> block(16384, 'z');
  std::uint64_t total = 0;
  std::uint64_t last_take = 1;
  for (int i = 0; i < 40; ++i) {
    auto r = manager_->input(st.execution_id, block, false);
    ASSERT_TRUE(r);
    EXPECT_LE(*r, 4096U);  // never more than the queue bound at once
    total += *r;
    last_take = *r;
  }
  // Pipe capacity (64 KiB) + the 4 KiB queue were taken, then nothing more: the memory held
  // for a child that does not read is bounded.
  EXPECT_EQ(last_take, 0U);
  EXPECT_LE(total, 65536U + 4096U);
  auto last = manager_->input(st.execution_id, {}, true);
  ASSERT_TRUE(last);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
}

TEST_F(SupervisorTest, ResizeOnPipesIsNotPty) {
  manager();
  auto st = start(plan({"/bin/sleep", "100"}));
  auto r = manager_->resize(st.execution_id, 40, 100);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::exec_not_pty);
  (void)manager_->cancel(st.execution_id, core::Trigger::user, "done");
  ASSERT_TRUE(terminal(st.execution_id));
}

core::ExecutionPlan pty_plan(core::ExecutionPlan p, bool resize) {
  p.io.mode = core::IoMode::pty;
  p.io.rows = 24;
  p.io.cols = 80;
  p.io.resize = resize;
  return p;
}

TEST_F(SupervisorTest, PtyResizeAllowed) {
  manager();
  Collected c;
  auto st = start(pty_plan(sh("stty size; sleep 0.3; stty size"), true), &c);
  auto r = manager_->resize(st.execution_id, 33, 101);
  ASSERT_TRUE(r) << r.error().message();
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  std::string const text = c.stream_text("pty");
  EXPECT_NE(text.find("33 101"), std::string::npos) << text;
  EXPECT_TRUE(rec->output.count(core::Stream::pty));
  // The terminal stream is also what a client asking for "stdout" gets.
  auto as_stdout = manager_->output(st.execution_id, core::Stream::stdout_stream, 0, 4096);
  ASSERT_TRUE(as_stdout);
  EXPECT_EQ(std::string(as_stdout->data.begin(), as_stdout->data.end()), text);
  EXPECT_TRUE(as_stdout->eof);
  auto no_stderr = manager_->output(st.execution_id, core::Stream::stderr_stream, 0, 4096);
  EXPECT_FALSE(no_stderr);
}

TEST_F(SupervisorTest, PtyResizeRefusedLeavesExecutionUnaffected) {
  manager();
  Collected c;
  auto st = start(pty_plan(sh("sleep 0.3; stty size; exit 4"), false), &c);
  auto r = manager_->resize(st.execution_id, 33, 101);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::exec_resize_refused);
  auto view = manager_->get(st.execution_id);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->phase, core::Phase::running);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->exit.code, 4);
  EXPECT_NE(c.stream_text("pty").find("24 80"), std::string::npos);
}

TEST_F(SupervisorTest, PtyInputReachesTheTerminal) {
  manager();
  Collected c;
  auto st = start(pty_plan(sh("read line; echo got:$line"), false), &c);
  std::string const msg = "hello\n";
  auto r = manager_->input(st.execution_id,
                           std::span(reinterpret_cast<std::uint8_t const*>(msg.data()), msg.size()),
                           false);
  ASSERT_TRUE(r);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  EXPECT_NE(c.stream_text("pty").find("got:hello"), std::string::npos);
}

TEST_F(SupervisorTest, StalledPtyReaderDoesNotBlockCancellation) {
  manager();
  auto p = pty_plan(plan({"/bin/sleep", "100"}), false);
  p.limits.stdin_bytes = 8 << 20;
  auto st = start(p);
  // Nobody reads the terminal: fill its input buffer and our queue.
  std::vector<std::uint8_t> block(65536, 'q');
  for (int i = 0; i < 16; ++i) (void)manager_->input(st.execution_id, block, false);
  drive([] { return false; }, 50ms);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(manager_->cancel(st.execution_id, core::Trigger::user, "stop")->accepted);
  auto rec = terminal(st.execution_id, 10s);
  ASSERT_TRUE(rec);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
}

// The size of the pipe behind a process's stdout (opened through /proc, which yields the very
// pipe), or -1.
int stdout_pipe_size(std::int32_t pid) {
  int const fd =
      ::open(("/proc/" + std::to_string(pid) + "/fd/1").c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  int const size = ::fcntl(fd, F_GETPIPE_SZ);
  ::close(fd);
  return size;
}

// A stream that floods gets a larger pipe (fewer wake-ups per byte); an idle one keeps the
// default, so idle executions cost no kernel buffer. Every byte is still accounted and spooled.
TEST_F(SupervisorTest, BusyStdoutPipeGrowsIdleOneDoesNot) {
  manager();
  Collected c;
  auto busy = start(sh("head -c 3000000 /dev/zero; exec sleep 30"), &c);
  auto idle = start(sh("exec sleep 30"));
  ASSERT_TRUE(drive([&] { return c.stream_text("stdout").size() >= 3000000U; }, 10s));
  EXPECT_EQ(stdout_pipe_size(busy.pid), 1 << 20);
  EXPECT_EQ(stdout_pipe_size(idle.pid), 64 * 1024);
  ASSERT_TRUE(manager_->cancel(busy.execution_id, core::Trigger::user, "done")->accepted);
  ASSERT_TRUE(manager_->cancel(idle.execution_id, core::Trigger::user, "done")->accepted);
  auto rec = terminal(busy.execution_id);
  ASSERT_TRUE(rec);
  ASSERT_TRUE(terminal(idle.execution_id));
  auto const& a = rec->output.at(core::Stream::stdout_stream);
  EXPECT_EQ(a.observed, 3000000U);
  EXPECT_EQ(a.retained, 3000000U);
  EXPECT_EQ(a.dropped, 0U);
  EXPECT_TRUE(a.complete);
  auto out = manager_->output(busy.execution_id, core::Stream::stdout_stream, 0, 4 << 20);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->data.size(), 3000000U);
  EXPECT_TRUE(std::all_of(out->data.begin(), out->data.end(), [](auto b) { return b == 0; }));
}

}  // namespace
}  // namespace custos::supervisor::testing
