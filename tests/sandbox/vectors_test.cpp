// Checks every conformance vector (conformance/vectors/*.json, format in conformance/README.md):
// input JSON → effective plan → canonical bytes (hex) → digest, or the exact rejection; for a
// sandboxed plan also its checked sandbox plan's controls, bytes and digest (the plan's
// sandbox_digest). The whole plan is parsed as the daemon parses it: sandbox::parse_plan.
//
// CUSTOS_REGENERATE_VECTORS=1 rewrites each file's "expect" from the inputs instead of checking
// (used once when a vector is added; the result is reviewed and checked in).
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "custos/core/canonical.hpp"
#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"
#include "custos/sandbox/canonical.hpp"
#include "custos/sandbox/plan.hpp"

namespace custos::core {
namespace {

using sandbox::parse_plan;

namespace fs = std::filesystem;
namespace json = boost::json;

std::vector<fs::path> vector_files() {
  std::vector<fs::path> out;
  for (auto const& e :
       fs::directory_iterator(fs::path{CUSTOS_SOURCE_DIR} / "conformance" / "vectors")) {
    if (e.path().extension() == ".json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_file(fs::path const& p) {
  std::ifstream in{p, std::ios::binary};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What our implementation produces for one vector's input.
json::object compute_expect(json::object const& input) {
  auto id = parse_identity(input.at("identity"), "/identity");
  auto plan = parse_plan(input.at("plan"), "/plan");
  json::object expect;
  if (!id || !plan) {
    std::vector<Diagnostic> all;
    if (!id) all = id.error().diagnostics;
    if (!plan) {
      auto const perr = plan.error();
      all.insert(all.end(), perr.diagnostics.begin(), perr.diagnostics.end());
    }
    // The plan's own error code when only the plan is refused (a compilation error keeps its
    // sandbox.* code even with several diagnostics), else the code of all the findings.
    Error const e = id ? plan.error() : Error::from_diagnostics(all);
    expect["error"] = e.wire();
    json::array diags;
    for (auto const& d : all)
      diags.emplace_back(json::object{{"code", errc_wire(d.code)}, {"pointer", d.pointer}});
    expect["diagnostics"] = std::move(diags);
    return expect;
  }
  expect["effective_plan"] = sandbox::to_json(*plan);
  auto bytes = encode_execution(*id, plan->plan).value();
  expect["canonical_hex"] = to_hex(bytes);
  expect["digest"] = plan_digest(*id, plan->plan).value().to_string();
  if (plan->sandbox) {
    json::array controls;
    for (auto const& c : plan->sandbox->checked.controls) controls.emplace_back(c);
    auto const sb = sandbox::encode(plan->sandbox->checked).value();
    expect["sandbox"] = json::object{{"controls", std::move(controls)},
                                     {"canonical_hex", to_hex(sb)},
                                     {"digest", plan->sandbox->digest.to_string()}};
  }
  return expect;
}

TEST(ConformanceVectors, EveryVectorMatches) {
  auto const files = vector_files();
  ASSERT_GE(files.size(), 8U);
  bool const regenerate = std::getenv("CUSTOS_REGENERATE_VECTORS") != nullptr;
  std::size_t accepted = 0;
  std::size_t rejected = 0;
  for (auto const& f : files) {
    SCOPED_TRACE(f.filename().string());
    auto parsed = parse_json_text(read_file(f));
    ASSERT_TRUE(parsed) << parsed.error().message();
    auto& doc = parsed->as_object();
    ASSERT_TRUE(doc.contains("input") && doc.contains("expect"));
    json::object const got = compute_expect(doc.at("input").as_object());
    if (regenerate) {
      doc["expect"] = got;
      std::ofstream out{f, std::ios::binary | std::ios::trunc};
      out << json::serialize(doc) << "\n";
      continue;
    }
    auto const& want = doc.at("expect").as_object();
    if (want.contains("error")) {
      ++rejected;
      EXPECT_EQ(got.at("error"), want.at("error"));
      EXPECT_EQ(got.at("diagnostics"), want.at("diagnostics"));
      continue;
    }
    ++accepted;
    ASSERT_TRUE(got.contains("canonical_hex")) << json::serialize(got);
    EXPECT_EQ(got.at("canonical_hex"), want.at("canonical_hex"));
    EXPECT_EQ(got.at("digest"), want.at("digest"));
    EXPECT_EQ(got.at("effective_plan"), want.at("effective_plan"));
    EXPECT_EQ(got.contains("sandbox"), want.contains("sandbox"));
    if (want.contains("sandbox")) {
      auto const& ws = want.at("sandbox").as_object();
      EXPECT_EQ(got.at("sandbox"), want.at("sandbox"));
      // The checked-in sandbox bytes decode, hash to the digest the plan's bytes carry, and
      // re-encode to themselves.
      auto sb = from_hex(json::value_to<std::string>(ws.at("canonical_hex")));
      ASSERT_TRUE(sb);
      auto checked = sandbox::decode(*sb);
      ASSERT_TRUE(checked) << checked.error().message();
      EXPECT_EQ(sandbox::encode(*checked).value(), *sb);
      EXPECT_EQ(sha256(*sb).value().to_string(), json::value_to<std::string>(ws.at("digest")));
    }
    // The effective plan is itself a plan that parses to the same thing.
    auto reparsed = parse_plan(want.at("effective_plan"));
    ASSERT_TRUE(reparsed) << reparsed.error().message();
    // The checked-in bytes decode to the same values, and the digest is SHA-256 of exactly them.
    auto bytes = from_hex(json::value_to<std::string>(want.at("canonical_hex")));
    ASSERT_TRUE(bytes);
    auto decoded = decode_execution(*bytes);
    ASSERT_TRUE(decoded) << decoded.error().message();
    EXPECT_EQ(decoded->plan, parse_plan(doc.at("input").at("plan")).value().plan);
    EXPECT_EQ(decoded->plan, reparsed->plan);
    EXPECT_EQ(decoded->identity, parse_identity(doc.at("input").at("identity")).value());
    EXPECT_EQ(sha256(*bytes).value().to_string(), json::value_to<std::string>(want.at("digest")));
  }
  if (!regenerate) {
    EXPECT_GE(accepted, 8U);
    EXPECT_GE(rejected, 1U);
  }
}

}  // namespace
}  // namespace custos::core
