// Typed errors: a stable numeric code, a stable wire string, and a recovery class.
//
// Codes are numbered by layer and never renumbered or reused:
//   1xxx plan and identity   2xxx lifecycle   3xxx sys   4xxx registry
//   5xxx rpc                 6xxx gateway     7xxx sandbox   8xxx engine   9xxx internal
// Add a code by appending it inside its range, then add its row to kErrorTable in error.cpp
// (a unit test checks every enumerator has exactly one row and every wire string is unique).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace custos {

// What a caller should do about an error (docs/architecture.md, Errors).
enum class Recovery : std::uint8_t {
  caller_correction,  // fix the request and send it again
  reauthorize,        // authority drifted: obtain fresh authority, then retry
  preparation_retry,  // transient host condition before any effect: retry as is
  cancel_reap,        // something is running that must be cancelled and reaped
  reopen_reconcile,   // durable state must be reopened and reconciled
  quarantine,         // the record is untrusted: kept and reported, never acted on
  publication_retry,  // artifact publication failed; the terminal result stands
  terminal,           // final: nothing to retry
};

enum class Errc : std::uint16_t {
  // 1xxx — plan, identity, canonical encoding
  plan_invalid_json = 1000,
  plan_missing_field = 1001,
  plan_wrong_type = 1002,
  plan_unknown_field = 1003,
  plan_invalid_id = 1004,
  plan_invalid_executable = 1005,
  plan_empty_argv = 1006,
  plan_nul_byte = 1007,
  plan_too_large = 1008,
  plan_invalid_env_name = 1009,
  plan_duplicate_env = 1010,
  plan_env_conflict = 1011,
  plan_invalid_cwd = 1012,
  plan_invalid_io = 1013,
  plan_invalid_limit = 1014,
  plan_invalid_output_policy = 1015,
  plan_invalid_escalation = 1016,
  plan_invalid_backend = 1017,
  plan_invalid_user = 1018,
  plan_invalid_workspace = 1019,
  plan_invalid_value = 1020,
  plan_invalid = 1099,  // several diagnostics; see Error::diagnostics
  canonical_malformed = 1100,
  canonical_unsupported_version = 1101,
  canonical_trailing_bytes = 1102,
  digest_failed = 1103,

  // 2xxx — lifecycle, cancellation, accounting
  lifecycle_illegal_transition = 2000,
  lifecycle_already_terminal = 2001,
  lifecycle_trigger_after_terminal = 2002,
  accounting_invariant = 2003,
  exec_not_found = 2004,
  exec_wait_timeout = 2005,
  exec_not_running = 2006,
  exec_input_closed = 2007,
  exec_input_limit = 2008,
  exec_resize_refused = 2009,
  exec_not_pty = 2010,
  teardown_illegal_event = 2011,  // the teardown reducer refused an event (core/teardown.hpp)

  // 3xxx — kernel facilities and process effects
  sys_error = 3000,
  sys_unsupported = 3001,
  spawn_failed = 3002,
  pidfd_failed = 3003,
  cgroup_unavailable = 3004,
  cgroup_failed = 3005,
  procfs_failed = 3006,
  pty_failed = 3007,
  workspace_escape = 3008,
  identity_mismatch = 3009,
  cleanup_unconfirmed = 3010,
  workspace_state_dir = 3011,  // the workspace is, or contains, the daemon's state directory

  // 4xxx — registry and recovery
  registry_open_failed = 4000,
  registry_locked = 4001,
  registry_schema_unknown = 4002,
  registry_schema_newer = 4003,
  registry_migration_failed = 4004,
  registry_corrupt_record = 4005,
  registry_illegal_phase = 4006,
  registry_claim_consumed = 4007,
  registry_io = 4008,
  registry_not_found = 4009,
  registry_legacy_unverified = 4010,
  recovery_indeterminate = 4011,
  registry_corrupt_database = 4012,  // the file is not a SQLite database, or truncated/damaged
  artifact_io = 4013,                // the artifact store could not be written or read (I/O error)
  artifact_no_space = 4014,          // the artifact store's file system is full
  artifact_spool_missing = 4015,     // a stream's spool is gone before its output was published
  artifact_corrupt = 4016,           // a stored artifact's bytes do not match its digest or size
  output_removed = 4017,             // retention removed the execution's output

  // 5xxx — rpc and daemon
  rpc_parse_error = 5000,
  rpc_invalid_request = 5001,
  rpc_method_not_found = 5002,
  rpc_invalid_params = 5003,
  rpc_line_too_long = 5004,
  rpc_overloaded = 5005,
  rpc_unavailable = 5006,
  rpc_subscription_limit = 5007,
  rpc_subscription_not_found = 5008,
  rpc_not_implemented = 5009,
  daemon_config_invalid = 5010,
  daemon_shutting_down = 5011,
  daemon_handover_failed = 5012,  // a handover (re-exec) was refused or its new image failed

  // 6xxx — gateway and authority
  auth_denied = 6000,
  auth_unknown_grant = 6001,
  auth_stale_revision = 6002,
  auth_stale_epoch = 6003,
  auth_operation_class = 6004,
  auth_executable = 6005,
  auth_workspace = 6006,
  auth_environment = 6007,
  auth_resource = 6008,
  auth_env_inherit = 6009,
  auth_env_literal = 6010,
  auth_limit_ceiling = 6011,
  auth_budget_exhausted = 6012,
  auth_lease_required = 6013,
  auth_lease_stale = 6014,
  auth_lease_surplus = 6015,
  auth_expired = 6016,
  auth_replay = 6017,
  auth_user = 6018,
  auth_digest_mismatch = 6019,
  lease_conflict = 6020,
  lease_not_found = 6021,
  auth_container = 6022,  // the grant does not name the plan's engine container

  // 7xxx — sandbox
  sandbox_invalid = 7000,
  sandbox_undeclared = 7001,
  sandbox_unsupported = 7002,
  sandbox_denied = 7003,
  sandbox_required = 7004,        // the grant has a contract and the plan has no sandbox
  sandbox_secret_unknown = 7005,  // a secret ref the secret store does not hold
  secret_invalid_name = 7006,     // a secret name is not 1-128 of [A-Za-z0-9_.-], first alnum
  secret_too_large = 7007,        // a secret value beyond the store's bound (docs/api.md)
  secret_read_only = 7008,        // the secret comes from $CREDENTIALS_DIRECTORY: not deletable
  secret_store_unsafe = 7009,     // the store's directory or a file in it has the wrong owner,
                                  // mode or type: the store is refused, never repaired

  // 8xxx — container engines (docs/engines.md)
  engine_unavailable = 8000,  // no socket, no answer within the deadline, connection lost
  engine_failed = 8001,       // any other refusal or malformed answer; the engine's message kept
  engine_container_not_found = 8002,    // no container by that name or id
  engine_container_not_running = 8003,  // the container exists but is not running (stopped, paused)
  engine_gate_unavailable = 8004,       // the container cannot run the exec gate (no /bin/sh)

  // 9xxx — internal
  internal = 9000,
};

// One finding of a validation pass: which field (RFC 6901 JSON pointer) and why.
struct Diagnostic {
  Errc code;
  std::string pointer;
  std::string message;

  friend bool operator==(Diagnostic const&, Diagnostic const&) = default;
};

struct Error {
  Errc code = Errc::internal;
  int sys_errno = 0;    // errno of the failing syscall, 0 when not a syscall failure
  std::string context;  // human detail: what was being done, on what
  std::vector<Diagnostic> diagnostics;  // every finding, for validation errors
  // sandbox.unsupported: every control the backend lacks, sorted (the wire's detail.missing).
  std::vector<std::string> missing;

  Error() = default;
  Error(Errc c, std::string ctx = {}, int err = 0)
      : code(c), sys_errno(err), context(std::move(ctx)) {}

  // Builds an error from a list of diagnostics: the single code when there is one, else
  // plan_invalid.
  static Error from_diagnostics(std::vector<Diagnostic> diags);

  [[nodiscard]] std::string_view wire() const noexcept;
  [[nodiscard]] Recovery recovery() const noexcept;
  // "plan.invalid_cwd: /plan/cwd: escapes the workspace (errno 2: No such file or directory)"
  [[nodiscard]] std::string message() const;
};

// The stable wire string of a code ("plan.invalid_cwd"). Never changes once released.
[[nodiscard]] std::string_view errc_wire(Errc code) noexcept;
[[nodiscard]] Recovery errc_recovery(Errc code) noexcept;
[[nodiscard]] std::optional<Errc> errc_from_wire(std::string_view wire) noexcept;
[[nodiscard]] std::string_view recovery_wire(Recovery r) noexcept;
// Every code, in table order (for tests and documentation generation).
[[nodiscard]] std::vector<Errc> all_errcs();

}  // namespace custos
