// The authority model of the execution gateway (docs/authority.md) and the pure cross-check
// that compares what an exec.start request claims with the authority that is current.
//
// Everything here is plain data and pure functions: no clock (the caller passes `now_ns`), no
// database, no I/O. The store (store.hpp) loads an AuthoritySnapshot inside the transaction
// that consumes the claim, and calls cross_check() on it there, so what was checked is what is
// consumed.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/sandbox/plan.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::gateway {

// ------------------------------------------------------------------------------ principals

// Ordered by power: every check "at least runner" is a comparison.
enum class Role : std::uint8_t { observer = 1, runner = 2, admin = 3 };
[[nodiscard]] std::string_view role_wire(Role r) noexcept;
[[nodiscard]] std::optional<Role> role_from_wire(std::string_view w) noexcept;

// A kernel identity: a uid, or a gid the caller belongs to (primary or supplementary).
enum class PrincipalKind : std::uint8_t { uid = 1, gid = 2 };

struct Principal {
  PrincipalKind kind = PrincipalKind::uid;
  std::uint32_t id = 0;

  // "uid:1000" / "gid:27": the stored and wire spelling.
  [[nodiscard]] std::string to_string() const;
  [[nodiscard]] static Result<Principal> parse(std::string_view text);
  friend bool operator==(Principal const&, Principal const&) = default;
  friend auto operator<=>(Principal const&, Principal const&) = default;
};

// Who is calling, as the kernel reported it on the socket. Never taken from a message.
struct Caller {
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::vector<std::uint32_t> groups;  // supplementary
  // Decided by the daemon from its configuration (root, the daemon's uid, the admin group):
  // admins manage authority and may start native executions as themselves without a grant.
  bool admin = false;

  // True when `p` names this caller: its uid, or its primary or a supplementary gid.
  [[nodiscard]] bool is(Principal const& p) const noexcept;
};

// ------------------------------------------------------------------------------ grants

enum class OperationClass : std::uint8_t {
  exec_native = 1,
  exec_reference,
  exec_docker,
  exec_podman
};
[[nodiscard]] std::string_view operation_wire(OperationClass c) noexcept;  // "exec.native" ...
[[nodiscard]] std::optional<OperationClass> operation_from_wire(std::string_view w) noexcept;
[[nodiscard]] OperationClass operation_of(core::BackendKind k) noexcept;

// An allowed executable: an exact absolute path, or (prefix=true) a directory whose descendants
// are allowed. A prefix matches whole path components only: "/usr/bin" allows "/usr/bin/make"
// and "/usr/bin/x/y" but never "/usr/binaries/evil".
struct ExecutableRule {
  std::string path;
  bool prefix = false;

  [[nodiscard]] bool allows(std::string_view executable) const noexcept;
  friend bool operator==(ExecutableRule const&, ExecutableRule const&) = default;
};

// A container the grant may exec into: an engine, the container's name or id exactly as the plan
// names it, and the engine socket the plan names (none: the daemon's configured socket only).
struct ContainerRule {
  core::BackendKind engine = core::BackendKind::docker;
  std::string name;
  std::optional<std::string> socket;

  [[nodiscard]] bool allows(core::Backend const& backend) const noexcept;
  friend bool operator==(ContainerRule const&, ContainerRule const&) = default;
};

// A workspace the grant covers: the identity's workspace_id bound to the plan's root path, and
// the most access an execution may ask for on it.
struct WorkspaceRule {
  std::string workspace_id;
  std::string root;
  core::WorkspaceAccess max_access = core::WorkspaceAccess::read_only;
  friend bool operator==(WorkspaceRule const&, WorkspaceRule const&) = default;
};

// Totals a grant may spend over its lifetime. Empty = unlimited in that dimension.
struct Budget {
  std::optional<std::uint64_t> executions;
  std::optional<std::uint64_t> cpu_ms;
  std::optional<std::uint64_t> wall_ms;
  friend bool operator==(Budget const&, Budget const&) = default;
};

// What a grant has spent: `used` is settled (actual usage of terminal executions); `reserved`
// is held by executions still running (their plan limits, settled to the actual at terminal).
struct BudgetUse {
  std::uint64_t executions = 0;
  std::uint64_t cpu_ms_used = 0;
  std::uint64_t wall_ms_used = 0;
  std::uint64_t cpu_ms_reserved = 0;
  std::uint64_t wall_ms_reserved = 0;
  friend bool operator==(BudgetUse const&, BudgetUse const&) = default;
};

struct Grant {
  std::string id;              // [A-Za-z0-9_.-]{1,64}
  std::uint64_t revision = 1;  // bumped by every mutation, in the same transaction
  Principal principal;
  Role role = Role::runner;  // runner or observer (admins are configured, not granted)
  std::vector<OperationClass> operations;
  std::vector<ExecutableRule> executables;
  std::vector<WorkspaceRule> workspaces;
  // exec.docker / exec.podman: the containers it may run in (none: no container at all).
  std::vector<ContainerRule> containers;
  std::vector<std::string> environment_ids;
  std::vector<std::string> resource_ids;
  // Names the caller may inherit from its own environment. Inheriting is not setting.
  std::vector<std::string> inherit_env;
  // Whether literal NAME=VALUE entries are allowed at all (any name).
  bool literal_env = false;
  // Other uids the execution may run as (the caller's own uid/gid needs nothing).
  std::vector<std::uint32_t> run_as_uids;
  // Ceilings for every plan limit. Empty member = no ceiling in that dimension. A finite
  // ceiling refuses a plan whose limit is unlimited.
  core::Limits ceilings{std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                        std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  Budget budget;
  // The sandbox contract (API.md: the same shape as a plan's requirements): the most a plan
  // under this grant may require, and with it, that every plan under it is sandboxed (a plan
  // without a sandbox is sandbox.required). Empty: no contract, unsandboxed plans allowed.
  std::optional<sandbox::SandboxRequirements> sandbox;
  std::optional<std::int64_t> expires_ns;  // CLOCK_REALTIME; empty = no expiry
  bool revoked = false;
  std::int64_t created_ns = 0;

  friend bool operator==(Grant const&, Grant const&) = default;
};

// Grant JSON (authority.grant params / authority.list entries). Strict: unknown keys, wrong
// types and invalid values are plan.* errors with diagnostics (pointers below `base`).
// `id` is optional on input (the store picks one when absent); `revision`, `revoked`,
// `created_ns` are output-only and refused on input (the store assigns them).
[[nodiscard]] Result<Grant> grant_from_json(boost::json::value const& v);
[[nodiscard]] boost::json::object grant_to_json(Grant const& g, BudgetUse const& use);
[[nodiscard]] bool is_valid_grant_id(std::string_view id) noexcept;

// ------------------------------------------------------------------------------ leases

struct Lease {
  std::string id;
  std::string workspace_id;
  std::string holder_session;
  std::uint64_t epoch = 0;  // the workspace's lease epoch when acquired (monotonic per workspace)
  bool active = true;
  Principal holder;  // who acquired it
  std::int64_t acquired_ns = 0;
  friend bool operator==(Lease const&, Lease const&) = default;
};
[[nodiscard]] boost::json::object lease_to_json(Lease const& l);

// ------------------------------------------------------------------------------ the request

// The `authority` object of exec.start (docs/api.md):
//   {"epoch": 12, "grant_id": "g7", "lease_id": null,
//    "grant_revision"?: 3, "lease_epoch"?: 5, "plan_digest"?: "sha256:..."}
// grant_id null = the admin's implicit self-authority (docs/authority.md).
struct AuthorityClaim {
  std::uint64_t epoch = 0;
  std::optional<std::string> grant_id;
  std::optional<std::uint64_t> grant_revision;
  std::optional<std::string> lease_id;
  std::optional<std::uint64_t> lease_epoch;
  std::optional<std::string> plan_digest;
};
// Strict parse of the authority object; absent/null -> all defaults (implicit authority).
[[nodiscard]] Result<AuthorityClaim> authority_from_json(boost::json::value const* v);

// The current authority as loaded inside the consuming transaction.
struct AuthoritySnapshot {
  std::uint64_t epoch = 0;     // the authority epoch
  std::optional<Grant> grant;  // the named grant (empty: not found / none named)
  BudgetUse budget_use;        // of that grant
  std::optional<Lease> lease;  // the named lease (empty: not found / none named)
  // The active writable lease on the identity's workspace, if any (whoever holds it).
  std::optional<Lease> workspace_lease;
};

struct CheckInput {
  Caller caller;
  core::ExecutionIdentity const* identity = nullptr;
  core::ExecutionPlan const* plan = nullptr;
  std::string plan_digest;  // computed by the gateway from identity + plan
  AuthorityClaim const* claim = nullptr;
  AuthoritySnapshot const* current = nullptr;
  std::int64_t now_ns = 0;
  // The plan's compiled sandbox (null: the plan has none): what the plan's sandbox_digest names.
  sandbox::PlanSandbox const* sandbox = nullptr;
  // Whether the secret store holds a ref; empty: no store (every ref is unknown).
  std::function<bool(std::string_view)> secret_exists;
};

// What a successful cross-check commits to: the budget reservation and the lease use.
struct CheckOutcome {
  bool implicit_admin = false;  // no grant: the admin's self-authority
  std::uint64_t cpu_ms_reserve = 0;
  std::uint64_t wall_ms_reserve = 0;
  std::optional<std::string> lease_id;  // the lease used (writable access)
};

// Compares the claim with the current authority, in a fixed order (docs/authority.md "Order of
// the checks"). The first mismatch is returned as its exact code, with the field in context:
//   auth.denied (role), auth.stale_epoch, auth.unknown_grant (none / revoked / other principal),
//   auth.stale_revision, auth.expired, auth.digest_mismatch, auth.operation_class,
//   auth.executable, auth.workspace, auth.environment, auth.resource, auth.env_inherit,
//   auth.env_literal, auth.user, auth.limit_ceiling, then the sandbox (check_sandbox below:
//   sandbox.invalid, sandbox.required, sandbox.undeclared, sandbox.secret_unknown,
//   auth.digest_mismatch), auth.budget_exhausted, auth.lease_required, auth.lease_stale,
//   auth.lease_surplus. The admin's implicit authority (no grant) checks the sandbox without a
//   contract.
[[nodiscard]] Result<CheckOutcome> cross_check(CheckInput const& in);

// The sandbox against the authority: sandbox::compile of the plan's requirements with the
// grant's contract (`grant` null: none), the caller and the secret store, and then the cross
// check that what it compiles to is exactly what the plan's sandbox_digest names
// (auth.digest_mismatch otherwise: the plan's bytes would not bind what is enforced).
[[nodiscard]] Result<void> check_sandbox(CheckInput const& in, Grant const* grant);

}  // namespace custos::gateway
