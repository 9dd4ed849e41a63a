// Durable authority: principals, grants, budgets, leases and the authority epoch, stored in the
// registry's SQLite database (docs/authority.md "Storage"), and the one transaction that turns
// a checked request into consumed authority.
//
// The store never opens a connection of its own to the registry's file: every statement runs
// through a `Database`, whose registry implementation queues the work on the registry's single
// connection (group commit, BEGIN IMMEDIATE). The authority checks and writes, the claim
// consumption and the execution record of one exec.start share ONE transaction (FULL, or the
// registry's group durability awaited before anything acts on it). Every statement comes from
// the connection's prepared-statement cache: no SQL is parsed per start.
//
// Thread safety: as the Database it is built on. Not on any event loop; blocking.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/gateway/authority.hpp"
#include "custos/registry/registry.hpp"
#include "custos/registry/sqlite.hpp"

namespace custos::gateway {

// Where the gateway's transactions run.
class Database {
 public:
  virtual ~Database() = default;
  // One BEGIN IMMEDIATE transaction committed with synchronous=FULL; `fn` failing rolls back
  // everything it did.
  [[nodiscard]] virtual Result<void> write(std::function<Result<void>(registry::sql::Db&)> fn) = 0;
  // The same with synchronous=NORMAL: only for a write a crash may lose because startup redoes
  // it from durable state (budget settlement: ExecutionGateway::settle_recovered re-settles
  // every unsettled use whose terminal record is durable).
  [[nodiscard]] virtual Result<void> write_normal(
      std::function<Result<void>(registry::sql::Db&)> fn) = 0;
  // Reads under the connection's lock (no transaction of its own beyond SQLite's implicit one).
  [[nodiscard]] virtual Result<void> read(std::function<Result<void>(registry::sql::Db&)> fn) = 0;
  // `also`, then the registry's one-use claim of (action_id, process_id) for execution_id, in
  // ONE transaction committed with `d` (full; or group, made durable by await_durable()).
  // Either both are committed or neither.
  // Errors: whatever `also` returns; registry.claim_consumed when the pair was ever consumed.
  [[nodiscard]] virtual Result<void> consume_claim_with(
      std::string_view action_id, std::string_view process_id, std::string_view execution_id,
      std::function<Result<void>(registry::sql::Db&)> also, registry::Durability d) = 0;
  // `also`, then the claim of ex's (action, process) for ex.execution_id, then ex's execution
  // record (phase authorized), in ONE transaction committed with `d`: all three or nothing.
  // Errors: whatever `also` returns; as Registry::record_authorized.
  [[nodiscard]] virtual Result<void> consume_claim_and_record(
      registry::NewExecution const& ex, std::function<Result<void>(registry::sql::Db&)> also,
      registry::Durability d) = 0;
  // Returns once every Durability::group commit made before the call is on stable storage.
  [[nodiscard]] virtual Result<void> await_durable() = 0;
  // Returns once the group commit that consumed execution_id's claim is on stable storage (as
  // await_durable() when the database noted none for it).
  [[nodiscard]] virtual Result<void> await_durable(std::string_view execution_id) = 0;
  // Queues `fn` (which must own what it uses) to run in the transaction of the database's next
  // immediate write, ahead of it (or at its next flush). Its refusal is kept for `execution_id`
  // (Registry::take_deferred_error), not returned here.
  virtual void write_deferred(std::string execution_id, char const* what,
                              std::function<Result<void>(registry::sql::Db&)> fn) = 0;
};

// The Database of the daemon (and of the tests): the registry's own connection, through its
// hooks (Registry::transact / read / consume_claim_with). The tables are the registry's schema
// v4 (src/registry/schema.cpp), so a fresh registry and a migrated one hold them alike.
class RegistryDatabase final : public Database {
 public:
  explicit RegistryDatabase(registry::Registry& reg) noexcept : reg_(&reg) {}
  [[nodiscard]] Result<void> write(std::function<Result<void>(registry::sql::Db&)> fn) override;
  [[nodiscard]] Result<void> write_normal(
      std::function<Result<void>(registry::sql::Db&)> fn) override;
  [[nodiscard]] Result<void> read(std::function<Result<void>(registry::sql::Db&)> fn) override;
  [[nodiscard]] Result<void> consume_claim_with(
      std::string_view action_id, std::string_view process_id, std::string_view execution_id,
      std::function<Result<void>(registry::sql::Db&)> also, registry::Durability d) override;
  [[nodiscard]] Result<void> consume_claim_and_record(
      registry::NewExecution const& ex, std::function<Result<void>(registry::sql::Db&)> also,
      registry::Durability d) override;
  [[nodiscard]] Result<void> await_durable() override;
  [[nodiscard]] Result<void> await_durable(std::string_view execution_id) override;
  void write_deferred(std::string execution_id, char const* what,
                      std::function<Result<void>(registry::sql::Db&)> fn) override;

 private:
  registry::Registry* reg_;
};

// What the authorizing transaction records about one execution (table authority_uses): which
// grant and lease it depends on (fences), its holder (quiescence) and its budget reservation.
struct AuthorityUse {
  std::string execution_id;
  std::string action_id;
  std::string process_id;
  std::string session_id;
  std::uint64_t generation = 0;
  std::string actor;                    // the caller, "uid:N"
  std::optional<std::string> grant_id;  // empty: the admin's implicit authority
  std::optional<std::string> lease_id;
  std::uint64_t cpu_ms_reserved = 0;
  std::uint64_t wall_ms_reserved = 0;
  bool settled = false;
  std::optional<std::int64_t> expires_ns;  // the grant's expiry at authorization
  std::int64_t authorized_ns = 0;
};

// The inputs of one authorization (ExecutionGateway::start builds it).
struct AuthorizeRequest {
  Caller caller;
  core::ExecutionIdentity const* identity = nullptr;
  core::ExecutionPlan const* plan = nullptr;
  std::string plan_digest;
  AuthorityClaim claim;
  std::string execution_id;
  std::int64_t now_ns = 0;
  // The plan's compiled sandbox (null: unsandboxed) and the secret store's answer (empty: no
  // store), for the sandbox's cross-check (check_sandbox).
  sandbox::PlanSandbox const* sandbox = nullptr;
  std::function<bool(std::string_view)> secret_exists;
  // The execution record to create in the authorizing transaction, after the claim (its
  // execution id, action and process must be the request's). Null: the claim and the authority
  // writes only (the record is then someone else's to create).
  registry::NewExecution const* record = nullptr;
  // How the authorizing transaction commits. `group`: the caller must await_durable() before it
  // acts on the authorization (lets the process run) or reports any outcome of it.
  registry::Durability durability = registry::Durability::full;
};

class AuthorityStore {
 public:
  // `db` must outlive the store.
  explicit AuthorityStore(Database& db) noexcept : db_(&db) {}

  [[nodiscard]] Result<std::uint64_t> epoch();

  // ---- principals: configured admins (in addition to root and the daemon's uid) ----------
  [[nodiscard]] Result<void> set_admin(Principal const& p, bool admin);
  [[nodiscard]] Result<bool> is_admin(Caller const& c);

  // ---- grants -----------------------------------------------------------------------------
  // Stores a new grant at revision 1 (id picked when empty) with a zero budget use, and bumps
  // the authority epoch. Errors: plan.invalid_id (the id exists, revoked or not: ids are never
  // reused, so a stale claim can never match a new grant).
  [[nodiscard]] Result<Grant> add_grant(Grant g, std::int64_t now_ns);
  // Marks the grant revoked, bumps its revision and the epoch. Errors: auth.unknown_grant
  // (absent or already revoked).
  [[nodiscard]] Result<Grant> revoke_grant(std::string_view grant_id);
  [[nodiscard]] Result<std::optional<std::pair<Grant, BudgetUse>>> get_grant(
      std::string_view grant_id);
  // Every grant (revoked ones too) with its budget use, ordered by id; `principal` filters.
  [[nodiscard]] Result<std::vector<std::pair<Grant, BudgetUse>>> list_grants(
      std::optional<Principal> const& principal = std::nullopt);

  // ---- leases -----------------------------------------------------------------------------
  // A new active writable lease on the workspace for `holder_session`, at the workspace's next
  // lease epoch; bumps the authority epoch. Errors: lease.conflict (an active lease exists; the
  // context names its id and session).
  [[nodiscard]] Result<Lease> acquire_lease(std::string_view workspace_id,
                                            std::string_view holder_session,
                                            Principal const& holder, std::int64_t now_ns);
  // Ends the lease (release by its holder, or break by an admin: the caller decides who may),
  // bumps the workspace's lease epoch and the authority epoch. Errors: lease.not_found (absent
  // or no longer active).
  [[nodiscard]] Result<Lease> end_lease(std::string_view lease_id);
  [[nodiscard]] Result<std::optional<Lease>> get_lease(std::string_view lease_id);
  [[nodiscard]] Result<std::vector<Lease>> list_leases(bool active_only);

  // ---- the authorizing transaction --------------------------------------------------------
  // In ONE transaction: refuse a replayed (action, process) pair (auth.replay), load the
  // current authority, cross_check() it, then begin the budget (one execution + the plan's
  // cpu/wall reserved), use the lease, record the AuthorityUse, consume the claim and, when
  // req.record is set, create the execution record. Any error leaves the database exactly as
  // it was (no claim, no record, no budget change).
  [[nodiscard]] Result<AuthorityUse> authorize(AuthorizeRequest const& req);
  // authorize()'s checks (replay, the current authority, cross_check) without any write: for a
  // start that must ask someone outside the daemon before its claim (an engine's preflight), so
  // a caller the authority refuses learns nothing from that party. authorize() checks again.
  [[nodiscard]] Result<void> precheck(AuthorizeRequest const& req);
  // Settles the budget of a terminal execution: its reservation is replaced by what the
  // terminal record observed (cpu_ms; wall_ms). Idempotent (a settled use is left alone).
  [[nodiscard]] Result<void> settle(std::string_view execution_id, core::TerminalRecord const& t);
  // The same settlement queued as a deferred write (Database::write_deferred): it commits in
  // the transaction of the database's next immediate write, ahead of it — the terminal record
  // the caller writes next. A refusal is kept for `execution_id` (take_deferred_error).
  void queue_settle(std::string const& execution_id, core::TerminalRecord const& t);
  // Database::await_durable.
  [[nodiscard]] Result<void> await_durable() { return db_->await_durable(); }
  [[nodiscard]] Result<void> await_durable(std::string_view execution_id) {
    return db_->await_durable(execution_id);
  }

  // ---- reads for fences and quiescence ----------------------------------------------------
  [[nodiscard]] Result<std::optional<AuthorityUse>> get_use(std::string_view execution_id);
  [[nodiscard]] Result<std::vector<AuthorityUse>> unsettled_uses();
  [[nodiscard]] Result<std::vector<AuthorityUse>> uses_of_grant(std::string_view grant_id,
                                                                bool unsettled_only);
  [[nodiscard]] Result<std::vector<AuthorityUse>> uses_of_lease(std::string_view lease_id,
                                                                bool unsettled_only);
  [[nodiscard]] Result<std::vector<AuthorityUse>> uses_of_holder(std::string_view session_id,
                                                                 std::uint64_t generation);
  // Every execution started by `actor` ("uid:N"), for a non-admin's own listing.
  [[nodiscard]] Result<std::vector<AuthorityUse>> uses_of_actor(std::string_view actor);

 private:
  Database* db_;
};

}  // namespace custos::gateway
