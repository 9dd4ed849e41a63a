// The authority tables and every statement that reads or writes them.
#include "custos/gateway/store.hpp"

#include <boost/json.hpp>

#include <algorithm>

#include "custos/registry/registry.hpp"
#include "custos/sys/procfs.hpp"

#include "clock.hpp"

namespace custos::gateway {

namespace json = boost::json;
using registry::sql::Db;
using registry::sql::Stmt;
using registry::sql::StmtLease;

namespace {

std::int64_t i64(std::uint64_t v) noexcept {
  return static_cast<std::int64_t>(v);
}
std::uint64_t u64(std::int64_t v) noexcept {
  return v < 0 ? 0 : static_cast<std::uint64_t>(v);
}

Result<std::string> random_id(std::string_view prefix) {
  auto m = sys::Marker::generate();
  if (!m) return m.error();
  return std::string{prefix} + m->env_value().substr(0, 16);
}

// Every statement below comes from the connection's statement cache (Db::cached): parsing the
// SQL again on each exec.start was a measurable share of the daemon's CPU per launch.
Result<std::uint64_t> read_epoch(Db& db) {
  StmtLease q = CUSTOS_TRY(db.cached("SELECT value FROM authority_meta WHERE key = 'epoch'"));
  if (!CUSTOS_TRY(q->step()) || q->is_null(0)) {
    return Error{Errc::registry_corrupt_database, "authority_meta has no epoch row"};
  }
  return u64(q->int64(0));
}

Result<void> bump_epoch(Db& db) {
  return db.exec_cached("UPDATE authority_meta SET value = value + 1 WHERE key = 'epoch'");
}

// The stored spec: the grant's JSON without the fields the store owns.
std::string spec_of(Grant const& g) {
  json::object o = grant_to_json(g, BudgetUse{});
  for (char const* k : {"id", "revision", "spent", "revoked", "created_ns"}) o.erase(k);
  return json::serialize(o);
}

constexpr std::string_view kGrantCols =
    "g.grant_id, g.revision, g.spec, g.revoked, g.created_ns, b.executions, b.cpu_ms_used, "
    "b.wall_ms_used, b.cpu_ms_reserved, b.wall_ms_reserved";

Result<std::pair<Grant, BudgetUse>> decode_grant(Stmt const& s) {
  std::string const id = s.text(0);
  boost::system::error_code ec;
  json::value v = json::parse(s.text(2), ec);
  if (ec) return Error{Errc::registry_corrupt_record, "grant " + id + ": spec is not JSON"};
  auto g = grant_from_json(v);
  if (!g) return Error{Errc::registry_corrupt_record, "grant " + id + ": " + g.error().message()};
  g->id = id;
  g->revision = u64(s.int64(1));
  g->revoked = s.int64(3) != 0;
  g->created_ns = s.int64(4);
  BudgetUse u;
  u.executions = u64(s.int64(5));
  u.cpu_ms_used = u64(s.int64(6));
  u.wall_ms_used = u64(s.int64(7));
  u.cpu_ms_reserved = u64(s.int64(8));
  u.wall_ms_reserved = u64(s.int64(9));
  return std::pair<Grant, BudgetUse>{std::move(*g), u};
}

Result<std::optional<std::pair<Grant, BudgetUse>>> load_grant(Db& db, std::string_view id) {
  static std::string const kSql = "SELECT " + std::string{kGrantCols} +
                                  " FROM grants g JOIN budgets b ON b.grant_id = g.grant_id"
                                  " WHERE g.grant_id = ?";
  StmtLease q = CUSTOS_TRY(db.cached(kSql));
  CUSTOS_TRYV(q->bind(1, id));
  if (!CUSTOS_TRY(q->step())) return std::optional<std::pair<Grant, BudgetUse>>{};
  return std::optional<std::pair<Grant, BudgetUse>>{CUSTOS_TRY(decode_grant(*q))};
}

constexpr std::string_view kLeaseCols =
    "lease_id, workspace_id, holder_session, holder, epoch, active, acquired_ns";

Result<Lease> decode_lease(Stmt const& s) {
  Lease l;
  l.id = s.text(0);
  l.workspace_id = s.text(1);
  l.holder_session = s.text(2);
  auto p = Principal::parse(s.text(3));
  if (!p) return Error{Errc::registry_corrupt_record, "lease " + l.id + ": holder"};
  l.holder = *p;
  l.epoch = u64(s.int64(4));
  l.active = s.int64(5) != 0;
  l.acquired_ns = s.int64(6);
  return l;
}

// The two ways a lease is looked up (the SQL text is built once: it is the cache's key).
enum class LeaseBy : std::uint8_t { id, active_on_workspace };

Result<std::optional<Lease>> load_lease(Db& db, LeaseBy by, std::string_view arg) {
  static std::string const kById =
      "SELECT " + std::string{kLeaseCols} + " FROM leases WHERE lease_id = ?";
  static std::string const kActive =
      "SELECT " + std::string{kLeaseCols} + " FROM leases WHERE workspace_id = ? AND active = 1";
  StmtLease q = CUSTOS_TRY(db.cached(by == LeaseBy::id ? kById : kActive));
  CUSTOS_TRYV(q->bind(1, arg));
  if (!CUSTOS_TRY(q->step())) return std::optional<Lease>{};
  return std::optional<Lease>{CUSTOS_TRY(decode_lease(*q))};
}

constexpr std::string_view kUseCols =
    "execution_id, action_id, process_id, session_id, generation, actor, grant_id, lease_id, "
    "cpu_ms_reserved, wall_ms_reserved, settled, expires_ns, authorized_ns";

AuthorityUse decode_use(Stmt const& s) {
  AuthorityUse u;
  u.execution_id = s.text(0);
  u.action_id = s.text(1);
  u.process_id = s.text(2);
  u.session_id = s.text(3);
  u.generation = u64(s.int64(4));
  u.actor = s.text(5);
  u.grant_id = s.opt_text(6);
  u.lease_id = s.opt_text(7);
  u.cpu_ms_reserved = u64(s.int64(8));
  u.wall_ms_reserved = u64(s.int64(9));
  u.settled = s.int64(10) != 0;
  u.expires_ns = s.opt_int64(11);
  u.authorized_ns = s.int64(12);
  return u;
}

Result<std::vector<AuthorityUse>> query_uses(Database& d, std::string const& where,
                                             std::function<Result<void>(Stmt&)> bind) {
  std::vector<AuthorityUse> out;
  Result<void> const txn = d.read([&](Db& db) -> Result<void> {
    StmtLease q =
        CUSTOS_TRY(db.cached("SELECT " + std::string{kUseCols} + " FROM authority_uses WHERE " +
                             where + " ORDER BY authorized_ns, execution_id"));
    CUSTOS_TRYV(bind(*q));
    while (CUSTOS_TRY(q->step())) out.push_back(decode_use(*q));
    return ok();
  });
  if (!txn) return txn.error();
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------ RegistryDatabase

Result<void> RegistryDatabase::write(std::function<Result<void>(Db&)> fn) {
  return reg_->transact(registry::Durability::full, std::move(fn));
}

Result<void> RegistryDatabase::write_normal(std::function<Result<void>(Db&)> fn) {
  return reg_->transact(registry::Durability::normal, std::move(fn));
}

Result<void> RegistryDatabase::read(std::function<Result<void>(Db&)> fn) {
  return reg_->read(fn);
}

Result<void> RegistryDatabase::consume_claim_with(std::string_view action_id,
                                                  std::string_view process_id,
                                                  std::string_view execution_id,
                                                  std::function<Result<void>(Db&)> also,
                                                  registry::Durability d) {
  return reg_->consume_claim_with(action_id, process_id, execution_id, std::move(also), d);
}

Result<void> RegistryDatabase::consume_claim_and_record(registry::NewExecution const& ex,
                                                        std::function<Result<void>(Db&)> also,
                                                        registry::Durability d) {
  return reg_->record_authorized_with(ex, std::move(also), d);
}

Result<void> RegistryDatabase::await_durable() {
  return reg_->await_durable();
}

Result<void> RegistryDatabase::await_durable(std::string_view execution_id) {
  return reg_->await_durable(execution_id);
}

void RegistryDatabase::write_deferred(std::string execution_id, char const* what,
                                      std::function<Result<void>(Db&)> fn) {
  reg_->transact_deferred(std::move(execution_id), what, std::move(fn));
}

// ------------------------------------------------------------------------------ AuthorityStore

Result<std::uint64_t> AuthorityStore::epoch() {
  std::uint64_t e = 0;
  Result<void> const txn = db_->read([&](Db& db) -> Result<void> {
    e = CUSTOS_TRY(read_epoch(db));
    return ok();
  });
  if (!txn) return txn.error();
  return e;
}

Result<void> AuthorityStore::set_admin(Principal const& p, bool admin) {
  std::string const key = p.to_string();
  return db_->write([&](Db& db) -> Result<void> {
    StmtLease s = CUSTOS_TRY(db.cached(
        "INSERT INTO principals (principal, role, revision, updated_ns) VALUES (?, ?, 1, ?) "
        "ON CONFLICT (principal) DO UPDATE SET role = excluded.role, "
        "revision = principals.revision + 1, updated_ns = excluded.updated_ns"));
    CUSTOS_TRYV(s->bind(1, std::string_view{key}));
    CUSTOS_TRYV(s->bind(2, admin ? std::string_view{"admin"} : std::string_view{"runner"}));
    CUSTOS_TRYV(s->bind(3, realtime_ns()));
    CUSTOS_TRYV(s->run());
    return bump_epoch(db);
  });
}

Result<bool> AuthorityStore::is_admin(Caller const& c) {
  std::vector<std::string> keys{Principal{PrincipalKind::uid, c.uid}.to_string(),
                                Principal{PrincipalKind::gid, c.gid}.to_string()};
  for (auto g : c.groups) keys.push_back(Principal{PrincipalKind::gid, g}.to_string());
  bool found = false;
  Result<void> const txn = db_->read([&](Db& db) -> Result<void> {
    StmtLease q =
        CUSTOS_TRY(db.cached("SELECT 1 FROM principals WHERE principal = ? AND role = 'admin'"));
    for (auto const& k : keys) {
      q->reset();
      CUSTOS_TRYV(q->bind(1, std::string_view{k}));
      if (CUSTOS_TRY(q->step())) {
        found = true;
        break;
      }
    }
    return ok();
  });
  if (!txn) return txn.error();
  return found;
}

Result<Grant> AuthorityStore::add_grant(Grant g, std::int64_t now_ns) {
  if (g.id.empty()) g.id = CUSTOS_TRY(random_id("g-"));
  if (!is_valid_grant_id(g.id))
    return Error{Errc::plan_invalid_id, "grant id: 1-64 of [A-Za-z0-9_.-]"};
  g.revision = 1;
  g.revoked = false;
  g.created_ns = now_ns;
  std::string const spec = spec_of(g);
  std::string const principal = g.principal.to_string();
  Result<void> const txn = db_->write([&](Db& db) -> Result<void> {
    StmtLease q = CUSTOS_TRY(db.cached("SELECT 1 FROM grants WHERE grant_id = ?"));
    CUSTOS_TRYV(q->bind(1, std::string_view{g.id}));
    if (CUSTOS_TRY(q->step())) {
      return Error{Errc::plan_invalid_id, "grant " + g.id + " exists (grant ids are never reused)"};
    }
    StmtLease ins = CUSTOS_TRY(db.cached(
        "INSERT INTO grants (grant_id, revision, principal, spec, revoked, created_ns, updated_ns) "
        "VALUES (?, 1, ?, ?, 0, ?, ?)"));
    CUSTOS_TRYV(ins->bind(1, std::string_view{g.id}));
    CUSTOS_TRYV(ins->bind(2, std::string_view{principal}));
    CUSTOS_TRYV(ins->bind(3, std::string_view{spec}));
    CUSTOS_TRYV(ins->bind(4, now_ns));
    CUSTOS_TRYV(ins->bind(5, now_ns));
    CUSTOS_TRYV(ins->run());
    StmtLease b = CUSTOS_TRY(db.cached("INSERT INTO budgets VALUES (?, 0, 0, 0, 0, 0)"));
    CUSTOS_TRYV(b->bind(1, std::string_view{g.id}));
    CUSTOS_TRYV(b->run());
    return bump_epoch(db);
  });
  if (!txn) return txn.error();
  return g;
}

Result<Grant> AuthorityStore::revoke_grant(std::string_view grant_id) {
  Grant out;
  Result<void> const txn = db_->write([&](Db& db) -> Result<void> {
    auto cur = CUSTOS_TRY(load_grant(db, grant_id));
    if (!cur || cur->first.revoked) {
      return Error{Errc::auth_unknown_grant, "grant " + std::string{grant_id} +
                                                 (cur ? " is already revoked" : " does not exist")};
    }
    StmtLease u =
        CUSTOS_TRY(db.cached("UPDATE grants SET revoked = 1, revision = revision + 1, updated_ns "
                             "= ? WHERE grant_id = ?"));
    CUSTOS_TRYV(u->bind(1, realtime_ns()));
    CUSTOS_TRYV(u->bind(2, grant_id));
    CUSTOS_TRYV(u->run());
    out = cur->first;
    out.revoked = true;
    out.revision += 1;
    return bump_epoch(db);
  });
  if (!txn) return txn.error();
  return out;
}

Result<std::optional<std::pair<Grant, BudgetUse>>> AuthorityStore::get_grant(
    std::string_view grant_id) {
  std::optional<std::pair<Grant, BudgetUse>> out;
  Result<void> const txn = db_->read([&](Db& db) -> Result<void> {
    out = CUSTOS_TRY(load_grant(db, grant_id));
    return ok();
  });
  if (!txn) return txn.error();
  return out;
}

Result<std::vector<std::pair<Grant, BudgetUse>>> AuthorityStore::list_grants(
    std::optional<Principal> const& principal) {
  std::vector<std::pair<Grant, BudgetUse>> out;
  Result<void> const txn = db_->read([&](Db& db) -> Result<void> {
    std::string sql = "SELECT " + std::string{kGrantCols} +
                      " FROM grants g JOIN budgets b ON b.grant_id = g.grant_id";
    if (principal) sql += " WHERE g.principal = ?";
    sql += " ORDER BY g.grant_id";
    StmtLease q = CUSTOS_TRY(db.cached(sql));
    std::string const key = principal ? principal->to_string() : std::string{};
    if (principal) CUSTOS_TRYV(q->bind(1, std::string_view{key}));
    while (CUSTOS_TRY(q->step())) out.push_back(CUSTOS_TRY(decode_grant(*q)));
    return ok();
  });
  if (!txn) return txn.error();
  return out;
}

Result<Lease> AuthorityStore::acquire_lease(std::string_view workspace_id,
                                            std::string_view holder_session,
                                            Principal const& holder, std::int64_t now_ns) {
  if (workspace_id.empty() || holder_session.empty() || workspace_id.size() > 255 ||
      holder_session.size() > 255) {
    return Error{Errc::plan_invalid_id,
                 "lease needs a workspace_id and a holder session (1-255 bytes)"};
  }
  Lease l;
  l.id = CUSTOS_TRY(random_id("l-"));
  l.workspace_id = std::string{workspace_id};
  l.holder_session = std::string{holder_session};
  l.holder = holder;
  l.acquired_ns = now_ns;
  std::string const holder_s = holder.to_string();
  Result<void> const txn = db_->write([&](Db& db) -> Result<void> {
    auto cur = CUSTOS_TRY(load_lease(db, LeaseBy::active_on_workspace, workspace_id));
    if (cur) {
      return Error{Errc::lease_conflict, "workspace " + std::string{workspace_id} +
                                             " is leased by " + cur->id + " (session " +
                                             cur->holder_session + ")"};
    }
    StmtLease e = CUSTOS_TRY(db.cached(
        "INSERT INTO lease_epochs (workspace_id, epoch) VALUES (?, 1) "
        "ON CONFLICT (workspace_id) DO UPDATE SET epoch = lease_epochs.epoch + 1 RETURNING epoch"));
    CUSTOS_TRYV(e->bind(1, workspace_id));
    if (!CUSTOS_TRY(e->step())) return Error{Errc::registry_io, "lease epoch not returned"};
    l.epoch = u64(e->int64(0));
    e->reset();
    StmtLease ins = CUSTOS_TRY(db.cached(
        "INSERT INTO leases (lease_id, workspace_id, holder_session, holder, epoch, active, "
        "acquired_ns) VALUES (?, ?, ?, ?, ?, 1, ?)"));
    CUSTOS_TRYV(ins->bind(1, std::string_view{l.id}));
    CUSTOS_TRYV(ins->bind(2, workspace_id));
    CUSTOS_TRYV(ins->bind(3, holder_session));
    CUSTOS_TRYV(ins->bind(4, std::string_view{holder_s}));
    CUSTOS_TRYV(ins->bind(5, i64(l.epoch)));
    CUSTOS_TRYV(ins->bind(6, now_ns));
    CUSTOS_TRYV(ins->run());
    return bump_epoch(db);
  });
  if (!txn) return txn.error();
  return l;
}

Result<Lease> AuthorityStore::end_lease(std::string_view lease_id) {
  Lease out;
  Result<void> const txn = db_->write([&](Db& db) -> Result<void> {
    auto cur = CUSTOS_TRY(load_lease(db, LeaseBy::id, lease_id));
    if (!cur || !cur->active) {
      return Error{Errc::lease_not_found, "lease " + std::string{lease_id} +
                                              (cur ? " is no longer active" : " does not exist")};
    }
    StmtLease u =
        CUSTOS_TRY(db.cached("UPDATE leases SET active = 0, ended_ns = ? WHERE lease_id = ?"));
    CUSTOS_TRYV(u->bind(1, realtime_ns()));
    CUSTOS_TRYV(u->bind(2, lease_id));
    CUSTOS_TRYV(u->run());
    // The workspace's lease epoch moves too: a claim naming the old epoch can never match the
    // next lease, even one held by the same session.
    StmtLease e =
        CUSTOS_TRY(db.cached("UPDATE lease_epochs SET epoch = epoch + 1 WHERE workspace_id = ?"));
    CUSTOS_TRYV(e->bind(1, std::string_view{cur->workspace_id}));
    CUSTOS_TRYV(e->run());
    out = *cur;
    out.active = false;
    return bump_epoch(db);
  });
  if (!txn) return txn.error();
  return out;
}

Result<std::optional<Lease>> AuthorityStore::get_lease(std::string_view lease_id) {
  std::optional<Lease> out;
  Result<void> const txn = db_->read([&](Db& db) -> Result<void> {
    out = CUSTOS_TRY(load_lease(db, LeaseBy::id, lease_id));
    return ok();
  });
  if (!txn) return txn.error();
  return out;
}

Result<std::vector<Lease>> AuthorityStore::list_leases(bool active_only) {
  std::vector<Lease> out;
  Result<void> const txn = db_->read([&](Db& db) -> Result<void> {
    StmtLease q = CUSTOS_TRY(db.cached("SELECT " + std::string{kLeaseCols} + " FROM leases" +
                                       (active_only ? " WHERE active = 1" : "") +
                                       " ORDER BY acquired_ns, lease_id"));
    while (CUSTOS_TRY(q->step())) out.push_back(CUSTOS_TRY(decode_lease(*q)));
    return ok();
  });
  if (!txn) return txn.error();
  return out;
}

namespace {

// The claim's (action_id, process_id) was not consumed before. Errors: auth.replay.
Result<void> refuse_replay(Db& db, core::ExecutionIdentity const& id) {
  // Scoped: the registry's claim step leases this same cached statement after us.
  StmtLease c = CUSTOS_TRY(
      db.cached("SELECT execution_id FROM claims WHERE action_id = ? AND process_id = ?"));
  CUSTOS_TRYV(c->bind(1, std::string_view{id.action_id}));
  CUSTOS_TRYV(c->bind(2, std::string_view{id.process_id}));
  if (CUSTOS_TRY(c->step())) {
    return Error{Errc::auth_replay, "action " + id.action_id + " / process " + id.process_id +
                                        " was consumed by execution " + c->text(0)};
  }
  return ok();
}

// The authority as it stands in this transaction: epoch, the claimed grant with its budget use,
// the claimed lease and the workspace's active lease.
Result<AuthoritySnapshot> load_snapshot(Db& db, AuthorizeRequest const& req) {
  AuthoritySnapshot snap;
  snap.epoch = CUSTOS_TRY(read_epoch(db));
  if (req.claim.grant_id) {
    if (auto g = CUSTOS_TRY(load_grant(db, *req.claim.grant_id))) {
      snap.grant = std::move(g->first);
      snap.budget_use = g->second;
    }
  }
  if (req.claim.lease_id) {
    snap.lease = CUSTOS_TRY(load_lease(db, LeaseBy::id, *req.claim.lease_id));
  }
  snap.workspace_lease =
      CUSTOS_TRY(load_lease(db, LeaseBy::active_on_workspace, req.identity->workspace_id));
  return snap;
}

// The use's reservation against its grant's budget, and the use itself.
Result<void> record_use(Db& db, AuthorityUse const& use) {
  if (use.grant_id) {
    StmtLease b =
        CUSTOS_TRY(db.cached("UPDATE budgets SET executions = executions + 1, "
                             "cpu_ms_reserved = cpu_ms_reserved + ?, "
                             "wall_ms_reserved = wall_ms_reserved + ? WHERE grant_id = ?"));
    CUSTOS_TRYV(b->bind(1, i64(use.cpu_ms_reserved)));
    CUSTOS_TRYV(b->bind(2, i64(use.wall_ms_reserved)));
    CUSTOS_TRYV(b->bind(3, std::string_view{*use.grant_id}));
    CUSTOS_TRYV(b->run());
  }
  StmtLease ins = CUSTOS_TRY(db.cached(
      "INSERT INTO authority_uses (execution_id, action_id, process_id, session_id, "
      "generation, actor, grant_id, lease_id, cpu_ms_reserved, wall_ms_reserved, settled, "
      "expires_ns, authorized_ns) VALUES (?,?,?,?,?,?,?,?,?,?,0,?,?)"));
  CUSTOS_TRYV(ins->bind(1, std::string_view{use.execution_id}));
  CUSTOS_TRYV(ins->bind(2, std::string_view{use.action_id}));
  CUSTOS_TRYV(ins->bind(3, std::string_view{use.process_id}));
  CUSTOS_TRYV(ins->bind(4, std::string_view{use.session_id}));
  CUSTOS_TRYV(ins->bind(5, i64(use.generation)));
  CUSTOS_TRYV(ins->bind(6, std::string_view{use.actor}));
  CUSTOS_TRYV(ins->bind(7, use.grant_id ? std::optional<std::string_view>{*use.grant_id}
                                        : std::optional<std::string_view>{}));
  CUSTOS_TRYV(ins->bind(8, use.lease_id ? std::optional<std::string_view>{*use.lease_id}
                                        : std::optional<std::string_view>{}));
  CUSTOS_TRYV(ins->bind(9, i64(use.cpu_ms_reserved)));
  CUSTOS_TRYV(ins->bind(10, i64(use.wall_ms_reserved)));
  CUSTOS_TRYV(ins->bind(11, use.expires_ns));
  CUSTOS_TRYV(ins->bind(12, use.authorized_ns));
  return ins->run();
}

// The checks of a start against the authority as it is now: replay first (a consumed pair is
// refused whatever the authority says), then the current grant, lease and epochs (`snap`),
// cross_check()ed.
Result<CheckOutcome> check_current(Db& db, AuthorizeRequest const& req, AuthoritySnapshot& snap) {
  CUSTOS_TRYV(refuse_replay(db, *req.identity));
  snap = CUSTOS_TRY(load_snapshot(db, req));
  CheckInput in;
  in.caller = req.caller;
  in.identity = req.identity;
  in.plan = req.plan;
  in.plan_digest = req.plan_digest;
  in.claim = &req.claim;
  in.current = &snap;
  in.now_ns = req.now_ns;
  in.sandbox = req.sandbox;
  in.secret_exists = req.secret_exists;
  return cross_check(in);
}

}  // namespace

Result<void> AuthorityStore::precheck(AuthorizeRequest const& req) {
  if (req.identity == nullptr || req.plan == nullptr) {
    return Error{Errc::internal, "precheck: incomplete request"};
  }
  return db_->read([&](Db& db) -> Result<void> {
    AuthoritySnapshot snap;
    CUSTOS_TRYV(check_current(db, req, snap));
    return Result<void>{};
  });
}

Result<AuthorityUse> AuthorityStore::authorize(AuthorizeRequest const& req) {
  if (req.identity == nullptr || req.plan == nullptr || req.execution_id.empty()) {
    return Error{Errc::internal, "authorize: incomplete request"};
  }
  auto const& id = *req.identity;
  AuthorityUse use;
  use.execution_id = req.execution_id;
  use.action_id = id.action_id;
  use.process_id = id.process_id;
  use.session_id = id.session_id;
  use.generation = id.generation;
  use.actor = Principal{PrincipalKind::uid, req.caller.uid}.to_string();
  use.authorized_ns = req.now_ns;
  if (req.record != nullptr &&
      (req.record->execution_id != req.execution_id || req.record->action_id != id.action_id ||
       req.record->process_id != id.process_id)) {
    return Error{Errc::internal, "authorize: the record is not the authorized execution's"};
  }
  // Runs first in the transaction; the registry then consumes the claim and (req.record)
  // creates the record in the same job, so a refusal anywhere undoes all of it.
  auto checks_and_writes = [&](Db& db) -> Result<void> {
    AuthoritySnapshot snap;
    CheckOutcome const out = CUSTOS_TRY(check_current(db, req, snap));
    if (snap.grant) {
      use.grant_id = snap.grant->id;
      use.expires_ns = snap.grant->expires_ns;
    }
    use.lease_id = out.lease_id;
    use.cpu_ms_reserved = out.cpu_ms_reserve;
    use.wall_ms_reserved = out.wall_ms_reserve;
    return record_use(db, use);
  };
  Result<void> const txn =
      req.record != nullptr
          ? db_->consume_claim_and_record(*req.record, checks_and_writes, req.durability)
          : db_->consume_claim_with(id.action_id, id.process_id, req.execution_id,
                                    checks_and_writes, req.durability);
  if (!txn) return txn.error();
  return use;
}

namespace {

// Replaces the reservation of one authority use by what its execution used. Idempotent: a
// settled use (or an execution the store never authorized) is left alone.
Result<void> settle_use(Db& db, std::string_view execution_id, std::optional<std::uint64_t> cpu_ms,
                        std::optional<std::uint64_t> wall_ms) {
  StmtLease q = CUSTOS_TRY(
      db.cached("SELECT grant_id, cpu_ms_reserved, wall_ms_reserved, settled FROM authority_uses "
                "WHERE execution_id = ?"));
  CUSTOS_TRYV(q->bind(1, execution_id));
  if (!CUSTOS_TRY(q->step())) return ok();  // not authorized through the gateway's store
  if (q->int64(3) != 0) return ok();
  std::optional<std::string> const grant_id = q->opt_text(0);
  std::uint64_t const cpu_reserved = u64(q->int64(1));
  std::uint64_t const wall_reserved = u64(q->int64(2));
  if (grant_id) {
    // An unmeasured dimension is charged its full reservation: the budget never gets
    // cheaper because a measurement was missing.
    std::uint64_t const cpu_used = cpu_ms.value_or(cpu_reserved);
    std::uint64_t const wall_used = wall_ms.value_or(wall_reserved);
    StmtLease b = CUSTOS_TRY(
        db.cached("UPDATE budgets SET cpu_ms_reserved = MAX(cpu_ms_reserved - ?, 0), "
                  "wall_ms_reserved = MAX(wall_ms_reserved - ?, 0), cpu_ms_used = cpu_ms_used + ?, "
                  "wall_ms_used = wall_ms_used + ? WHERE grant_id = ?"));
    CUSTOS_TRYV(b->bind(1, i64(cpu_reserved)));
    CUSTOS_TRYV(b->bind(2, i64(wall_reserved)));
    CUSTOS_TRYV(b->bind(3, i64(cpu_used)));
    CUSTOS_TRYV(b->bind(4, i64(wall_used)));
    CUSTOS_TRYV(b->bind(5, std::string_view{*grant_id}));
    CUSTOS_TRYV(b->run());
  }
  StmtLease s =
      CUSTOS_TRY(db.cached("UPDATE authority_uses SET settled = 1 WHERE execution_id = ?"));
  CUSTOS_TRYV(s->bind(1, execution_id));
  return s->run();
}

}  // namespace

Result<void> AuthorityStore::settle(std::string_view execution_id, core::TerminalRecord const& t) {
  auto const cpu = t.resources.at(core::ResourceDim::cpu).value;
  auto const wall = t.resources.at(core::ResourceDim::wall).value;
  // NORMAL, not FULL: settling only ever releases a reservation the execution did not use, and a
  // settlement lost in a crash is redone at the next start from the durable terminal record
  // (settle_recovered), so no fsync of its own is needed on every execution's close.
  return db_->write_normal(
      [&](Db& db) -> Result<void> { return settle_use(db, execution_id, cpu, wall); });
}

void AuthorityStore::queue_settle(std::string const& execution_id, core::TerminalRecord const& t) {
  // Owns everything it uses: it runs after this call returned, in the terminal record's
  // transaction (which commits with the terminal record's durability; see settle() for why
  // that need not be FULL).
  db_->write_deferred(execution_id, "budget settlement",
                      [execution_id, cpu = t.resources.at(core::ResourceDim::cpu).value,
                       wall = t.resources.at(core::ResourceDim::wall).value](Db& db) {
                        return settle_use(db, execution_id, cpu, wall);
                      });
}

Result<std::optional<AuthorityUse>> AuthorityStore::get_use(std::string_view execution_id) {
  auto v = CUSTOS_TRY(
      query_uses(*db_, "execution_id = ?", [&](Stmt& q) { return q.bind(1, execution_id); }));
  if (v.empty()) return std::optional<AuthorityUse>{};
  return std::optional<AuthorityUse>{std::move(v.front())};
}

Result<std::vector<AuthorityUse>> AuthorityStore::unsettled_uses() {
  return query_uses(*db_, "settled = 0", [](Stmt&) -> Result<void> { return ok(); });
}

Result<std::vector<AuthorityUse>> AuthorityStore::uses_of_grant(std::string_view grant_id,
                                                                bool unsettled_only) {
  return query_uses(*db_, unsettled_only ? "grant_id = ? AND settled = 0" : "grant_id = ?",
                    [&](Stmt& q) { return q.bind(1, grant_id); });
}

Result<std::vector<AuthorityUse>> AuthorityStore::uses_of_lease(std::string_view lease_id,
                                                                bool unsettled_only) {
  return query_uses(*db_, unsettled_only ? "lease_id = ? AND settled = 0" : "lease_id = ?",
                    [&](Stmt& q) { return q.bind(1, lease_id); });
}

Result<std::vector<AuthorityUse>> AuthorityStore::uses_of_holder(std::string_view session_id,
                                                                 std::uint64_t generation) {
  return query_uses(*db_, "session_id = ? AND generation = ?", [&](Stmt& q) -> Result<void> {
    CUSTOS_TRYV(q.bind(1, session_id));
    return q.bind(2, i64(generation));
  });
}

Result<std::vector<AuthorityUse>> AuthorityStore::uses_of_actor(std::string_view actor) {
  return query_uses(*db_, "actor = ?", [&](Stmt& q) { return q.bind(1, actor); });
}

}  // namespace custos::gateway
