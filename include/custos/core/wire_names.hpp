// One table per enum <-> wire name, for every layer.
//
// Each enumerator is written once, beside its stable wire string, and the table answers both
// ways. Hand-written pairs (a switch one way, a list of ifs the other) drift apart when an
// enumerator is added to one and not the other; a table cannot. Declare it where the enum's
// wire functions are defined:
//
//   constexpr auto kRoleNames = core::wire_names<Role>({
//       {Role::observer, "observer"},
//       {Role::runner, "runner"},
//       {Role::admin, "admin"},
//   });
//   static_assert(kRoleNames.complete());
//
//   std::string_view role_wire(Role r) noexcept { return kRoleNames.wire(r); }
//   std::optional<Role> role_from_wire(std::string_view w) noexcept {
//     return kRoleNames.from_wire(w);
//   }
//
// complete() holds when the enumerators 0..N-1 (first..first+N-1 with complete(1), for an enum
// that starts at 1) each appear once under distinct non-empty names: it catches a duplicated or
// skipped row at compile time. An enumerator added past the end of the enum without a row is not
// seen by it; where the enum has a count constant, assert the size too
// (static_assert(kNames.size() == kPhaseCount)).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace custos::core {

// One row of a wire-name table.
template <class E>
struct WireName {
  E value;
  std::string_view wire;
};

template <class E, std::size_t N>
class WireNames {
 public:
  constexpr explicit WireNames(std::array<WireName<E>, N> const& rows) noexcept : rows_(rows) {}

  // The wire name of `e`; "invalid" for a value outside the table (an integer cast to the enum).
  [[nodiscard]] constexpr std::string_view wire(E e) const noexcept {
    auto const i = static_cast<std::size_t>(e);
    if (i < N && rows_[i].value == e) return rows_[i].wire;  // rows in order, from 0
    for (auto const& row : rows_) {
      if (row.value == e) return row.wire;
    }
    return "invalid";
  }

  // The enumerator named `wire` exactly (case-sensitive); nullopt for any other string.
  [[nodiscard]] constexpr std::optional<E> from_wire(std::string_view wire) const noexcept {
    for (auto const& row : rows_) {
      if (row.wire == wire) return row.value;
    }
    return std::nullopt;
  }

  // The enumerators first..first+N-1, each exactly once, under distinct non-empty names (see the
  // file comment). `first` is 1 for enums whose 0 is deliberately no value.
  [[nodiscard]] constexpr bool complete(std::size_t first = 0) const noexcept {
    std::array<bool, N> seen{};
    for (std::size_t i = 0; i < N; ++i) {
      auto const v = static_cast<std::size_t>(rows_[i].value);
      if (v < first || v - first >= N || seen[v - first] || rows_[i].wire.empty()) return false;
      seen[v - first] = true;
      for (std::size_t j = 0; j < i; ++j) {
        if (rows_[j].wire == rows_[i].wire) return false;
      }
    }
    return true;
  }

  [[nodiscard]] static constexpr std::size_t size() noexcept { return N; }
  [[nodiscard]] constexpr std::array<WireName<E>, N> const& rows() const noexcept { return rows_; }

 private:
  std::array<WireName<E>, N> rows_;
};

// Builds a table from its rows; N is the number of rows: wire_names<Role>({{...}, {...}}).
template <class E, std::size_t N>
[[nodiscard]] constexpr WireNames<E, N> wire_names(WireName<E> const (&rows)[N]) noexcept {
  std::array<WireName<E>, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = rows[i];
  return WireNames<E, N>(a);
}

}  // namespace custos::core
