// Fuzz target: arbitrary bytes → JSON → parse_identity / parse_plan (the whole plan, its sandbox
// included: sandbox::parse_plan). Whatever is accepted must survive encode → decode and
// to_json → parse unchanged, and a sandboxed plan's checked sandbox plan its own encode → decode
// and digest; anything else is a crash (abort) that libFuzzer and the replay runner both report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"
#include "custos/sandbox/canonical.hpp"
#include "custos/sandbox/plan.hpp"

namespace {

using namespace custos::core;

// A violated round-trip property: stop loudly so the input is kept as a reproducer.
void require(bool ok) {
  if (!ok) std::abort();
}

void check_identity(ExecutionIdentity const& id) {
  auto bytes = encode_identity(id);
  require(static_cast<bool>(bytes));
  auto back = decode_identity(*bytes);
  require(back && *back == id);
  auto again = parse_identity(to_json(id));
  require(again && *again == id);
}

void check_plan(custos::sandbox::ParsedPlan const& parsed) {
  auto const& plan = parsed.plan;
  auto bytes = encode_plan(plan);
  require(static_cast<bool>(bytes));
  auto back = decode_plan(*bytes);
  require(back && *back == plan);
  auto again = custos::sandbox::parse_plan(custos::sandbox::to_json(parsed));
  require(again && again->plan == plan);
  require(encode_plan(again->plan).value() == *bytes);
  require((parsed.sandbox == nullptr) == (again->sandbox == nullptr));
  if (parsed.sandbox) {
    require(again->sandbox->checked == parsed.sandbox->checked);
    auto sb = custos::sandbox::encode(parsed.sandbox->checked);
    require(static_cast<bool>(sb));
    auto sback = custos::sandbox::decode(*sb);
    require(sback && *sback == parsed.sandbox->checked);
    require(sha256(*sb).value() == *plan.sandbox_digest);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const text{reinterpret_cast<char const*>(data), size};
  auto v = parse_json_text(text);
  if (!v) return 0;
  // Either exec.start-shaped params {identity, plan} or a bare identity / plan.
  if (auto const* o = v->if_object();
      o != nullptr && o->contains("identity") && o->contains("plan")) {
    auto id = parse_identity(o->at("identity"), "/identity");
    auto plan = custos::sandbox::parse_plan(o->at("plan"), "/plan");
    if (id) check_identity(*id);
    if (plan) check_plan(*plan);
    if (id && plan) {
      auto bytes = encode_execution(*id, plan->plan);
      require(static_cast<bool>(bytes));
      auto back = decode_execution(*bytes);
      require(back && back->identity == *id && back->plan == plan->plan);
    }
    return 0;
  }
  if (auto id = parse_identity(*v)) check_identity(*id);
  if (auto plan = custos::sandbox::parse_plan(*v)) check_plan(*plan);
  return 0;
}
