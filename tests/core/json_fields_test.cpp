// The JSON field reader every layer reads outside JSON with (core/json_fields.hpp).
#include "custos/core/json_fields.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "custos/core/cancellation.hpp"

namespace custos::core {
namespace {

namespace json = boost::json;
using namespace std::string_literals;

std::vector<std::pair<Errc, std::string>> found(FieldReader const& r) {
  std::vector<std::pair<Errc, std::string>> out;
  for (auto const& d : r.diagnostics()) out.emplace_back(d.code, d.pointer);
  return out;
}

TEST(FieldReader, CollectsEveryProblemWithItsPointer) {
  auto const v = json::parse(R"({"name": 3, "extra": 1, "a/b": true, "n": -1})");
  FieldReader r;
  auto const* o = r.object(v, "/x");
  ASSERT_NE(o, nullptr);
  r.only(*o, "/x", {"name", "n", "count"});
  std::string name;
  EXPECT_FALSE(r.string(o->at("name"), "/x/name", name));
  EXPECT_EQ(r.required(*o, "/x", "count"), nullptr);
  std::uint64_t n = 7;
  EXPECT_FALSE(r.unsigned_int(o->at("n"), "/x/n", n));
  EXPECT_EQ(n, 7U) << "a value that did not read leaves its output alone";
  EXPECT_EQ(found(r), (std::vector<std::pair<Errc, std::string>>{
                          {Errc::plan_unknown_field, "/x/extra"},
                          {Errc::plan_unknown_field, "/x/a~1b"},  // RFC 6901 escaping
                          {Errc::plan_wrong_type, "/x/name"},
                          {Errc::plan_missing_field, "/x/count"},
                          {Errc::plan_invalid_value, "/x/n"},
                      }));
  EXPECT_EQ(r.diagnostics()[2].message, "must be a string, is an integer");
  auto const e = std::move(r).error();
  EXPECT_EQ(e.code, Errc::plan_invalid) << "several findings";
  EXPECT_EQ(e.diagnostics.size(), 5U);
}

TEST(FieldReader, OneFindingIsItsOwnCode) {
  FieldReader r;
  bool b = false;
  EXPECT_FALSE(r.boolean(json::value("yes"), "/flag", b));
  auto const e = std::move(r).error();
  EXPECT_EQ(e.code, Errc::plan_wrong_type);
  EXPECT_EQ(e.context, "/flag: must be a boolean, is a string");
}

TEST(FieldReader, CodesAreTheCallers) {
  FieldCodes rpc;
  rpc.wrong_type = rpc.missing = rpc.unknown = rpc.invalid = rpc.several = Errc::rpc_invalid_params;
  FieldReader r{rpc};
  json::object const o{{"x", 1}};
  r.only(o, "", {"y"});
  (void)r.required(o, "", "y");
  auto const e = std::move(r).error();
  EXPECT_EQ(e.code, Errc::rpc_invalid_params);
  ASSERT_EQ(e.diagnostics.size(), 2U);
  EXPECT_EQ(e.diagnostics[0].pointer, "/x");
  EXPECT_EQ(e.diagnostics[1].pointer, "/y");
}

TEST(FieldReader, NumbersAndNames) {
  FieldReader r;
  std::int32_t i = 0;
  EXPECT_TRUE(r.int32(json::value(-5), "/i", i));
  EXPECT_EQ(i, -5);
  EXPECT_TRUE(r.int32(json::value(std::uint64_t{9}), "/i", i));
  EXPECT_EQ(i, 9);
  EXPECT_FALSE(r.int32(json::value(std::int64_t{1} << 40), "/big", i));
  EXPECT_FALSE(r.int32(json::value(1.5), "/float", i));
  std::uint64_t u = 0;
  EXPECT_TRUE(r.unsigned_int(json::value(10), "/u", 10, Errc::plan_invalid_limit, u));
  EXPECT_FALSE(r.unsigned_int(json::value(11), "/over", 10, Errc::plan_invalid_limit, u));
  Cleanup c = Cleanup::confirmed;
  EXPECT_TRUE(r.name(json::value("unconfirmed"), "/c", cleanup_from_wire, c));
  EXPECT_EQ(c, Cleanup::unconfirmed);
  EXPECT_FALSE(r.name(json::value("gone"), "/gone", cleanup_from_wire, c));
  EXPECT_EQ(found(r), (std::vector<std::pair<Errc, std::string>>{
                          {Errc::plan_invalid_value, "/big"},
                          {Errc::plan_wrong_type, "/float"},
                          {Errc::plan_invalid_limit, "/over"},
                          {Errc::plan_invalid_value, "/gone"},
                      }));
}

TEST(FieldReader, GivenTreatsNullAsAbsentOptionalDoesNot) {
  json::object const o{{"a", nullptr}, {"b", 1}};
  EXPECT_EQ(FieldReader::given(o, "a"), nullptr);
  EXPECT_NE(FieldReader::optional(o, "a"), nullptr);
  EXPECT_NE(FieldReader::given(o, "b"), nullptr);
  EXPECT_EQ(FieldReader::given(o, "c"), nullptr);
}

TEST(FieldReader, AbsorbsAnotherErrorsFindings) {
  FieldReader r;
  Error plain{Errc::auth_denied, "no"};
  r.absorb(plain, "/authority");
  r.absorb(Error::from_diagnostics({{Errc::plan_invalid_cwd, "/plan/cwd", "escapes"},
                                    {Errc::plan_nul_byte, "/plan/env/0", "NUL"}}),
           "/plan");
  EXPECT_EQ(found(r), (std::vector<std::pair<Errc, std::string>>{
                          {Errc::auth_denied, "/authority"},
                          {Errc::plan_invalid_cwd, "/plan/cwd"},
                          {Errc::plan_nul_byte, "/plan/env/0"},
                      }));
}

}  // namespace
}  // namespace custos::core
