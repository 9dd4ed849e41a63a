// The sandbox through the real daemon over its real socket: exec.check's sandbox_digest and
// admission; exec.start's refusals (unsupported, invalid, required, undeclared, secret_unknown)
// before any claim is consumed or any process exists — the action id stays unused, proven by
// starting it afterwards; a grant's contract stored and applied; a sandboxed reference run, its
// record carrying the sandbox digest, ending sandbox_denied on a forbidden spawn.
#include "custos/sandbox/plan.hpp"

#include "e2e/harness.hpp"

namespace custos::e2e {
namespace {

class DaemonSandbox : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
    ::chmod(daemon_.tmp().c_str(), 0755);
    ::chmod(daemon_.state().c_str(), 0711);
  }

  json::object result_of(std::optional<json::object> const& r) {
    EXPECT_TRUE(r.has_value());
    if (!r) return {};
    EXPECT_TRUE(r->contains("result")) << json::serialize(*r);
    return r->contains("result") ? r->at("result").as_object() : json::object{};
  }

  // The start params of `argv` with `sandbox` as plan.sandbox (when not null) and no env (an
  // empty sandbox allows no environment name).
  static json::object sandboxed(std::vector<std::string> const& argv, json::value sandbox) {
    auto p = start_params(argv);
    auto& plan = p.at("plan").as_object();
    plan["env"] = json::array{};
    if (!sandbox.is_null()) plan["sandbox"] = std::move(sandbox);
    return p;
  }
  static json::object on_reference(json::object p, json::array steps) {
    p.at("plan").as_object()["backend"] =
        json::object{{"kind", "reference"}, {"script", json::object{{"steps", std::move(steps)}}}};
    return p;
  }
  // What the daemon must say, computed here by the sandbox layer itself.
  static std::string local_sandbox_digest(json::object const& params) {
    auto parsed = sandbox::parse_plan(params.at("plan"), "/plan");
    EXPECT_TRUE(parsed) << parsed.error().message();
    return parsed && parsed->sandbox ? parsed->sandbox->digest.to_string() : std::string{};
  }
  static std::vector<std::string> local_controls(json::object const& params) {
    auto parsed = sandbox::parse_plan(params.at("plan"), "/plan");
    return parsed && parsed->sandbox ? parsed->sandbox->checked.controls
                                     : std::vector<std::string>{};
  }
  std::size_t executions_of_session(LineClient& c, std::string const& session) {
    auto l = result_of(c.call(next_id_++, "exec.list", {{"session_id", session}}));
    return l.contains("executions") ? l.at("executions").as_array().size() : 0;
  }

  Daemon daemon_{DaemonOptions{
      {"--socket-mode", "0666"}, true, {"ASAN_OPTIONS=quarantine_size_mb=8"}, {}, {}}};
  std::int64_t next_id_ = 1;
};

std::vector<std::string> strings(json::value const& v) {
  std::vector<std::string> out;
  for (auto const& s : v.as_array()) out.emplace_back(s.as_string());
  return out;
}

TEST_F(DaemonSandbox, ExecCheckAnswersTheSandboxDigestAndTheCompleteMissingList) {
  auto c = daemon_.client();
  // The daemon's caller is root: the sandbox must allow it (run_as_root).
  // CPU time is only ever sampled on native: a plan that must have it enforced is refused.
  json::value const sb = json::parse(R"({"process": {"run_as_root": true},
                                         "network": {"outbound": {"tcp_connect": [443, 80]}},
                                         "resources": {"enforce": ["cpu_ms"]}})");
  auto params = sandboxed({"/bin/true"}, sb);
  params.at("plan").as_object()["limits"] = json::object{{"cpu_ms", 10000}};
  auto chk = result_of(c.call(next_id_++, "exec.check", params));
  ASSERT_TRUE(chk.contains("sandbox_digest"));
  EXPECT_EQ(chk.at("sandbox_digest").as_string(), local_sandbox_digest(params));
  auto const& adm = chk.at("admission").as_object();
  EXPECT_FALSE(adm.at("admitted").as_bool());
  // Every missing control is one the plan needs, cpu_ms among them.
  auto const missing = strings(adm.at("missing"));
  auto const needed = local_controls(params);
  EXPECT_NE(std::find(missing.begin(), missing.end(), "resources.cpu_ms"), missing.end());
  for (auto const& m : missing) {
    EXPECT_NE(std::find(needed.begin(), needed.end(), m), needed.end()) << m;
  }
  EXPECT_EQ(strings(chk.at("sandbox").at("controls")), needed);
  EXPECT_EQ(chk.at("sandbox").at("network").at("outbound"),
            json::parse(R"({"tcp_connect": [80, 443]})"));

  // argv is not part of the sandbox digest; the plan digest covers both.
  auto other = params;
  other.at("plan").at("command").as_object()["argv"] = json::array{"true", "--x"};
  auto chk2 = result_of(c.call(next_id_++, "exec.check", other));
  EXPECT_EQ(chk2.at("sandbox_digest"), chk.at("sandbox_digest"));
  EXPECT_NE(chk2.at("plan_digest"), chk.at("plan_digest"));
  // Lists are sets: the order of the ports changes nothing.
  auto reordered = sandboxed({"/bin/true"}, json::parse(R"({"process": {"run_as_root": true},
      "network": {"outbound": {"tcp_connect": [80, 443, 80]}}, "resources": {"enforce": ["cpu_ms"]}})"));
  reordered.at("identity") = params.at("identity");
  reordered.at("plan").as_object()["limits"] = json::object{{"cpu_ms", 10000}};
  auto chk3 = result_of(c.call(next_id_++, "exec.check", reordered));
  EXPECT_EQ(chk3.at("sandbox_digest"), chk.at("sandbox_digest"));
  EXPECT_EQ(chk3.at("plan_digest"), chk.at("plan_digest"));

  // Unsandboxed: no digest, admitted.
  auto plain = result_of(c.call(next_id_++, "exec.check", start_params({"/bin/true"})));
  EXPECT_TRUE(plain.at("sandbox_digest").is_null());
  EXPECT_TRUE(plain.at("admission").at("admitted").as_bool());
  EXPECT_FALSE(plain.contains("sandbox"));
}

TEST_F(DaemonSandbox, UnsupportedIsRefusedBeforeTheClaimAndTheActionIdStaysUnused) {
  auto c = daemon_.client();
  // CPU time is only ever sampled on native: a plan that must have it enforced is refused.
  auto params = sandboxed({"/bin/true"}, json::parse(R"({"process": {"run_as_root": true},
                                                         "resources": {"enforce": ["cpu_ms"]}})"));
  params.at("plan").as_object()["limits"] = json::object{{"cpu_ms", 10000}};
  auto const session = "sb-" + unique_suffix();
  params.at("identity").as_object()["session_id"] = session;
  auto r = c.call(next_id_++, "exec.start", params);
  ASSERT_TRUE(r);
  ASSERT_EQ(error_code_of(*r), "sandbox.unsupported") << json::serialize(*r);
  auto const& detail = r->at("error").at("data").at("detail");
  auto const missing = strings(detail.at("missing"));
  EXPECT_NE(std::find(missing.begin(), missing.end(), "resources.cpu_ms"), missing.end());
  EXPECT_EQ(r->at("error").at("data").at("recovery").as_string(), "caller_correction");
  EXPECT_EQ(executions_of_session(c, session), 0U);
  // The very same identity, unsandboxed: the (action, process) claim was never consumed.
  auto plain = params;
  plain.at("plan").as_object().erase("sandbox");
  plain.at("plan").as_object().erase("limits");
  auto st = result_of(c.call(next_id_++, "exec.start", plain));
  ASSERT_TRUE(st.contains("execution_id"));
  EXPECT_TRUE(st.at("sandbox_digest").is_null());
  auto t = result_of(c.call(next_id_++, "exec.wait",
                            {{"execution_id", st.at("execution_id")}, {"timeout_ms", 20000}}, 25s));
  EXPECT_EQ(t.at("classification").as_string(), "exited");
  EXPECT_EQ(executions_of_session(c, session), 1U);
  // And now it is consumed.
  auto again = c.call(next_id_++, "exec.start", plain);
  ASSERT_TRUE(again);
  EXPECT_EQ(error_code_of(*again), "auth.replay");
}

TEST_F(DaemonSandbox, ARootCallerWithoutRunAsRootIsInvalidBeforeTheClaim) {
  if (::geteuid() != 0) GTEST_SKIP() << "the rule is about a root caller";
  auto c = daemon_.client();
  auto params = on_reference(sandboxed({"/bin/true"}, json::object{}), json::array{});
  for (char const* method : {"exec.check", "exec.start"}) {
    auto r = c.call(next_id_++, method, params);
    ASSERT_TRUE(r);
    EXPECT_EQ(error_code_of(*r), "sandbox.invalid") << method << json::serialize(*r);
    auto const& d = r->at("error").at("data").at("detail").at("diagnostics").as_array();
    ASSERT_EQ(d.size(), 1U);
    EXPECT_EQ(d[0].at("pointer").as_string(), "/plan/sandbox/process/run_as_root");
  }
  params.at("plan").as_object()["sandbox"] = json::parse(R"({"process": {"run_as_root": true}})");
  auto st = result_of(c.call(next_id_++, "exec.start", params));
  ASSERT_TRUE(st.contains("execution_id")) << "the refusal consumed nothing";
  EXPECT_EQ(st.at("sandbox_digest").as_string(), local_sandbox_digest(params));
}

TEST_F(DaemonSandbox, AReferenceRunIsDeniedWhatItsSandboxForbidsAndItsRecordNamesTheSandbox) {
  auto c = daemon_.client();
  auto params =
      on_reference(sandboxed({"/bin/true"}, json::parse(R"({"process": {"run_as_root": true}})")),
                   json::array{json::object{{"write", "stdout"}, {"data_b64", "aGk="}},
                               json::object{{"spawn", 1}},
                               json::object{{"write", "stdout"}, {"data_b64", "bm8="}}});
  auto st = result_of(c.call(next_id_++, "exec.start", params));
  ASSERT_TRUE(st.contains("execution_id"));
  auto const digest = local_sandbox_digest(params);
  EXPECT_EQ(st.at("sandbox_digest").as_string(), digest);
  auto t = result_of(c.call(next_id_++, "exec.wait",
                            {{"execution_id", st.at("execution_id")}, {"timeout_ms", 20000}}, 25s));
  EXPECT_EQ(t.at("classification").as_string(), "sandbox_denied") << json::serialize(t);
  EXPECT_EQ(t.at("exit").at("signal").as_int64(), SIGSYS);
  EXPECT_EQ(t.at("output").at("stdout").at("observed").as_int64(), 2);  // "hi", never "no"
  EXPECT_NE(std::string{t.at("observations").at("sandbox_denied").as_string()}.find(
                "process.no_descendants"),
            std::string::npos);
  auto g = result_of(c.call(next_id_++, "exec.get", {{"execution_id", st.at("execution_id")}}));
  EXPECT_EQ(g.at("sandbox_digest").as_string(), digest);
}

TEST_F(DaemonSandbox, AGrantsContractIsStoredAndAppliedBeforeTheClaim) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  auto admin = daemon_.client();
  auto grant = runner_grant("uid:4301", "g-sb", 10);
  grant["operations"] = json::array{"exec.reference"};
  grant["sandbox"] = json::parse(R"({"network": {"outbound": {"tcp_connect": [443]}},
                                     "secrets": [{"ref": "db", "to": {"env": "DB"}}]})");
  auto granted = result_of(admin.call(next_id_++, "authority.grant", grant));
  ASSERT_TRUE(granted.contains("grant")) << json::serialize(granted);
  EXPECT_EQ(granted.at("grant").at("sandbox"), grant.at("sandbox"));
  auto listed = result_of(admin.call(next_id_++, "authority.list"));
  bool found = false;
  for (auto const& g : listed.at("grants").as_array()) {
    if (g.at("id").as_string() == "g-sb") {
      found = true;
      EXPECT_EQ(g.at("sandbox"), grant.at("sandbox"));
    }
  }
  EXPECT_TRUE(found);
  auto const epoch = listed.at("epoch").to_number<std::uint64_t>();
  auto const session = "sbg-" + unique_suffix();
  auto as_runner = [&](json::value sb) {
    auto p = on_reference(sandboxed({"/bin/true"}, std::move(sb)), json::array{});
    p.at("identity").as_object()["session_id"] = session;
    p["authority"] = json::object{{"epoch", epoch}, {"grant_id", "g-sb"}, {"lease_id", nullptr}};
    return p;
  };
  struct Attempt {
    json::value sandbox;
    char const* code;
    char const* pointer;
  };
  std::vector<Attempt> const attempts = {
      {nullptr, "sandbox.required", "/plan/sandbox"},
      {json::parse(R"({"network": {"outbound": "any"}})"), "sandbox.undeclared",
       "/plan/sandbox/network/outbound"},
      {json::parse(R"({"network": {"outbound": {"tcp_connect": [443, 22]}}})"),
       "sandbox.undeclared", "/plan/sandbox/network/outbound/tcp_connect/1"},
      // Declared, but the store holds no secret of that name: the ref is unknown.
      {json::parse(R"({"secrets": [{"ref": "db", "to": {"env": "DB"}}]})"),
       "sandbox.secret_unknown", "/plan/sandbox/secrets/0/ref"},
  };
  fs::path const sock = daemon_.socket();
  auto [rc, why] = as_user_output(4301, 4301, {}, [&](std::string& out) {
    LineClient c{sock};
    if (!c.connected()) return 10;
    std::int64_t id = 1;
    for (auto const& a : attempts) {
      for (char const* method : {"exec.check", "exec.start"}) {
        auto r = c.call(id++, method, as_runner(a.sandbox));
        auto const* d =
            r && r->contains("error")
                ? r->at("error").at("data").at("detail").as_object().if_contains("diagnostics")
                : nullptr;
        if (!r || error_code_of(*r) != a.code || d == nullptr ||
            d->as_array().at(0).at("pointer").as_string() != a.pointer) {
          out = std::string{method} + " " + a.code + ": " + (r ? json::serialize(*r) : "none");
          return 20;
        }
      }
    }
    // Within the contract: it runs, and the same identity was never consumed by the refusals.
    auto ok =
        c.call(id++, "exec.start",
               as_runner(json::parse(R"({"network": {"outbound": {"tcp_connect": [443]}}})")));
    if (!ok || !ok->contains("result")) {
      out = ok ? json::serialize(*ok) : "no answer";
      return 30;
    }
    return 0;
  });
  EXPECT_EQ(rc, 0) << why;
  EXPECT_EQ(executions_of_session(admin, session), 1U);
}

}  // namespace
}  // namespace custos::e2e
