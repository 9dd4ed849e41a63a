// Canonical bytes and digests of the identity and the effective plan.
//
// Layouts (tags, kinds, types) are specified in docs/canonical-encoding.md; the kinds are listed
// here because other records may embed these ones (write_identity / read_identity etc.).
// Encoders validate first and refuse an invalid value (its diagnostics in the error), so no
// invalid plan ever gets a digest; decoders are strict framing-wise (canonical.*) and then
// re-validate, reporting a semantically invalid value as canonical.malformed with diagnostics.
// decode(encode(x)) == x for every valid x, and encode(decode(b)) == b for every accepted b.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "custos/core/canonical.hpp"
#include "custos/core/digest.hpp"
#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"

namespace custos::core {

namespace kind {
inline constexpr RecordKind identity = 0x0001;
inline constexpr RecordKind plan = 0x0002;
inline constexpr RecordKind execution = 0x0003;  // identity + plan: what plan_digest covers
inline constexpr RecordKind command = 0x0010;
inline constexpr RecordKind workspace = 0x0011;
inline constexpr RecordKind env_inherit = 0x0012;
inline constexpr RecordKind env_literal = 0x0013;
inline constexpr RecordKind io_pipes = 0x0014;
inline constexpr RecordKind io_pty = 0x0015;
inline constexpr RecordKind limits = 0x0016;
inline constexpr RecordKind output_policy = 0x0017;
inline constexpr RecordKind escalation = 0x0018;
inline constexpr RecordKind user = 0x0019;
inline constexpr RecordKind sandbox_none = 0x001A;    // plan field 10: no sandbox
inline constexpr RecordKind sandbox_digest = 0x001D;  // plan field 10: the checked plan's digest
inline constexpr RecordKind backend = 0x001B;
inline constexpr RecordKind reference_script = 0x001C;
// One kind per script step, in ScriptStep order: the kind says what the step does.
inline constexpr RecordKind step_write = 0x0020;
inline constexpr RecordKind step_sleep = 0x0021;
inline constexpr RecordKind step_spawn = 0x0022;
inline constexpr RecordKind step_ignore = 0x0023;
inline constexpr RecordKind step_use = 0x0024;
inline constexpr RecordKind step_read_stdin = 0x0025;
inline constexpr RecordKind step_exit = 0x0026;
inline constexpr RecordKind step_signal = 0x0027;
}  // namespace kind

// Whole documents.
[[nodiscard]] Result<std::vector<std::uint8_t>> encode_identity(ExecutionIdentity const& id);
[[nodiscard]] Result<std::vector<std::uint8_t>> encode_plan(ExecutionPlan const& plan);
[[nodiscard]] Result<std::vector<std::uint8_t>> encode_execution(ExecutionIdentity const& id,
                                                                 ExecutionPlan const& plan);
[[nodiscard]] Result<ExecutionIdentity> decode_identity(std::span<std::uint8_t const> doc);
[[nodiscard]] Result<ExecutionPlan> decode_plan(std::span<std::uint8_t const> doc);

struct ExecutionRequest {
  ExecutionIdentity identity;
  ExecutionPlan plan;
  friend bool operator==(ExecutionRequest const&, ExecutionRequest const&) = default;
};
[[nodiscard]] Result<ExecutionRequest> decode_execution(std::span<std::uint8_t const> doc);

// SHA-256 of encode_execution(id, plan): the digest every event, record and authorization of
// the execution carries.
[[nodiscard]] Result<Digest> plan_digest(ExecutionIdentity const& id, ExecutionPlan const& plan);

// Embedding in another record: writes the record as field `tag` of the writer's current record
// (the caller validates first), or reads it back (framing checks only; validate separately).
void write_identity(CanonicalWriter& w, Tag tag, ExecutionIdentity const& id);
void write_plan(CanonicalWriter& w, Tag tag, ExecutionPlan const& plan);
[[nodiscard]] Result<ExecutionIdentity> read_identity(CanonicalReader& r, Tag tag);
[[nodiscard]] Result<ExecutionPlan> read_plan(CanonicalReader& r, Tag tag);

}  // namespace custos::core
