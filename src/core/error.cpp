// The one table that maps every error code to its wire string and recovery class.
#include "custos/core/error.hpp"

#include <array>
#include <cstring>

#include "custos/core/result.hpp"
#include "custos/core/wire_names.hpp"

namespace custos {
namespace {

struct ErrorRow {
  Errc code;
  std::string_view wire;
  Recovery recovery;
};

// Wire strings are part of the API contract (docs/api.md): append, never rename.
constexpr ErrorRow kErrorTable[] = {
    {Errc::plan_invalid_json, "plan.invalid_json", Recovery::caller_correction},
    {Errc::plan_missing_field, "plan.missing_field", Recovery::caller_correction},
    {Errc::plan_wrong_type, "plan.wrong_type", Recovery::caller_correction},
    {Errc::plan_unknown_field, "plan.unknown_field", Recovery::caller_correction},
    {Errc::plan_invalid_id, "plan.invalid_id", Recovery::caller_correction},
    {Errc::plan_invalid_executable, "plan.invalid_executable", Recovery::caller_correction},
    {Errc::plan_empty_argv, "plan.empty_argv", Recovery::caller_correction},
    {Errc::plan_nul_byte, "plan.nul_byte", Recovery::caller_correction},
    {Errc::plan_too_large, "plan.too_large", Recovery::caller_correction},
    {Errc::plan_invalid_env_name, "plan.invalid_env_name", Recovery::caller_correction},
    {Errc::plan_duplicate_env, "plan.duplicate_env", Recovery::caller_correction},
    {Errc::plan_env_conflict, "plan.env_conflict", Recovery::caller_correction},
    {Errc::plan_invalid_cwd, "plan.invalid_cwd", Recovery::caller_correction},
    {Errc::plan_invalid_io, "plan.invalid_io", Recovery::caller_correction},
    {Errc::plan_invalid_limit, "plan.invalid_limit", Recovery::caller_correction},
    {Errc::plan_invalid_output_policy, "plan.invalid_output_policy", Recovery::caller_correction},
    {Errc::plan_invalid_escalation, "plan.invalid_escalation", Recovery::caller_correction},
    {Errc::plan_invalid_backend, "plan.invalid_backend", Recovery::caller_correction},
    {Errc::plan_invalid_user, "plan.invalid_user", Recovery::caller_correction},
    {Errc::plan_invalid_workspace, "plan.invalid_workspace", Recovery::caller_correction},
    {Errc::plan_invalid_value, "plan.invalid_value", Recovery::caller_correction},
    {Errc::plan_invalid, "plan.invalid", Recovery::caller_correction},
    {Errc::canonical_malformed, "canonical.malformed", Recovery::caller_correction},
    {Errc::canonical_unsupported_version, "canonical.unsupported_version",
     Recovery::caller_correction},
    {Errc::canonical_trailing_bytes, "canonical.trailing_bytes", Recovery::caller_correction},
    {Errc::digest_failed, "digest.failed", Recovery::terminal},
    {Errc::lifecycle_illegal_transition, "lifecycle.illegal_transition", Recovery::terminal},
    {Errc::lifecycle_already_terminal, "lifecycle.already_terminal", Recovery::terminal},
    {Errc::lifecycle_trigger_after_terminal, "lifecycle.trigger_after_terminal",
     Recovery::terminal},
    {Errc::accounting_invariant, "accounting.invariant", Recovery::terminal},
    {Errc::exec_not_found, "exec.not_found", Recovery::caller_correction},
    {Errc::exec_wait_timeout, "exec.wait_timeout", Recovery::preparation_retry},
    {Errc::exec_not_running, "exec.not_running", Recovery::caller_correction},
    {Errc::exec_input_closed, "exec.input_closed", Recovery::caller_correction},
    {Errc::exec_input_limit, "exec.input_limit", Recovery::caller_correction},
    {Errc::exec_resize_refused, "exec.resize_refused", Recovery::caller_correction},
    {Errc::exec_not_pty, "exec.not_pty", Recovery::caller_correction},
    // The supervisor's teardown went off its table: its view of the tree cannot be trusted, so
    // whatever may still run must be killed and reaped (not merely retried).
    {Errc::teardown_illegal_event, "teardown.illegal_event", Recovery::cancel_reap},
    {Errc::sys_error, "sys.error", Recovery::preparation_retry},
    {Errc::sys_unsupported, "sys.unsupported", Recovery::caller_correction},
    {Errc::spawn_failed, "spawn.failed", Recovery::terminal},
    {Errc::pidfd_failed, "pidfd.failed", Recovery::preparation_retry},
    {Errc::cgroup_unavailable, "cgroup.unavailable", Recovery::preparation_retry},
    {Errc::cgroup_failed, "cgroup.failed", Recovery::preparation_retry},
    {Errc::procfs_failed, "procfs.failed", Recovery::preparation_retry},
    {Errc::pty_failed, "pty.failed", Recovery::preparation_retry},
    {Errc::workspace_escape, "workspace.escape", Recovery::caller_correction},
    {Errc::identity_mismatch, "identity.mismatch", Recovery::quarantine},
    {Errc::cleanup_unconfirmed, "cleanup.unconfirmed", Recovery::cancel_reap},
    {Errc::workspace_state_dir, "workspace.state_dir", Recovery::caller_correction},
    {Errc::registry_open_failed, "registry.open_failed", Recovery::reopen_reconcile},
    {Errc::registry_locked, "registry.locked", Recovery::reopen_reconcile},
    {Errc::registry_schema_unknown, "registry.schema_unknown", Recovery::terminal},
    {Errc::registry_schema_newer, "registry.schema_newer", Recovery::terminal},
    {Errc::registry_migration_failed, "registry.migration_failed", Recovery::reopen_reconcile},
    {Errc::registry_corrupt_record, "registry.corrupt_record", Recovery::quarantine},
    {Errc::registry_illegal_phase, "registry.illegal_phase", Recovery::reopen_reconcile},
    {Errc::registry_claim_consumed, "registry.claim_consumed", Recovery::terminal},
    {Errc::registry_io, "registry.io", Recovery::reopen_reconcile},
    {Errc::registry_not_found, "registry.not_found", Recovery::caller_correction},
    {Errc::registry_legacy_unverified, "registry.legacy_unverified", Recovery::quarantine},
    {Errc::recovery_indeterminate, "recovery.indeterminate", Recovery::quarantine},
    {Errc::registry_corrupt_database, "registry.corrupt_database", Recovery::quarantine},
    {Errc::artifact_io, "artifact.io", Recovery::publication_retry},
    {Errc::artifact_no_space, "artifact.no_space", Recovery::publication_retry},
    {Errc::artifact_spool_missing, "artifact.spool_missing", Recovery::terminal},
    {Errc::artifact_corrupt, "artifact.corrupt", Recovery::quarantine},
    {Errc::output_removed, "output.removed", Recovery::terminal},
    {Errc::rpc_parse_error, "rpc.parse_error", Recovery::caller_correction},
    {Errc::rpc_invalid_request, "rpc.invalid_request", Recovery::caller_correction},
    {Errc::rpc_method_not_found, "rpc.method_not_found", Recovery::caller_correction},
    {Errc::rpc_invalid_params, "rpc.invalid_params", Recovery::caller_correction},
    {Errc::rpc_line_too_long, "rpc.line_too_long", Recovery::caller_correction},
    {Errc::rpc_overloaded, "rpc.overloaded", Recovery::preparation_retry},
    {Errc::rpc_unavailable, "rpc.unavailable", Recovery::preparation_retry},
    {Errc::rpc_subscription_limit, "rpc.subscription_limit", Recovery::caller_correction},
    {Errc::rpc_subscription_not_found, "rpc.subscription_not_found", Recovery::caller_correction},
    {Errc::rpc_not_implemented, "rpc.not_implemented", Recovery::terminal},
    {Errc::daemon_config_invalid, "daemon.config_invalid", Recovery::caller_correction},
    {Errc::daemon_shutting_down, "daemon.shutting_down", Recovery::preparation_retry},
    {Errc::daemon_handover_failed, "daemon.handover_failed", Recovery::caller_correction},
    {Errc::auth_denied, "auth.denied", Recovery::caller_correction},
    {Errc::auth_unknown_grant, "auth.unknown_grant", Recovery::reauthorize},
    {Errc::auth_stale_revision, "auth.stale_revision", Recovery::reauthorize},
    {Errc::auth_stale_epoch, "auth.stale_epoch", Recovery::reauthorize},
    {Errc::auth_operation_class, "auth.operation_class", Recovery::caller_correction},
    {Errc::auth_executable, "auth.executable", Recovery::caller_correction},
    {Errc::auth_workspace, "auth.workspace", Recovery::caller_correction},
    {Errc::auth_environment, "auth.environment", Recovery::reauthorize},
    {Errc::auth_resource, "auth.resource", Recovery::reauthorize},
    {Errc::auth_env_inherit, "auth.env_inherit", Recovery::caller_correction},
    {Errc::auth_env_literal, "auth.env_literal", Recovery::caller_correction},
    {Errc::auth_limit_ceiling, "auth.limit_ceiling", Recovery::caller_correction},
    {Errc::auth_budget_exhausted, "auth.budget_exhausted", Recovery::reauthorize},
    {Errc::auth_lease_required, "auth.lease_required", Recovery::reauthorize},
    {Errc::auth_lease_stale, "auth.lease_stale", Recovery::reauthorize},
    {Errc::auth_lease_surplus, "auth.lease_surplus", Recovery::caller_correction},
    {Errc::auth_expired, "auth.expired", Recovery::reauthorize},
    {Errc::auth_replay, "auth.replay", Recovery::terminal},
    {Errc::auth_user, "auth.user", Recovery::caller_correction},
    {Errc::auth_digest_mismatch, "auth.digest_mismatch", Recovery::caller_correction},
    {Errc::lease_conflict, "lease.conflict", Recovery::reauthorize},
    {Errc::lease_not_found, "lease.not_found", Recovery::reauthorize},
    {Errc::auth_container, "auth.container", Recovery::caller_correction},
    {Errc::sandbox_invalid, "sandbox.invalid", Recovery::caller_correction},
    {Errc::sandbox_undeclared, "sandbox.undeclared", Recovery::caller_correction},
    {Errc::sandbox_unsupported, "sandbox.unsupported", Recovery::caller_correction},
    {Errc::sandbox_denied, "sandbox.denied", Recovery::terminal},
    {Errc::sandbox_required, "sandbox.required", Recovery::caller_correction},
    // The request names a secret the store does not hold: an admin sets it (secret.set) or the
    // caller names another; the request as sent will never pass.
    {Errc::sandbox_secret_unknown, "sandbox.secret_unknown", Recovery::caller_correction},
    {Errc::secret_invalid_name, "secret.invalid_name", Recovery::caller_correction},
    {Errc::secret_too_large, "secret.too_large", Recovery::caller_correction},
    // The name is served from systemd's credentials (read-only): change the unit, not the store.
    {Errc::secret_read_only, "secret.read_only", Recovery::caller_correction},
    // Someone else could have read or planted a value: the operator inspects and fixes the store;
    // the daemon never uses it, nor repairs it silently.
    {Errc::secret_store_unsafe, "secret.store_unsafe", Recovery::quarantine},
    {Errc::engine_unavailable, "engine.unavailable", Recovery::preparation_retry},
    {Errc::engine_failed, "engine.failed", Recovery::preparation_retry},
    {Errc::engine_container_not_found, "engine.container_not_found", Recovery::caller_correction},
    {Errc::engine_container_not_running, "engine.container_not_running",
     Recovery::preparation_retry},
    {Errc::engine_gate_unavailable, "engine.gate_unavailable", Recovery::caller_correction},
    {Errc::internal, "internal.error", Recovery::terminal},
};

constexpr auto kRecoveryNames = core::wire_names<Recovery>({
    {Recovery::caller_correction, "caller_correction"},
    {Recovery::reauthorize, "reauthorize"},
    {Recovery::preparation_retry, "preparation_retry"},
    {Recovery::cancel_reap, "cancel_reap"},
    {Recovery::reopen_reconcile, "reopen_reconcile"},
    {Recovery::quarantine, "quarantine"},
    {Recovery::publication_retry, "publication_retry"},
    {Recovery::terminal, "terminal"},
});
static_assert(kRecoveryNames.complete());

// Every code is one number with one wire string: two enumerators given the same number (or two
// rows of one code) would make a code answer with another's name.
constexpr bool rows_unique() {
  constexpr std::size_t n = std::size(kErrorTable);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      if (kErrorTable[i].code == kErrorTable[j].code) return false;
      if (kErrorTable[i].wire == kErrorTable[j].wire) return false;
    }
  }
  return true;
}
static_assert(rows_unique(), "two error rows share a number or a wire string");

ErrorRow const* find_row(Errc code) noexcept {
  for (auto const& row : kErrorTable) {
    if (row.code == code) return &row;
  }
  return nullptr;
}

}  // namespace

std::string_view errc_wire(Errc code) noexcept {
  auto const* row = find_row(code);
  return row != nullptr ? row->wire : std::string_view{"internal.unknown_code"};
}

Recovery errc_recovery(Errc code) noexcept {
  auto const* row = find_row(code);
  return row != nullptr ? row->recovery : Recovery::terminal;
}

std::optional<Errc> errc_from_wire(std::string_view wire) noexcept {
  for (auto const& row : kErrorTable) {
    if (row.wire == wire) return row.code;
  }
  return std::nullopt;
}

std::string_view recovery_wire(Recovery r) noexcept {
  return kRecoveryNames.wire(r);
}

std::vector<Errc> all_errcs() {
  std::vector<Errc> out;
  out.reserve(std::size(kErrorTable));
  for (auto const& row : kErrorTable) out.push_back(row.code);
  return out;
}

Error Error::from_diagnostics(std::vector<Diagnostic> diags) {
  Error e;
  if (diags.size() == 1) {
    e.code = diags.front().code;
    e.context = diags.front().pointer + ": " + diags.front().message;
  } else {
    e.code = Errc::plan_invalid;
    e.context = std::to_string(diags.size()) + " problems";
  }
  e.diagnostics = std::move(diags);
  return e;
}

std::string_view Error::wire() const noexcept {
  return errc_wire(code);
}

Recovery Error::recovery() const noexcept {
  return errc_recovery(code);
}

std::string Error::message() const {
  std::string out{wire()};
  if (!context.empty()) {
    out += ": ";
    out += context;
  }
  if (sys_errno != 0) {
    out += " (errno ";
    out += std::to_string(sys_errno);
    out += ")";
  }
  return out;
}

void throw_exception_from_error(Error const& e, boost::source_location const&) {
  // Calling value() on an error Result is a bug in custos, not an input problem.
  (void)e;
  std::abort();
}

}  // namespace custos
