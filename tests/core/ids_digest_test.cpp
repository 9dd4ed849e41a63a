// Id syntax and SHA-256 digests.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "custos/core/digest.hpp"
#include "custos/core/ids.hpp"

namespace custos::core {
namespace {

TEST(Ids, Rule) {
  struct Row {
    std::string id;
    bool valid;
  };
  std::vector<Row> const rows = {
      {"a", true},
      {"act-42", true},
      {"tenant:42.run_7", true},
      {"_x", true},
      {":x", true},
      {std::string(128, 'z'), true},
      {"", false},
      {std::string(129, 'z'), false},
      {".hidden", false},
      {"-opt", false},
      {"a b", false},
      {"a/b", false},
      {"caf\xc3\xa9", false},
      {std::string("a\0b", 3), false},
      {"a\n", false},
  };
  for (auto const& r : rows) {
    EXPECT_EQ(is_valid_id(r.id), r.valid) << r.id;
    EXPECT_EQ(!id_problem(r.id).has_value(), r.valid) << r.id;
  }
}

std::vector<std::uint8_t> bytes(std::string const& s) {
  return {s.begin(), s.end()};
}

TEST(Digest, KnownSha256Vectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(sha256(bytes("abc")).value().to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256(bytes("")).value().to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(
      sha256(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")).value().to_string(),
      "sha256:248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Digest, ParseRoundTripAndStrictness) {
  auto d = sha256(bytes("abc")).value();
  auto parsed = Digest::parse(d.to_string());
  ASSERT_TRUE(parsed);
  EXPECT_EQ(*parsed, d);
  std::string const hex = d.to_string().substr(7);
  EXPECT_FALSE(Digest::parse(hex));                        // no prefix
  EXPECT_FALSE(Digest::parse("sha1:" + hex));              // other algorithm
  EXPECT_FALSE(Digest::parse("sha256:" + hex.substr(2)));  // short
  EXPECT_FALSE(Digest::parse("sha256:" + hex + "00"));     // long
  std::string upper = "sha256:" + hex;
  upper[7] = 'B';
  EXPECT_FALSE(Digest::parse(upper));  // one spelling only
  EXPECT_EQ(Digest::parse("sha256:zz").error().code, Errc::plan_invalid_value);
}

TEST(Digest, DifferentInputsDiffer) {
  EXPECT_NE(sha256(bytes("a")).value(), sha256(bytes("b")).value());
}

}  // namespace
}  // namespace custos::core
