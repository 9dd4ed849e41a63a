// Sandboxed executions through the manager: admission of the checked plan's controls against
// each backend's descriptor (nothing created when refused), the binding of the request's
// sandbox to the plan's digest, the reference backend as the oracle of denials, and
// terminal.input false enforced by the supervisor.
#include <boost/json/parse.hpp>
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "custos/sandbox/controls.hpp"
#include "custos/sandbox/json.hpp"
#include "custos/sandbox/plan.hpp"

#include "harness.hpp"

namespace custos::supervisor::testing {
namespace {

namespace script = core::script;

class SandboxTest : public SupervisorTest {
 protected:
  core::ExecutionPlan model(std::vector<core::ScriptStep> steps) {
    auto p = plan({"/bin/true"});
    p.env.clear();
    p.backend.kind = core::BackendKind::reference;
    p.backend.script = core::ReferenceScript{std::move(steps)};
    return p;
  }
  // The request for `p` with `requirements` compiled as its sandbox (digest into the plan).
  LaunchRequest sandboxed(core::ExecutionPlan p, std::string_view requirements) {
    auto req = sandbox::parse_requirements(boost::json::parse(requirements), "/plan/sandbox");
    EXPECT_TRUE(req) << req.error().message();
    auto compiled = sandbox::compile_sandbox(*req, p);
    EXPECT_TRUE(compiled) << compiled.error().message();
    p.sandbox_digest = (*compiled)->digest;
    auto r = request(std::move(p));
    r.sandbox = *compiled;
    return r;
  }
  StartResult start_request(LaunchRequest r, Collected* sink = nullptr) {
    auto st = start_with_test_permit(*manager_, std::move(r));
    EXPECT_TRUE(st) << (st ? "" : st.error().message());
    if (!st) return {};
    if (sink != nullptr) {
      auto s = manager_->subscribe(st->execution_id, std::uint64_t{1}, [sink](Event const& e) {
        sink->events.push_back(e);
        return true;
      });
      EXPECT_TRUE(s.has_value());
      if (s) subscriptions_.push_back(*s);
    }
    return *st;
  }
  static std::vector<std::string> kinds(Collected const& c) {
    std::vector<std::string> k;
    for (auto const& e : c.events) k.push_back(e.kind);
    return k;
  }
};

// The caller here is whoever runs the test: a root caller's sandbox must allow root.
constexpr std::string_view kRoot = R"("process": {"run_as_root": true})";

std::string sb(std::string_view more = {}) {
  return "{" + std::string{kRoot} + (more.empty() ? "" : ", " + std::string{more}) + "}";
}

TEST_F(SandboxTest, ANativeSandboxedPlanIsRefusedWithEveryMissingControlAndNothingIsCreated) {
  manager();
  auto p = plan({"/bin/true"});
  p.env.clear();
  // CPU time is only ever sampled on native: enforcing it is a control the backend lacks.
  p.limits.cpu_ms = 10000;
  auto r = sandboxed(std::move(p), sb(R"("network": {"outbound": {"tcp_connect": [443]}},
                                       "resources": {"enforce": ["wall_ms", "cpu_ms"]})"));
  auto const controls = r.sandbox->checked.controls;
  auto admitted = manager_->admit(r);
  ASSERT_FALSE(admitted);
  EXPECT_EQ(admitted.error().code, Errc::sandbox_unsupported);
  // Every control the native descriptor does not list at fidelity hard on this host, and only
  // those: cpu_ms among them, wall_ms (the supervisor's) not.
  backend::Descriptor native;
  for (auto const& d : manager_->backends()) {
    if (d.kind == core::BackendKind::native) native = d;
  }
  std::vector<std::string> expected;
  for (auto const& c : controls) {
    auto const* got = native.find(c);
    if (got == nullptr || got->fidelity != backend::ControlFidelity::hard) expected.push_back(c);
  }
  EXPECT_NE(std::find(expected.begin(), expected.end(), "resources.cpu_ms"), expected.end());
  EXPECT_EQ(std::find(expected.begin(), expected.end(), "resources.wall_ms"), expected.end());
  EXPECT_EQ(admitted.error().missing, expected);
  auto const a = manager_->admission(r.plan, &r.sandbox->checked);
  EXPECT_FALSE(a.admitted);
  EXPECT_EQ(a.missing, expected);
  // start refuses the same way, before anything exists.
  auto st = start_with_test_permit(*manager_, r);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::sandbox_unsupported);
  EXPECT_EQ(manager_->live_count(), 0U);
  EXPECT_TRUE(manager_->list(ListFilter{}).empty());
}

TEST_F(SandboxTest, EachDescriptorSaysWhatItEnforces) {
  manager();
  for (auto const& d : manager_->backends()) {
    for (auto const& c : sandbox::sandbox_controls()) {
      auto const* got = d.find(c.name);
      ASSERT_NE(got, nullptr) << core::to_string(d.kind) << " " << c.name;
      EXPECT_FALSE(got->how.empty()) << core::to_string(d.kind) << " " << c.name;
      if (d.kind == core::BackendKind::reference) {
        EXPECT_EQ(got->fidelity, backend::ControlFidelity::hard) << c.name;
      } else if (d.kind != core::BackendKind::native) {
        EXPECT_EQ(got->fidelity, backend::ControlFidelity::none) << c.name;  // containers
      } else {
        // Native: hard or none, never a sampled sandbox control.
        EXPECT_NE(got->fidelity, backend::ControlFidelity::sampled) << c.name;
      }
    }
  }
  // As root with namespaces (these hosts), the view and the PID namespace are enforced, and
  // no_new_privs always.
  for (auto const& d : manager_->backends()) {
    if (d.kind != core::BackendKind::native) continue;
    EXPECT_EQ(d.find("process.no_new_privs")->fidelity, backend::ControlFidelity::hard);
    if (::geteuid() == 0) {
      EXPECT_EQ(d.find("filesystem.mount_namespace")->fidelity, backend::ControlFidelity::hard);
      EXPECT_EQ(d.find("process.pid_namespace")->fidelity, backend::ControlFidelity::hard);
    }
  }
}

TEST_F(SandboxTest, TheRequestsSandboxMustBeTheOneThePlanNames) {
  manager();
  auto r = sandboxed(model({}), sb());
  auto other = sandboxed(model({}), sb(R"("network": {"outbound": "any"})"));
  r.sandbox = other.sandbox;  // another checked plan than the digested one
  EXPECT_EQ(manager_->admit(r).error().code, Errc::auth_digest_mismatch);
  r.sandbox = nullptr;  // the plan names a sandbox that did not come with it
  EXPECT_EQ(manager_->admit(r).error().code, Errc::auth_digest_mismatch);
  auto plain = request(model({}));
  plain.sandbox = other.sandbox;  // a sandbox the plan does not name
  EXPECT_EQ(manager_->admit(plain).error().code, Errc::auth_digest_mismatch);
}

TEST_F(SandboxTest, TheReferenceModelDeniesASpawnWithoutDescendants) {
  manager();
  Collected c;
  auto r =
      sandboxed(model({script::Write{core::ScriptStream::stdout_stream, {'a'}}, script::Spawn{1},
                       script::Write{core::ScriptStream::stdout_stream, {'b'}}}),
                sb());
  auto const digest = r.plan.sandbox_digest;
  auto st = start_request(std::move(r), &c);
  EXPECT_EQ(st.sandbox_digest, digest);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::sandbox_denied);
  EXPECT_EQ(rec->exit.signal, SIGSYS);
  EXPECT_EQ(c.stream_text("stdout"), "a");  // the steps after the denial never ran
  EXPECT_EQ(rec->observations.at("sandbox_denied"),
            "process.no_descendants: spawn 1 with descendants: false");
  EXPECT_EQ(rec->observations.at("sandbox"), "denied");
  EXPECT_EQ(rec->tree.cleanup, core::Cleanup::confirmed);
  auto v = manager_->get(st.execution_id);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->sandbox_digest, digest);
}

TEST_F(SandboxTest, TheReferenceModelBoundsTheTreeToMaxProcesses) {
  manager();
  // Root + 2 + 1 = 4 processes fit max_processes 4; one more does not.
  auto fits = sandboxed(model({script::Spawn{2}, script::Spawn{1}, script::Exit{0}}),
                        sb(R"("process": {"run_as_root": true, "descendants": true,
                                          "max_processes": 4})"));
  auto rec = terminal(start_request(std::move(fits)).execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->observations.at("sandbox"), "enforced");
  auto over = sandboxed(model({script::Spawn{2}, script::Spawn{2}, script::Exit{0}}),
                        sb(R"("process": {"run_as_root": true, "descendants": true,
                                          "max_processes": 4})"));
  auto denied = terminal(start_request(std::move(over)).execution_id);
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->classification, core::Classification::sandbox_denied);
  EXPECT_NE(denied->observations.at("sandbox_denied").find("process.max_processes"),
            std::string::npos);
  // The two spawned before the denial were ended by the teardown, and counted.
  EXPECT_EQ(denied->resources.at(core::ResourceDim::processes).value, 3U);
}

TEST_F(SandboxTest, WithoutInputTheProgramReadsEndOfFileAndInputIsRefused) {
  manager();
  Collected c;
  auto st = start_request(
      sandboxed(
          model({script::ReadStdin{4}, script::Write{core::ScriptStream::stdout_stream, {'o', 'k'}},
                 script::Sleep{200}}),
          sb()),
      &c);
  ASSERT_TRUE(drive([&] { return c.count("input_closed") > 0; }, 5s));
  auto in = manager_->input(st.execution_id, std::vector<std::uint8_t>{'x'}, false);
  ASSERT_FALSE(in);
  EXPECT_EQ(in.error().code, Errc::exec_input_closed);
  auto rec = terminal(st.execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(c.stream_text("stdout"), "ok");  // the read ended at EOF, the model went on
  auto const k = kinds(c);
  auto it = std::find(k.begin(), k.end(), "input_closed");
  ASSERT_NE(it, k.end());
  auto const& closed = c.events[static_cast<std::size_t>(it - k.begin())];
  EXPECT_EQ(closed.fields.at("reason").as_string(), "sandbox");
  // With input allowed, the same model takes its bytes.
  Collected c2;
  auto st2 = start_request(sandboxed(model({script::ReadStdin{1}, script::Exit{0}}),
                                     sb(R"("terminal": {"input": true})")),
                           &c2);
  auto ok = manager_->input(st2.execution_id, std::vector<std::uint8_t>{'x'}, true);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(*ok, 1U);
  ASSERT_TRUE(terminal(st2.execution_id));
}

TEST_F(SandboxTest, AnUnsandboxedReferenceRunIsNotDenied) {
  manager();
  auto rec = terminal(start(model({script::Spawn{5}, script::Exit{0}})).execution_id);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->classification, core::Classification::exited);
  EXPECT_EQ(rec->observations.count("sandbox"), 0U);
}

}  // namespace
}  // namespace custos::supervisor::testing
