// The reference backend's script: its JSON form, its rules at and past every bound, its canonical
// bytes (every member digested, non-reference bytes untouched), and round trips.
// The one-diagnostic rule table is in plan_validation_test.cpp (PlanRule, "the reference script").
#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"

#include "core/plan_fixtures.hpp"

namespace custos::core {
namespace {

namespace json = boost::json;
using namespace std::string_literals;
using testing::full_identity;
using testing::full_reference_plan;
using testing::full_script;

// The example request's plan on the reference backend with these steps (JSON text).
json::object plan_with_steps(std::string_view steps) {
  auto plan = testing::example_request().at("plan").as_object();
  plan["backend"] =
      json::object{{"kind", "reference"}, {"script", json::object{{"steps", json::parse(steps)}}}};
  return plan;
}

std::vector<std::pair<Errc, std::string>> diagnostics_of(json::object const& plan) {
  auto r = parse_plan(plan, "/plan");
  std::vector<std::pair<Errc, std::string>> out;
  if (!r) {
    for (auto const& d : r.error().diagnostics) out.emplace_back(d.code, d.pointer);
  }
  return out;
}

TEST(ReferenceScript, EveryStepKindParses) {
  auto plan = parse_plan(plan_with_steps(R"([
      {"write": "stdout", "data_b64": "aGkK"},
      {"write": "stderr", "data_b64": "AP+A"},
      {"sleep_ms": 250},
      {"spawn": 3},
      {"ignore": "SIGTERM"},
      {"use": {"cpu_ms": 100, "memory_bytes": 1048576, "disk_bytes": 4096, "descriptors": 12}},
      {"read_stdin": 64},
      {"signal": "SIGSEGV"}])"));
  ASSERT_TRUE(plan) << plan.error().message();
  ASSERT_TRUE(plan->backend.script.has_value());
  EXPECT_EQ(*plan->backend.script, full_script());
  EXPECT_EQ(script_end(*plan->backend.script),
            (std::variant<script::Exit, script::Signal>{script::Signal{11}}));
  std::vector<std::string_view> keys;
  for (auto const& s : plan->backend.script->steps) keys.push_back(script_step_key(s));
  EXPECT_EQ(keys, (std::vector<std::string_view>{"write", "write", "sleep_ms", "spawn", "ignore",
                                                 "use", "read_stdin", "signal"}));
}

TEST(ReferenceScript, ToJsonIsTheInputForm) {
  auto const j = to_json(full_reference_plan());
  auto const want = json::parse(R"({"kind": "reference", "script": {"steps": [
      {"write": "stdout", "data_b64": "aGkK"},
      {"write": "stderr", "data_b64": "AP+A"},
      {"sleep_ms": 250},
      {"spawn": 3},
      {"ignore": "SIGTERM"},
      {"use": {"cpu_ms": 100, "memory_bytes": 1048576, "disk_bytes": 4096, "descriptors": 12}},
      {"read_stdin": 64},
      {"signal": "SIGSEGV"}]}})");
  EXPECT_EQ(j.at("backend"), want);
  // A Use names only what it sets.
  auto plan = full_reference_plan();
  plan.backend.script->steps = {script::Use{std::nullopt, 7, std::nullopt, std::nullopt},
                                script::Exit{4}};
  EXPECT_EQ(to_json(plan).at("backend").at("script"),
            json::parse(R"({"steps": [{"use": {"memory_bytes": 7}}, {"exit": 4}]})"));
}

TEST(ReferenceScript, EndsWithItsExitOrSignalElseExitZero) {
  using End = std::variant<script::Exit, script::Signal>;
  EXPECT_EQ(script_end(ReferenceScript{}), End{script::Exit{0}});
  EXPECT_EQ(script_end(ReferenceScript{{script::Sleep{5}}}), End{script::Exit{0}});
  EXPECT_EQ(script_end(ReferenceScript{{script::Sleep{5}, script::Exit{7}}}), End{script::Exit{7}});
  EXPECT_EQ(script_end(ReferenceScript{{script::Signal{9}}}), End{script::Signal{9}});
  // An empty script is a valid plan: the model exits 0 at once.
  EXPECT_TRUE(parse_plan(plan_with_steps("[]")));
}

TEST(ReferenceScript, BoundsAreInclusive) {
  // Exactly at every bound: accepted.
  std::string steps = "[";
  for (std::size_t i = 0; i < kMaxScriptSteps - 4; ++i) steps += R"({"spawn": 1},)";
  steps += R"({"sleep_ms": 3599999}, {"sleep_ms": 1}, {"spawn": 3076},)";
  steps += R"({"read_stdin": 9007199254740991}])";
  ASSERT_EQ(kMaxScriptSpawn, 1020U + 3076U);
  auto plan = parse_plan(plan_with_steps(steps));
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(plan->backend.script->steps.size(), kMaxScriptSteps);
  // One more of anything: refused.
  EXPECT_EQ(
      diagnostics_of(plan_with_steps(R"([{"read_stdin": 9007199254740991}, {"read_stdin": 1}])")),
      (std::vector<std::pair<Errc, std::string>>{
          {Errc::plan_too_large, "/plan/backend/script/steps/1/read_stdin"}}));
  EXPECT_EQ(diagnostics_of(plan_with_steps(R"([{"read_stdin": 9007199254740992}])")),
            (std::vector<std::pair<Errc, std::string>>{
                {Errc::plan_invalid_backend, "/plan/backend/script/steps/0/read_stdin"}}));
  // A write of exactly the bound.
  std::string b64(((1U << 20U) + 2) / 3 * 4, 'A');
  b64.replace(b64.size() - 2, 2, "==");  // 2^20 = 3 * 349525 + 1
  auto big = parse_plan(plan_with_steps(R"([{"write": "stdout", "data_b64": ")" + b64 + "\"}]"));
  ASSERT_TRUE(big) << big.error().message();
  EXPECT_EQ(std::get<script::Write>(big->backend.script->steps[0]).data.size(), 1U << 20U);
}

TEST(ReferenceScript, CollectsEveryRuleDiagnostic) {
  // Each problem once, in step order: a bound crossed is reported where it is crossed, and only
  // there; the end is reported at the first step after it.
  auto got = diagnostics_of(plan_with_steps(R"([
      {"sleep_ms": 0},
      {"write": "stderr", "data_b64": ""},
      {"spawn": 4096},
      {"spawn": 1},
      {"spawn": 1},
      {"use": {}},
      {"exit": 3},
      {"sleep_ms": 1},
      {"exit": 4}])"));
  std::vector<std::pair<Errc, std::string>> const want = {
      {Errc::plan_invalid_backend, "/plan/backend/script/steps/0/sleep_ms"},
      {Errc::plan_invalid_backend, "/plan/backend/script/steps/1/data_b64"},
      {Errc::plan_too_large, "/plan/backend/script/steps/3/spawn"},
      {Errc::plan_invalid_backend, "/plan/backend/script/steps/5/use"},
      {Errc::plan_invalid_backend, "/plan/backend/script/steps/7"},
  };
  EXPECT_EQ(got, want);
  // Structural problems in several steps are all reported (the rules wait for a whole script).
  got = diagnostics_of(plan_with_steps(R"([{"sleep_ms": "1"}, {"exit": 0}, {"signal": 11}])"));
  EXPECT_EQ(got, (std::vector<std::pair<Errc, std::string>>{
                     {Errc::plan_wrong_type, "/plan/backend/script/steps/0/sleep_ms"},
                     {Errc::plan_wrong_type, "/plan/backend/script/steps/2/signal"}}));
}

TEST(ReferenceScript, RulesOnStructs) {
  // validate_plan is what the encoder and decoder run: the same rules on values built in C++.
  auto plan = full_reference_plan();
  EXPECT_TRUE(validate_plan(plan).empty());
  auto with = [&](ScriptStep step) {
    auto p = plan;
    p.backend.script->steps.insert(p.backend.script->steps.begin(), std::move(step));
    return validate_plan(p, "/plan");
  };
  auto only = [](std::vector<Diagnostic> const& d) {
    return d.size() == 1 ? std::pair{d[0].code, d[0].pointer} : std::pair{Errc::internal, ""s};
  };
  EXPECT_EQ(only(with(script::Write{static_cast<ScriptStream>(3), {1}})),
            (std::pair{Errc::plan_invalid_backend, "/plan/backend/script/steps/0/write"s}));
  EXPECT_EQ(only(with(script::Ignore{9})),
            (std::pair{Errc::plan_invalid_backend, "/plan/backend/script/steps/0/ignore"s}));
  auto ending = plan;
  ending.backend.script->steps.back() = script::Signal{17};  // SIGCHLD does not end a process
  EXPECT_EQ(only(validate_plan(ending, "/plan")),
            (std::pair{Errc::plan_invalid_backend, "/plan/backend/script/steps/7/signal"s}));
  EXPECT_EQ(only(with(script::Use{kMaxPlanNumber + 1, std::nullopt, std::nullopt, std::nullopt})),
            (std::pair{Errc::plan_invalid_backend, "/plan/backend/script/steps/0/use/cpu_ms"s}));
  auto p = plan;
  p.backend.script.reset();
  EXPECT_EQ(only(validate_plan(p, "/plan")),
            (std::pair{Errc::plan_missing_field, "/plan/backend/script"s}));
  p = testing::full_plan();  // podman
  p.backend.script = ReferenceScript{};
  EXPECT_EQ(only(validate_plan(p, "/plan")),
            (std::pair{Errc::plan_invalid_backend, "/plan/backend/script"s}));
  p.backend.script->steps.assign(kMaxScriptSteps + 1, script::Sleep{1});
  p.backend.kind = BackendKind::reference;
  p.backend.container.reset();
  p.backend.socket.reset();
  EXPECT_EQ(only(validate_plan(p, "/plan")),
            (std::pair{Errc::plan_too_large, "/plan/backend/script/steps"s}));
}

TEST(ReferenceScript, SignalNamesRoundTrip) {
  std::set<std::uint32_t> numbers;
  for (std::uint32_t n = 0; n <= 64; ++n) {
    if (auto name = terminating_signal_name(n)) {
      EXPECT_EQ(terminating_signal_from_name(*name), n);
      numbers.insert(n);
    }
  }
  EXPECT_EQ(numbers.size(), 23U);
  EXPECT_EQ(terminating_signal_from_name("SIGSEGV"), 11U);
  EXPECT_EQ(terminating_signal_from_name("SIGKILL"), 9U);
  for (auto name : {"SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGWINCH", "SIGURG", "sigsegv"}) {
    EXPECT_EQ(terminating_signal_from_name(name), std::nullopt) << name;
  }
  // Every graceful signal also ends a process by default.
  for (std::uint32_t g : {1U, 2U, 3U, 10U, 12U, 15U}) EXPECT_TRUE(terminating_signal_name(g));
}

// ---- canonical bytes -----------------------------------------------------------------------

using Mutation = std::function<void(ReferenceScript&)>;

// One mutation per member of every step struct (and of the script: its step list).
std::vector<std::pair<std::string, Mutation>> const& script_mutators() {
  static std::vector<std::pair<std::string, Mutation>> const kMutators = {
      {"steps", [](ReferenceScript& s) { s.steps.pop_back(); }},
      {"write.stream",
       [](ReferenceScript& s) {
         std::get<script::Write>(s.steps[0]).stream = ScriptStream::stderr_stream;
       }},
      {"write.data", [](ReferenceScript& s) { std::get<script::Write>(s.steps[0]).data[0] ^= 1; }},
      {"sleep.ms", [](ReferenceScript& s) { std::get<script::Sleep>(s.steps[2]).ms += 1; }},
      {"spawn.count", [](ReferenceScript& s) { std::get<script::Spawn>(s.steps[3]).count += 1; }},
      {"ignore.signal",
       [](ReferenceScript& s) { std::get<script::Ignore>(s.steps[4]).signal = 2; }},
      {"use.cpu_ms", [](ReferenceScript& s) { *std::get<script::Use>(s.steps[5]).cpu_ms += 1; }},
      {"use.memory_bytes",
       [](ReferenceScript& s) { std::get<script::Use>(s.steps[5]).memory_bytes.reset(); }},
      {"use.disk_bytes",
       [](ReferenceScript& s) { *std::get<script::Use>(s.steps[5]).disk_bytes += 1; }},
      {"use.descriptors",
       [](ReferenceScript& s) { *std::get<script::Use>(s.steps[5]).descriptors += 1; }},
      {"read_stdin.bytes",
       [](ReferenceScript& s) { std::get<script::ReadStdin>(s.steps[6]).bytes += 1; }},
      {"signal.signal",
       [](ReferenceScript& s) { std::get<script::Signal>(s.steps[7]).signal = 6; }},
      {"exit.code", [](ReferenceScript& s) { s.steps[7] = script::Exit{0}; }},
      {"exit.code+1", [](ReferenceScript& s) { s.steps[7] = script::Exit{1}; }},
      {"order", [](ReferenceScript& s) { std::swap(s.steps[2], s.steps[3]); }},
  };
  return kMutators;
}

TEST(ReferenceScriptBytes, EveryMemberIsDigested) {
  // Leaves: the script's list, the eight step structs' members (Exit's code twice: the Signal
  // step is replaced by two different exits).
  std::size_t const leaves =
      ReferenceScript::kFieldCount + script::Write::kFieldCount + script::Sleep::kFieldCount +
      script::Spawn::kFieldCount + script::Ignore::kFieldCount + script::Use::kFieldCount +
      script::ReadStdin::kFieldCount + script::Exit::kFieldCount + script::Signal::kFieldCount;
  EXPECT_EQ(script_mutators().size(), leaves + 2) << "a step member was added: mutate it here";
  auto const id = full_identity();
  auto const base = full_reference_plan();
  auto const d0 = plan_digest(id, base);
  ASSERT_TRUE(d0) << d0.error().message();
  std::set<std::string> digests{d0->to_string()};
  for (auto const& [name, mutate] : script_mutators()) {
    auto plan = base;
    mutate(*plan.backend.script);
    ASSERT_NE(plan, base) << name << " changed nothing (Backend equality misses it)";
    auto d = plan_digest(id, plan);
    ASSERT_TRUE(d) << name << ": " << d.error().message();
    EXPECT_TRUE(digests.insert(d->to_string()).second) << name << " did not change the digest";
    auto back = decode_execution(encode_execution(id, plan).value());
    ASSERT_TRUE(back) << name << ": " << back.error().message();
    EXPECT_EQ(back->plan, plan) << name;
  }
}

TEST(ReferenceScriptBytes, OtherBackendsKeepTheirBytes) {
  // The script is an optional field: a plan without one encodes exactly as before it existed
  // (the vectors hold those bytes); here, the backend record of a native plan is kind + u8 only.
  auto plan = testing::full_plan();
  plan.backend = Backend{};
  auto const bytes = encode_plan(plan).value();
  std::vector<std::uint8_t> const tail = {0x00, 0x0b, 0x08, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x1b,
                                          0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01, 0x01};
  ASSERT_GE(bytes.size(), tail.size());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), bytes.end() - static_cast<long>(tail.size())));
}

TEST(ReferenceScriptBytes, DecoderRejectsWhatTheRulesRefuse) {
  // Framing-valid bytes of a script with a step after its end: the embedding writer does not
  // validate, so it can build them; the decoder re-applies the rules and refuses them.
  auto broken = full_reference_plan();
  broken.backend.script->steps.emplace_back(script::Sleep{1});
  CanonicalWriter w{kind::execution};
  write_identity(w, 1, full_identity());
  write_plan(w, 2, broken);
  auto const doc = std::move(w).finish();
  auto d = decode_execution(doc);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Errc::canonical_malformed);
  ASSERT_EQ(d.error().diagnostics.size(), 1U);
  EXPECT_EQ(d.error().diagnostics[0].code, Errc::plan_invalid_backend);
  EXPECT_EQ(d.error().diagnostics[0].pointer, "/plan/backend/script/steps/8");
  // And a script under a native backend.
  auto native = full_reference_plan();
  native.backend.kind = BackendKind::native;
  CanonicalWriter w2{kind::execution};
  write_identity(w2, 1, full_identity());
  write_plan(w2, 2, native);
  auto const doc2 = std::move(w2).finish();
  auto d2 = decode_execution(doc2);
  ASSERT_FALSE(d2);
  ASSERT_EQ(d2.error().diagnostics.size(), 1U);
  EXPECT_EQ(d2.error().diagnostics[0].pointer, "/plan/backend/script");
}

TEST(ReferenceScriptBytes, UnknownStepKindIsMalformed) {
  auto plan = full_reference_plan();
  plan.backend.script->steps = {script::Sleep{0x1234}};
  auto bytes = encode_plan(plan).value();
  // The step record's kind (0x0021) directly precedes its first field (tag 1, type u64).
  std::vector<std::uint8_t> const needle = {0x00, 0x21, 0x00, 0x01, 0x03};
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end());
  it[1] = 0x2f;
  auto d = decode_plan(bytes);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Errc::canonical_malformed);
  EXPECT_NE(d.error().context.find("script step"), std::string::npos) << d.error().context;
}

RC_GTEST_PROP(ReferenceScriptProps, ScriptsRoundTripThroughJsonAndBytes, ()) {
  auto plan = full_reference_plan();
  plan.backend.script = testing::generate_script();
  RC_ASSERT(validate_plan(plan).empty());
  auto const text = json::serialize(to_json(plan));
  auto parsed = parse_plan(parse_json_text(text).value());
  RC_ASSERT(static_cast<bool>(parsed));
  RC_ASSERT(*parsed == plan);
  auto bytes = encode_plan(plan);
  RC_ASSERT(static_cast<bool>(bytes));
  auto back = decode_plan(*bytes);
  RC_ASSERT(static_cast<bool>(back));
  RC_ASSERT(*back == plan);
  RC_ASSERT(encode_plan(*back).value() == *bytes);
}

}  // namespace
}  // namespace custos::core
