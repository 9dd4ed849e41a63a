// ExecutionGateway: start through the authorizing transaction, fences, expiry, quiescence.
#include "custos/gateway/gateway.hpp"

#include <boost/asio/post.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unistd.h>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"

#include "clock.hpp"

namespace custos::gateway {

namespace json = boost::json;

namespace {

Error not_admin(char const* what) {
  return Error{Errc::auth_denied, std::string{what} + " is for admins only"};
}

bool grant_live(Grant const& g, std::int64_t now_ns) {
  return !g.revoked && (!g.expires_ns || *g.expires_ns > now_ns);
}

// The kernel's limit on run_as: only a privileged daemon can give a child credentials other
// than its own (setresuid/setresgid/setgroups need CAP_SETUID/CAP_SETGID). A daemon running
// as an ordinary user therefore refuses, typed and before any consumption, a plan.user that is
// not exactly its own identity, instead of consuming the claim for a certain spawn failure.
Result<void> check_switchable_user(core::ExecutionPlan const& plan) {
  if (!plan.user || ::geteuid() == 0) return ok();
  if (plan.user->uid == ::geteuid() && plan.user->gid == ::getegid() && plan.user->groups.empty()) {
    return ok();
  }
  return Error{Errc::auth_user, "the daemon runs as uid " + std::to_string(::geteuid()) +
                                    " without privilege: it cannot run an execution as uid " +
                                    std::to_string(plan.user->uid)};
}

}  // namespace

// ------------------------------------------------------------------------------ the sink

// The manager's OwnershipSink: authorizes in record_authorized, forwards everything else to
// the inner sink, settles the budget at the terminal record.
class ExecutionGateway::Sink final : public supervisor::OwnershipSink {
 public:
  explicit Sink(ExecutionGateway& g) noexcept : g_(&g) {}

  void record_authorized_async(std::string const& execution_id,
                               core::ExecutionIdentity const& identity,
                               core::ExecutionPlan const& plan, std::string const& plan_digest,
                               std::function<void(Result<>)> done) override {
    done(g_->on_record_authorized(execution_id, identity, plan, plan_digest));
  }
  void record_staged_async(std::string const& execution_id, sys::PidfsIdentity const& identity,
                           supervisor::StagedBoundary const& boundary,
                           std::function<void(Result<>)> done) override {
    if (inner() == nullptr) return done(ok());
    inner()->record_staged_async(execution_id, identity, boundary, std::move(done));
  }
  void record_committed_async(std::string const& execution_id,
                              std::function<void(Result<>)> done) override {
    if (inner() == nullptr) return done(ok());
    inner()->record_committed_async(execution_id, std::move(done));
  }
  Result<> record_phase(std::string const& execution_id, core::Phase phase) override {
    if (inner() == nullptr) return ok();
    return inner()->record_phase(execution_id, phase);
  }
  Result<> record_trigger(std::string const& execution_id, core::Trigger trigger) override {
    if (inner() == nullptr) return ok();
    return inner()->record_trigger(execution_id, trigger);
  }
  Result<> record_output(std::string const& execution_id, supervisor::StreamId stream,
                         core::StreamAccounting const& accounting) override {
    if (inner() == nullptr) return ok();
    return inner()->record_output(execution_id, stream, accounting);
  }
  void when_durable(std::string const& execution_id, std::function<void(Result<>)> done) override {
    if (inner() == nullptr) {
      // No registry sink (a gateway over a store alone): the store's own commit is awaited.
      return done(g_->store_->await_durable(execution_id));
    }
    // The authorizing transaction (authority writes, claim, record) committed in the inner
    // sink's registry before this launch began, so the inner wait covers it. A second wait here
    // would wait for the group commits made since (other starts), not for this one.
    inner()->when_durable(execution_id, std::move(done));
  }
  void record_terminal_async(std::string const& execution_id, core::TerminalRecord const& record,
                             std::function<void(Result<>)> done) override {
    bool const with_terminal = queue_settlement(execution_id, record);
    if (inner() == nullptr) return done(after_terminal(execution_id, record, with_terminal, ok()));
    // The inner sink answers on the loop (or at once); the gateway outlives the manager's
    // supervisors and their completions.
    inner()->record_terminal_async(
        execution_id, record,
        [this, id = execution_id, record, with_terminal, done = std::move(done)](Result<> r) {
          done(after_terminal(id, record, with_terminal, std::move(r)));
        });
  }

 private:
  // With the registry's sink inside, the settlement is queued ahead of the terminal record
  // and commits in its transaction (one commit for both); the sink reports a refusal of it
  // as its own error (RegistrySink takes the execution's deferred errors). True when queued.
  bool queue_settlement(std::string const& execution_id, core::TerminalRecord const& record) {
    bool const with_terminal = inner() != nullptr && g_->options_.registry != nullptr;
    if (with_terminal) g_->store_->queue_settle(execution_id, record);
    return with_terminal;
  }
  // After the terminal write (its result `r`). Settled even when the record write failed: the
  // budget follows what happened to the process, not whether its record reached the disk.
  // settle() is idempotent, so after a failed terminal write it only does what the queued
  // settlement did not.
  Result<> after_terminal(std::string const& execution_id, core::TerminalRecord const& record,
                          bool with_terminal, Result<> r) {
    Result<> settled = ok();
    if (!with_terminal || !r) settled = g_->store_->settle(execution_id, record);
    g_->on_terminal(execution_id, record);
    if (!r) return r;
    return settled;
  }

  supervisor::OwnershipSink* inner() const noexcept { return g_->options_.inner; }
  ExecutionGateway* g_;
};

// ------------------------------------------------------------------------------ gateway

ExecutionGateway::ExecutionGateway(boost::asio::io_context& io, AuthorityStore& store,
                                   GatewayOptions options)
    : io_(io),
      store_(&store),
      options_(std::move(options)),
      sink_(std::make_unique<Sink>(*this)),
      slow_authorizer_(registry::failpoint_set("authorizer_slow")) {}

ExecutionGateway::~ExecutionGateway() {
  // No authorization outlives the gateway: the one running finishes (its completion, posted to
  // the loop, sees `alive_` gone), queued ones never start.
  *alive_ = false;
  authorizer_.stop();
  authorizer_.join();
}

supervisor::OwnershipSink& ExecutionGateway::sink() noexcept {
  return *sink_;
}

Result<Caller> ExecutionGateway::resolve_caller(std::uint32_t uid, std::uint32_t gid,
                                                std::vector<std::uint32_t> groups,
                                                bool configured_admin) {
  Caller c;
  c.uid = uid;
  c.gid = gid;
  c.groups = std::move(groups);
  c.admin = configured_admin || uid == 0;
  if (!c.admin) c.admin = CUSTOS_TRY(store_->is_admin(c));
  return c;
}

// The gateway's only way to a supervisor::LaunchPermit (its constructor is private, and this is
// the one friend defined under src/; scripts/lint checks that the test minter is not).
class PermitMinter {
 public:
  // Called only after the authorizing transaction for `use` committed. user_checked: the
  // cross-check compared plan.user with the caller's authority (runs as the caller, or a uid
  // of the grant's run_as_uids), so the manager does not apply its own narrower rule.
  [[nodiscard]] static supervisor::LaunchPermit mint(AuthorityUse const& use,
                                                     std::string plan_digest) {
    return supervisor::LaunchPermit{use.execution_id, use.action_id, use.process_id,
                                    std::move(plan_digest), true};
  }
};

// One exec.start between its checks and its launch: the request, the record the authorizing
// transaction creates from it, that transaction's request (pointing into both: a Pending is
// never moved once made) and its outcome.
struct ExecutionGateway::Pending {
  supervisor::LaunchRequest request;
  std::optional<registry::NewExecution> record;
  AuthorizeRequest req;
  Result<AuthorityUse> use{Error{Errc::internal, "not authorized yet"}};
  bool recorded = false;  // the manager's record_authorized ran for it (async launch)
};

Result<std::unique_ptr<ExecutionGateway::Pending>> ExecutionGateway::prepare(
    Caller const& caller, supervisor::LaunchRequest request, AuthorityClaim const& claim) {
  if (manager_ == nullptr) return Error{Errc::internal, "gateway has no execution manager"};
  std::string const execution_id = CUSTOS_TRY(supervisor::new_execution_id());
  auto p = std::make_unique<Pending>();
  p->request = std::move(request);
  // Validates the plan (the encoder re-runs every rule) before any authority is touched. The
  // same canonical bytes and digest become the execution record the authorizing transaction
  // creates (encoded and hashed once).
  p->record = CUSTOS_TRY(
      registry::make_new_execution(execution_id, p->request.identity, p->request.plan, {}));
  p->request.caller.uid = caller.uid;
  p->request.caller.gid = caller.gid;
  // Everything the manager would refuse before it creates anything is refused now, before the
  // claim is consumed: after the authorizing transaction, the launch is attempted.
  CUSTOS_TRYV(manager_->admit(p->request));
  CUSTOS_TRYV(check_switchable_user(p->request.plan));

  AuthorizeRequest& req = p->req;
  req.caller = caller;
  req.identity = &p->request.identity;
  req.plan = &p->request.plan;
  req.sandbox = p->request.sandbox.get();
  req.secret_exists = options_.secret_exists;
  req.plan_digest = p->record->plan_digest;
  req.claim = claim;
  req.execution_id = execution_id;
  req.now_ns = realtime_ns();
  // With a registry: the record is created in the authorizing transaction, after the claim,
  // and the transaction commits with group durability (its fsync is awaited by the sink's
  // when_durable before the barrier release, and by after_launch before any reply).
  if (options_.registry != nullptr) {
    req.record = &*p->record;
    req.durability = registry::Durability::group;
  }
  return p;
}

void ExecutionGateway::start_async(Caller const& caller, supervisor::LaunchRequest request,
                                   AuthorityClaim const& claim, StartDone done) {
  if (draining_) return done(Error{Errc::daemon_shutting_down, "the daemon is shutting down"});
  auto p = prepare(caller, std::move(request), claim);
  if (!p) return done(p.error());
  std::shared_ptr<Pending> pending = std::move(*p);
  // In flight from here: a quiescence check or a drain sees this start while its preflight runs.
  inflight_.emplace(
      pending->req.execution_id,
      Inflight{pending->request.identity.session_id, pending->request.identity.generation,
               Principal{PrincipalKind::uid, caller.uid}.to_string(), std::nullopt});
  // Native and reference starts ask no one before their claim: straight to the authorizing
  // transaction, as fast as before.
  if (!manager_->asks_before_claim(pending->request.plan)) {
    return authorize_and_launch(std::move(pending), std::move(done));
  }
  // A backend that must ask an outside party (an engine: the container exists, runs and can run
  // the gate) does so before the claim, so a refusal there consumes nothing — but only for a
  // caller the authority accepts (a read-only check on the authorizer thread), so nobody learns
  // from the engine what they may not use. The authorizing transaction checks again.
  boost::asio::post(authorizer_, [this, pending, done = std::move(done)]() mutable {
    Result<> checked = Error{Errc::internal, "not checked"};
    try {
      checked = store_->precheck(pending->req);
    } catch (std::exception const& ex) {
      checked = Error{Errc::internal, std::string{"authority check failed: "} + ex.what()};
    }
    boost::asio::post(io_, [this, alive = std::weak_ptr<bool>(alive_), pending,
                            checked = std::move(checked), done = std::move(done)]() mutable {
      if (alive.expired()) return;
      if (!checked) return answer_async(pending->req.execution_id, checked.error(), done);
      preflight_then_launch(std::move(pending), std::move(done));
    });
  });
}

void ExecutionGateway::preflight_then_launch(std::shared_ptr<Pending> pending, StartDone done) {
  auto const& plan = pending->request.plan;
  manager_->preflight(plan, [this, alive = std::weak_ptr<bool>(alive_), pending,
                             done = std::move(done)](Result<> const& r) mutable {
    if (alive.expired()) return;
    std::string const id = pending->req.execution_id;
    if (!r) return answer_async(id, r.error(), done);
    if (draining_) {
      return answer_async(id, Error{Errc::daemon_shutting_down, "the daemon is shutting down"},
                          done);
    }
    authorize_and_launch(std::move(pending), std::move(done));
  });
}

void ExecutionGateway::authorize_and_launch(std::shared_ptr<Pending> pending, StartDone done) {
  // An idle daemon (this is the only start in flight and nothing runs) has no one for the loop
  // to serve meanwhile: the loop makes the authorizing transaction itself, saving the two
  // cross-thread hand-offs. The registry is then free too (no
  // execution is writing), so the loop does not wait for another transaction.
  if (inflight_.size() == 1 && manager_->live_count() == 0 && !slow_authorizer_) {
    authorize(*pending);
    return launch_async(std::move(pending), std::move(done));
  }
  // Otherwise the authorizing transaction runs on the authorizer thread (the registry
  // serializes it with every other write); the loop serves everything else meanwhile. The
  // launch itself goes back to the loop.
  boost::asio::post(authorizer_, [this, pending, done = std::move(done)]() mutable {
    if (slow_authorizer_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    authorize(*pending);
    boost::asio::post(io_, [this, alive = std::weak_ptr<bool>(alive_), pending,
                            done = std::move(done)]() mutable {
      if (alive.expired()) return;  // the gateway is gone: nobody to launch for
      launch_async(std::move(pending), std::move(done));
    });
  });
}

void ExecutionGateway::authorize(Pending& pending) noexcept {
  try {
    // Checked against the authority as of now (an expiry counts from here, not from when
    // the request was queued).
    pending.req.now_ns = realtime_ns();
    pending.use = store_->authorize(pending.req);
  } catch (std::exception const& ex) {
    // Nothing may unwind the authorizer thread or the loop; the transaction rolled back with
    // the throw.
    pending.use = Error{Errc::internal, std::string{"authorization failed: "} + ex.what()};
  }
}

void ExecutionGateway::launch_async(std::shared_ptr<Pending> const& p, StartDone done) {
  std::string const id = p->req.execution_id;
  if (!p->use) return answer_async(id, p->use.error(), done);
  AuthorityUse const use = *p->use;
  auto const& launched = p->request;
  armed_ = Armed{use,
                 p->req.plan_digest,
                 launched.plan.sandbox_digest,
                 launched.identity.generation,
                 launched.identity.revision,
                 launched.plan.backend.kind,
                 false};
  auto answered = std::make_shared<bool>(false);
  try {
    manager_->start_async(
        std::move(p->request), PermitMinter::mint(use, p->req.plan_digest),
        [this, alive = std::weak_ptr<bool>(alive_), p, use, answered,
         done](Result<supervisor::StartResult> r) mutable {
          if (alive.expired() || *answered) return;
          *answered = true;
          // Answered at once (armed_ is still this launch's), or later (it was noted below).
          bool const recorded = armed_ && armed_->use.execution_id == use.execution_id
                                    ? armed_->recorded
                                    : p->recorded;
          Result<supervisor::StartResult> out = Error{Errc::internal, "launch failed"};
          try {
            out = after_launch(use, recorded, std::move(r));
          } catch (std::exception const& ex) {
            // A handler of the loop: nothing may unwind into io_context::run().
            out = Error{Errc::internal, std::string{"launch failed: "} + ex.what()};
          }
          answer_async(use.execution_id, std::move(out), done);
        });
  } catch (std::exception const& ex) {
    armed_.reset();
    if (*answered) return;  // the manager answered before it threw: that answer stands
    *answered = true;
    return answer_async(id, Error{Errc::internal, std::string{"launch failed: "} + ex.what()},
                        done);
  }
  if (armed_) p->recorded = armed_->recorded;
  armed_.reset();
}

void ExecutionGateway::answer_async(std::string const& id, Result<supervisor::StartResult> r,
                                    StartDone& done) {
  std::optional<std::string> fence_reason;
  if (auto it = inflight_.find(id); it != inflight_.end()) {
    fence_reason = std::move(it->second.fence_reason);
    inflight_.erase(it);
  }
  // Revoked (grant, lease) while its authorization or launch was in flight: fenced now that it
  // runs, before anyone hears of the start — as if the revocation had come right after it.
  if (r && fence_reason && r->phase != core::Phase::terminal) fence(id, *fence_reason);
  done(std::move(r));
  if (inflight_.empty()) end_drain();
}

void ExecutionGateway::drain(std::chrono::milliseconds bound, std::function<void()> done) {
  draining_ = true;
  if (inflight_.empty()) return done();
  drained_ = std::move(done);
  // Bounded like the manager's own shutdown: a start that never answers (it cannot, short of
  // a bug) must not hold the daemon's exit forever.
  drain_timer_.expires_after(bound);
  drain_timer_.async_wait(
      [this, alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec) {
        if (ec || alive.expired()) return;
        end_drain();
      });
}

void ExecutionGateway::end_drain() {
  if (!drained_) return;
  drain_timer_.cancel();
  auto cb = std::move(drained_);
  drained_ = nullptr;
  cb();
}

Result<supervisor::StartResult> ExecutionGateway::after_launch(AuthorityUse const& use,
                                                               bool recorded,
                                                               Result<supervisor::StartResult> r) {
  // No outcome of an authorized start (not even a refusal) reaches the caller before the claim
  // behind it is on stable storage. A launched execution's result comes only after the manager
  // awaited it (before the release), so it does not wait again (that would wait for the group
  // commits of starts authorized meanwhile, not for this one's). A refusal by the manager and
  // a spawn failure (whose own wait reports no error) wait here, and a failed wait wins.
  if (!r || r->phase == core::Phase::terminal) {
    if (auto durable = store_->await_durable(use.execution_id); !durable) return durable.error();
    if (!r) return r.error();
  }
  if (!recorded || r->execution_id != use.execution_id) {
    return Error{Errc::internal, "the manager launched without recording the authorized execution"};
  }
  // Already terminal (spawn failed): settled at its terminal record, nothing to fence. The
  // start result says so (no execution view needs to be built for it).
  if (r->phase != core::Phase::terminal) {
    Dependent d;
    d.grant_id = use.grant_id;
    d.lease_id = use.lease_id;
    live_[r->execution_id] = std::move(d);
    if (use.expires_ns) arm_expiry(r->execution_id, *use.expires_ns);
  }
  return r;
}

Result<void> ExecutionGateway::on_record_authorized(std::string const& execution_id,
                                                    core::ExecutionIdentity const& identity,
                                                    core::ExecutionPlan const& plan,
                                                    std::string const& plan_digest) {
  // A permit minted anywhere but in launch_async() above (a test minter) launches nothing here.
  if (!armed_ || armed_->recorded || armed_->use.execution_id != execution_id) {
    return Error{Errc::auth_denied,
                 "executions start only through the gateway (no authorized launch for " +
                     execution_id + ")"};
  }
  if (plan_digest != armed_->plan_digest) {
    return Error{Errc::auth_digest_mismatch, "the launched plan is not the one authorized"};
  }
  // The plan digest binds all of these; they are compared one by one as well, so that a
  // launch that is not the authorized one is named by what differs (the seed's cross-check:
  // revision tuple, sandbox digest, backend).
  if (identity.generation != armed_->generation || identity.revision != armed_->revision) {
    return Error{Errc::auth_digest_mismatch,
                 "the launched identity's generation/revision is not the one authorized"};
  }
  if (plan.sandbox_digest != armed_->sandbox_digest) {
    return Error{Errc::auth_digest_mismatch, "the launched sandbox is not the one authorized"};
  }
  if (plan.backend.kind != armed_->backend) {
    return Error{Errc::auth_digest_mismatch, "the launched backend is not the one authorized"};
  }
  // The record was created by the authorizing transaction from the very plan whose digest was
  // just compared: nothing to write. The backend's support for the plan (its sandbox controls
  // included) was admitted again by the manager right before this call, in the same turn of
  // the loop.
  armed_->recorded = true;
  return ok();
}

void ExecutionGateway::on_terminal(std::string const& execution_id, core::TerminalRecord const&) {
  live_.erase(execution_id);
}

Result<std::uint64_t> ExecutionGateway::input(std::string const& execution_id,
                                              std::span<std::uint8_t const> data, bool eof) {
  if (manager_ == nullptr) return Error{Errc::internal, "gateway has no execution manager"};
  if (fenced_.contains(execution_id)) {
    return Error{Errc::exec_input_closed,
                 execution_id + ": stdin is fenced (its grant or lease was revoked)"};
  }
  return manager_->input(execution_id, data, eof);
}

bool ExecutionGateway::fenced(std::string const& execution_id) const {
  return fenced_.contains(execution_id);
}

Result<bool> ExecutionGateway::may_access(Caller const& caller, std::string const& execution_id) {
  if (caller.admin) return true;
  auto use = CUSTOS_TRY(store_->get_use(execution_id));
  return use.has_value() && use->actor == Principal{PrincipalKind::uid, caller.uid}.to_string();
}

Result<std::set<std::string>> ExecutionGateway::executions_of(Caller const& caller) {
  std::set<std::string> ids;
  auto const self = Principal{PrincipalKind::uid, caller.uid}.to_string();
  for (auto const& u : CUSTOS_TRY(store_->uses_of_actor(self))) ids.insert(u.execution_id);
  return ids;
}

void ExecutionGateway::remember_fenced(std::string const& execution_id) {
  if (!fenced_.insert(execution_id).second) return;
  fenced_order_.push_back(execution_id);
  while (fenced_order_.size() > kFencedHistory) {
    fenced_.erase(fenced_order_.front());
    fenced_order_.pop_front();
  }
}

void ExecutionGateway::fence(std::string const& execution_id, std::string const& reason) {
  // The fence is in place before the revoking call returns: this runs on the loop thread, and
  // every later exec.input is served after it and refused by input().
  remember_fenced(execution_id);
  if (manager_ == nullptr) return;
  (void)manager_->cancel(execution_id, core::Trigger::lease_fence, reason);
  // Bytes already admitted may still drain; then the child sees EOF.
  (void)manager_->input(execution_id, {}, true);
}

FenceReport ExecutionGateway::fence_all(std::vector<AuthorityUse> const& uses,
                                        std::string const& reason) {
  FenceReport rep;
  for (auto const& u : uses) {
    if (fenced_.contains(u.execution_id)) continue;
    if (auto in = inflight_.find(u.execution_id); in != inflight_.end()) {
      // Authorized, not launched yet: fenced the moment it is (answer_async), and its input
      // is refused from now on.
      remember_fenced(u.execution_id);
      in->second.fence_reason = reason;
      rep.fenced.push_back(u.execution_id);
      continue;
    }
    if (!live_.contains(u.execution_id)) continue;
    fence(u.execution_id, reason);
    rep.fenced.push_back(u.execution_id);
  }
  return rep;
}

void ExecutionGateway::arm_expiry(std::string const& execution_id, std::int64_t expires_ns) {
  auto it = live_.find(execution_id);
  if (it == live_.end()) return;
  std::int64_t const left_ns = std::max<std::int64_t>(0, expires_ns - realtime_ns());
  auto timer = std::make_unique<boost::asio::steady_timer>(io_);
  timer->expires_after(std::chrono::nanoseconds(left_ns));
  timer->async_wait([this, execution_id](boost::system::error_code const& ec) {
    if (ec) return;  // cancelled: the execution ended first (its Dependent was destroyed)
    if (!live_.contains(execution_id) || fenced_.contains(execution_id)) return;
    fence(execution_id, "grant expired");
  });
  it->second.expiry = std::move(timer);
}

Result<std::size_t> ExecutionGateway::settle_recovered() {
  if (options_.registry == nullptr) return std::size_t{0};
  std::size_t settled = 0;
  for (auto const& u : CUSTOS_TRY(store_->unsettled_uses())) {
    if (live_.contains(u.execution_id)) continue;
    auto rec = options_.registry->get(u.execution_id);
    if (!rec || !rec->terminal) continue;
    auto t = registry::decode_terminal(*rec->terminal);
    if (!t) continue;
    CUSTOS_TRYV(store_->settle(u.execution_id, *t));
    ++settled;
  }
  return settled;
}

Result<void> ExecutionGateway::adopted(std::string const& execution_id) {
  auto use = CUSTOS_TRY(store_->get_use(execution_id));
  if (!use || live_.contains(execution_id)) return ok();
  Dependent d;
  d.grant_id = use->grant_id;
  d.lease_id = use->lease_id;
  live_[execution_id] = std::move(d);
  // What changed while no daemon ran fences it now, as it would have then.
  std::string why;
  if (use->grant_id) {
    auto g = CUSTOS_TRY(store_->get_grant(*use->grant_id));
    if (!g || g->first.revoked) why = "grant " + *use->grant_id + " revoked";
  }
  if (why.empty() && use->lease_id) {
    auto l = CUSTOS_TRY(store_->get_lease(*use->lease_id));
    if (!l || !l->active) why = "lease " + *use->lease_id + " ended";
  }
  if (!why.empty()) {
    fence(execution_id, why + " while no daemon ran");
    return ok();
  }
  // An expiry that passed meanwhile fires at once.
  if (use->expires_ns) arm_expiry(execution_id, *use->expires_ns);
  return ok();
}

// ------------------------------------------------------------------------------ authority.*

Result<Grant> ExecutionGateway::grant(Caller const& caller, Grant g) {
  if (!caller.admin) return not_admin("authority.grant");
  return store_->add_grant(std::move(g), realtime_ns());
}

Result<RevokeResult> ExecutionGateway::revoke(Caller const& caller, std::string const& grant_id) {
  if (!caller.admin) return not_admin("authority.revoke");
  RevokeResult res;
  res.grant = CUSTOS_TRY(store_->revoke_grant(grant_id));
  auto uses = CUSTOS_TRY(store_->uses_of_grant(grant_id, true));
  res.fence = fence_all(uses, "grant " + grant_id + " revoked");
  return res;
}

Result<std::vector<std::pair<Grant, BudgetUse>>> ExecutionGateway::list(Caller const& caller) {
  auto all = CUSTOS_TRY(store_->list_grants());
  if (caller.admin) return all;
  std::erase_if(all, [&](auto const& gu) { return !caller.is(gu.first.principal); });
  return all;
}

Result<std::uint64_t> ExecutionGateway::epoch() {
  return store_->epoch();
}

// ------------------------------------------------------------------------------ lease.*

Result<Lease> ExecutionGateway::acquire_lease(Caller const& caller, std::string const& workspace_id,
                                              std::string const& holder_session) {
  if (!caller.admin) {
    auto const now = realtime_ns();
    auto grants = CUSTOS_TRY(store_->list_grants());
    bool const allowed = std::any_of(grants.begin(), grants.end(), [&](auto const& gu) {
      Grant const& g = gu.first;
      return caller.is(g.principal) && grant_live(g, now) && g.role >= Role::runner &&
             std::any_of(g.workspaces.begin(), g.workspaces.end(), [&](WorkspaceRule const& w) {
               return w.workspace_id == workspace_id &&
                      w.max_access == core::WorkspaceAccess::writable;
             });
    });
    if (!allowed) {
      return Error{Errc::auth_denied,
                   "no live grant of this caller allows workspace " + workspace_id + " writable"};
    }
  }
  return store_->acquire_lease(workspace_id, holder_session,
                               Principal{PrincipalKind::uid, caller.uid}, realtime_ns());
}

Result<LeaseEndResult> ExecutionGateway::release_lease(Caller const& caller,
                                                       std::string const& lease_id, bool force) {
  auto cur = CUSTOS_TRY(store_->get_lease(lease_id));
  if (!cur || !cur->active) {
    return Error{Errc::lease_not_found,
                 "lease " + lease_id + (cur ? " is no longer active" : " does not exist")};
  }
  if (force) {
    if (!caller.admin) return not_admin("breaking a lease");
  } else if (!caller.is(cur->holder)) {
    return Error{Errc::auth_denied, "lease " + lease_id + " is held by " + cur->holder.to_string() +
                                        "; only its holder releases it (admins may break it)"};
  }
  LeaseEndResult res;
  res.lease = CUSTOS_TRY(store_->end_lease(lease_id));
  auto uses = CUSTOS_TRY(store_->uses_of_lease(lease_id, true));
  res.fence = fence_all(uses, "lease " + lease_id + (force ? " broken" : " released"));
  return res;
}

Result<std::vector<Lease>> ExecutionGateway::list_leases(bool active_only) {
  return store_->list_leases(active_only);
}

}  // namespace custos::gateway
