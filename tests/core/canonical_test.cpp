// The canonical framing: exact bytes for each primitive, strict decoding, round trips.
#include "custos/core/canonical.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <vector>

namespace custos::core {
namespace {

constexpr RecordKind kTestKind = 0x7F01;
constexpr RecordKind kInnerKind = 0x7F02;

std::vector<std::uint8_t> bytes_of(std::string const& hex) {
  auto b = from_hex(hex);
  EXPECT_TRUE(b.has_value()) << hex;
  return b.value_or(std::vector<std::uint8_t>{});
}

TEST(Canonical, EmptyDocumentIsHeaderOnly) {
  auto doc = CanonicalWriter{kTestKind}.finish();
  EXPECT_EQ(to_hex(doc),
            "43535453"
            "0001"
            "7f01"
            "00000000");
  auto r = CanonicalReader::open(doc, kTestKind);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->finish());
}

TEST(Canonical, ScalarFieldsHaveExactBytes) {
  CanonicalWriter w{kTestKind};
  w.u8(1, 0xAB)
      .u32(2, 0x01020304)
      .u64(3, 0x0102030405060708ULL)
      .i64(4, -2)
      .boolean(5, true)
      .string(6, "hi");
  auto doc = std::move(w).finish();
  std::string const body =
      "0001"
      "01"
      "00000001"
      "ab"
      "0002"
      "02"
      "00000004"
      "01020304"
      "0003"
      "03"
      "00000008"
      "0102030405060708"
      "0004"
      "04"
      "00000008"
      "fffffffffffffffe"
      "0005"
      "05"
      "00000001"
      "01"
      "0006"
      "07"
      "00000002"
      "6869";
  auto expected_body = bytes_of(body);
  std::vector<std::uint8_t> header = bytes_of(
      "43535453"
      "0001"
      "7f01");
  auto n = static_cast<std::uint32_t>(expected_body.size());
  header.push_back(static_cast<std::uint8_t>(n >> 24U));
  header.push_back(static_cast<std::uint8_t>(n >> 16U));
  header.push_back(static_cast<std::uint8_t>(n >> 8U));
  header.push_back(static_cast<std::uint8_t>(n));
  header.insert(header.end(), expected_body.begin(), expected_body.end());
  EXPECT_EQ(to_hex(doc), to_hex(header));

  auto r = CanonicalReader::open(doc, kTestKind);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->u8(1).value(), 0xAB);
  EXPECT_EQ(r->u32(2).value(), 0x01020304U);
  EXPECT_EQ(r->u64(3).value(), 0x0102030405060708ULL);
  EXPECT_EQ(r->i64(4).value(), -2);
  EXPECT_EQ(r->boolean(5).value(), true);
  EXPECT_EQ(r->string(6).value(), "hi");
  EXPECT_TRUE(r->finish());
}

TEST(Canonical, NestedRecordsAndListsRoundTrip) {
  CanonicalWriter w{kTestKind};
  w.record(1, kInnerKind, [](CanonicalWriter& r) { r.u32(1, 7).string(3, "x"); });
  std::vector<std::string> const items = {"a", "", "ccc"};
  w.string_list(2, items);
  w.begin_list(3, FieldType::record);
  w.begin_element_record(kInnerKind).u64(1, 9).end_element_record();
  w.begin_element_record(kTestKind).end_element_record();
  w.end_list();
  auto doc = std::move(w).finish();

  auto r = CanonicalReader::open(doc, kTestKind);
  ASSERT_TRUE(r);
  auto inner = r->record(1, kInnerKind);
  ASSERT_TRUE(inner);
  EXPECT_EQ(inner->u32(1).value(), 7U);
  EXPECT_FALSE(inner->has(2));
  EXPECT_EQ(inner->optional_string(2).value(), std::nullopt);
  EXPECT_EQ(inner->string(3).value(), "x");
  EXPECT_TRUE(inner->finish());
  EXPECT_EQ(r->string_list(2).value(), items);
  auto l = r->list(3, FieldType::record);
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 2U);
  auto e0 = l->next_record();
  ASSERT_TRUE(e0);
  EXPECT_EQ(e0->kind(), kInnerKind);
  EXPECT_EQ(e0->u64(1).value(), 9U);
  auto e1 = l->next_record();
  ASSERT_TRUE(e1);
  EXPECT_EQ(e1->kind(), kTestKind);
  EXPECT_TRUE(e1->finish());
  EXPECT_TRUE(l->finish());
  EXPECT_TRUE(r->finish());
}

std::vector<std::uint8_t> sample_doc() {
  CanonicalWriter w{kTestKind};
  w.u32(1, 5).string(2, "abc");
  return std::move(w).finish();
}

Errc open_error(std::vector<std::uint8_t> const& doc, RecordKind kind = kTestKind) {
  auto r = CanonicalReader::open(doc, kind);
  return r ? Errc::internal : r.error().code;
}

TEST(Canonical, RejectsBadHeaders) {
  auto doc = sample_doc();
  auto bad_magic = doc;
  bad_magic[0] = 'X';
  EXPECT_EQ(open_error(bad_magic), Errc::canonical_malformed);
  auto bad_version = doc;
  bad_version[5] = 2;
  EXPECT_EQ(open_error(bad_version), Errc::canonical_unsupported_version);
  EXPECT_EQ(open_error(doc, kInnerKind), Errc::canonical_malformed);
  auto trailing = doc;
  trailing.push_back(0);
  EXPECT_EQ(open_error(trailing), Errc::canonical_trailing_bytes);
  auto truncated = doc;
  truncated.pop_back();
  EXPECT_EQ(open_error(truncated), Errc::canonical_malformed);
  EXPECT_EQ(open_error({}), Errc::canonical_malformed);
}

TEST(Canonical, RejectsBadFieldFraming) {
  auto doc = sample_doc();
  // Field 1 header starts at offset 12: tag(2) type(1) len(4).
  auto bad_type = doc;
  bad_type[14] = 0x0A;
  EXPECT_EQ(open_error(bad_type), Errc::canonical_malformed);
  auto zero_tag = doc;
  zero_tag[13] = 0;
  EXPECT_EQ(open_error(zero_tag), Errc::canonical_malformed);
  auto wrong_width = doc;  // u32 declared with a 3-byte payload
  wrong_width[18] = 3;
  EXPECT_EQ(open_error(wrong_width), Errc::canonical_malformed);
  auto reordered = doc;  // second field's tag lowered to 1: not strictly increasing
  reordered[12 + 7 + 4 + 1] = 1;
  EXPECT_EQ(open_error(reordered), Errc::canonical_malformed);
}

TEST(Canonical, ReaderRejectsMissingWrongTypeAndLeftovers) {
  auto doc = sample_doc();
  {
    auto r = CanonicalReader::open(doc, kTestKind).value();
    EXPECT_EQ(r.u64(1).error().code, Errc::canonical_malformed);  // wrong type
  }
  {
    auto r = CanonicalReader::open(doc, kTestKind).value();
    EXPECT_EQ(r.string(2).error().code, Errc::canonical_malformed);  // tag 1 not consumed
  }
  {
    auto r = CanonicalReader::open(doc, kTestKind).value();
    ASSERT_TRUE(r.u32(1));
    EXPECT_EQ(r.finish().error().code, Errc::canonical_malformed);  // tag 2 left over
  }
}

TEST(Canonical, BooleanMustBeZeroOrOne) {
  CanonicalWriter w{kTestKind};
  w.boolean(1, false);
  auto doc = std::move(w).finish();
  doc.back() = 2;
  EXPECT_EQ(open_error(doc), Errc::canonical_malformed);
}

TEST(Canonical, ListCountMustMatchElements) {
  CanonicalWriter w{kTestKind};
  std::vector<std::string> const items = {"a", "b"};
  w.string_list(1, items);
  auto doc = std::move(w).finish();
  // list payload: type(1) at 19, count(4) at 20..23
  auto fewer = doc;
  fewer[23] = 1;
  {
    auto r = CanonicalReader::open(fewer, kTestKind);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->string_list(1).error().code, Errc::canonical_malformed);
  }
  auto huge = doc;
  huge[20] = 0x7F;
  {
    auto r = CanonicalReader::open(huge, kTestKind);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->string_list(1).error().code, Errc::canonical_malformed);
  }
}

TEST(Canonical, HexRoundTrip) {
  std::vector<std::uint8_t> const b = {0x00, 0x0f, 0xf0, 0xff};
  EXPECT_EQ(to_hex(b), "000ff0ff");
  EXPECT_EQ(from_hex("000FF0ff"), b);
  EXPECT_EQ(from_hex("0"), std::nullopt);
  EXPECT_EQ(from_hex("zz"), std::nullopt);
}

RC_GTEST_PROP(CanonicalProperty, ScalarsAndStringsRoundTrip,
              (std::uint32_t a, std::uint64_t b, std::int64_t c, bool d, std::string s,
               std::vector<std::string> list)) {
  CanonicalWriter w{kTestKind};
  w.u32(1, a).u64(2, b).i64(3, c).boolean(4, d).string(5, s).string_list(6, list);
  auto doc = std::move(w).finish();
  auto r = CanonicalReader::open(doc, kTestKind);
  RC_ASSERT(static_cast<bool>(r));
  RC_ASSERT(r->u32(1).value() == a);
  RC_ASSERT(r->u64(2).value() == b);
  RC_ASSERT(r->i64(3).value() == c);
  RC_ASSERT(r->boolean(4).value() == d);
  RC_ASSERT(r->string(5).value() == s);
  RC_ASSERT(r->string_list(6).value() == list);
  RC_ASSERT(static_cast<bool>(r->finish()));
}

RC_GTEST_PROP(CanonicalProperty, TruncationIsAlwaysRejected, (std::string s)) {
  CanonicalWriter w{kTestKind};
  w.string(1, s).u64(2, 1);
  auto doc = std::move(w).finish();
  auto const cut = *rc::gen::inRange<std::size_t>(0, doc.size());
  std::vector<std::uint8_t> prefix(doc.begin(), doc.begin() + static_cast<std::ptrdiff_t>(cut));
  RC_ASSERT(!CanonicalReader::open(prefix, kTestKind));
}

}  // namespace
}  // namespace custos::core

namespace custos::core {
namespace {

TEST(Canonical, NestingDepthIsBounded) {
  auto nested = [](std::size_t depth) {
    CanonicalWriter w{kTestKind};
    for (std::size_t i = 0; i < depth; ++i) w.begin_record(1, kInnerKind);
    for (std::size_t i = 0; i < depth; ++i) w.end_record();
    return std::move(w).finish();
  };
  auto walk = [](std::vector<std::uint8_t> const& doc) -> Errc {
    auto r = CanonicalReader::open(doc, kTestKind);
    if (!r) return r.error().code;
    CanonicalReader cur = *r;
    while (cur.has(1)) {
      auto next = cur.record(1, kInnerKind);
      if (!next) return next.error().code;
      cur = *next;
    }
    return Errc::internal;  // reached the innermost record
  };
  EXPECT_EQ(walk(nested(kCanonicalMaxDepth)), Errc::internal);
  EXPECT_EQ(walk(nested(kCanonicalMaxDepth + 1)), Errc::canonical_malformed);
}

TEST(Canonical, PeekKind) {
  auto doc = sample_doc();
  EXPECT_EQ(CanonicalReader::peek_kind(doc).value(), kTestKind);
  std::vector<std::uint8_t> const short_doc(doc.begin(), doc.begin() + 6);
  EXPECT_EQ(CanonicalReader::peek_kind(short_doc).error().code, Errc::canonical_malformed);
}

// A misused writer stops the process instead of producing bytes that would be digested.
TEST(CanonicalWriterDeathTest, MisuseAborts) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        CanonicalWriter w{kTestKind};
        w.u8(2, 0).u8(1, 0);  // tags must increase
      },
      "");
  EXPECT_DEATH(
      {
        CanonicalWriter w{kTestKind};
        w.u8(0, 0);  // tag 0 is reserved
      },
      "");
  EXPECT_DEATH(
      {
        CanonicalWriter w{kTestKind};
        w.begin_record(1, kInnerKind);
        (void)std::move(w).finish();  // record left open
      },
      "");
  EXPECT_DEATH(
      {
        CanonicalWriter w{kTestKind};
        w.begin_list(1, FieldType::string);
        w.element_u32(1);  // element of the wrong type
      },
      "");
  EXPECT_DEATH(
      {
        CanonicalWriter w{kTestKind};
        w.end_record();  // nothing to close
      },
      "");
}

}  // namespace
}  // namespace custos::core
