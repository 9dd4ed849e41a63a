// The checked sandbox plan's canonical bytes and digest (canonical.hpp): round trips, strict
// decoding, set invariance, and what the digest binds (and does not).
#include "custos/sandbox/canonical.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "custos/core/plan_canonical.hpp"
#include "custos/sandbox/controls.hpp"
#include "custos/sandbox/plan.hpp"

#include "sandbox/fixtures.hpp"

namespace custos::sandbox {
namespace {

using testing::req;
using testing::roomy_plan;

CheckedSandboxPlan checked_of(std::string_view sandbox) {
  return compile_plan(req(sandbox), roomy_plan()).value();
}

CheckedSandboxPlan checked_of(SandboxRequirements const& r) {
  CheckedSandboxPlan c;
  c.policy = effective(r);
  c.controls = required_controls(c.policy);
  return c;
}

TEST(SandboxCanonical, RoundTripsAndStartsWithItsKind) {
  auto const c = checked_of(R"({
      "filesystem": [{"path": "/usr", "allow": ["discover", "metadata", "read", "execute"]},
                     {"path": "/w", "allow": ["metadata", "write"]}],
      "process": {"descendants": true, "max_processes": 7},
      "environment": {"allow": ["PATH"]},
      "network": {"outbound": {"tcp_connect": [443, 80]}},
      "secrets": [{"ref": "a", "to": {"fd": 5}}, {"ref": "a", "to": {"env": "A"}},
                  {"ref": "b", "to": {"file": "b.key"}}],
      "resources": {"enforce": ["wall_ms", "processes"]},
      "terminal": {"modes": ["pty", "pipes"], "input": true, "resize": true}})");
  auto bytes = encode(c);
  ASSERT_TRUE(bytes) << bytes.error().message();
  EXPECT_EQ(core::CanonicalReader::peek_kind(*bytes).value(), kind::checked_sandbox);
  auto back = decode(*bytes);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(*back, c);
  EXPECT_EQ(digest(c).value(), core::sha256(*bytes).value());
}

TEST(SandboxCanonical, TheEmptySandboxHasOneFixedEncoding) {
  // Pinned (the same bytes conformance/reference_encoder.py computes from the page): a change
  // of them is a change of the encoding (docs/canonical-encoding.md §4).
  auto const bytes = encode(checked_of("{}")).value();
  EXPECT_EQ(
      core::to_hex(bytes),
      "4353545300010200000001700001090000000508000000000002080000002902020001050000000100000203"
      "000000080000000000000001000301000000010100040500000001000003080000000e020300010900000005"
      "0700000000000408000000160204000101000000010100020900000005020000000000050900000005080000"
      "00000006080000000a020800010100000001000007080000001a020900010100000001010002050000000100"
      "0003050000000100000809000000bd070000000800000011656e7669726f6e6d656e742e616c6c6f77000000"
      "1a66696c6573797374656d2e6d6f756e745f6e616d657370616365000000126e6574776f726b2e6e6f5f696e"
      "626f756e640000000c6e6574776f726b2e6e6f6e650000001670726f636573732e6e6f5f64657363656e6461"
      "6e74730000001470726f636573732e6e6f5f6e65775f70726976730000001070726f636573732e6e6f6e5f72"
      "6f6f740000001570726f636573732e7069645f6e616d657370616365");
}

TEST(SandboxCanonical, DecodeRejectsWhatEffectiveCannotProduce) {
  auto bad_policy = [](auto mutate) {
    CheckedSandboxPlan c = checked_of("{}");
    mutate(c.policy);
    c.controls = required_controls(c.policy);
    return c;
  };
  std::vector<CheckedSandboxPlan> const bad = {
      bad_policy([](SandboxPolicy& p) {
        p.filesystem = {{"/b", {}}, {"/a", {}}};
      }),
      bad_policy([](SandboxPolicy& p) {
        p.filesystem = {{"/a/../b", {}}};
      }),
      bad_policy([](SandboxPolicy& p) {
        p.filesystem = {{"/a", RightSet{Right::read}}};
      }),
      bad_policy([](SandboxPolicy& p) { p.process.max_processes = 2; }),
      bad_policy([](SandboxPolicy& p) {
        p.environment.allow = {"B", "A"};
      }),
      bad_policy([](SandboxPolicy& p) { p.network.tcp_ports = {443}; }),
      bad_policy([](SandboxPolicy& p) {
        p.network.outbound = Outbound::tcp_connect;
        p.network.tcp_ports = {80, 80};
      }),
      bad_policy([](SandboxPolicy& p) {
        p.secrets = {{"a", SecretChannel::env, "X", 0}, {"b", SecretChannel::env, "X", 0}};
      }),
      bad_policy([](SandboxPolicy& p) {
        p.secrets = {{"a", SecretChannel::fd, "", 2}};
      }),
      bad_policy([](SandboxPolicy& p) { p.resources.enforce.add(core::ResourceDim::concurrency); }),
      bad_policy([](SandboxPolicy& p) { p.terminal.modes = ModeSet{}; }),
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_FALSE(policy_problems(bad[i].policy).empty());
    EXPECT_EQ(encode(bad[i]).error().code, Errc::sandbox_invalid);
  }
  // Controls that are not exactly the policy's.
  auto c = checked_of("{}");
  c.controls.pop_back();
  EXPECT_EQ(encode(c).error().code, Errc::sandbox_invalid);
  // Bytes: every truncation, a trailing byte and another kind are refused.
  auto const good = encode(checked_of(R"({"environment": {"allow": ["X"]}})")).value();
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(decode(std::span(good).first(n))) << n;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(decode(longer).error().code, Errc::canonical_trailing_bytes);
  auto plan_doc = core::encode_plan(roomy_plan()).value();
  EXPECT_EQ(decode(plan_doc).error().code, Errc::canonical_malformed);
}

TEST(SandboxCanonical, ArgvDoesNotChangeTheSandboxDigestButThePlanDigestCoversIt) {
  auto const r = req(R"({"network": {"outbound": "any"}})");
  auto plan = roomy_plan();
  auto const a = compile_sandbox(r, plan).value();
  plan.command.argv.push_back("--verbose");
  auto const b = compile_sandbox(r, plan).value();
  EXPECT_EQ(a->digest, b->digest);
  core::ExecutionIdentity const id{"p", "s", "r", "a", "t", "act", "proc", "w", "res", "env", 1, 1};
  plan.sandbox_digest = a->digest;
  auto const with = core::plan_digest(id, plan).value();
  auto other = plan;
  other.sandbox_digest = compile_sandbox(req("{}"), plan).value()->digest;
  EXPECT_NE(core::plan_digest(id, other).value(), with);
  auto none = plan;
  none.sandbox_digest.reset();
  EXPECT_NE(core::plan_digest(id, none).value(), with);
  // Core decodes the digest back.
  auto back = core::decode_plan(core::encode_plan(plan).value());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->sandbox_digest, a->digest);
}

TEST(SandboxCanonical, AnUnsandboxedPlanKeepsItsBytes) {
  // Core writes the same sandbox_none record it always wrote (the vectors 01-13 are unchanged).
  auto const bytes = core::encode_plan(roomy_plan()).value();
  std::vector<std::uint8_t> const none = {0x00, 0x0a, 0x08, 0x00, 0x00, 0x00, 0x02, 0x00, 0x1a};
  EXPECT_NE(std::search(bytes.begin(), bytes.end(), none.begin(), none.end()), bytes.end());
}

RC_GTEST_PROP(SandboxCanonicalProps, EncodeDecodeRoundTrip, ()) {
  auto const c = checked_of(*testing::gen_requirements());
  auto bytes = encode(c);
  RC_ASSERT(static_cast<bool>(bytes));
  auto back = decode(*bytes);
  RC_ASSERT(static_cast<bool>(back));
  bool const same = *back == c;
  RC_ASSERT(same);
  bool const same_bytes = encode(*back).value() == *bytes;
  RC_ASSERT(same_bytes);
}

RC_GTEST_PROP(SandboxCanonicalProps, OrderAndRepeatsInListsDoNotChangeTheDigest, ()) {
  auto const r = *testing::gen_requirements();
  auto const s = testing::shuffled(r);
  bool const same_policy = effective(s) == effective(r);
  RC_ASSERT(same_policy);
  bool const same_digest = digest(checked_of(s)).value() == digest(checked_of(r)).value();
  RC_ASSERT(same_digest);
}

RC_GTEST_PROP(SandboxCanonicalProps, DifferentPoliciesHaveDifferentDigests, ()) {
  auto const a = checked_of(*testing::gen_requirements());
  auto const b = checked_of(*testing::gen_requirements());
  bool const equal = a == b;
  bool const equal_digests = digest(a).value() == digest(b).value();
  RC_ASSERT(equal == equal_digests);
}

}  // namespace
}  // namespace custos::sandbox
