// Fuzz target: arbitrary bytes as an engine's answer. The HTTP parser must accept or refuse
// them within the client's limits (a refusal is a typed engine.* error), and whatever body it
// gives back goes through every body parser and the classification of every operation: none
// may crash, throw or report success with an impossible value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "custos/engine/wire.hpp"

namespace {

using namespace custos;
using namespace custos::engine;

void require(bool ok) {
  if (!ok) std::abort();
}

bool is_engine_error(Error const& e) {
  return e.code == Errc::engine_failed || e.code == Errc::engine_unavailable ||
         e.code == Errc::engine_container_not_found || e.code == Errc::engine_container_not_running;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const in{reinterpret_cast<char const*>(data), size};
  Limits limits;
  limits.header_bytes = 4096;
  limits.body_bytes = 8192;
  auto r = parse_response(in, limits);
  if (!r) {
    require(is_engine_error(r.error()));
    return 0;
  }
  require(r->body.size() <= limits.body_bytes);
  require(r->status >= 100 && r->status <= 999);
  for (auto op :
       {Operation::version, Operation::ping, Operation::container_inspect, Operation::exec_create,
        Operation::exec_start, Operation::exec_inspect, Operation::exec_resize}) {
    if (is_success(op, r->status)) continue;
    auto const e = classify_failure(EngineKind::podman, op, "subject", r->status, r->body, 64);
    require(is_engine_error(e));
    // The kept message is bounded: the prefix, the status and at most 64 bytes (+ "...").
    require(e.context.size() <= 80 + 64 + 3);
  }
  if (auto v = parse_version(r->body)) {
    require(v->negotiated >= kMinApiVersion && v->negotiated <= kMaxApiVersion);
    require(v->negotiated <= v->api && v->negotiated >= v->min_api);
  }
  if (auto c = parse_container_inspect(r->body)) {
    require(!c->id.empty() && c->pid >= 0);
  }
  if (auto id = parse_exec_create(r->body)) require(is_valid_exec_id(*id));
  if (auto x = parse_exec_inspect(r->body)) {
    require(!x->id.empty() && x->pid >= 0);
    require(!(x->running && x->exit_code));
  }
  auto const m = parse_engine_message(r->body, 32);
  require(m.message.size() <= 35 && m.cause.size() <= 35);
  for (char c : m.message) require(static_cast<unsigned char>(c) >= 0x20 && c != 0x7F);
  return 0;
}
