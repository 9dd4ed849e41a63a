// What the gateway suites share: the identity and plan they authorize (project p1, session s1,
// action act-1, process proc-1, workspace w1 at /srv/w1, environment env1, resource res1) and
// a row count of the authority store's tables.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/gateway/store.hpp"
#include "custos/registry/sqlite.hpp"

namespace custos::gateway::fixture {

[[nodiscard]] inline core::ExecutionIdentity fixture_identity(std::uint64_t generation) {
  core::ExecutionIdentity id;
  id.project_id = "p1";
  id.session_id = "s1";
  id.run_id = "r1";
  id.attempt_id = "a1";
  id.turn_id = "t1";
  id.action_id = "act-1";
  id.process_id = "proc-1";
  id.workspace_id = "w1";
  id.resource_id = "res1";
  id.environment_id = "env1";
  id.generation = generation;
  return id;
}

// /bin/true in /srv/w1 with cpu and wall limits below every test grant's ceilings.
[[nodiscard]] inline core::ExecutionPlan fixture_plan() {
  core::ExecutionPlan plan;
  plan.command.executable = "/bin/true";
  plan.command.argv = {"true"};
  plan.workspace.root = "/srv/w1";
  plan.limits.cpu_ms = 1000;
  plan.limits.wall_ms = 5000;
  return plan;
}

// Rows in `table` of the authority store's database (-1 when the read failed).
[[nodiscard]] inline std::int64_t row_count(Database& db, char const* table) {
  std::int64_t n = -1;
  auto r = db.read([&](registry::sql::Db& sql) -> Result<void> {
    auto v = sql.query_int(std::string{"SELECT COUNT(*) FROM "} + table);
    if (!v) return v.error();
    n = v->value_or(-1);
    return ok();
  });
  EXPECT_TRUE(r.has_value());
  return n;
}

}  // namespace custos::gateway::fixture
