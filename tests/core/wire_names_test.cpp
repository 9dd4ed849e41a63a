// The enum <-> wire-name table every layer uses (core/wire_names.hpp).
#include "custos/core/wire_names.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

namespace custos::core {
namespace {

enum class Colour : std::uint8_t { red, green, blue };
enum class Level : std::uint8_t { low = 1, high = 2 };

constexpr auto kColours = wire_names<Colour>({
    {Colour::red, "red"},
    {Colour::green, "green"},
    {Colour::blue, "blue"},
});
static_assert(kColours.complete() && kColours.size() == 3);

TEST(WireNames, AnswersBothWays) {
  for (auto const& row : kColours.rows()) {
    EXPECT_EQ(kColours.wire(row.value), row.wire);
    EXPECT_EQ(kColours.from_wire(row.wire), row.value);
  }
  EXPECT_EQ(kColours.from_wire("Red"), std::nullopt) << "names are exact";
  EXPECT_EQ(kColours.from_wire(""), std::nullopt);
  EXPECT_EQ(kColours.wire(static_cast<Colour>(7)), "invalid");
}

TEST(WireNames, RowsNeedNotFollowTheEnumOrder) {
  constexpr auto shuffled = wire_names<Colour>({
      {Colour::blue, "blue"},
      {Colour::red, "red"},
      {Colour::green, "green"},
  });
  static_assert(shuffled.complete());
  EXPECT_EQ(shuffled.wire(Colour::red), "red");
  EXPECT_EQ(shuffled.wire(Colour::blue), "blue");
  EXPECT_EQ(shuffled.from_wire("green"), Colour::green);
}

TEST(WireNames, CompleteCatchesDuplicatesGapsAndEmptyNames) {
  constexpr auto twice = wire_names<Colour>({{Colour::red, "red"}, {Colour::red, "rouge"}});
  static_assert(!twice.complete());
  constexpr auto same_name = wire_names<Colour>({{Colour::red, "red"}, {Colour::green, "red"}});
  static_assert(!same_name.complete());
  constexpr auto gap = wire_names<Colour>({{Colour::red, "red"}, {Colour::blue, "blue"}});
  static_assert(!gap.complete());
  constexpr auto empty = wire_names<Colour>({{Colour::red, ""}, {Colour::green, "green"}});
  static_assert(!empty.complete());
  // An enum that starts at 1.
  constexpr auto levels = wire_names<Level>({{Level::low, "low"}, {Level::high, "high"}});
  static_assert(levels.complete(1) && !levels.complete());
  EXPECT_EQ(levels.wire(Level::high), "high");
  EXPECT_EQ(levels.from_wire("low"), Level::low);
}

}  // namespace
}  // namespace custos::core
