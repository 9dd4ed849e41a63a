// Registry schema v3 -> v4 (the authority tables): a v3 file built by hand exactly as released
// opens as v4 with its consumed claims still consumed, the authority tables shaped exactly like
// a fresh registry's, the epoch at 0, and the gateway working on it.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <stdlib.h>
#include <string>

#include "custos/core/plan_canonical.hpp"
#include "custos/gateway/store.hpp"
#include "custos/registry/registry.hpp"

namespace custos::gateway {
namespace {

// Schema version 3, written out by hand (not taken from the implementation), as released.
constexpr char const* kV3 = R"sql(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE claims (action_id TEXT NOT NULL, process_id TEXT NOT NULL, execution_id TEXT NOT NULL,
  consumed_ns INTEGER NOT NULL, PRIMARY KEY (action_id, process_id)) WITHOUT ROWID;
CREATE INDEX claims_by_execution ON claims (execution_id);
CREATE TABLE executions (execution_id TEXT PRIMARY KEY, action_id TEXT NOT NULL,
  process_id TEXT NOT NULL, session_id TEXT NOT NULL, plan_canonical BLOB NOT NULL,
  plan_digest TEXT NOT NULL, backend TEXT NOT NULL, boundary_kind TEXT NOT NULL,
  cgroup_path TEXT NOT NULL, marker TEXT NOT NULL, phase TEXT NOT NULL, pid INTEGER,
  start_time INTEGER, trigger TEXT, out_observed INTEGER NOT NULL, out_retained INTEGER NOT NULL,
  out_dropped INTEGER NOT NULL, out_complete INTEGER NOT NULL, err_observed INTEGER NOT NULL,
  err_retained INTEGER NOT NULL, err_dropped INTEGER NOT NULL, err_complete INTEGER NOT NULL,
  terminal BLOB, terminal_digest TEXT, classification TEXT, recovery TEXT,
  checksum TEXT NOT NULL, created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL,
  ownership TEXT NOT NULL DEFAULT 'unassigned', boot_id TEXT, pidfs_dev INTEGER,
  pidfs_ino INTEGER, pid_ns_ino INTEGER,
  out_published INTEGER NOT NULL DEFAULT 0, out_pub_done INTEGER NOT NULL DEFAULT 0,
  err_published INTEGER NOT NULL DEFAULT 0, err_pub_done INTEGER NOT NULL DEFAULT 0);
CREATE INDEX executions_by_phase ON executions (phase);
CREATE INDEX executions_by_session ON executions (session_id);
CREATE TABLE quarantine (execution_id TEXT PRIMARY KEY, code TEXT NOT NULL, reason TEXT NOT NULL,
  detected_ns INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema_id', 'custos-registry'), ('schema_version', '3');
INSERT INTO claims VALUES ('act-old', 'proc-1', 'ex-old', 7);
)sql";

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/custos-gw-mig-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] std::filesystem::path const& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// name -> CREATE statement of every authority table and index.
std::map<std::string, std::string> authority_shape(registry::Registry& reg) {
  std::map<std::string, std::string> out;
  EXPECT_TRUE(reg.read([&](registry::sql::Db& db) -> Result<void> {
                   auto q = db.prepare(
                       "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL AND (tbl_name IN "
                       "('authority_meta','principals','grants','budgets','lease_epochs','leases',"
                       "'authority_uses'))");
                   if (!q) return q.error();
                   while (true) {
                     auto more = q->step();
                     if (!more) return more.error();
                     if (!*more) break;
                     out[q->text(0)] = q->text(1);
                   }
                   return ok();
                 })
                  .has_value());
  return out;
}

TEST(AuthorityMigration, FromV3KeepsClaimsAndAddsTheAuthorityTables) {
  TempDir t;
  {
    std::filesystem::create_directories(t.path() / "old");
    auto db = registry::sql::Db::open((t.path() / "old" / "registry.db").string(), true);
    ASSERT_TRUE(db.has_value());
    ASSERT_TRUE(db->exec(kV3).has_value());
  }
  auto migrated = registry::Registry::open(t.path() / "old");
  ASSERT_TRUE(migrated.has_value()) << migrated.error().message();
  EXPECT_EQ((*migrated)->opened_version(), 3);
  EXPECT_GE(registry::kSchemaVersion, 4);

  auto fresh = registry::Registry::open(t.path() / "new");
  ASSERT_TRUE(fresh.has_value()) << fresh.error().message();
  auto const shape = authority_shape(**migrated);
  EXPECT_EQ(shape.size(), 12U);  // 7 tables + 5 indexes
  EXPECT_EQ(shape, authority_shape(**fresh)) << "a migrated file and a fresh one differ";

  RegistryDatabase rdb(**migrated);
  AuthorityStore store(rdb);
  EXPECT_EQ(*store.epoch(), 0U);
  // The v3 claim stays consumed: authority cannot bring a consumed pair back.
  auto claim = (*migrated)->find_claim("act-old", "proc-1");
  ASSERT_TRUE(claim.has_value() && claim->has_value());
  EXPECT_EQ((*claim)->execution_id, "ex-old");

  Caller admin{0, 0, {}, true};
  core::ExecutionIdentity id;
  id.project_id = "p";
  id.session_id = "s";
  id.run_id = "r";
  id.attempt_id = "a";
  id.turn_id = "t";
  id.action_id = "act-old";
  id.process_id = "proc-1";
  id.workspace_id = "w";
  id.resource_id = "res";
  id.environment_id = "env";
  core::ExecutionPlan plan;
  plan.command.executable = "/bin/true";
  plan.command.argv = {"true"};
  plan.workspace.root = "/tmp";
  AuthorizeRequest req;
  req.caller = admin;
  req.identity = &id;
  req.plan = &plan;
  req.plan_digest = core::plan_digest(id, plan)->to_string();
  req.execution_id = "ex-new";
  auto replay = store.authorize(req);
  ASSERT_FALSE(replay.has_value());
  EXPECT_EQ(replay.error().code, Errc::auth_replay);

  Grant g;
  g.id = "g1";
  g.principal = Principal{PrincipalKind::uid, 1000};
  ASSERT_TRUE(store.add_grant(g, 1).has_value());
  EXPECT_EQ(*store.epoch(), 1U);

  // Reopening a v4 file migrates nothing and keeps the authority.
  migrated->reset();
  auto again = registry::Registry::open(t.path() / "old");
  ASSERT_TRUE(again.has_value()) << again.error().message();
  EXPECT_EQ((*again)->opened_version(), registry::kSchemaVersion);
  RegistryDatabase rdb2(**again);
  AuthorityStore store2(rdb2);
  EXPECT_EQ(*store2.epoch(), 1U);
  auto back = store2.get_grant("g1");
  ASSERT_TRUE(back.has_value() && back->has_value());
  EXPECT_EQ((*back)->first.revision, 1U);
}

}  // namespace
}  // namespace custos::gateway
