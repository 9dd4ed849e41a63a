// The terminal record: the one durable answer to "what finally happened to this execution".
//
// JSON shape is docs/api.md "The terminal result" (with `recovery`, `tree.containment` and, for
// a spawn failure, `spawn_error`). The digest covers the canonical bytes of every field below, so
// changing any of them changes the digest.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/accounting.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/resources.hpp"
#include "custos/core/result.hpp"

namespace custos::core {

// Which ownership boundary the execution got (docs/architecture.md "Ownership boundaries").
// `reference`: the scripted model of the reference backend, which holds no process at all.
enum class Boundary : std::uint8_t { cgroup, marker, reference };
// Whether the boundary was kernel-enforced for this process (non-root, or nsdelegate) or a
// process in the tree could have left it.
enum class Containment : std::uint8_t { kernel_enforced, escapable };

[[nodiscard]] std::string_view boundary_wire(Boundary b) noexcept;
[[nodiscard]] std::optional<Boundary> boundary_from_wire(std::string_view wire) noexcept;
[[nodiscard]] std::string_view containment_wire(Containment c) noexcept;
[[nodiscard]] std::optional<Containment> containment_from_wire(std::string_view wire) noexcept;

struct TreeReport {
  Boundary boundary = Boundary::cgroup;
  Cleanup cleanup = Cleanup::unconfirmed;
  Containment containment = Containment::escapable;

  friend bool operator==(TreeReport const&, TreeReport const&) = default;
};

struct EscalationReport {
  bool graceful_sent = false;  // the plan's graceful signal was delivered to the tree
  bool forced = false;         // the tree was killed (cgroup.kill or marker sweep SIGKILL)

  friend bool operator==(EscalationReport const&, EscalationReport const&) = default;
};

// What the backend saw of the execution, bound into the terminal record (and its digest):
// name -> value, names without '=' (the canonical bytes list them as "name=value", in name order).
using Observations = std::map<std::string, std::string>;

struct TerminalRecord {
  Classification classification = Classification::supervisor_failed;
  RecoveryPath recovery = RecoveryPath::observed;
  ExitStatus exit;                 // raw exit, always kept; empty if none observed
  std::optional<Trigger> trigger;  // first accepted trigger
  EscalationReport escalation;
  OutputAccounting output;
  ResourceReport resources;
  TreeReport tree;
  std::optional<SpawnFailure> spawn_error;  // present exactly when the program never started
  Observations observations;                // absent from JSON and bytes when empty

  friend bool operator==(TerminalRecord const&, TerminalRecord const&) = default;
};

// Cross-field consistency (a record that could not have been produced by classify()):
// classification vs trigger/exit/spawn_error/recovery, exit validity, accounting invariants.
// Errc::lifecycle_illegal_transition for an inconsistent outcome, accounting_invariant for
// output accounting.
[[nodiscard]] Result<> validate(TerminalRecord const& rec);

// Builds the record's classification fields from the supervisor's observations through
// classify(); the caller fills output, resources, tree and escalation.
[[nodiscard]] Result<TerminalRecord> make_terminal_record(ClassifyInput const& in,
                                                          std::optional<SpawnFailure> spawn_error);

// JSON per docs/api.md, with "digest": "sha256:<hex>" of the canonical bytes.
[[nodiscard]] Result<boost::json::value> to_json(TerminalRecord const& rec);
// Strict: unknown fields, missing fields, wrong types and out-of-range numbers are
// Errc::plan_* errors with a JSON pointer; the record must validate(); a present "digest" must
// match the recomputed one (Errc::auth_digest_mismatch otherwise).
[[nodiscard]] Result<TerminalRecord> terminal_from_json(boost::json::value const& v);

// Versioned canonical bytes (docs/canonical-encoding.md, "terminal record") and their digest.
[[nodiscard]] Result<std::vector<std::uint8_t>> canonical_bytes(TerminalRecord const& rec);
[[nodiscard]] Result<TerminalRecord> terminal_from_canonical(std::span<std::uint8_t const> bytes);
[[nodiscard]] Result<std::string> terminal_digest(TerminalRecord const& rec);

}  // namespace custos::core
