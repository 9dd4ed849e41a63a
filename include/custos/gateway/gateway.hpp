// ExecutionGateway: the only door to a process effect (docs/architecture.md, "The life of an
// execution", step 5). Every exec.start goes validate -> cross-check -> one durable transaction
// (claim + budget + lease) -> launch permit -> supervisor launch; every revocation, lease
// release/break and grant expiry fences the executions that depend on it. docs/authority.md and
// docs/contracts.md state the rules.
//
// How the permit reaches the launch: start_async() validates the plan, asks the manager whether it
// would attempt the launch (ExecutionManager::admit), runs the cross-check and the authorizing
// transaction for a fresh execution id, and only then mints the one-use supervisor::LaunchPermit
// (its private constructor is open to gateway::PermitMinter, defined in gateway.cpp only) and
// passes it by value to ExecutionManager::start_async, which refuses any permit not minted for
// exactly that request. The authorizing transaction also creates the execution's registry record
// (after the claim, in the same BEGIN IMMEDIATE: claim, authority and record are durable together
// or not at all) and commits with the registry's group durability, whose fsync the sink's
// when_durable awaits before the barrier release. The gateway is also the manager's
// OwnershipSink (sink() below): its record_authorized_async writes nothing, it only accepts the
// execution id it just authorized with the digest it authorized and refuses every other one,
// so a permit minted elsewhere (tests) still launches nothing in a daemon wired to the gateway.
// At the terminal record the budget settlement is queued ahead of it and commits in its
// transaction.
//
// Threading: everything runs on the daemon's single event-loop thread (like the manager).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/gateway/authority.hpp"
#include "custos/gateway/store.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/ownership_sink.hpp"

namespace custos::registry {
class Registry;
}

namespace custos::gateway {

struct GatewayOptions {
  // The registry the execution records live in (created by the authorizing transaction;
  // quiescence scans). The same registry as the AuthorityStore's database (its
  // RegistryDatabase). May be null in tests: records then exist only in memory.
  registry::Registry* registry = nullptr;
  // Receives every OwnershipSink call after record_authorized (the registry's RegistrySink over
  // the same registry in the daemon: its terminal record commits the queued budget
  // settlement). Null: nothing durable beyond the authority tables.
  supervisor::OwnershipSink* inner = nullptr;
  // Whether the secret store holds a ref (docs/sandbox.md: sandbox.secret_unknown). Called on
  // the loop (exec.check) and on the authorizer thread (inside the authorizing transaction), so
  // it must be safe on both. Empty: this daemon has no secret store, so every ref is unknown.
  std::function<bool(std::string_view ref)> secret_exists = {};
};

// What exec.check answers through the gateway: the dry run of exec.start's refusals up to the
// claim, as data where they are not errors.
struct CheckAnswer {
  std::string plan_digest;
  std::optional<core::Digest> sandbox_digest;
  sandbox::PlanSandbox const* sandbox = nullptr;  // the request's (for its checked plan)
  backend::Admission admission;
};

struct FenceReport {
  std::vector<std::string> fenced;  // executions cancelled with trigger lease_fence, stdin closed
};

struct RevokeResult {
  Grant grant;
  FenceReport fence;
};

struct LeaseEndResult {
  Lease lease;
  FenceReport fence;
};

struct QuiescenceBlock {
  std::string execution_id;
  // live, unresolved (not terminal in the registry and not supervised here), cleanup_unconfirmed,
  // record_error (a durable write of the execution failed), orphan_claim, quarantined
  std::string reason;
};

struct QuiescenceResult {
  bool quiescent = false;
  std::vector<QuiescenceBlock> blocking;
  // Present when quiescent: what was scanned, and a digest binding it.
  std::optional<boost::json::object> evidence;
  [[nodiscard]] boost::json::object to_json() const;
};

class ExecutionGateway {
 public:
  ExecutionGateway(boost::asio::io_context& io, AuthorityStore& store, GatewayOptions options);
  ~ExecutionGateway();
  ExecutionGateway(ExecutionGateway const&) = delete;
  ExecutionGateway& operator=(ExecutionGateway const&) = delete;

  // Set this as ManagerConfig::sink, then attach() the manager. Must outlive the manager's use.
  [[nodiscard]] supervisor::OwnershipSink& sink() noexcept;
  void attach(supervisor::ExecutionManager& manager) noexcept { manager_ = &manager; }

  // The caller as the gateway sees it: `configured_admin` (root, the daemon's uid, the admin
  // group) or an admin principal stored in the registry.
  [[nodiscard]] Result<Caller> resolve_caller(std::uint32_t uid, std::uint32_t gid,
                                              std::vector<std::uint32_t> groups,
                                              bool configured_admin);

  // exec.start, never holding the loop during the authorizing transaction: the checks run now,
  // the transaction on the gateway's authorizer thread (on the loop itself when the daemon is
  // idle), the launch back on the loop, and `done` gets the answer (before this returns when
  // refused at once; else as a handler of the loop). The request's caller credentials are
  // replaced by `caller`'s. Errors: every auth.* of cross_check(), auth.replay, the manager's
  // errors; a spawn failure after the authorizing transaction is NOT an error (the execution is
  // terminal, spawn_failed, and its authority stays consumed). An execution whose grant or
  // lease is revoked while its authorization is in flight is fenced as soon as it is launched,
  // before `done` runs.
  using StartDone = std::function<void(Result<supervisor::StartResult>)>;
  void start_async(Caller const& caller, supervisor::LaunchRequest request,
                   AuthorityClaim const& claim, StartDone done);
  // exec.check: what exec.start would decide before the claim, with no effect and no
  // consumption. The plan is validated and digested; the sandbox compiled against the caller,
  // the secret store and — when the claim names a grant — that grant's contract (read, not
  // consumed; a grant that does not exist, is revoked or is not the caller's is
  // auth.unknown_grant, so nobody learns of another principal's grants); then the admission,
  // answered as data (admitted, every missing control). No other authority is checked (the
  // claim's epoch, revision, budget and lease are exec.start's).
  [[nodiscard]] Result<CheckAnswer> check(Caller const& caller,
                                          supervisor::LaunchRequest const& request,
                                          AuthorityClaim const& claim);
  // Shutdown: refuses new starts (daemon.shutting_down) and calls `done` once no start is in
  // flight any more (at once when none is), so the manager's shutdown sees every execution
  // that was authorized, launched — or once `bound` has passed.
  void drain(std::chrono::milliseconds bound, std::function<void()> done);
  // Starts submitted by start_async and not answered yet (authorizing or launching).
  [[nodiscard]] std::size_t inflight() const noexcept { return inflight_.size(); }

  // exec.input through the fence: once an execution is fenced, nothing more is admitted
  // (exec.input_closed), whatever the manager would still accept.
  [[nodiscard]] Result<std::uint64_t> input(std::string const& execution_id,
                                            std::span<std::uint8_t const> data, bool eof);
  [[nodiscard]] bool fenced(std::string const& execution_id) const;
  // Admins, or the uid that started the execution through the gateway (its actor).
  [[nodiscard]] Result<bool> may_access(Caller const& caller, std::string const& execution_id);
  // The executions `caller` started through the gateway (actor = its uid): what a non-admin
  // sees in exec.list.
  [[nodiscard]] Result<std::set<std::string>> executions_of(Caller const& caller);
  // What the rpc layer lists from (null before attach() / without a registry).
  [[nodiscard]] supervisor::ExecutionManager* manager() noexcept { return manager_; }
  [[nodiscard]] registry::Registry* registry() noexcept { return options_.registry; }

  // ---- authority.* (admin only: auth.denied otherwise) ------------------------------------
  [[nodiscard]] Result<Grant> grant(Caller const& caller, Grant g);
  [[nodiscard]] Result<RevokeResult> revoke(Caller const& caller, std::string const& grant_id);
  // Admins see every grant; others their own (uid or one of their groups).
  [[nodiscard]] Result<std::vector<std::pair<Grant, BudgetUse>>> list(Caller const& caller);
  [[nodiscard]] Result<std::uint64_t> epoch();

  // ---- lease.* ---------------------------------------------------------------------------
  // Admins, or a caller holding a live grant that allows the workspace writable.
  [[nodiscard]] Result<Lease> acquire_lease(Caller const& caller, std::string const& workspace_id,
                                            std::string const& holder_session);
  // Release by the holder (same uid) or, `force` = break, by an admin. Fences dependents.
  [[nodiscard]] Result<LeaseEndResult> release_lease(Caller const& caller,
                                                     std::string const& lease_id, bool force);
  [[nodiscard]] Result<std::vector<Lease>> list_leases(bool active_only);

  // ---- holder.quiescence -----------------------------------------------------------------
  // Admins, or a caller asking about its own executions (actor = its uid).
  [[nodiscard]] Result<QuiescenceResult> quiescence(Caller const& caller,
                                                    std::string const& session_id,
                                                    std::uint64_t generation,
                                                    std::optional<std::string> const& actor);

  // After startup recovery (before any start): settles the budget of every authorized execution
  // the registry now holds terminal but whose budget a previous daemon never settled (it died
  // first). Executions still without a terminal record keep their reservation: their budget is
  // not released on a guess. Returns how many were settled.
  [[nodiscard]] Result<std::size_t> settle_recovered();
  // After startup recovery: an execution the manager adopted (supervisor::adopt_recovered)
  // depends on the authority it was launched under, as a launched one does — fenced when its
  // grant is revoked or expires or its lease ends, and at once when that happened while no
  // daemon ran. Its budget is settled at its terminal record like any other's. Nothing for an
  // execution the gateway never authorized. Errors: the store's reads.
  [[nodiscard]] Result<void> adopted(std::string const& execution_id);

  [[nodiscard]] AuthorityStore& store() noexcept { return *store_; }

 private:
  class Sink;
  friend class Sink;

  // The launch in flight between the authorizing transaction and the manager's record call:
  // what was authorized, compared with what the manager launches (on_record_authorized).
  struct Armed {
    AuthorityUse use;
    std::string plan_digest;
    std::optional<core::Digest> sandbox_digest;
    std::uint64_t generation = 0;
    std::uint64_t revision = 0;
    core::BackendKind backend = core::BackendKind::native;
    bool recorded = false;  // record_authorized ran for it (once)
  };

  struct Dependent {
    std::optional<std::string> grant_id;
    std::optional<std::string> lease_id;
    std::unique_ptr<boost::asio::steady_timer> expiry;
  };

  struct Pending;
  Result<std::unique_ptr<Pending>> prepare(Caller const& caller, supervisor::LaunchRequest request,
                                           AuthorityClaim const& claim);
  // The authorizing transaction of a start_async (on the authorizer thread, or on the loop when
  // the daemon is idle); its outcome in `pending.use`.
  void authorize(Pending& pending) noexcept;
  // After the backend's preflight: the authorizing transaction (on the loop or the authorizer
  // thread), then the launch.
  // The backend's preflight (after the read-only authority check), then as above.
  void preflight_then_launch(std::shared_ptr<Pending> pending, StartDone done);
  void authorize_and_launch(std::shared_ptr<Pending> pending, StartDone done);
  // start_async on the loop, once the authorizing transaction ended: the manager's launch.
  void launch_async(std::shared_ptr<Pending> const& p, StartDone done);
  // The end of an async start: its fence if it was revoked in flight, its answer, the drain.
  void answer_async(std::string const& id, Result<supervisor::StartResult> r, StartDone& done);
  // After the manager's launch of an authorized execution: the durability wait and the
  // dependents' bookkeeping (the common end of start and start_async).
  Result<supervisor::StartResult> after_launch(AuthorityUse const& use, bool recorded,
                                               Result<supervisor::StartResult> r);
  void remember_fenced(std::string const& execution_id);
  void end_drain();

  Result<void> on_record_authorized(std::string const& execution_id,
                                    core::ExecutionIdentity const& identity,
                                    core::ExecutionPlan const& plan,
                                    std::string const& plan_digest);
  void on_terminal(std::string const& execution_id, core::TerminalRecord const& record);
  FenceReport fence_all(std::vector<AuthorityUse> const& uses, std::string const& reason);
  void fence(std::string const& execution_id, std::string const& reason);
  void arm_expiry(std::string const& execution_id, std::int64_t expires_ns);

  boost::asio::io_context& io_;
  AuthorityStore* store_;
  GatewayOptions options_;
  supervisor::ExecutionManager* manager_ = nullptr;
  std::unique_ptr<Sink> sink_;
  std::optional<Armed> armed_;
  std::map<std::string, Dependent> live_;
  // Fenced executions stay fenced after they end (exec.input keeps answering input_closed),
  // bounded: the oldest are forgotten beyond kFencedHistory (the manager refuses input to an
  // execution it no longer knows anyway).
  static constexpr std::size_t kFencedHistory = 4096;
  std::set<std::string> fenced_;
  std::deque<std::string> fenced_order_;
  // start_async: starts in flight, authorizing or launching (a fence reason once revoked
  // meanwhile), the drain
  // state, and the thread the authorizing transactions run on (joined first at destruction).
  struct Inflight {
    std::string session_id;  // the holder: holder.quiescence counts the start
    std::uint64_t generation = 0;
    std::string actor;
    std::optional<std::string> fence_reason;  // revoked meanwhile
  };
  std::map<std::string, Inflight> inflight_;
  bool draining_ = false;
  std::function<void()> drained_;
  boost::asio::steady_timer drain_timer_{io_};
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  bool const slow_authorizer_;  // failpoint authorizer_slow (failpoint builds only)
  boost::asio::thread_pool authorizer_{1};
};

}  // namespace custos::gateway
