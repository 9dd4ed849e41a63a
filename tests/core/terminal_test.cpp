// Terminal record: strict JSON, canonical bytes, digest sensitivity, and round trips of random
// valid records.
#include "custos/core/terminal.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace custos::core {
namespace {

namespace json = boost::json;

TerminalRecord sample_exited() {
  ClassifyInput in;
  in.exit = ExitStatus::exited(0);
  in.cleanup = Cleanup::confirmed;
  auto rec = make_terminal_record(in, std::nullopt).value();
  rec.output[Stream::stdout_stream] = {12, 12, 0, true};
  rec.output[Stream::stderr_stream] = {0, 0, 0, true};
  rec.resources.at(ResourceDim::cpu) = {3, 300000, Fidelity::sampled};
  rec.resources.at(ResourceDim::wall) = {15, 600000, Fidelity::hard};
  rec.tree = {Boundary::cgroup, Cleanup::confirmed, Containment::kernel_enforced};
  return rec;
}

TerminalRecord sample_spawn_failed() {
  ClassifyInput in;
  in.spawn_failed = true;
  in.cleanup = Cleanup::confirmed;
  return make_terminal_record(in, SpawnFailure{"execve", 2, "No such file or directory"}).value();
}

TEST(Terminal, JsonShapeFollowsTheApi) {
  auto const j = to_json(sample_exited());
  ASSERT_TRUE(j) << j.error().message();
  auto const& o = j->as_object();
  EXPECT_EQ(o.at("classification"), "exited");
  EXPECT_EQ(o.at("recovery"), "observed");
  EXPECT_EQ(o.at("exit").at("code"), 0);
  EXPECT_TRUE(o.at("exit").at("signal").is_null());
  EXPECT_TRUE(o.at("trigger").is_null());
  EXPECT_EQ(o.at("escalation").at("forced"), false);
  EXPECT_EQ(o.at("output").at("stdout").at("observed"), 12);
  EXPECT_EQ(o.at("output").at("stderr").at("complete"), true);
  EXPECT_EQ(o.at("resources").as_object().size(), 8U);
  EXPECT_EQ(o.at("resources").at("cpu_ms").at("value"), 3);
  EXPECT_EQ(o.at("resources").at("cpu_ms").at("fidelity"), "sampled");
  EXPECT_EQ(o.at("resources").at("memory_bytes").at("fidelity"), "unavailable");
  EXPECT_EQ(o.at("tree").at("boundary"), "cgroup");
  EXPECT_EQ(o.at("tree").at("cleanup"), "confirmed");
  EXPECT_EQ(o.at("tree").at("containment"), "kernel_enforced");
  EXPECT_TRUE(o.at("spawn_error").is_null());
  auto const digest = std::string{o.at("digest").as_string()};
  EXPECT_EQ(digest.rfind("sha256:", 0), 0U);
  EXPECT_EQ(digest.size(), 7U + 64U);
  EXPECT_EQ(digest, terminal_digest(sample_exited()).value());
}

TEST(Terminal, SpawnFailureCarriesItsError) {
  auto const rec = sample_spawn_failed();
  EXPECT_EQ(rec.classification, Classification::spawn_failed);
  auto const j = to_json(rec).value();
  EXPECT_EQ(j.at("spawn_error").at("code"), "execve");
  EXPECT_EQ(j.at("spawn_error").at("errno"), 2);
  EXPECT_EQ(terminal_from_json(j).value(), rec);
  // spawn_failed without its error, or an error without spawn_failed, is inconsistent.
  auto missing = rec;
  missing.spawn_error.reset();
  EXPECT_EQ(validate(missing).error().code, Errc::lifecycle_illegal_transition);
  ClassifyInput ran;
  ran.exit = ExitStatus::exited(0);
  EXPECT_EQ(make_terminal_record(ran, SpawnFailure{}).error().code,
            Errc::lifecycle_illegal_transition);
}

TEST(Terminal, ValidateRejectsContradictions) {
  auto rec = sample_exited();
  ASSERT_TRUE(validate(rec));
  auto wrong = rec;
  wrong.classification = Classification::signaled;  // the exit says code 0
  EXPECT_EQ(validate(wrong).error().code, Errc::lifecycle_illegal_transition);
  wrong = rec;
  wrong.trigger = Trigger::deadline;  // a deadline trigger means timed_out
  EXPECT_EQ(validate(wrong).error().code, Errc::lifecycle_illegal_transition);
  wrong.classification = Classification::timed_out;
  EXPECT_TRUE(validate(wrong));
  wrong = rec;
  wrong.output[Stream::stdout_stream] = {12, 10, 2, true};  // truncated output claimed complete
  EXPECT_EQ(validate(wrong).error().code, Errc::accounting_invariant);
  wrong = rec;
  wrong.exit = ExitStatus{0, 9};
  EXPECT_EQ(validate(wrong).error().code, Errc::lifecycle_illegal_transition);
  wrong = rec;
  wrong.recovery = RecoveryPath::already_terminal;
  EXPECT_EQ(validate(wrong).error().code, Errc::lifecycle_illegal_transition);
  wrong = rec;
  wrong.recovery = RecoveryPath::indeterminate;  // nobody saw the end: cannot be "exited"
  EXPECT_EQ(validate(wrong).error().code, Errc::lifecycle_illegal_transition);
  wrong.classification = Classification::recovery_indeterminate;
  EXPECT_TRUE(validate(wrong));
  // Invalid records have no canonical bytes and no JSON.
  wrong = rec;
  wrong.classification = Classification::cancelled;
  EXPECT_FALSE(canonical_bytes(wrong));
  EXPECT_FALSE(to_json(wrong));
}

TEST(Terminal, StrictJsonParsing) {
  auto const good = to_json(sample_exited()).value();
  ASSERT_TRUE(terminal_from_json(good));

  auto expect_error = [&](std::function<void(json::object&)> const& mutate, Errc code,
                          std::string const& pointer) {
    json::value v = good;
    mutate(v.as_object());
    auto r = terminal_from_json(v);
    ASSERT_FALSE(r) << pointer;
    EXPECT_EQ(r.error().code, code) << pointer << ": " << r.error().message();
    if (!pointer.empty()) {
      ASSERT_EQ(r.error().diagnostics.size(), 1U) << r.error().message();
      EXPECT_EQ(r.error().diagnostics.front().pointer, pointer);
    }
  };
  expect_error([](json::object& o) { o["extra"] = 1; }, Errc::plan_unknown_field, "/extra");
  expect_error([](json::object& o) { o.erase("tree"); }, Errc::plan_missing_field, "/tree");
  expect_error([](json::object& o) { o.erase("trigger"); }, Errc::plan_missing_field, "/trigger");
  expect_error([](json::object& o) { o["classification"] = "finished"; }, Errc::plan_invalid_value,
               "/classification");
  expect_error([](json::object& o) { o["classification"] = 3; }, Errc::plan_wrong_type,
               "/classification");
  expect_error([](json::object& o) { o["exit"].as_object()["code"] = "0"; }, Errc::plan_wrong_type,
               "/exit/code");
  expect_error([](json::object& o) { o["exit"].as_object()["code"] = 1LL << 40; },
               Errc::plan_invalid_value, "/exit/code");
  expect_error([](json::object& o) { o["exit"].as_object()["core"] = true; },
               Errc::plan_unknown_field, "/exit/core");
  expect_error([](json::object& o) { o["output"].as_object()["stdin"] = json::object{}; },
               Errc::plan_unknown_field, "/output/stdin");
  expect_error(
      [](json::object& o) { o["output"].as_object()["stdout"].as_object()["observed"] = -1; },
      Errc::plan_invalid_value, "/output/stdout/observed");
  expect_error(
      [](json::object& o) { o["output"].as_object()["stdout"].as_object()["observed"] = 13; },
      Errc::accounting_invariant, "/output/stdout");
  expect_error([](json::object& o) { o["resources"].as_object().erase("disk_bytes"); },
               Errc::plan_missing_field, "/resources/disk_bytes");
  expect_error([](json::object& o) { o["resources"].as_object()["gpu"] = json::object{}; },
               Errc::plan_unknown_field, "/resources/gpu");
  expect_error(
      [](json::object& o) {
        o["resources"].as_object()["cpu_ms"].as_object()["fidelity"] = "exact";
      },
      Errc::plan_invalid_value, "/resources/cpu_ms/fidelity");
  expect_error([](json::object& o) { o["tree"].as_object()["cleanup"] = "gone"; },
               Errc::plan_invalid_value, "/tree/cleanup");
  expect_error([](json::object& o) { o["escalation"].as_object()["forced"] = 0; },
               Errc::plan_wrong_type, "/escalation/forced");
  // A digest that does not match the content is refused; an absent digest is recomputed.
  expect_error([](json::object& o) { o["digest"] = "sha256:00"; }, Errc::auth_digest_mismatch, "");
  expect_error(
      [](json::object& o) {
        o["output"].as_object()["stdout"].as_object()["observed"] = 11;
        o["output"].as_object()["stdout"].as_object()["retained"] = 11;
      },
      Errc::auth_digest_mismatch, "");
  json::value no_digest = good;
  no_digest.as_object().erase("digest");
  EXPECT_EQ(terminal_from_json(no_digest).value(), sample_exited());
  EXPECT_EQ(terminal_from_json(json::value(json::array{})).error().code, Errc::plan_wrong_type);
}

TEST(Terminal, CanonicalDecodingIsStrict) {
  auto const bytes = canonical_bytes(sample_exited()).value();
  EXPECT_EQ(terminal_from_canonical(bytes).value(), sample_exited());
  auto trailing = bytes;
  trailing.push_back(0);
  EXPECT_FALSE(terminal_from_canonical(trailing));
  auto truncated = bytes;
  truncated.pop_back();
  EXPECT_FALSE(terminal_from_canonical(truncated));
  EXPECT_FALSE(terminal_from_canonical(std::span<std::uint8_t const>{}));
  // Every single-byte corruption is either rejected or decodes to a different record whose
  // digest differs: a corrupted record can never pass as the original.
  auto const original_digest = terminal_digest(sample_exited()).value();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto corrupt = bytes;
    corrupt[i] ^= 0x01;
    auto r = terminal_from_canonical(corrupt);
    if (r) {
      EXPECT_NE(terminal_digest(*r).value(), original_digest) << "byte " << i;
    }
  }
}

// Changing any single field changes the digest. The list enumerates every field of the record;
// a field added to TerminalRecord without an entry here is caught by the size check below.
// Backend observations are bound into the record: they change its digest, round-trip through
// JSON and canonical bytes, and an empty set writes nothing (older records keep their bytes).
TEST(Terminal, BackendObservationsAreBoundIntoTheDigest) {
  auto const base = sample_exited();
  ASSERT_TRUE(base.observations.empty());
  auto const base_bytes = canonical_bytes(base).value();
  auto obs = base;
  obs.observations = {{"launch", "clone3"}, {"cgroup", "/custos/ex-1"}};
  EXPECT_NE(terminal_digest(obs).value(), terminal_digest(base).value());
  auto changed = obs;
  changed.observations["launch"] = "model";
  EXPECT_NE(terminal_digest(changed).value(), terminal_digest(obs).value());
  EXPECT_EQ(terminal_from_canonical(canonical_bytes(obs).value()).value(), obs);
  auto j = to_json(obs).value();
  EXPECT_EQ(j.as_object().at("observations").as_object().at("launch").as_string(), "clone3");
  EXPECT_EQ(terminal_from_json(j).value(), obs);
  EXPECT_FALSE(to_json(base).value().as_object().contains("observations"));
  EXPECT_EQ(canonical_bytes(base).value(), base_bytes);
  auto bad = base;
  bad.observations = {{"a=b", "c"}};
  EXPECT_FALSE(validate(bad));
}

TEST(Terminal, DigestCoversEveryField) {
  auto const base = sample_exited();
  auto const base_digest = terminal_digest(base).value();
  std::vector<std::pair<std::string, std::function<void(TerminalRecord&)>>> const edits = {
      {"classification+trigger",
       [](TerminalRecord& r) {
         r.trigger = Trigger::user;
         r.classification = Classification::cancelled;
       }},
      {"recovery", [](TerminalRecord& r) { r.recovery = RecoveryPath::live_owned; }},
      {"exit.code", [](TerminalRecord& r) { r.exit.code = 1; }},
      {"exit.signal",
       [](TerminalRecord& r) {
         r.exit = ExitStatus::signaled(9);
         r.classification = Classification::signaled;
       }},
      {"escalation.graceful_sent", [](TerminalRecord& r) { r.escalation.graceful_sent = true; }},
      {"escalation.forced", [](TerminalRecord& r) { r.escalation.forced = true; }},
      {"output.observed+retained",
       [](TerminalRecord& r) { r.output[Stream::stdout_stream] = {13, 13, 0, true}; }},
      {"output.dropped",
       [](TerminalRecord& r) { r.output[Stream::stdout_stream] = {12, 11, 1, false}; }},
      {"output.complete",
       [](TerminalRecord& r) { r.output[Stream::stdout_stream].complete = false; }},
      {"output.stream", [](TerminalRecord& r) { r.output.erase(Stream::stderr_stream); }},
      {"output.pty", [](TerminalRecord& r) { r.output[Stream::pty] = {}; }},
      {"resources.value", [](TerminalRecord& r) { r.resources.at(ResourceDim::cpu).value = 4; }},
      {"resources.value.absent",
       [](TerminalRecord& r) { r.resources.at(ResourceDim::cpu).value.reset(); }},
      {"resources.limit", [](TerminalRecord& r) { r.resources.at(ResourceDim::cpu).limit = 1; }},
      {"resources.fidelity",
       [](TerminalRecord& r) { r.resources.at(ResourceDim::cpu).fidelity = Fidelity::hard; }},
      {"resources.other_dim",
       [](TerminalRecord& r) { r.resources.at(ResourceDim::concurrency).value = 1; }},
      {"tree.boundary", [](TerminalRecord& r) { r.tree.boundary = Boundary::marker; }},
      {"tree.cleanup", [](TerminalRecord& r) { r.tree.cleanup = Cleanup::unconfirmed; }},
      {"tree.containment", [](TerminalRecord& r) { r.tree.containment = Containment::escapable; }},
  };
  std::set<std::string> digests{base_digest};
  for (auto const& [name, edit] : edits) {
    auto rec = base;
    edit(rec);
    auto d = terminal_digest(rec);
    ASSERT_TRUE(d) << name << ": " << d.error().message();
    EXPECT_TRUE(digests.insert(*d).second) << name << " did not change the digest";
  }
  // spawn_error fields, on a spawn-failure record.
  auto const sf = sample_spawn_failed();
  auto const sf_digest = terminal_digest(sf).value();
  for (auto const& edit : std::vector<std::function<void(SpawnFailure&)>>{
           [](SpawnFailure& f) { f.code = "chdir"; }, [](SpawnFailure& f) { f.sys_errno = 13; },
           [](SpawnFailure& f) { f.detail += "."; }}) {
    auto rec = sf;
    edit(*rec.spawn_error);
    EXPECT_NE(terminal_digest(rec).value(), sf_digest);
  }
  // Guard: this binding names every member of TerminalRecord. Adding a member breaks the build
  // here until the encoding, the JSON and the edit list above cover it.
  auto const& [classification, recovery, exit, trigger, escalation, output, resources, tree,
               spawn_error, observations] = base;
  (void)classification, (void)recovery, (void)exit, (void)trigger, (void)escalation, (void)output;
  (void)resources, (void)tree, (void)spawn_error, (void)observations;
}

// ---- properties ----------------------------------------------------------------------------

rc::Gen<StreamAccounting> gen_stream() {
  return rc::gen::map(
      rc::gen::tuple(rc::gen::inRange<std::uint64_t>(0, 1u << 30),
                     rc::gen::inRange<std::uint64_t>(0, 1u << 30), rc::gen::arbitrary<bool>()),
      [](std::tuple<std::uint64_t, std::uint64_t, bool> const& t) {
        auto const [retained, dropped, incomplete] = t;
        return StreamAccounting{retained + dropped, retained, dropped, dropped == 0 && !incomplete};
      });
}

rc::Gen<TerminalRecord> gen_record() {
  return rc::gen::exec([] {
    ClassifyInput in;
    in.recovery =
        *rc::gen::element(RecoveryPath::observed, RecoveryPath::live_owned,
                          RecoveryPath::absent_without_terminal, RecoveryPath::indeterminate);
    in.spawn_failed = *rc::gen::arbitrary<bool>();
    bool const indeterminate = in.recovery == RecoveryPath::absent_without_terminal ||
                               in.recovery == RecoveryPath::indeterminate;
    if (!in.spawn_failed && (!indeterminate || *rc::gen::arbitrary<bool>())) {
      in.exit = *rc::gen::arbitrary<bool>() ? ExitStatus::exited(*rc::gen::inRange(0, 256))
                                            : ExitStatus::signaled(*rc::gen::inRange(1, 65));
    }
    if (*rc::gen::arbitrary<bool>()) in.trigger = static_cast<Trigger>(*rc::gen::inRange(0, 7));
    in.cleanup = *rc::gen::element(Cleanup::confirmed, Cleanup::unconfirmed);
    in.sandbox_denied = *rc::gen::arbitrary<bool>();
    std::optional<SpawnFailure> err;
    if (in.spawn_failed) {
      // Printable ASCII: the JSON text round trip needs valid UTF-8 (see docs/lifecycle.md).
      auto const text = rc::gen::container<std::string>(rc::gen::inRange<char>(32, 127));
      err = SpawnFailure{*text, *rc::gen::inRange(0, 4096), *text};
    }
    auto rec = make_terminal_record(in, err);
    RC_ASSERT(bool(rec));
    TerminalRecord r = *rec;
    r.escalation = {*rc::gen::arbitrary<bool>(), *rc::gen::arbitrary<bool>()};
    if (*rc::gen::arbitrary<bool>()) {
      r.output[Stream::pty] = *gen_stream();
    } else {
      r.output[Stream::stdout_stream] = *gen_stream();
      r.output[Stream::stderr_stream] = *gen_stream();
    }
    for (auto& d : r.resources.dims) {
      if (*rc::gen::arbitrary<bool>()) d.value = *rc::gen::arbitrary<std::uint64_t>();
      if (*rc::gen::arbitrary<bool>()) d.limit = *rc::gen::arbitrary<std::uint64_t>();
      d.fidelity = *rc::gen::element(Fidelity::hard, Fidelity::sampled, Fidelity::unavailable);
    }
    r.tree = {*rc::gen::element(Boundary::cgroup, Boundary::marker), in.cleanup,
              *rc::gen::element(Containment::kernel_enforced, Containment::escapable)};
    return r;
  });
}

RC_GTEST_PROP(TerminalProps, CanonicalRoundTrip, ()) {
  auto const rec = *gen_record();
  auto const bytes = canonical_bytes(rec);
  RC_ASSERT(bool(bytes));
  auto const back = terminal_from_canonical(*bytes);
  RC_ASSERT(bool(back));
  RC_ASSERT(*back == rec);
  RC_ASSERT(canonical_bytes(*back).value() == *bytes);
}

RC_GTEST_PROP(TerminalProps, JsonRoundTripThroughText, ()) {
  auto const rec = *gen_record();
  auto const j = to_json(rec);
  RC_ASSERT(bool(j));
  // Through serialized text, as a client or the registry would see it.
  auto const text = json::serialize(*j);
  auto const back = terminal_from_json(json::parse(text));
  RC_ASSERT(bool(back));
  RC_ASSERT(*back == rec);
  RC_ASSERT(terminal_digest(*back).value() == std::string{j->at("digest").as_string()});
}

RC_GTEST_PROP(TerminalProps, GeneratedRecordsAreValidAndTruncationIsNeverComplete, ()) {
  auto const rec = *gen_record();
  RC_ASSERT(bool(validate(rec)));
  for (auto const& [stream, acc] : rec.output) {
    if (acc.dropped > 0) RC_ASSERT(!acc.complete);
  }
  if (rec.recovery == RecoveryPath::absent_without_terminal ||
      rec.recovery == RecoveryPath::indeterminate) {
    RC_ASSERT(rec.classification == Classification::recovery_indeterminate);
  }
}

}  // namespace
}  // namespace custos::core
