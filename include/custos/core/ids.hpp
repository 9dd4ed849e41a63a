// Identifier syntax shared by every id of an execution's lineage.
//
// The rule: 1 to kMaxIdBytes bytes, each one of [A-Za-z0-9._:-], and the first byte is neither
// '.' nor '-'. Why so narrow: ids end up in file names, cgroup names, log lines, SQL keys and
// JSON without escaping; '.'/'-' first keeps them from reading as a hidden file or an option, and
// ':' allows namespaced ids such as "tenant:42". Ids are compared as bytes (case-sensitive).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace custos::core {

inline constexpr std::size_t kMaxIdBytes = 128;

[[nodiscard]] bool is_id_char(char c) noexcept;
[[nodiscard]] bool is_valid_id(std::string_view id) noexcept;
// Why an id is invalid in plain words, or empty when it is valid.
[[nodiscard]] std::optional<std::string> id_problem(std::string_view id);

}  // namespace custos::core
