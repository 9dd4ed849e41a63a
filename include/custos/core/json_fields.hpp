// One reader for the members of JSON documents that come from outside, with diagnostics.
//
// Every layer that takes JSON it did not write reads it the same way: an object's members, each
// required or optional, checked for type and range, one Diagnostic per problem — its code, the
// RFC 6901 pointer of the member, a message — collected rather than stopping at the first, so a
// caller learns every mistake of a request at once (docs/architecture.md, "Conventions"). Users:
// the plan and identity (plan_json.cpp), the terminal record (terminal.cpp), the authority forms
// (gateway/authority.cpp) and the RPC methods' params (src/rpc).
//
//   FieldReader r;
//   if (auto const* o = r.object(v, "/plan/io")) {
//     r.only(*o, "/plan/io", {"mode", "rows"});
//     if (auto const* m = r.required(*o, "/plan/io", "mode")) (void)r.string(*m, ptr, mode);
//   }
//   if (!r.ok()) return std::move(r).error();
//
// A reading function reports at most one diagnostic for the value it was given and returns false
// (or nullptr) when it did, leaving `out` untouched.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/error.hpp"

namespace custos::core {

// The codes a reader gives its structural findings. The plan's by default; the RPC methods give
// every finding about their params rpc.invalid_params.
struct FieldCodes {
  Errc wrong_type = Errc::plan_wrong_type;  // a member of the wrong JSON type
  Errc missing = Errc::plan_missing_field;  // a required member absent
  Errc unknown = Errc::plan_unknown_field;  // a member the reader does not know
  Errc invalid = Errc::plan_invalid_value;  // out of range, or not one of the names allowed
  Errc several = Errc::plan_invalid;        // the error's code when there is more than one
};

class FieldReader {
 public:
  FieldReader() = default;
  explicit FieldReader(FieldCodes codes) : codes_(codes) {}

  [[nodiscard]] FieldCodes const& codes() const noexcept { return codes_; }

  // ---- findings
  void add(Errc code, std::string pointer, std::string message);
  // "must be <expected>, is <what v is>", with codes().wrong_type.
  void wrong_type(boost::json::value const& v, std::string pointer, std::string_view expected);
  // "is required", with codes().missing, at base + key.
  void missing(std::string_view base, std::string_view key);

  [[nodiscard]] bool ok() const noexcept { return diags_.empty(); }
  [[nodiscard]] std::size_t count() const noexcept { return diags_.size(); }
  [[nodiscard]] std::vector<Diagnostic>& diagnostics() noexcept { return diags_; }
  [[nodiscard]] std::vector<Diagnostic> const& diagnostics() const noexcept { return diags_; }
  // Takes over the findings of an Error: its diagnostics, or the error itself at `pointer`.
  void absorb(Error const& e, std::string_view pointer);
  // Everything found, as one Error (Error::from_diagnostics; codes().several when more than one).
  [[nodiscard]] Error error() &&;

  // ---- structure
  [[nodiscard]] boost::json::object const* object(boost::json::value const& v,
                                                  std::string const& ptr);
  [[nodiscard]] boost::json::array const* array(boost::json::value const& v,
                                                std::string const& ptr);
  // Reports every member of `o` not in `allowed` (codes().unknown), in document order.
  void only(boost::json::object const& o, std::string const& ptr,
            std::initializer_list<std::string_view> allowed);
  // The member `key`, or nullptr after reporting it missing. A null member is present.
  [[nodiscard]] boost::json::value const* required(boost::json::object const& o,
                                                   std::string const& ptr, std::string_view key);
  // The member `key`, or nullptr when absent (a null member is present).
  [[nodiscard]] static boost::json::value const* optional(boost::json::object const& o,
                                                          std::string_view key);
  // The member `key`, or nullptr when absent or null: for members where null means "not given".
  [[nodiscard]] static boost::json::value const* given(boost::json::object const& o,
                                                       std::string_view key);

  // ---- values
  bool string(boost::json::value const& v, std::string const& ptr, std::string& out);
  bool boolean(boost::json::value const& v, std::string const& ptr, bool& out);
  // A non-negative integer no larger than `max`; a negative or too large one is `range_code`.
  bool unsigned_int(boost::json::value const& v, std::string const& ptr, std::uint64_t max,
                    Errc range_code, std::uint64_t& out);
  bool unsigned_int(boost::json::value const& v, std::string const& ptr, std::uint64_t& out) {
    return unsigned_int(v, ptr, std::numeric_limits<std::uint64_t>::max(), codes_.invalid, out);
  }
  // An integer in the 32-bit signed range: another type is wrong_type, out of range is invalid.
  bool int32(boost::json::value const& v, std::string const& ptr, std::int32_t& out);
  // A string naming one of an enum's values through its from_wire function (wire_names.hpp);
  // "unknown value" otherwise, with codes().invalid.
  template <class E, class FromWire>
  bool name(boost::json::value const& v, std::string const& ptr, FromWire&& from_wire, E& out) {
    std::string s;
    if (!string(v, ptr, s)) return false;
    std::optional<E> e = from_wire(s);
    if (!e.has_value()) {
      add(codes_.invalid, ptr, "unknown value \"" + s + "\"");
      return false;
    }
    out = *e;
    return true;
  }
  // Optional numeric member: leaves `out` at its default when absent.
  template <class T>
  void opt_number(boost::json::object const& o, std::string const& ptr, std::string_view key,
                  std::uint64_t max, Errc range_code, T& out) {
    if (auto const* v = optional(o, key)) {
      std::uint64_t n = 0;
      if (unsigned_int(*v, member(ptr, key), max, range_code, n)) out = static_cast<T>(n);
    }
  }

 private:
  static std::string member(std::string_view base, std::string_view key);

  FieldCodes codes_;
  std::vector<Diagnostic> diags_;
};

}  // namespace custos::core
