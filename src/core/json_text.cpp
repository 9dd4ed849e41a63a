// Strict JSON text parsing for authority-relevant input.
//
// Boost.JSON keeps the last of two members with the same name. A caller (or a proxy, or an
// authority service) whose parser keeps the first would then have approved a different plan
// than the one custos runs, so a duplicate member name anywhere in the text is refused. The
// check is a first pass with basic_parser that builds nothing; the value is then parsed normally.
#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/parse_options.hpp>

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "custos/core/json_pointer.hpp"
#include "custos/core/plan_json.hpp"

namespace custos::core {
namespace json = boost::json;

namespace {

using boost::system::error_code;

// Tracks the member names of every open object and the pointer of the current position.
class DuplicateKeyHandler {
 public:
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);

  std::optional<std::string> duplicate;  // pointer of the first repeated member

  bool on_document_begin(error_code&) { return true; }
  bool on_document_end(error_code&) { return true; }
  bool on_array_begin(error_code&) { return open(false); }
  bool on_array_end(std::size_t, error_code&) { return close(); }
  bool on_object_begin(error_code&) { return open(true); }
  bool on_object_end(std::size_t, error_code&) { return close(); }
  bool on_string_part(json::string_view, std::size_t, error_code&) { return true; }
  bool on_string(json::string_view, std::size_t, error_code&) { return value_done(); }
  bool on_key_part(json::string_view s, std::size_t, error_code&) {
    key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t, error_code& ec) {
    key_.append(s.data(), s.size());
    Level& top = levels_.back();
    if (!top.keys.insert(key_).second) {
      duplicate = pointer_here() + pointer_append("", key_);
      ec = json::error::syntax;  // stop the pass; the caller reports `duplicate`
      return false;
    }
    top.current = key_;
    key_.clear();
    return true;
  }
  bool on_number_part(json::string_view, error_code&) { return true; }
  bool on_int64(std::int64_t, json::string_view, error_code&) { return value_done(); }
  bool on_uint64(std::uint64_t, json::string_view, error_code&) { return value_done(); }
  bool on_double(double, json::string_view, error_code&) { return value_done(); }
  bool on_bool(bool, error_code&) { return value_done(); }
  bool on_null(error_code&) { return value_done(); }
  bool on_comment_part(json::string_view, error_code&) { return true; }
  bool on_comment(json::string_view, error_code&) { return true; }

 private:
  struct Level {
    bool object = false;
    std::unordered_set<std::string> keys;  // objects only
    std::string current;                   // objects: the member being parsed
    std::size_t index = 0;                 // arrays: index of the element being parsed
  };

  bool open(bool object) {
    levels_.push_back(Level{object, {}, {}, 0});
    return true;
  }
  bool close() {
    levels_.pop_back();
    return value_done();
  }
  // A value inside an array moves the array to its next index.
  bool value_done() {
    if (!levels_.empty() && !levels_.back().object) ++levels_.back().index;
    return true;
  }
  // The pointer of the object that is open now (the member's parent).
  std::string pointer_here() const {
    std::string p;
    for (std::size_t i = 0; i + 1 < levels_.size(); ++i) {
      auto const& l = levels_[i];
      p = l.object ? pointer_append(p, l.current) : pointer_append(p, l.index);
    }
    return p;
  }

  std::vector<Level> levels_;
  std::string key_;
};

}  // namespace

Result<json::value> parse_json_text(std::string_view text) {
  json::parse_options opts;
  opts.max_depth = 64;
  {
    json::basic_parser<DuplicateKeyHandler> scan{opts};
    error_code ec;
    scan.write_some(false, text.data(), text.size(), ec);
    if (scan.handler().duplicate) {
      return Error{Errc::plan_invalid_json, "duplicate member " + *scan.handler().duplicate};
    }
    if (ec) return Error{Errc::plan_invalid_json, ec.message()};
  }
  error_code ec;
  json::value v = json::parse(text, ec, json::storage_ptr{}, opts);
  if (ec) return Error{Errc::plan_invalid_json, ec.message()};
  return v;
}

}  // namespace custos::core
