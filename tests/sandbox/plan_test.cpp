// A whole plan with its sandbox (plan.hpp): the digest enters the plan, the diagnostics of the
// plan and of its sandbox come together, the effective JSON parses back, and the binding check.
#include "custos/sandbox/plan.hpp"

#include <gtest/gtest.h>

#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"
#include "custos/sandbox/canonical.hpp"

#include "sandbox/fixtures.hpp"

namespace custos::sandbox {
namespace {

using testing::js;
namespace json = boost::json;

json::value plan_json(std::string_view sandbox_member) {
  std::string text = R"({"command": {"executable": "/bin/true", "argv": ["true"]},
                         "workspace": {"root": "/w"}, "env": [{"name": "PATH", "inherit": true}])";
  if (!sandbox_member.empty()) text += R"(, "sandbox": )" + std::string{sandbox_member};
  return js(text + "}");
}

TEST(SandboxPlan, AbsentMeansUnsandboxed) {
  auto p = parse_plan(plan_json(""), "/plan");
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->sandbox, nullptr);
  EXPECT_FALSE(p->plan.sandbox_digest);
  EXPECT_FALSE(to_json(*p).as_object().contains("sandbox"));
  // Exactly what core's own parser gives for the same plan.
  EXPECT_EQ(p->plan, core::parse_plan(plan_json("")).value());
}

TEST(SandboxPlan, PresentEvenEmptyIsASandboxWhoseDigestEntersThePlan) {
  auto p = parse_plan(plan_json(R"({"environment": {"allow": ["PATH"]}})"), "/plan");
  ASSERT_TRUE(p) << p.error().message();
  ASSERT_NE(p->sandbox, nullptr);
  EXPECT_EQ(p->plan.sandbox_digest, p->sandbox->digest);
  EXPECT_EQ(digest(p->sandbox->checked).value(), p->sandbox->digest);
  EXPECT_TRUE(check_binding(p->plan, p->sandbox.get()));
  // {} is not "no sandbox": the plan's env is then not allowed.
  auto empty = parse_plan(plan_json("{}"), "/plan");
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, Errc::sandbox_invalid);
  EXPECT_EQ(empty.error().diagnostics.at(0).pointer, "/plan/env/0/name");
}

TEST(SandboxPlan, CoresOwnParserRefusesASandboxItCannotCompile) {
  auto r = core::parse_plan(plan_json("{}"), "/plan");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_unsupported);
  EXPECT_EQ(r.error().diagnostics.at(0).pointer, "/plan/sandbox");
}

TEST(SandboxPlan, PlanAndSandboxProblemsComeTogether) {
  auto text = R"({"command": {"executable": "bin/true", "argv": ["true"]},
                  "workspace": {"root": "/w"},
                  "sandbox": {"process": {"descendants": true}, "network": 1}})";
  auto r = parse_plan(js(text), "/plan");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::plan_invalid);
  std::vector<std::string> ptrs;
  for (auto const& d : r.error().diagnostics) ptrs.push_back(d.pointer);
  EXPECT_EQ(ptrs, (std::vector<std::string>{"/plan/command/executable",
                                            "/plan/sandbox/process/max_processes",
                                            "/plan/sandbox/network"}));
}

TEST(SandboxPlan, SeveralCompilationProblemsKeepTheSandboxCode) {
  auto r = parse_plan(js(R"({"command": {"executable": "/bin/true", "argv": ["true"]},
                             "workspace": {"root": "/w"},
                             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                             "sandbox": {}})"),
                      "/plan");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_invalid);
  EXPECT_EQ(r.error().diagnostics.size(), 2U);
}

TEST(SandboxPlan, TheEffectivePlanParsesBack) {
  auto p = parse_plan(plan_json(R"({"environment": {"allow": ["PATH", "PATH"]},
                                    "network": {"outbound": {"tcp_connect": [443, 80]}}})"),
                      "/plan")
               .value();
  auto const printed = to_json(p);
  auto const& sb = printed.at("sandbox").as_object();
  EXPECT_EQ(sb.at("network").at("outbound"), js(R"({"tcp_connect": [80, 443]})"));
  EXPECT_EQ(sb.at("process"), js(R"({"descendants": false, "max_processes": 1,
                                     "signal_scope": "own_tree", "run_as_root": false})"));
  auto again = parse_plan(printed, "/plan");
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again->plan, p.plan);
  EXPECT_EQ(again->sandbox->checked, p.sandbox->checked);
}

TEST(SandboxPlan, TheBindingIsChecked) {
  auto p = parse_plan(plan_json(R"({"environment": {"allow": ["PATH"]}})"), "/plan").value();
  auto other =
      parse_plan(plan_json(R"({"environment": {"allow": ["PATH", "HOME"]}})"), "/plan").value();
  EXPECT_EQ(check_binding(p.plan, other.sandbox.get()).error().code, Errc::auth_digest_mismatch);
  EXPECT_EQ(check_binding(p.plan, nullptr).error().code, Errc::auth_digest_mismatch);
  auto unsandboxed = parse_plan(plan_json(""), "/plan").value();
  EXPECT_TRUE(check_binding(unsandboxed.plan, nullptr));
  EXPECT_EQ(check_binding(unsandboxed.plan, p.sandbox.get()).error().code,
            Errc::auth_digest_mismatch);
  // A checked plan that was changed after it was digested.
  auto forged = std::make_shared<PlanSandbox>(*p.sandbox);
  forged->checked.policy.network.outbound = Outbound::any;
  forged->checked.controls = {"environment.allow"};
  EXPECT_EQ(check_binding(p.plan, forged.get()).error().code, Errc::auth_digest_mismatch);
}

}  // namespace
}  // namespace custos::sandbox
