// The JSON field reader (json_fields.hpp).
#include "custos/core/json_fields.hpp"

#include <algorithm>

#include "custos/core/json_pointer.hpp"

namespace custos::core {
namespace json = boost::json;

namespace {

std::string_view kind_name(json::kind k) {
  switch (k) {
    case json::kind::null:
      return "null";
    case json::kind::bool_:
      return "a boolean";
    case json::kind::int64:
    case json::kind::uint64:
      return "an integer";
    case json::kind::double_:
      return "a floating-point number";
    case json::kind::string:
      return "a string";
    case json::kind::array:
      return "an array";
    case json::kind::object:
      return "an object";
  }
  return "a value";
}

}  // namespace

std::string FieldReader::member(std::string_view base, std::string_view key) {
  return pointer_append(base, key);
}

void FieldReader::add(Errc code, std::string pointer, std::string message) {
  diags_.push_back(Diagnostic{code, std::move(pointer), std::move(message)});
}

void FieldReader::wrong_type(json::value const& v, std::string pointer, std::string_view expected) {
  add(codes_.wrong_type, std::move(pointer),
      "must be " + std::string{expected} + ", is " + std::string{kind_name(v.kind())});
}

void FieldReader::missing(std::string_view base, std::string_view key) {
  add(codes_.missing, member(base, key), "is required");
}

void FieldReader::absorb(Error const& e, std::string_view pointer) {
  if (e.diagnostics.empty()) {
    add(e.code, std::string{pointer}, e.context);
    return;
  }
  diags_.insert(diags_.end(), e.diagnostics.begin(), e.diagnostics.end());
}

Error FieldReader::error() && {
  bool const several = diags_.size() > 1;
  Error e = Error::from_diagnostics(std::move(diags_));
  if (several) e.code = codes_.several;
  return e;
}

json::object const* FieldReader::object(json::value const& v, std::string const& ptr) {
  if (auto const* o = v.if_object()) return o;
  wrong_type(v, ptr, "an object");
  return nullptr;
}

json::array const* FieldReader::array(json::value const& v, std::string const& ptr) {
  if (auto const* a = v.if_array()) return a;
  wrong_type(v, ptr, "an array");
  return nullptr;
}

void FieldReader::only(json::object const& o, std::string const& ptr,
                       std::initializer_list<std::string_view> allowed) {
  for (auto const& kv : o) {
    if (std::find(allowed.begin(), allowed.end(), kv.key()) == allowed.end()) {
      add(codes_.unknown, member(ptr, kv.key()), "unknown member");
    }
  }
}

json::value const* FieldReader::required(json::object const& o, std::string const& ptr,
                                         std::string_view key) {
  auto it = o.find(key);
  if (it == o.end()) {
    missing(ptr, key);
    return nullptr;
  }
  return &it->value();
}

json::value const* FieldReader::optional(json::object const& o, std::string_view key) {
  auto it = o.find(key);
  return it == o.end() ? nullptr : &it->value();
}

json::value const* FieldReader::given(json::object const& o, std::string_view key) {
  auto const* v = optional(o, key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

bool FieldReader::string(json::value const& v, std::string const& ptr, std::string& out) {
  if (auto const* s = v.if_string()) {
    out.assign(s->data(), s->size());
    return true;
  }
  wrong_type(v, ptr, "a string");
  return false;
}

bool FieldReader::boolean(json::value const& v, std::string const& ptr, bool& out) {
  if (auto const* b = v.if_bool()) {
    out = *b;
    return true;
  }
  wrong_type(v, ptr, "a boolean");
  return false;
}

bool FieldReader::unsigned_int(json::value const& v, std::string const& ptr, std::uint64_t max,
                               Errc range_code, std::uint64_t& out) {
  std::uint64_t n = 0;
  if (auto const* i = v.if_int64()) {
    if (*i < 0) {
      add(range_code, ptr, "must not be negative");
      return false;
    }
    n = static_cast<std::uint64_t>(*i);
  } else if (auto const* u = v.if_uint64()) {
    n = *u;
  } else {
    wrong_type(v, ptr, "a non-negative integer");
    return false;
  }
  if (n > max) {
    add(range_code, ptr, "must be at most " + std::to_string(max));
    return false;
  }
  out = n;
  return true;
}

bool FieldReader::int32(json::value const& v, std::string const& ptr, std::int32_t& out) {
  constexpr auto kMin = std::numeric_limits<std::int32_t>::min();
  constexpr auto kMax = std::numeric_limits<std::int32_t>::max();
  if (auto const* i = v.if_int64()) {
    if (*i < kMin || *i > kMax) {
      add(codes_.invalid, ptr, "out of the 32-bit range");
      return false;
    }
    out = static_cast<std::int32_t>(*i);
    return true;
  }
  if (auto const* u = v.if_uint64()) {
    if (*u > static_cast<std::uint64_t>(kMax)) {
      add(codes_.invalid, ptr, "out of the 32-bit range");
      return false;
    }
    out = static_cast<std::int32_t>(*u);
    return true;
  }
  wrong_type(v, ptr, "a 32-bit integer");
  return false;
}

}  // namespace custos::core
