// Test harness for supervisor tests: a real io_context, a real ExecutionManager, a temporary
// state dir and workspace, and a test cgroup subtree under the cgroup2 mount
// (`<mount>/custos-test-<pid>-<n>`) that each test removes at its end.
#pragma once

#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <signal.h>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"

#include "support/launch_permit_minter.hpp"

namespace custos::supervisor::testing {

using namespace std::chrono_literals;

inline std::atomic<int> g_counter{0};

struct Collected {
  std::vector<Event> events;
  std::string stream_text(std::string_view stream) const {
    std::string out;
    for (auto const& e : events) {
      if (e.kind != "output") continue;
      auto it = e.fields.find("stream");
      if (it == e.fields.end() || it->value().as_string() != stream) continue;
      out.append(e.data.begin(), e.data.end());
    }
    return out;
  }
  std::size_t count(std::string_view kind) const {
    std::size_t n = 0;
    for (auto const& e : events) n += e.kind == kind ? 1 : 0;
    return n;
  }
};

// A shell script whose background child drops its marker (`env -u CUSTOS_MARKER`) and escapes
// the root: it prints the child's pid and exits only once the child runs `sleep` unmarked (its
// comm says so after the exec), so a final sweep can never catch it still marked, however late
// the child is scheduled.
inline std::string unmarked_escapee_script() {
  return "env -u CUSTOS_MARKER sleep 100 </dev/null >/dev/null 2>&1 & p=$!; i=0; "
         "until read c </proc/$p/comm && [ \"$c\" = sleep ]; do i=$((i+1)); "
         "[ $i -gt 200000 ] && break; done; echo $p; exit 0";
}

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/custos-sup-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    state_ = tmpl;
    ::chmod(state_.c_str(), 0755);  // a test running as nobody must reach the workspace
    workspace_ = state_ / "ws";
    std::filesystem::create_directories(workspace_);
    ::chmod(workspace_.c_str(), 0777);
    if (auto m = sys::find_cgroup2_mount()) {
      std::string const path = m->path + "/custos-test-" + std::to_string(::getpid()) + "-" +
                               std::to_string(g_counter++);
      if (::mkdir(path.c_str(), 0755) == 0) cgroup_path_ = path;
    }
  }

  void TearDown() override {
    if (manager_) {
      // Sinks point into the test body's stack: they must not see the teardown's events.
      for (auto const& h : subscriptions_) manager_->unsubscribe(h);
      // Anything still live is a test failure; do not leave it running.
      if (manager_->live_count() > 0) {
        ADD_FAILURE() << manager_->live_count() << " executions still live at teardown";
        bool done = false;
        manager_->shutdown(ShutdownPolicy::cancel, 5s, [&] { done = true; });
        drive([&] { return done; }, 10s);
      }
      // Collect this test's reparented orphans so none is left for the next test to see.
      drive([] { return false; }, 20ms);
      manager_->reap_orphans_now();
      manager_.reset();
    }
    if (!cgroup_path_.empty()) {
      // Per-execution cgroups are removed at close; the subtree itself goes here.
      for (int i = 0; i < 100 && ::rmdir(cgroup_path_.c_str()) != 0 && errno == EBUSY; ++i) {
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_FALSE(std::filesystem::exists(cgroup_path_)) << "test cgroup left behind";
    }
    std::error_code ec;
    std::filesystem::remove_all(state_, ec);
  }

  bool have_cgroup() const { return !cgroup_path_.empty(); }

  ExecutionManager& manager(BoundaryPreference pref = BoundaryPreference::automatic,
                            std::function<void(ManagerConfig&)> tweak = {}) {
    ManagerConfig cfg;
    cfg.cgroup_subtree = pref == BoundaryPreference::marker ? std::string{} : cgroup_path_;
    cfg.boundary = pref;
    cfg.state_dir = state_ / "state";
    cfg.exit_drain = 300ms;
    cfg.reader_close_bound = 500ms;
    cfg.sample_interval = 50ms;
    cfg.reap_interval = 100ms;
    if (tweak) tweak(cfg);
    manager_ = std::make_unique<ExecutionManager>(io_, std::move(cfg));
    return *manager_;
  }

  core::ExecutionPlan plan(std::vector<std::string> argv) {
    core::ExecutionPlan p;
    p.command.executable = argv.at(0);
    p.command.argv = std::move(argv);
    p.workspace.root = workspace_.string();
    p.env.push_back(core::EnvEntry{"PATH", std::string{"/usr/bin:/bin"}});
    p.escalation.grace_ms = 300;
    p.escalation.kill_after_ms = 3000;
    return p;
  }
  core::ExecutionPlan sh(std::string const& script) { return plan({"/bin/sh", "-c", script}); }

  LaunchRequest request(core::ExecutionPlan p) {
    LaunchRequest r;
    r.identity.project_id = "p1";
    r.identity.session_id = "s1";
    r.identity.run_id = "r1";
    r.identity.attempt_id = "a1";
    r.identity.turn_id = "t1";
    r.identity.action_id = "act-" + std::to_string(g_counter++);
    r.identity.process_id = "proc-1";
    r.identity.workspace_id = "w1";
    r.identity.resource_id = "res1";
    r.identity.environment_id = "env1";
    r.identity.generation = 1;
    r.identity.revision = 1;
    r.plan = std::move(p);
    r.caller = CallerCreds{static_cast<std::uint32_t>(::geteuid()),
                           static_cast<std::uint32_t>(::getegid()), ::getpid()};
    return r;
  }

  // Starts and subscribes from seq 1 (so the test sees every event).
  StartResult start(core::ExecutionPlan p, Collected* sink = nullptr) {
    auto r = start_with_test_permit(*manager_, request(std::move(p)));
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message());
    if (!r) return {};
    if (sink != nullptr) {
      auto s = manager_->subscribe(r->execution_id, std::uint64_t{1}, [sink](Event const& e) {
        sink->events.push_back(e);
        return true;
      });
      EXPECT_TRUE(s.has_value());
      if (s) subscriptions_.push_back(*s);
    }
    return *r;
  }

  bool drive(std::function<bool()> const& pred, std::chrono::milliseconds timeout) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      if (io_.stopped()) io_.restart();
      io_.run_for(5ms);
    }
    return true;
  }

  std::optional<core::TerminalRecord> terminal(std::string const& id,
                                               std::chrono::milliseconds timeout = 20s) {
    std::optional<Result<core::TerminalRecord>> got;
    manager_->wait(id, timeout, [&](Result<core::TerminalRecord> r) { got = std::move(r); });
    drive([&] { return got.has_value(); }, timeout + 5s);
    if (!got || !*got) {
      ADD_FAILURE() << "no terminal record for " << id
                    << (got ? ": " + got->error().message() : std::string{});
      return std::nullopt;
    }
    return **got;
  }

  // Why an execution's cleanup was unconfirmed (for failure messages).
  std::string detail(std::string const& id) {
    auto v = manager_->get(id);
    return v && v->cleanup_detail ? *v->cleanup_detail : std::string{};
  }

  // Pids printed one per line on the execution's stdout; pidfds are opened at once so that the
  // later liveness check cannot be fooled by pid reuse.
  std::vector<sys::Pidfd> pidfds_from(std::string const& text) {
    std::vector<sys::Pidfd> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
      auto nl = text.find('\n', pos);
      auto line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? text.size() : nl + 1;
      std::int32_t pid = 0;
      if (std::from_chars(line.data(), line.data() + line.size(), pid).ec != std::errc{}) continue;
      if (auto fd = sys::Pidfd::open(pid)) out.push_back(std::move(*fd));
    }
    return out;
  }

  // No zombie children of this process remain (the manager's orphan reaping collected them).
  std::vector<std::int32_t> zombie_children() {
    std::vector<std::int32_t> out;
    std::error_code ec;
    for (auto const& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      FILE* f = std::fopen((t.path() / "children").c_str(), "r");
      if (f == nullptr) continue;
      int pid = 0;
      while (std::fscanf(f, "%d", &pid) == 1) {
        std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
        FILE* s = std::fopen(stat_path.c_str(), "r");
        if (s == nullptr) continue;
        char buf[512] = {};
        auto n = std::fread(buf, 1, sizeof buf - 1, s);
        std::fclose(s);
        std::string st(buf, n);
        auto close = st.rfind(')');
        if (close != std::string::npos && close + 2 < st.size() && st[close + 2] == 'Z') {
          out.push_back(pid);
        }
      }
      std::fclose(f);
    }
    return out;
  }

  boost::asio::io_context io_;
  std::unique_ptr<ExecutionManager> manager_;
  std::vector<SubscriptionHandle> subscriptions_;
  std::filesystem::path state_;
  std::filesystem::path workspace_;
  std::string cgroup_path_;
};

}  // namespace custos::supervisor::testing
