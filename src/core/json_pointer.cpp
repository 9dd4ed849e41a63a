#include "custos/core/json_pointer.hpp"

namespace custos::core {

std::string pointer_append(std::string_view base, std::string_view token) {
  std::string out{base};
  out.reserve(base.size() + token.size() + 1);
  out.push_back('/');
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string pointer_append(std::string_view base, std::size_t index) {
  return pointer_append(base, std::to_string(index));
}

}  // namespace custos::core
