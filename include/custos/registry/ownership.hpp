// Conversions between core/sys values and registry records, so the daemon's
// supervisor::OwnershipSink adapter is a line per call (docs/registry.md "Wiring").
#pragma once

#include <string>

#include "custos/core/accounting.hpp"
#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/registry/registry.hpp"
#include "custos/sys/identity.hpp"

namespace custos::registry {

// The record of a new execution: canonical bytes of (identity, effective plan) and their digest.
// `expected_digest` (what the caller already computed, e.g. the supervisor's plan digest) must
// match when given. Errors: the encoder's plan.* errors; auth.digest_mismatch.
[[nodiscard]] Result<NewExecution> make_new_execution(std::string const& execution_id,
                                                      core::ExecutionIdentity const& identity,
                                                      core::ExecutionPlan const& plan,
                                                      std::string const& expected_digest = {});

// A staged ownership slot for a child at its barrier. The pid namespace recorded is the
// caller's own (the namespace the pid was read in).
[[nodiscard]] Ownership staged_ownership(sys::PidfsIdentity const& id);
// The slot of a reference execution: modelled, no process identity at all.
[[nodiscard]] Ownership modelled_ownership();
// The slot of an ungated container exec: known by its marker (and PID namespace) only.
// `not_before_ticks`: a time before the exec started (clock ticks since boot), which bounds the
// marker sweep; 0 when unknown.
[[nodiscard]] Ownership marked_ownership(std::uint64_t not_before_ticks);

// `marker_ns_ino`: the PID namespace the marker sweep is limited to (a container's), 0: the
// daemon's.
[[nodiscard]] BoundaryInfo boundary_info(core::Boundary boundary, std::string const& cgroup_path,
                                         std::string const& marker_hex,
                                         std::uint64_t marker_ns_ino = 0);

// Index of a stream in ExecutionRecord: stdout and pty -> 0 (out), stderr -> 1 (err).
[[nodiscard]] int stream_index(core::Stream s) noexcept;

// Canonical bytes + digest of a terminal record. Errors: core::validate's errors.
[[nodiscard]] Result<TerminalBlob> terminal_blob(core::TerminalRecord const& rec);

// Decodes a stored terminal record (exec.get of a terminal execution).
// Errors: canonical.* when the bytes do not decode.
[[nodiscard]] Result<core::TerminalRecord> decode_terminal(TerminalBlob const& blob);

}  // namespace custos::registry
