// Canonical bytes and digests of identity + plan: round trips, strict decoding, and a mutator for
// every single field proving the digest covers it.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>

#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"

#include "core/plan_fixtures.hpp"

namespace custos::core {
namespace {

using testing::full_identity;
using testing::full_plan;

// ------------------------------------------------------------------------------ every field

struct Mutator {
  std::string field;  // dotted path of the one member it changes
  std::function<void(ExecutionIdentity&, ExecutionPlan&)> apply;
};

using I = ExecutionIdentity;
using P = ExecutionPlan;

// One entry per leaf member. Adding a member to any struct means bumping its kFieldCount (the
// encoder's structured binding will not compile otherwise), which makes kLeafFields below
// disagree with this list until a mutator for the new member is added here.
std::vector<Mutator> const& mutators() {
  static std::vector<Mutator> const kMutators = {
      {"identity.project_id", [](I& i, P&) { i.project_id = "p2"; }},
      {"identity.session_id", [](I& i, P&) { i.session_id = "s2"; }},
      {"identity.run_id", [](I& i, P&) { i.run_id = "r2"; }},
      {"identity.attempt_id", [](I& i, P&) { i.attempt_id = "a2"; }},
      {"identity.turn_id", [](I& i, P&) { i.turn_id = "t2"; }},
      {"identity.action_id", [](I& i, P&) { i.action_id = "act-43"; }},
      {"identity.process_id", [](I& i, P&) { i.process_id = "proc-2"; }},
      {"identity.workspace_id", [](I& i, P&) { i.workspace_id = "w2"; }},
      {"identity.resource_id", [](I& i, P&) { i.resource_id = "res2"; }},
      {"identity.environment_id", [](I& i, P&) { i.environment_id = "env2"; }},
      {"identity.generation", [](I& i, P&) { i.generation += 1; }},
      {"identity.revision", [](I& i, P&) { i.revision += 1; }},
      {"plan.command.executable", [](I&, P& p) { p.command.executable = "/usr/bin/envv"; }},
      {"plan.command.argv", [](I&, P& p) { p.command.argv.back() += "x"; }},
      {"plan.workspace.root", [](I&, P& p) { p.workspace.root = "/srv/work/w2"; }},
      {"plan.workspace.access", [](I&, P& p) { p.workspace.access = WorkspaceAccess::read_only; }},
      {"plan.cwd", [](I&, P& p) { p.cwd = "src"; }},
      {"plan.env.name", [](I&, P& p) { p.env[1].name = "LC_ALL"; }},
      {"plan.env.value", [](I&, P& p) { p.env[1].value = "C"; }},
      {"plan.io.mode", [](I&, P& p) { p.io = IoPolicy{}; }},
      {"plan.io.rows", [](I&, P& p) { p.io.rows += 1; }},
      {"plan.io.cols", [](I&, P& p) { p.io.cols += 1; }},
      {"plan.io.resize", [](I&, P& p) { p.io.resize = !p.io.resize; }},
      {"plan.limits.wall_ms", [](I&, P& p) { p.limits.wall_ms = std::nullopt; }},
      {"plan.limits.cpu_ms", [](I&, P& p) { *p.limits.cpu_ms += 1; }},
      {"plan.limits.memory_bytes", [](I&, P& p) { *p.limits.memory_bytes += 1; }},
      {"plan.limits.processes", [](I&, P& p) { *p.limits.processes += 1; }},
      {"plan.limits.open_files", [](I&, P& p) { *p.limits.open_files += 1; }},
      {"plan.limits.disk_bytes", [](I&, P& p) { *p.limits.disk_bytes += 1; }},
      {"plan.limits.output_bytes", [](I&, P& p) { *p.limits.output_bytes += 1; }},
      {"plan.limits.stdin_bytes", [](I&, P& p) { *p.limits.stdin_bytes += 1; }},
      {"plan.output.chunk_bytes", [](I&, P& p) { p.output.chunk_bytes += 1; }},
      {"plan.output.retained_bytes", [](I&, P& p) { p.output.retained_bytes += 1; }},
      {"plan.output.spool_bytes", [](I&, P& p) { p.output.spool_bytes += 1; }},
      {"plan.output.max_events", [](I&, P& p) { p.output.max_events += 1; }},
      {"plan.output.on_limit", [](I&, P& p) { p.output.on_limit = OnLimit::truncate; }},
      {"plan.escalation.signal", [](I&, P& p) { p.escalation.signal = 15; }},
      {"plan.escalation.grace_ms", [](I&, P& p) { p.escalation.grace_ms += 1; }},
      {"plan.escalation.kill_after_ms", [](I&, P& p) { p.escalation.kill_after_ms += 1; }},
      {"plan.user.uid", [](I&, P& p) { p.user->uid += 1; }},
      {"plan.user.gid", [](I&, P& p) { p.user->gid += 1; }},
      {"plan.user.groups", [](I&, P& p) { p.user->groups.push_back(5000); }},
      {"plan.sandbox_digest",
       [](I&, P& p) {
         Digest d;
         d.bytes.fill(0x5a);
         p.sandbox_digest = d;
       }},
      {"plan.backend.kind", [](I&, P& p) { p.backend.kind = BackendKind::docker; }},
      {"plan.backend.container", [](I&, P& p) { p.backend.container = "c0ffee2"; }},
      {"plan.backend.socket", [](I&, P& p) { p.backend.socket = std::nullopt; }},
      {"plan.backend.gate", [](I&, P& p) { p.backend.gate = GatePolicy::optional; }},
      // The script needs the reference kind (and no container or socket); each of its own
      // members is mutated alone in reference_script_test.cpp.
      {"plan.backend.script",
       [](I&, P& p) {
         p.backend = Backend{BackendKind::reference, std::nullopt, std::nullopt,
                             ReferenceScript{{script::Exit{3}}}};
       }},
  };
  return kMutators;
}

// Leaf members: every member of every struct, except that a member which is itself a struct is
// counted through its own members (plan.cwd and plan.sandbox_digest are the plan's direct leaves).
constexpr std::size_t kLeafFields =
    ExecutionIdentity::kFieldCount + Command::kFieldCount + Workspace::kFieldCount + 1 /* cwd */ +
    EnvEntry::kFieldCount + IoPolicy::kFieldCount + Limits::kFieldCount +
    OutputPolicy::kFieldCount + Escalation::kFieldCount + UserSpec::kFieldCount +
    1 /* sandbox_digest */ + Backend::kFieldCount;
// The plan's own members: command, workspace, cwd, env, io, limits, output, escalation, user,
// sandbox, backend — each covered above through its leaves.
static_assert(ExecutionPlan::kFieldCount == 11);

TEST(PlanDigest, EveryFieldHasAMutator) {
  std::set<std::string> names;
  for (auto const& m : mutators())
    EXPECT_TRUE(names.insert(m.field).second) << "duplicate " << m.field;
  EXPECT_EQ(mutators().size(), kLeafFields)
      << "a struct member was added or removed: add its mutator here and encode it";
}

TEST(PlanDigest, ChangingAnySingleFieldChangesTheDigest) {
  auto const id0 = full_identity();
  auto const plan0 = full_plan();
  auto const base = plan_digest(id0, plan0);
  ASSERT_TRUE(base) << base.error().message();
  std::set<std::string> digests{base->to_string()};
  for (auto const& m : mutators()) {
    auto id = id0;
    auto plan = plan0;
    m.apply(id, plan);
    ASSERT_TRUE(id != id0 || plan != plan0) << m.field << " mutator changed nothing";
    auto d = plan_digest(id, plan);
    ASSERT_TRUE(d) << m.field << ": " << d.error().message();
    EXPECT_NE(*d, *base) << m.field;
    EXPECT_TRUE(digests.insert(d->to_string()).second)
        << m.field << " collides with another mutation";
    // And the decoded value carries the change.
    auto bytes = encode_execution(id, plan).value();
    auto back = decode_execution(bytes);
    ASSERT_TRUE(back) << m.field << ": " << back.error().message();
    EXPECT_EQ(back->identity, id) << m.field;
    EXPECT_EQ(back->plan, plan) << m.field;
  }
}

TEST(PlanDigest, InheritAndLiteralEncodeDifferently) {
  auto id = full_identity();
  auto a = full_plan();
  a.env = {{"PATH", std::nullopt}};
  auto b = a;
  b.env[0].value = "";  // literal empty value: still not the same as inheriting
  EXPECT_NE(plan_digest(id, a).value(), plan_digest(id, b).value());
  EXPECT_NE(encode_plan(a).value(), encode_plan(b).value());
}

TEST(PlanDigest, EnvOrderMatters) {
  // The env list is encoded in the caller's order: the digest binds exactly the request.
  auto id = full_identity();
  auto a = full_plan();
  auto b = a;
  std::swap(b.env[0], b.env[1]);
  EXPECT_NE(plan_digest(id, a).value(), plan_digest(id, b).value());
}

TEST(PlanDigest, EncodersRefuseInvalidValues) {
  auto id = full_identity();
  auto plan = full_plan();
  id.run_id = "bad id";
  auto e = encode_execution(id, plan);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Errc::plan_invalid_id);
  EXPECT_EQ(e.error().diagnostics.at(0).pointer, "/identity/run_id");
  plan.command.argv.clear();
  EXPECT_EQ(encode_plan(plan).error().code, Errc::plan_empty_argv);
  EXPECT_FALSE(plan_digest(id, plan));
}

TEST(PlanDigest, DecodeRejectsSemanticallyInvalidBytes) {
  // Build framing-valid bytes for a plan that breaks a rule (argv empty) with the primitives.
  auto good = encode_plan(full_plan()).value();
  auto plan = full_plan();
  plan.cwd = "../x";
  CanonicalWriter w{kind::plan};
  write_plan(w, 1, plan);  // nested under tag 1: wrong layout for a plan document
  auto nested = std::move(w).finish();
  EXPECT_EQ(decode_plan(nested).error().code, Errc::canonical_malformed);
  // Same layout as a real plan document but with an invalid cwd: rewrite the cwd string bytes.
  auto valid = full_plan();
  valid.cwd = "abcd";
  auto bytes = encode_plan(valid).value();
  std::string const needle = "abcd";
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end());
  std::string const escape = "../x";
  std::copy(escape.begin(), escape.end(), it);
  auto d = decode_plan(bytes);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Errc::canonical_malformed);
  ASSERT_EQ(d.error().diagnostics.size(), 1U);
  EXPECT_EQ(d.error().diagnostics[0].code, Errc::plan_invalid_cwd);
  EXPECT_TRUE(decode_plan(good));
}

TEST(PlanDigest, DecodeRejectsWrongDocumentKinds) {
  auto id_doc = encode_identity(full_identity()).value();
  EXPECT_EQ(decode_plan(id_doc).error().code, Errc::canonical_malformed);
  EXPECT_EQ(decode_execution(id_doc).error().code, Errc::canonical_malformed);
  auto doc = encode_plan(full_plan()).value();
  doc.push_back(0);
  EXPECT_EQ(decode_plan(doc).error().code, Errc::canonical_trailing_bytes);
  doc.pop_back();
  doc[5] = 9;  // version
  EXPECT_EQ(decode_plan(doc).error().code, Errc::canonical_unsupported_version);
}

TEST(PlanDigest, UnknownEnumBytesAreMalformed) {
  auto plan = full_plan();
  plan.env.clear();
  plan.user.reset();
  auto doc = encode_plan(plan).value();
  // The workspace access byte: the u8 field with tag 2 inside the workspace record.
  // Locate it by encoding the other access and diffing.
  auto other = plan;
  other.workspace.access = WorkspaceAccess::read_only;
  auto doc2 = encode_plan(other).value();
  ASSERT_EQ(doc.size(), doc2.size());
  std::size_t diff = 0;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    if (doc[i] != doc2[i]) diff = i;
  }
  ASSERT_NE(diff, 0U);
  doc[diff] = 3;
  EXPECT_EQ(decode_plan(doc).error().code, Errc::canonical_malformed);
}

// ------------------------------------------------------------------------------ properties

RC_GTEST_PROP(PlanProperty, IdentityRoundTrips, ()) {
  auto const id = testing::generate_identity();
  auto bytes = encode_identity(id);
  RC_ASSERT(static_cast<bool>(bytes));
  auto back = decode_identity(*bytes);
  RC_ASSERT(static_cast<bool>(back));
  RC_ASSERT(*back == id);
  auto json_back = parse_identity(to_json(id));
  RC_ASSERT(static_cast<bool>(json_back));
  RC_ASSERT(*json_back == id);
}

RC_GTEST_PROP(PlanProperty, PlanRoundTripsThroughBytesAndJson, ()) {
  auto const plan = testing::generate_plan();
  auto diags = validate_plan(plan);
  RC_ASSERT(diags.empty());
  auto bytes = encode_plan(plan);
  RC_ASSERT(static_cast<bool>(bytes));
  auto back = decode_plan(*bytes);
  RC_ASSERT(static_cast<bool>(back));
  RC_ASSERT(*back == plan);
  // The JSON form is the effective plan too: parsing it gives the same value and bytes.
  auto text = boost::json::serialize(to_json(plan));
  auto v = parse_json_text(text);
  RC_ASSERT(static_cast<bool>(v));
  auto parsed = parse_plan(*v);
  RC_ASSERT(static_cast<bool>(parsed));
  RC_ASSERT(*parsed == plan);
  RC_ASSERT(encode_plan(*parsed).value() == *bytes);
}

RC_GTEST_PROP(PlanProperty, ExecutionRoundTripsAndDistinctPlansHaveDistinctDigests, ()) {
  auto const id = testing::generate_identity();
  auto const a = testing::generate_plan();
  auto const b = testing::generate_plan();
  auto bytes = encode_execution(id, a).value();
  auto back = decode_execution(bytes);
  RC_ASSERT(static_cast<bool>(back));
  RC_ASSERT(back->identity == id);
  RC_ASSERT(back->plan == a);
  bool const same_digest = plan_digest(id, a).value() == plan_digest(id, b).value();
  bool const same_plan = a == b;
  RC_ASSERT(same_digest == same_plan);
}

RC_GTEST_PROP(PlanProperty, AnySingleByteFlipIsRejectedOrChangesTheValue, ()) {
  auto const plan = testing::generate_plan();
  auto bytes = encode_plan(plan).value();
  auto const at = *rc::gen::inRange<std::size_t>(0, bytes.size());
  auto const x = *rc::gen::inRange<int>(1, 256);
  bytes[at] = static_cast<std::uint8_t>(bytes[at] ^ x);
  auto back = decode_plan(bytes);
  // Strictness: a flipped byte never decodes to the same plan (one value, one encoding).
  if (back) {
    bool const same = *back == plan;
    RC_ASSERT(!same);
    bool const reencodes = encode_plan(*back).value() == bytes;
    RC_ASSERT(reencodes);
  }
}

}  // namespace
}  // namespace custos::core
