// Migrations: every older schema version, built by hand here exactly as it was released, opens
// as the current version with its records intact and its legacy process values never upgraded.
#include <gtest/gtest.h>

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

// Schema version 1, written out by hand (not taken from the implementation), as released.
constexpr char const* kV1 = R"sql(
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
  checksum TEXT NOT NULL, created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL);
CREATE INDEX executions_by_phase ON executions (phase);
CREATE INDEX executions_by_session ON executions (session_id);
INSERT INTO meta VALUES ('schema_id', 'custos-registry'), ('schema_version', '1');
)sql";

// Version 2 = version 1 plus the pidfs ownership columns.
constexpr char const* kV2Additions = R"sql(
ALTER TABLE executions ADD COLUMN ownership TEXT NOT NULL DEFAULT 'unassigned';
ALTER TABLE executions ADD COLUMN boot_id TEXT;
ALTER TABLE executions ADD COLUMN pidfs_dev INTEGER;
ALTER TABLE executions ADD COLUMN pidfs_ino INTEGER;
ALTER TABLE executions ADD COLUMN pid_ns_ino INTEGER;
UPDATE meta SET value = '2' WHERE key = 'schema_version';
)sql";

// What v7 added, taken away again: a current file made into a v6 one.
constexpr char const* kDropV7 =
    "ALTER TABLE executions DROP COLUMN out_pub_state; "
    "ALTER TABLE executions DROP COLUMN out_artifact; "
    "ALTER TABLE executions DROP COLUMN out_pub_error; "
    "ALTER TABLE executions DROP COLUMN err_pub_state; "
    "ALTER TABLE executions DROP COLUMN err_artifact; "
    "ALTER TABLE executions DROP COLUMN err_pub_error; ";

std::string quote(std::string const& s) {
  return "'" + s + "'";
}
std::string hex_blob(std::vector<std::uint8_t> const& b) {
  static char const* d = "0123456789ABCDEF";
  std::string out = "X'";
  for (auto c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out + "'";
}

// The record a v1 row describes, as the current code sees it after migration.
ExecutionRecord v1_record(std::string const& id, core::Phase phase,
                          std::optional<std::int32_t> pid) {
  auto ex = make_execution(id, "act-" + id);
  ExecutionRecord r;
  r.execution_id = ex.execution_id;
  r.action_id = ex.action_id;
  r.process_id = ex.process_id;
  r.session_id = ex.session_id;
  r.plan_canonical = ex.plan_canonical;
  r.plan_digest = ex.plan_digest;
  r.backend = ex.backend;
  r.boundary = {core::Boundary::marker, "", std::string(32, 'c')};
  r.phase = phase;
  if (pid) {
    r.ownership.state = OwnershipState::legacy_unverified;
    r.ownership.pid = *pid;
    r.ownership.start_time_ticks = 777;
  }
  if (phase == core::Phase::terminal) r.terminal = fake_terminal("exited");
  return r;
}

// An INSERT of `r` in v1 columns, with the checksum a v1 writer computed.
std::string v1_insert(ExecutionRecord const& r, std::string checksum = {}) {
  if (checksum.empty()) checksum = record_checksum(r);
  bool const has_pid = r.ownership.state != OwnershipState::unassigned;
  std::string s =
      "INSERT INTO executions (execution_id, action_id, process_id, session_id, plan_canonical, "
      "plan_digest, backend, boundary_kind, cgroup_path, marker, phase, pid, start_time, trigger, "
      "out_observed, out_retained, out_dropped, out_complete, err_observed, err_retained, "
      "err_dropped, err_complete, terminal, terminal_digest, classification, recovery, checksum, "
      "created_ns, updated_ns) VALUES (" +
      quote(r.execution_id) + "," + quote(r.action_id) + "," + quote(r.process_id) + "," +
      quote(r.session_id) + "," + hex_blob(r.plan_canonical) + "," + quote(r.plan_digest) + "," +
      quote(r.backend) + ",'marker',''," + quote(r.boundary.marker_hex) + "," +
      quote(std::string{core::phase_wire(r.phase)}) + "," +
      (has_pid ? std::to_string(r.ownership.pid) : "NULL") + "," +
      (has_pid ? std::to_string(r.ownership.start_time_ticks) : "NULL") + ",NULL,0,0,0,1,0,0,0,1,";
  if (r.terminal) {
    s += hex_blob(r.terminal->bytes) + "," + quote(r.terminal->digest) + "," +
         quote(r.terminal->classification) + "," + quote(r.terminal->recovery) + ",";
  } else {
    s += "NULL,NULL,NULL,NULL,";
  }
  s += quote(checksum) + ",1,1);";
  s += "INSERT INTO claims VALUES (" + quote(r.action_id) + "," + quote(r.process_id) + "," +
       quote(r.execution_id) + ",1);";
  return s;
}

void build_v1(TempDir const& t) {
  std::filesystem::create_directories(t.state());
  auto db = sql::Db::open(t.db().string(), true);
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->exec(kV1));
  ASSERT_TRUE(db->exec(v1_insert(v1_record("ex-legacy", core::Phase::running, 31337))));
  ASSERT_TRUE(db->exec(v1_insert(v1_record("ex-auth", core::Phase::authorized, std::nullopt))));
  ASSERT_TRUE(db->exec(v1_insert(v1_record("ex-done", core::Phase::terminal, 4242))));
  // A v1 row whose checksum was already wrong: migration must not launder it.
  ASSERT_TRUE(db->exec(v1_insert(v1_record("ex-rotten", core::Phase::running, 99),
                                 "sha256:" + std::string(64, 'e'))));
  ASSERT_TRUE(db->exec("INSERT INTO claims VALUES ('act-orphan','proc-1','ex-orphan',2)"));
}

TEST(RegistryMigration, FromV1KeepsPidStartAsLegacyUnverified) {
  TempDir t;
  build_v1(t);
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg) << reg.error().message();
  EXPECT_EQ((*reg)->opened_version(), 1);

  auto legacy = (*reg)->get("ex-legacy");
  ASSERT_TRUE(legacy) << legacy.error().message();
  EXPECT_EQ(legacy->ownership.state, OwnershipState::legacy_unverified);
  EXPECT_EQ(legacy->ownership.pid, 31337);
  EXPECT_EQ(legacy->ownership.start_time_ticks, 777u);
  EXPECT_FALSE(legacy->ownership.has_pidfs_authority());
  // Never upgraded: neither staging over it nor committing it is accepted.
  CUSTOS_EXPECT_ERRC((*reg)->record_staged("ex-legacy", fake_staged(31337), {}),
                     Errc::registry_legacy_unverified);
  CUSTOS_EXPECT_ERRC((*reg)->record_committed("ex-legacy"), Errc::registry_legacy_unverified);

  auto auth = (*reg)->get("ex-auth");
  ASSERT_TRUE(auth);
  EXPECT_EQ(auth->ownership.state, OwnershipState::unassigned);
  EXPECT_EQ(auth->out.published_bytes, 0u);
  auto done = (*reg)->get("ex-done");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->terminal->classification, "exited");

  auto q = (*reg)->quarantined();
  ASSERT_EQ(q->size(), 1u);
  EXPECT_EQ((*q)[0].execution_id, "ex-rotten");

  auto orphans = (*reg)->orphan_claims();
  ASSERT_EQ(orphans->size(), 1u);
  EXPECT_EQ((*orphans)[0].execution_id, "ex-orphan");
  CUSTOS_EXPECT_ERRC((*reg)->consume_claim("act-ex-auth", "proc-1", "ex-again"),
                     Errc::registry_claim_consumed);
  // A migrated record keeps working with current writes.
  CUSTOS_ASSERT_OK((*reg)->record_staged("ex-auth", fake_staged(), {}));
  CUSTOS_ASSERT_OK((*reg)->record_publication("ex-done", 0, 0, true));
}

TEST(RegistryMigration, FromV1ThenReopenIsCurrent) {
  TempDir t;
  build_v1(t);
  { ASSERT_TRUE(Registry::open(t.state())); }
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg);
  EXPECT_EQ((*reg)->opened_version(), kSchemaVersion);
  auto db_text = [&](char const* sql) {
    auto db = sql::Db::open(t.db().string(), false);
    return db->query_text(sql);
  };
  reg->reset();
  EXPECT_EQ(*db_text("SELECT value FROM meta WHERE key='schema_version'"),
            std::to_string(kSchemaVersion));
}

// v4 -> v5 drops the phase index. A v4 file is a current one with the index put back, v6's column
// dropped and the version set to 4; its records and claims survive the steps.
TEST(RegistryMigration, FromV4DropsThePhaseIndexAndKeepsRecords) {
  TempDir t;
  {
    auto reg = Registry::open(t.state());
    ASSERT_TRUE(reg) << reg.error().message();
    CUSTOS_ASSERT_OK((*reg)->record_authorized(make_execution("ex-4", "act-4")));
  }
  raw_exec(t.db(), std::string{kDropV7} +
                       "CREATE INDEX executions_by_phase ON executions (phase); "
                       "ALTER TABLE executions DROP COLUMN marker_ns_ino; "
                       "UPDATE meta SET value = '4' WHERE key = 'schema_version';");
  auto index_count = [&] {
    auto db = sql::Db::open(t.db().string(), false);
    return db
        ->query_int(
            "SELECT count(*) FROM sqlite_master WHERE type='index' AND "
            "name='executions_by_phase'")
        ->value_or(-1);
  };
  EXPECT_EQ(index_count(), 1);
  {
    auto reg = Registry::open(t.state());
    ASSERT_TRUE(reg) << reg.error().message();
    EXPECT_EQ((*reg)->opened_version(), 4);
    auto rec = (*reg)->get("ex-4");
    ASSERT_TRUE(rec) << rec.error().message();
    EXPECT_EQ(rec->phase, core::Phase::authorized);
    EXPECT_TRUE((*reg)->quarantined()->empty());
    CUSTOS_EXPECT_ERRC((*reg)->consume_claim("act-4", "proc-1", "ex-again"),
                       Errc::registry_claim_consumed);
  }
  EXPECT_EQ(index_count(), 0);
}

// v5 -> v6 adds the marker sweep's PID namespace. A v5 file is a current one without that column;
// its staged record survives with no namespace (the daemon's), and a new one keeps its own.
TEST(RegistryMigration, FromV5AddsTheMarkerNamespaceAndKeepsRecords) {
  TempDir t;
  auto const old = make_execution("ex-5", "act-5");
  {
    auto reg = Registry::open(t.state());
    ASSERT_TRUE(reg) << reg.error().message();
    CUSTOS_ASSERT_OK((*reg)->record_authorized(old));
    CUSTOS_ASSERT_OK(
        (*reg)->record_staged("ex-5", fake_staged(555, 8888),
                              boundary_info(core::Boundary::marker, "", std::string(32, 'a'))));
  }
  raw_exec(t.db(), std::string{kDropV7} +
                       "ALTER TABLE executions DROP COLUMN marker_ns_ino; "
                       "UPDATE meta SET value = '5' WHERE key = 'schema_version';");
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg) << reg.error().message();
  EXPECT_EQ((*reg)->opened_version(), 5);
  EXPECT_TRUE((*reg)->quarantined()->empty());
  auto rec = (*reg)->get("ex-5");
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->boundary.marker_hex, std::string(32, 'a'));
  EXPECT_EQ(rec->boundary.marker_ns_ino, 0U);
  // A container execution's namespace is kept, and covered by the record's checksum.
  CUSTOS_ASSERT_OK((*reg)->record_authorized(make_execution("ex-6", "act-6")));
  CUSTOS_ASSERT_OK((*reg)->record_staged(
      "ex-6", fake_staged(556, 8889),
      boundary_info(core::Boundary::marker, "", std::string(32, 'b'), 4026532001ULL)));
  auto fresh = (*reg)->get("ex-6");
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_EQ(fresh->boundary.marker_ns_ino, 4026532001ULL);
  EXPECT_EQ(fresh->checksum, record_checksum(*fresh));
  reg->reset();
  raw_exec(t.db(), "UPDATE executions SET marker_ns_ino = 4026532002 WHERE execution_id='ex-6'");
  auto again = Registry::open(t.state());
  ASSERT_TRUE(again) << again.error().message();
  ASSERT_EQ((*again)->quarantined()->size(), 1U);
  EXPECT_EQ((*again)->quarantined()->front().execution_id, "ex-6");
}

TEST(RegistryMigration, FromV2KeepsStagedPidfsOwnership) {
  TempDir t;
  std::filesystem::create_directories(t.state());
  ExecutionRecord staged = v1_record("ex-staged", core::Phase::starting, std::nullopt);
  staged.ownership = fake_staged(555, 8888);
  ExecutionRecord legacy = v1_record("ex-legacy", core::Phase::running, 31337);
  {
    auto db = sql::Db::open(t.db().string(), true);
    ASSERT_TRUE(db);
    ASSERT_TRUE(db->exec(kV1));
    ASSERT_TRUE(db->exec(kV2Additions));
    // A v2 writer stored the pidfs identity in the v2 columns.
    ASSERT_TRUE(db->exec(v1_insert(staged)));
    ASSERT_TRUE(
        db->exec("UPDATE executions SET ownership='staged', boot_id='" + staged.ownership.boot_id +
                 "', pidfs_dev=15, pidfs_ino=8888, pid_ns_ino=4026531836, pid=555, start_time=1234 "
                 "WHERE execution_id='ex-staged'"));
    ASSERT_TRUE(db->exec(v1_insert(legacy)));
    ASSERT_TRUE(db->exec(
        "UPDATE executions SET ownership='legacy_unverified' WHERE execution_id='ex-legacy'"));
  }
  auto reg = Registry::open(t.state());
  ASSERT_TRUE(reg) << reg.error().message();
  EXPECT_EQ((*reg)->opened_version(), 2);
  for (auto const& q : *(*reg)->quarantined()) ADD_FAILURE() << q.execution_id << ": " << q.reason;
  auto rec = (*reg)->get("ex-staged");
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->ownership, fake_staged(555, 8888));
  CUSTOS_ASSERT_OK((*reg)->record_committed("ex-staged"));
  EXPECT_EQ((*reg)->get("ex-legacy")->ownership.state, OwnershipState::legacy_unverified);
}

TEST(RegistryMigration, UnreadableVersionIsSchemaUnknown) {
  TempDir t;
  std::filesystem::create_directories(t.state());
  {
    auto db = sql::Db::open(t.db().string(), true);
    ASSERT_TRUE(db->exec(kV1));
    ASSERT_TRUE(db->exec("UPDATE meta SET value='one' WHERE key='schema_version'"));
  }
  CUSTOS_EXPECT_ERRC(Registry::open(t.state()), Errc::registry_schema_unknown);
}

}  // namespace
}  // namespace custos::registry::test
