// Launch, output, exit, spawn failure, deadline, cancellation races: real processes on a real
// io_context, with the cgroup boundary where the host gives us one.
#include <algorithm>
#include <set>
#include <sys/ptrace.h>

#include "custos/core/base64.hpp"

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

core::StreamAccounting const& acc(core::TerminalRecord const& r, core::Stream s) {
  return r.output.at(s);
}

TEST_F(SupervisorTest, ExitCodeOutputAndNumberedEvents) {
  manager();
  Collected c;
  auto st = start(sh("printf hello; printf oops >&2; exit 3"), &c);
  ASSERT_FALSE(st.execution_id.empty());
  EXPECT_EQ(st.phase, core::Phase::running);
  EXPECT_GT(st.pid, 0);
  EXPECT_EQ(st.execution_id.rfind("ex-", 0), 0U);
  EXPECT_EQ(st.boundary, have_cgroup() ? Boundary::cgroup : Boundary::marker);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->exit.code, 3);
  EXPECT_FALSE(rec->trigger.has_value());
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  EXPECT_EQ(acc(*rec, core::Stream::stdout_stream), (core::StreamAccounting{5, 5, 0, true}));
  EXPECT_EQ(acc(*rec, core::Stream::stderr_stream), (core::StreamAccounting{4, 4, 0, true}));
  EXPECT_TRUE(core::validate(*rec).has_value());

  // Events: 1..n without gaps, the plan digest on each, ending with closed then terminal.
  ASSERT_GE(c.events.size(), 5U);
  for (std::size_t i = 0; i < c.events.size(); ++i) {
    EXPECT_EQ(c.events[i].seq, i + 1);
    EXPECT_EQ(c.events[i].plan_digest, st.plan_digest);
  }
  EXPECT_EQ(c.events.front().kind, "started");
  EXPECT_EQ(c.events[c.events.size() - 2].kind, "closed");
  EXPECT_EQ(c.events.back().kind, "terminal");
  EXPECT_EQ(c.count("exited"), 1U);
  EXPECT_EQ(c.stream_text("stdout"), "hello");
  EXPECT_EQ(c.stream_text("stderr"), "oops");

  auto out = manager_->output(st.execution_id, core::Stream::stdout_stream, 0, 100);
  ASSERT_TRUE(out);
  EXPECT_EQ(std::string(out->data.begin(), out->data.end()), "hello");
  EXPECT_TRUE(out->eof);
  EXPECT_TRUE(out->complete);
  auto part = manager_->output(st.execution_id, core::Stream::stdout_stream, 1, 2);
  ASSERT_TRUE(part);
  EXPECT_EQ(std::string(part->data.begin(), part->data.end()), "el");
  EXPECT_FALSE(part->eof);

  auto view = manager_->get(st.execution_id);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->phase, core::Phase::terminal);
  ASSERT_TRUE(view->terminal.has_value());
  EXPECT_EQ(view->plan_digest, st.plan_digest);
  EXPECT_EQ(manager_->list({}).size(), 1U);
  EXPECT_EQ(manager_->live_count(), 0U);
}

TEST_F(SupervisorTest, NonUtf8AndNulBytesReturnedExactly) {
  manager();
  Collected c;
  // Every byte value 0..255, twice, through printf octal escapes.
  std::string script = "printf '";
  std::string expected;
  for (int round = 0; round < 2; ++round) {
    for (int b = 0; b < 256; ++b) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\%03o", b);
      script += esc;
      expected.push_back(static_cast<char>(b));
    }
  }
  script += "'";
  auto st = start(sh(script), &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  EXPECT_EQ(c.stream_text("stdout"), expected);
  auto out = manager_->output(st.execution_id, core::Stream::stdout_stream, 0, 4096);
  ASSERT_TRUE(out);
  EXPECT_EQ(std::string(out->data.begin(), out->data.end()), expected);
  // And through the JSON form the rpc layer sends.
  std::string via_json;
  for (auto const& e : c.events) {
    if (e.kind != "output") continue;
    auto j = e.to_json();
    auto dec = custos::core::base64_decode(j.at("data_b64").as_string());
    ASSERT_TRUE(dec);
    via_json.append(dec->begin(), dec->end());
  }
  EXPECT_EQ(via_json, expected);
}

namespace {
// The child's environment as a set of lines (/usr/bin/env output).
std::set<std::string> env_lines(std::string const& text) {
  std::set<std::string> lines;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    lines.insert(text.substr(pos, nl - pos));
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  return lines;
}
}  // namespace

TEST_F(SupervisorTest, EnvironmentIsExactlyThePlanPlusMarker) {
  // A variable of this process that no plan entry names must not reach the child.
  ::setenv("CUSTOS_TEST_DAEMON_ONLY", "leak", 1);
  manager(BoundaryPreference::automatic, [](ManagerConfig& cfg) {
    cfg.inherit_source = std::map<std::string, std::string>{{"FROM_DAEMON", "daemon-value"},
                                                            {"NOT_NAMED", "must-not-appear"}};
  });
  Collected c;
  auto p = plan({"/usr/bin/env"});
  p.env.clear();
  p.env.push_back(core::EnvEntry{"LITERAL", std::string{"a b=c"}});
  p.env.push_back(core::EnvEntry{"FROM_DAEMON", std::nullopt});
  p.env.push_back(core::EnvEntry{"ABSENT_AT_DAEMON", std::nullopt});
  auto r = start_with_test_permit(*manager_, request(p));
  ASSERT_TRUE(r);
  ASSERT_TRUE(manager_->subscribe(r->execution_id, std::uint64_t{1}, [&](Event const& e) {
    c.events.push_back(e);
    return true;
  }));
  auto rec = terminal(r->execution_id);
  ASSERT_TRUE(rec);
  std::string const text = c.stream_text("stdout");
  auto const lines = env_lines(text);
  ASSERT_EQ(lines.size(), 3U) << text;
  EXPECT_TRUE(lines.count("LITERAL=a b=c"));
  EXPECT_TRUE(lines.count("FROM_DAEMON=daemon-value"));
  auto marker = std::find_if(lines.begin(), lines.end(), [](std::string const& l) {
    return l.rfind("CUSTOS_MARKER=", 0) == 0;
  });
  ASSERT_NE(marker, lines.end());
  EXPECT_EQ(marker->size(), std::string("CUSTOS_MARKER=").size() + 32);
  ::unsetenv("CUSTOS_TEST_DAEMON_ONLY");
}

TEST_F(SupervisorTest, InheritedValuesAreTheDaemonsSnapshotAtStart) {
  // Without an explicit source the manager snapshots its own environment when constructed:
  // a later change to this process's environment does not reach executions.
  ::setenv("CUSTOS_TEST_INHERITED", "at-start", 1);
  manager();
  ::setenv("CUSTOS_TEST_INHERITED", "changed-later", 1);
  Collected c;
  auto p = plan({"/usr/bin/env"});
  p.env.clear();
  p.env.push_back(core::EnvEntry{"CUSTOS_TEST_INHERITED", std::nullopt});
  auto r = start_with_test_permit(*manager_, request(p));
  ::unsetenv("CUSTOS_TEST_INHERITED");
  ASSERT_TRUE(r);
  ASSERT_TRUE(manager_->subscribe(r->execution_id, std::uint64_t{1}, [&](Event const& e) {
    c.events.push_back(e);
    return true;
  }));
  ASSERT_TRUE(terminal(r->execution_id));
  auto const lines = env_lines(c.stream_text("stdout"));
  EXPECT_TRUE(lines.count("CUSTOS_TEST_INHERITED=at-start"));
  EXPECT_FALSE(lines.count("CUSTOS_TEST_INHERITED=changed-later"));
}

TEST_F(SupervisorTest, MissingExecutableIsSpawnFailedNot127) {
  manager();
  Collected c;
  auto st = start(plan({"/nonexistent/custos-no-such-binary"}), &c);
  EXPECT_EQ(st.phase, core::Phase::terminal);
  EXPECT_EQ(st.pid, 0);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
  ASSERT_TRUE(rec->spawn_error.has_value());
  EXPECT_EQ(rec->spawn_error->code, "execve");
  EXPECT_EQ(rec->spawn_error->sys_errno, ENOENT);
  EXPECT_FALSE(rec->exit.observed());
  EXPECT_EQ(c.events.back().kind, "terminal");
  EXPECT_EQ(manager_->stats().spawn_failed, 1U);
  auto out = manager_->output(st.execution_id, core::Stream::stdout_stream, 0, 100);
  ASSERT_TRUE(out);
  EXPECT_TRUE(out->data.empty());
  EXPECT_TRUE(out->eof);
  EXPECT_TRUE(out->complete);
  // Input and cancel on a terminal execution are typed refusals.
  EXPECT_EQ(manager_->cancel(st.execution_id, core::Trigger::user, "x").error().code,
            Errc::exec_not_running);
}

TEST_F(SupervisorTest, CwdEscapeIsRefusedBeforeAnyRecord) {
  // Resolved beneath the workspace when the start is admitted (docs/sandbox.md, "Workspace,
  // working directory and state directory"): refused, nothing recorded, no process. The spawn
  // resolves it again (SpawnTest.CwdIsResolvedBeneathTheWorkspace).
  manager();
  std::filesystem::create_symlink("/", workspace_ / "out");
  auto p = plan({"/bin/true"});
  p.cwd = "out";
  auto r = start_with_test_permit(*manager_, request(std::move(p)));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::workspace_escape);
  EXPECT_TRUE(manager_->list(ListFilter{}).empty());
}

TEST_F(SupervisorTest, CwdResolvedBeneathWorkspace) {
  manager();
  std::filesystem::create_directories(workspace_ / "sub" / "dir");
  Collected c;
  auto p = plan({"/bin/pwd"});
  p.cwd = "sub/dir";
  auto st = start(p, &c);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->exit.code, 0);
  EXPECT_EQ(c.stream_text("stdout"), (workspace_ / "sub" / "dir").string() + "\n");
}

TEST_F(SupervisorTest, DeadlineTimesOut) {
  manager();
  auto p = plan({"/bin/sleep", "100"});
  p.limits.wall_ms = 200;
  auto t0 = std::chrono::steady_clock::now();
  auto st = start(p);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::timed_out);
  EXPECT_EQ(rec->trigger, core::Trigger::deadline);
  EXPECT_TRUE(rec->escalation.graceful_sent);
  EXPECT_EQ(rec->exit.signal, SIGTERM);
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed) << detail(st.execution_id);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  auto wall = rec->resources.at(core::ResourceDim::wall);
  ASSERT_TRUE(wall.value.has_value());
  EXPECT_GE(*wall.value, 200U);
}

TEST_F(SupervisorTest, UserCancelAndFirstTriggerWins) {
  manager();
  Collected c;
  auto st = start(plan({"/bin/sleep", "100"}), &c);
  auto first = manager_->cancel(st.execution_id, core::Trigger::user, "stop please");
  ASSERT_TRUE(first);
  EXPECT_TRUE(first->accepted);
  auto second = manager_->cancel(st.execution_id, core::Trigger::deadline, "later");
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->accepted);
  EXPECT_EQ(second->trigger, core::Trigger::user);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::cancelled);
  EXPECT_EQ(rec->trigger, core::Trigger::user);
  EXPECT_EQ(c.count("cancel_requested"), 1U);
  EXPECT_GE(c.count("signal_sent"), 1U);
}

TEST_F(SupervisorTest, CancelVersusExitRaceIsAlwaysConsistent) {
  manager();
  int accepted = 0;
  int rejected = 0;
  for (int round = 0; round < 40; ++round) {
    auto st = start(plan({"/bin/true"}));
    ASSERT_FALSE(st.execution_id.empty());
    // Let the loop observe the exit in some rounds but not others.
    if (round % 3 == 1) drive([] { return false; }, std::chrono::milliseconds(round % 7));
    auto res = manager_->cancel(st.execution_id, core::Trigger::user, "race");
    auto rec = terminal(st.execution_id);
    ASSERT_TRUE(rec);
    bool const took = res && res->accepted;
    if (took) {
      ++accepted;
      EXPECT_EQ(rec->classification, core::Classification::cancelled);
      EXPECT_EQ(rec->trigger, core::Trigger::user);
    } else {
      ++rejected;
      EXPECT_EQ(rec->classification, core::Classification::exited);
      EXPECT_FALSE(rec->trigger.has_value());
      EXPECT_EQ(rec->exit.code, 0);
    }
    EXPECT_TRUE(rec->exit.observed());  // the raw exit is always kept
    EXPECT_TRUE(core::validate(*rec).has_value());
  }
  EXPECT_EQ(accepted + rejected, 40);
}

TEST_F(SupervisorTest, DeadlineVersusUserCancelFirstAcceptedDecides) {
  manager();
  for (int round = 0; round < 20; ++round) {
    auto p = plan({"/bin/sleep", "100"});
    p.limits.wall_ms = 1 + round % 3;
    auto st = start(p);
    if (round % 2 == 0) drive([] { return false; }, 2ms);
    auto res = manager_->cancel(st.execution_id, core::Trigger::user, "race");
    ASSERT_TRUE(res);
    auto rec = terminal(st.execution_id);
    ASSERT_TRUE(rec);
    ASSERT_TRUE(rec->trigger.has_value());
    if (res->accepted) {
      EXPECT_EQ(rec->classification, core::Classification::cancelled);
    } else {
      EXPECT_EQ(*rec->trigger, core::Trigger::deadline);
      EXPECT_EQ(rec->classification, core::Classification::timed_out);
    }
  }
}

TEST_F(SupervisorTest, WaitTimesOutWithTypedError) {
  manager();
  auto st = start(plan({"/bin/sleep", "100"}));
  std::optional<Result<core::TerminalRecord>> got;
  manager_->wait(st.execution_id, 50ms,
                 [&](Result<core::TerminalRecord> r) { got = std::move(r); });
  ASSERT_TRUE(drive([&] { return got.has_value(); }, 5s));
  ASSERT_FALSE(*got);
  EXPECT_EQ(got->error().code, Errc::exec_wait_timeout);
  (void)manager_->cancel(st.execution_id, core::Trigger::user, "done");
  ASSERT_TRUE(terminal(st.execution_id));
  EXPECT_EQ(manager_->get("ex-unknown").error().code, Errc::exec_not_found);
}

TEST_F(SupervisorTest, SubscriberReturningFalseIsDroppedAndCounted) {
  manager();
  int calls = 0;
  auto st = start(sh("printf a; sleep 0.05; printf b; sleep 0.05; printf c"));
  ASSERT_TRUE(manager_->subscribe(st.execution_id, std::uint64_t{1}, [&](Event const&) {
    ++calls;
    return calls < 2;
  }));
  Collected all;
  ASSERT_TRUE(manager_->subscribe(st.execution_id, std::nullopt, [&](Event const& e) {
    all.events.push_back(e);
    return true;
  }));
  ASSERT_TRUE(terminal(st.execution_id));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(manager_->stats().dropped_subscribers, 1U);
  EXPECT_EQ(all.events.back().kind, "terminal");
}

// live_count() is a counter, not a scan: it must stay exact through spawn failures and the
// eviction of terminal executions from the history.
TEST_F(SupervisorTest, LiveCountStaysExactThroughFailuresAndHistoryEviction) {
  manager(BoundaryPreference::automatic, [](ManagerConfig& c) { c.terminal_history = 2; });
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto st = start(plan({"/bin/true"}));
    ids.push_back(st.execution_id);
    ASSERT_TRUE(terminal(st.execution_id));
  }
  auto failed = start(plan({"/nonexistent/custos-test"}));
  EXPECT_EQ(failed.phase, core::Phase::terminal);
  EXPECT_EQ(manager_->live_count(), 0U);
  drive([] { return false; }, 20ms);  // the posted history evictions
  EXPECT_FALSE(manager_->get(ids.front())) << "evicted from the history";
  EXPECT_EQ(manager_->list({}).size(), 2U);
  EXPECT_EQ(manager_->live_count(), 0U);
  auto a = start(sh("exec sleep 30"));
  auto b = start(sh("exec sleep 30"));
  EXPECT_EQ(manager_->live_count(), 2U);
  ASSERT_TRUE(manager_->cancel(a.execution_id, core::Trigger::user, "done")->accepted);
  ASSERT_TRUE(terminal(a.execution_id));
  EXPECT_EQ(manager_->live_count(), 1U);
  ASSERT_TRUE(manager_->cancel(b.execution_id, core::Trigger::user, "done")->accepted);
  ASSERT_TRUE(terminal(b.execution_id));
  drive([] { return false; }, 20ms);
  EXPECT_EQ(manager_->live_count(), 0U);
  EXPECT_EQ(manager_->list({}).size(), 2U);
}

// A failure in the child's own setup (here RLIMIT_NOFILE above fs.nr_open: EPERM even for root)
// reaches the caller as spawn_failed with the step, before anything of the target ran, and the
// child is reaped — whether the setup report is read in spawn_staged or in release().
TEST_F(SupervisorTest, ChildSetupFailureIsSpawnFailedWithItsStep) {
  manager();
  auto p = plan({"/bin/true"});
  p.limits.open_files = std::uint64_t{1} << 31;
  auto st = start(p);
  ASSERT_EQ(st.phase, core::Phase::terminal);
  EXPECT_EQ(st.pid, 0);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::spawn_failed);
  ASSERT_TRUE(rec->spawn_error.has_value());
  EXPECT_EQ(rec->spawn_error->code, "setrlimit");
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed);
  EXPECT_EQ(manager_->live_count(), 0U);
}

}  // namespace
}  // namespace custos::supervisor::testing
