// Fuzz target: arbitrary bytes → canonical decode (by the document's kind). Whatever decodes
// must re-encode to exactly the input: the encoding is a bijection between valid values and
// accepted byte strings (docs/canonical-encoding.md §7).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "custos/core/plan_canonical.hpp"
#include "custos/sandbox/canonical.hpp"

namespace {

using namespace custos::core;

void require(bool ok) {
  if (!ok) std::abort();
}

void same_bytes(custos::Result<std::vector<std::uint8_t>> const& re,
                std::span<std::uint8_t const> in) {
  require(static_cast<bool>(re));
  require(re->size() == in.size() && std::equal(re->begin(), re->end(), in.begin()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::span<std::uint8_t const> const in{data, size};
  auto kind_of = CanonicalReader::peek_kind(in);
  if (!kind_of) return 0;
  switch (*kind_of) {
    case kind::identity:
      if (auto id = decode_identity(in)) same_bytes(encode_identity(*id), in);
      break;
    case kind::plan:
      if (auto plan = decode_plan(in)) same_bytes(encode_plan(*plan), in);
      break;
    case kind::execution:
      if (auto req = decode_execution(in))
        same_bytes(encode_execution(req->identity, req->plan), in);
      break;
    case custos::sandbox::kind::checked_sandbox:
      if (auto checked = custos::sandbox::decode(in))
        same_bytes(custos::sandbox::encode(*checked), in);
      break;
    default:
      // Unknown kinds must be refused by every typed decoder.
      require(!decode_identity(in) && !decode_plan(in) && !decode_execution(in) &&
              !custos::sandbox::decode(in));
      break;
  }
  return 0;
}
