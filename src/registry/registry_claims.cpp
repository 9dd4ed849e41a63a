// Registry: one-use claims and the gateway's transaction hooks (transact, read).
#include <vector>

#include "custos/registry/failpoint.hpp"
#include "custos/registry/registry.hpp"

#include "registry_internal.hpp"
#include "schema.hpp"

namespace custos::registry {

// ---- claims -----------------------------------------------------------------------------------

namespace detail {

Result<void> check_claim_ids(std::string_view action_id, std::string_view process_id,
                             std::string_view execution_id) {
  if (!action_id.empty() && !process_id.empty() && !execution_id.empty()) return ok();
  return Error{Errc::plan_invalid_id, "claim needs action, process and execution ids"};
}

std::function<void(Result<void>)> after_commit(std::initializer_list<char const*> points,
                                               std::function<void(Result<void>)> done) {
  return [pts = std::vector<char const*>(points), done = std::move(done)](Result<void> r) {
    if (r) {
      for (char const* p : pts) failpoint(p);
    }
    done(std::move(r));
  };
}

}  // namespace detail

Result<void> Registry::consume_claim(std::string_view action_id, std::string_view process_id,
                                     std::string_view execution_id, Durability d) {
  return consume_claim_with(
      action_id, process_id, execution_id, [](sql::Db&) -> Result<void> { return ok(); }, d);
}

Result<void> Registry::consume_claim_with(std::string_view action_id, std::string_view process_id,
                                          std::string_view execution_id,
                                          std::function<Result<void>(sql::Db&)> also,
                                          Durability d) {
  return claim_job(
      action_id, process_id, execution_id, std::move(also),
      [](sql::Db&) -> Result<void> { return ok(); }, detail::claim_durability(d));
}

Registry::JobFn Registry::claim_fn(std::string a, std::string p, std::string e, JobFn before,
                                   JobFn after) {
  // One job: `before`, the claim and `after` share its savepoint, so a refusal by any of them
  // undoes all three.
  return [a = std::move(a), p = std::move(p), e = std::move(e), before = std::move(before),
          after = std::move(after)](sql::Db& db) -> Result<void> {
    if (auto r = before(db); !r) return r;
    {
      // Scoped: `after` may lease the same cached statements.
      sql::StmtLease q = CUSTOS_TRY(
          db.cached("SELECT execution_id FROM claims WHERE action_id = ? AND process_id = ?"));
      CUSTOS_TRYV(q->bind(1, std::string_view{a}));
      CUSTOS_TRYV(q->bind(2, std::string_view{p}));
      if (CUSTOS_TRY(q->step())) {
        return Error{
            Errc::registry_claim_consumed,
            "action " + a + " / process " + p + " was already consumed by execution " + q->text(0)};
      }
      sql::StmtLease ins =
          CUSTOS_TRY(db.cached("INSERT INTO claims (action_id, process_id, execution_id, "
                               "consumed_ns) VALUES (?,?,?,?)"));
      CUSTOS_TRYV(ins->bind(1, std::string_view{a}));
      CUSTOS_TRYV(ins->bind(2, std::string_view{p}));
      CUSTOS_TRYV(ins->bind(3, std::string_view{e}));
      CUSTOS_TRYV(ins->bind(4, detail::now_ns()));
      CUSTOS_TRYV(ins->run());
    }
    return after(db);
  };
}

Result<void> Registry::claim_job(std::string_view action_id, std::string_view process_id,
                                 std::string_view execution_id, JobFn before, JobFn after,
                                 Durability d) {
  CUSTOS_TRYV(detail::check_claim_ids(action_id, process_id, execution_id));
  if (auto wr = write(d,
                      claim_fn(std::string{action_id}, std::string{process_id},
                               std::string{execution_id}, std::move(before), std::move(after)),
                      std::string{execution_id});
      !wr)
    return std::move(wr).error();
  failpoint("after_claim");
  return ok();
}

Result<void> Registry::transact(Durability d, std::function<Result<void>(sql::Db&)> fn) {
  return write(d, std::move(fn));
}

void Registry::transact_deferred(std::string execution_id, char const* what,
                                 std::function<Result<void>(sql::Db&)> fn) {
  // NORMAL: it commits in the transaction of the immediate write that follows it, with that
  // write's durability.
  enqueue_deferred(Durability::normal, std::move(execution_id), what, std::move(fn));
}

Result<void> Registry::read(std::function<Result<void>(sql::Db&)> const& fn) {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  return fn(db_);
}

Result<std::optional<Claim>> Registry::find_claim(std::string_view action_id,
                                                  std::string_view process_id) {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  sql::Stmt q = CUSTOS_TRY(db_.prepare(
      "SELECT execution_id, consumed_ns FROM claims WHERE action_id = ? AND process_id = ?"));
  CUSTOS_TRYV(q.bind(1, action_id));
  CUSTOS_TRYV(q.bind(2, process_id));
  if (!CUSTOS_TRY(q.step())) return std::optional<Claim>{};
  return std::optional<Claim>{
      Claim{std::string{action_id}, std::string{process_id}, q.text(0), q.int64(1)}};
}

Result<std::vector<Claim>> Registry::orphan_claims() {
  CUSTOS_TRYV(settle_deferred());
  std::lock_guard<std::mutex> g(db_mu_);
  sql::Stmt q = CUSTOS_TRY(db_.prepare(
      "SELECT c.action_id, c.process_id, c.execution_id, c.consumed_ns FROM claims c "
      "WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.execution_id = c.execution_id) "
      "ORDER BY c.consumed_ns, c.action_id, c.process_id"));
  std::vector<Claim> out;
  while (CUSTOS_TRY(q.step())) out.push_back(Claim{q.text(0), q.text(1), q.text(2), q.int64(3)});
  return out;
}

}  // namespace custos::registry
