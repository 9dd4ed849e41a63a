// Reading the methods' params (exec_internal.hpp): core's field reader with the RPC codes.
#include "custos/core/base64.hpp"
#include "custos/core/json_pointer.hpp"
#include "custos/core/plan_json.hpp"
#include "custos/sandbox/plan.hpp"

#include "exec_internal.hpp"

namespace custos::rpc::detail {

namespace json = boost::json;

core::FieldCodes rpc_param_codes() noexcept {
  core::FieldCodes c;
  c.wrong_type = c.missing = c.unknown = c.invalid = c.several = Errc::rpc_invalid_params;
  return c;
}

core::FieldCodes launch_param_codes() noexcept {
  // A missing identity or plan is the plan's finding, and several findings (the plan's every
  // diagnostic, typically) are plan.invalid; the params' own problems stay rpc.invalid_params.
  core::FieldCodes c = rpc_param_codes();
  c.missing = Errc::plan_missing_field;
  c.several = Errc::plan_invalid;
  return c;
}

Params::Params(json::object const& params, std::initializer_list<std::string_view> allowed,
               core::FieldCodes codes)
    : params_(params), fields_(codes) {
  fields_.only(params_, "", allowed);
}

std::string Params::at(std::string_view key) {
  return core::pointer_append("", key);
}

std::string Params::required_string(std::string_view key) {
  auto const* v = core::FieldReader::given(params_, key);
  if (v == nullptr) {
    fields_.missing("", key);
    return {};
  }
  if (!v->is_string() || v->get_string().empty()) {
    fields_.add(fields_.codes().wrong_type, at(key), "must be a non-empty string");
    return {};
  }
  return std::string{v->get_string()};
}

std::optional<std::string> Params::optional_string(std::string_view key) {
  auto const* v = core::FieldReader::given(params_, key);
  std::string s;
  if (v == nullptr || !fields_.string(*v, at(key), s)) return std::nullopt;
  return s;
}

std::optional<std::uint64_t> Params::optional_u64(std::string_view key, std::uint64_t max) {
  auto const* v = core::FieldReader::given(params_, key);
  std::uint64_t n = 0;
  if (v == nullptr || !fields_.unsigned_int(*v, at(key), max, fields_.codes().invalid, n)) {
    return std::nullopt;
  }
  return n;
}

std::uint64_t Params::required_u64(std::string_view key) {
  if (core::FieldReader::given(params_, key) == nullptr) {
    fields_.missing("", key);
    return 0;
  }
  return optional_u64(key).value_or(0);
}

bool Params::optional_bool(std::string_view key, bool absent) {
  auto const* v = core::FieldReader::given(params_, key);
  bool b = absent;
  if (v != nullptr && !fields_.boolean(*v, at(key), b)) return absent;
  return b;
}

void Params::bad(std::string_view key, std::string message) {
  fields_.add(fields_.codes().invalid, at(key), std::move(message));
}

std::optional<Error> Params::error() && {
  if (fields_.ok()) return std::nullopt;
  return std::move(fields_).error();
}

std::vector<std::uint8_t> input_bytes(Params& in) {
  auto const* b = core::FieldReader::given(in.object(), "data_b64");
  if (b == nullptr) return {};
  auto decoded = b->is_string() ? core::base64_decode(b->get_string()) : std::nullopt;
  if (!decoded) {
    in.bad("data_b64", "must be padded base64");
    return {};
  }
  if (decoded->size() > kMaxInputChunk) {
    in.bad("data_b64", "carries more than " + std::to_string(kMaxInputChunk) + " bytes");
    return {};
  }
  return std::move(*decoded);
}

LaunchParts read_launch(Params& in) {
  LaunchParts out;
  auto& f = in.fields();
  if (auto const* id = f.required(in.object(), "", "identity")) {
    if (auto r = core::parse_identity(*id, "/identity")) {
      out.identity = std::move(*r);
    } else {
      f.absorb(r.error(), "/identity");
    }
  }
  if (auto const* plan = f.required(in.object(), "", "plan")) {
    if (auto r = sandbox::parse_plan(*plan, "/plan")) {
      out.plan = std::move(r->plan);
      out.sandbox = std::move(r->sandbox);
    } else {
      out.plan_error = r.error();
    }
  }
  out.subscribe = in.optional_bool("subscribe");
  return out;
}

std::optional<Error> finish_launch(Params&& in, LaunchParts& parts) {
  if (parts.plan_error) {
    if (in.fields().ok()) return std::move(*parts.plan_error);
    in.fields().absorb(*parts.plan_error, "/plan");
  }
  return std::move(in).error();
}

}  // namespace custos::rpc::detail
