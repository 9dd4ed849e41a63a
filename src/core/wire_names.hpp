// Enum <-> wire-string tables shared by the core's .cpp files (private to src/core).
// A table is indexed by enumerator value, so its order must follow the enum declaration.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace custos::core::detail {

template <class E, std::size_t N>
std::optional<E> lookup(std::array<std::string_view, N> const& names,
                        std::string_view wire) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == wire) return static_cast<E>(i);
  }
  return std::nullopt;
}

template <std::size_t N, class E>
std::string_view name_of(std::array<std::string_view, N> const& names, E e) noexcept {
  auto const i = static_cast<std::size_t>(e);
  return i < N ? names[i] : std::string_view{"invalid"};
}

}  // namespace custos::core::detail
