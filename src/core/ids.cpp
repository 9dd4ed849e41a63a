#include "custos/core/ids.hpp"

namespace custos::core {

bool is_id_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '-';
}

std::optional<std::string> id_problem(std::string_view id) {
  if (id.empty()) return "is empty";
  if (id.size() > kMaxIdBytes) {
    return "is " + std::to_string(id.size()) + " bytes, more than " + std::to_string(kMaxIdBytes);
  }
  if (id.front() == '.' || id.front() == '-') return "starts with '.' or '-'";
  for (char c : id) {
    if (!is_id_char(c)) return "has a byte outside [A-Za-z0-9._:-]";
  }
  return std::nullopt;
}

bool is_valid_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > kMaxIdBytes || id.front() == '.' || id.front() == '-') return false;
  for (char c : id) {
    if (!is_id_char(c)) return false;
  }
  return true;
}

}  // namespace custos::core
