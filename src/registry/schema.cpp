// The registry schema, its append-only migrations, and the row <-> record mapping.
#include "schema.hpp"

#include <array>
#include <string>
#include <time.h>

namespace custos::registry::detail {

namespace {

// Version 1, as released. Process identity was a bare pid + start time.
constexpr std::string_view kSchemaV1 = R"sql(
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE claims (
  action_id    TEXT NOT NULL,
  process_id   TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  consumed_ns  INTEGER NOT NULL,
  PRIMARY KEY (action_id, process_id)
) WITHOUT ROWID;
CREATE INDEX claims_by_execution ON claims (execution_id);
CREATE TABLE executions (
  execution_id    TEXT PRIMARY KEY,
  action_id       TEXT NOT NULL,
  process_id      TEXT NOT NULL,
  session_id      TEXT NOT NULL,
  plan_canonical  BLOB NOT NULL,
  plan_digest     TEXT NOT NULL,
  backend         TEXT NOT NULL,
  boundary_kind   TEXT NOT NULL,
  cgroup_path     TEXT NOT NULL,
  marker          TEXT NOT NULL,
  phase           TEXT NOT NULL,
  pid             INTEGER,
  start_time      INTEGER,
  trigger         TEXT,
  out_observed    INTEGER NOT NULL,
  out_retained    INTEGER NOT NULL,
  out_dropped     INTEGER NOT NULL,
  out_complete    INTEGER NOT NULL,
  err_observed    INTEGER NOT NULL,
  err_retained    INTEGER NOT NULL,
  err_dropped     INTEGER NOT NULL,
  err_complete    INTEGER NOT NULL,
  terminal        BLOB,
  terminal_digest TEXT,
  classification  TEXT,
  recovery        TEXT,
  checksum        TEXT NOT NULL,
  created_ns      INTEGER NOT NULL,
  updated_ns      INTEGER NOT NULL
);
CREATE INDEX executions_by_phase ON executions (phase);
CREATE INDEX executions_by_session ON executions (session_id);
INSERT INTO meta (key, value) VALUES ('schema_id', 'custos-registry'), ('schema_version', '1');
)sql";

// v1 -> v2: pidfs ownership slots. A v1 pid/start value is kept as legacy_unverified and is
// never converted into pidfs authority (no observation happens here at all).
constexpr std::string_view kMigrateV1toV2 = R"sql(
ALTER TABLE executions ADD COLUMN ownership TEXT NOT NULL DEFAULT 'unassigned';
ALTER TABLE executions ADD COLUMN boot_id TEXT;
ALTER TABLE executions ADD COLUMN pidfs_dev INTEGER;
ALTER TABLE executions ADD COLUMN pidfs_ino INTEGER;
ALTER TABLE executions ADD COLUMN pid_ns_ino INTEGER;
UPDATE executions SET ownership = 'legacy_unverified' WHERE pid IS NOT NULL;
UPDATE meta SET value = '2' WHERE key = 'schema_version';
)sql";

// v2 -> v3: artifact publication progress per stream, and the quarantine list.
constexpr std::string_view kMigrateV2toV3 = R"sql(
ALTER TABLE executions ADD COLUMN out_published INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN out_pub_done INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN err_published INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN err_pub_done INTEGER NOT NULL DEFAULT 0;
CREATE TABLE quarantine (
  execution_id TEXT PRIMARY KEY,
  code         TEXT NOT NULL,
  reason       TEXT NOT NULL,
  detected_ns  INTEGER NOT NULL
) WITHOUT ROWID;
UPDATE meta SET value = '3' WHERE key = 'schema_version';
)sql";

// v3 -> v4: the gateway's authority (docs/authority.md "Storage"). One epoch for all authority,
// stored admin principals, grants (spec JSON + revision), their budget use, a lease epoch per
// workspace, leases (at most one active per workspace, by a unique partial index), and one
// authority use per authorized execution (grant, lease, holder, reservation, settled).
constexpr std::string_view kMigrateV3toV4 = R"sql(
CREATE TABLE authority_meta (
  key   TEXT PRIMARY KEY,
  value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO authority_meta (key, value) VALUES ('epoch', 0);
CREATE TABLE principals (
  principal  TEXT PRIMARY KEY,
  role       TEXT NOT NULL,
  revision   INTEGER NOT NULL,
  updated_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE grants (
  grant_id   TEXT PRIMARY KEY,
  revision   INTEGER NOT NULL,
  principal  TEXT NOT NULL,
  spec       TEXT NOT NULL,
  revoked    INTEGER NOT NULL,
  created_ns INTEGER NOT NULL,
  updated_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX grants_by_principal ON grants (principal);
CREATE TABLE budgets (
  grant_id         TEXT PRIMARY KEY,
  executions       INTEGER NOT NULL,
  cpu_ms_used      INTEGER NOT NULL,
  wall_ms_used     INTEGER NOT NULL,
  cpu_ms_reserved  INTEGER NOT NULL,
  wall_ms_reserved INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE lease_epochs (
  workspace_id TEXT PRIMARY KEY,
  epoch        INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE leases (
  lease_id       TEXT PRIMARY KEY,
  workspace_id   TEXT NOT NULL,
  holder_session TEXT NOT NULL,
  holder         TEXT NOT NULL,
  epoch          INTEGER NOT NULL,
  active         INTEGER NOT NULL,
  acquired_ns    INTEGER NOT NULL,
  ended_ns       INTEGER
) WITHOUT ROWID;
CREATE UNIQUE INDEX leases_one_active ON leases (workspace_id) WHERE active = 1;
CREATE TABLE authority_uses (
  execution_id     TEXT PRIMARY KEY,
  action_id        TEXT NOT NULL,
  process_id       TEXT NOT NULL,
  session_id       TEXT NOT NULL,
  generation       INTEGER NOT NULL,
  actor            TEXT NOT NULL,
  grant_id         TEXT,
  lease_id         TEXT,
  cpu_ms_reserved  INTEGER NOT NULL,
  wall_ms_reserved INTEGER NOT NULL,
  settled          INTEGER NOT NULL,
  expires_ns       INTEGER,
  authorized_ns    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX uses_by_grant ON authority_uses (grant_id);
CREATE INDEX uses_by_lease ON authority_uses (lease_id);
CREATE INDEX uses_by_holder ON authority_uses (session_id, generation);
UPDATE meta SET value = '4' WHERE key = 'schema_version';
)sql";

// v4 -> v5: no index on the phase. Every phase write moved the record's entry in it, one more
// WAL page per write for an index no query could use: list() filters with
// `(? IS NULL OR phase = ?)` and non_terminal() with `phase <> 'terminal'`, both scans, and
// open() validates every record anyway (docs/durability.md, "Making each commit cheap").
constexpr std::string_view kMigrateV4toV5 = R"sql(
DROP INDEX IF EXISTS executions_by_phase;
UPDATE meta SET value = '5' WHERE key = 'schema_version';
)sql";

// v5 -> v6: the PID namespace a container execution's marker sweep is limited to, so recovery
// sweeps the container's namespace (not the daemon's) for a gone execution's leftovers.
constexpr std::string_view kMigrateV5toV6 = R"sql(
ALTER TABLE executions ADD COLUMN marker_ns_ino INTEGER;
UPDATE meta SET value = '6' WHERE key = 'schema_version';
)sql";

// v6 -> v7: each stream's publication state, the digest of its artifact and the last
// publication error (docs/durability.md, "Output"). NULL is `pending`, no digest, no error: the
// values every record written before had, so their checksums stay valid.
constexpr std::string_view kMigrateV6toV7 = R"sql(
ALTER TABLE executions ADD COLUMN out_pub_state TEXT;
ALTER TABLE executions ADD COLUMN out_artifact TEXT;
ALTER TABLE executions ADD COLUMN out_pub_error TEXT;
ALTER TABLE executions ADD COLUMN err_pub_state TEXT;
ALTER TABLE executions ADD COLUMN err_artifact TEXT;
ALTER TABLE executions ADD COLUMN err_pub_error TEXT;
UPDATE meta SET value = '7' WHERE key = 'schema_version';
)sql";

// kMigrations[i] moves version i+1 to i+2. Append only; never edit a released step.
constexpr std::array<std::string_view, 6> kMigrations = {
    kMigrateV1toV2, kMigrateV2toV3, kMigrateV3toV4, kMigrateV4toV5, kMigrateV5toV6, kMigrateV6toV7};
static_assert(kMigrations.size() + 1 == static_cast<std::size_t>(kSchemaVersion),
              "every version above 1 needs exactly one migration step");

constexpr std::string_view kColumns =
    "execution_id, action_id, process_id, session_id, plan_canonical, plan_digest, backend, "
    "boundary_kind, cgroup_path, marker, phase, pid, start_time, trigger, "
    "out_observed, out_retained, out_dropped, out_complete, "
    "err_observed, err_retained, err_dropped, err_complete, "
    "terminal, terminal_digest, classification, recovery, checksum, created_ns, updated_ns, "
    "ownership, boot_id, pidfs_dev, pidfs_ino, pid_ns_ino, "
    "out_published, out_pub_done, err_published, err_pub_done, marker_ns_ino, "
    "out_pub_state, out_artifact, out_pub_error, err_pub_state, err_artifact, err_pub_error";
constexpr int kColumnCount = 45;

// u64 values are stored bit-for-bit in SQLite's signed 64-bit INTEGER.
std::int64_t to_i64(std::uint64_t v) noexcept {
  return static_cast<std::int64_t>(v);
}
std::uint64_t to_u64(std::int64_t v) noexcept {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

std::string_view schema_v1_ddl() noexcept {
  return kSchemaV1;
}
std::string_view record_columns() noexcept {
  return kColumns;
}

std::int64_t now_ns() noexcept {
  timespec ts{};
  (void)clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

Result<void> migrate(sql::Db& db, int from) {
  for (int v = from; v < kSchemaVersion; ++v) {
    auto const step = kMigrations[static_cast<std::size_t>(v - 1)];
    auto fail = [&](Error const& e) {
      (void)db.exec("ROLLBACK");
      return Error{Errc::registry_migration_failed, "migration v" + std::to_string(v) + " -> v" +
                                                        std::to_string(v + 1) + ": " + e.message()};
    };
    if (auto r = db.exec("BEGIN IMMEDIATE"); !r) return fail(r.error());
    if (auto r = db.exec(step); !r) return fail(r.error());
    auto ver = db.query_text("SELECT value FROM meta WHERE key = 'schema_version'");
    if (!ver) return fail(ver.error());
    if (*ver != std::to_string(v + 1)) {
      return fail(Error{Errc::registry_migration_failed, "version row not updated"});
    }
    if (auto r = db.exec("COMMIT"); !r) return fail(r.error());
  }
  return ok();
}

namespace {

Error bad_row(std::string const& id, std::string what) {
  return Error{Errc::registry_corrupt_record, id + ": " + std::move(what)};
}

Result<std::uint64_t> counter(sql::Stmt const& s, int col, std::string const& id,
                              char const* name) {
  if (s.type(col) != 1 /* SQLITE_INTEGER */) {
    return bad_row(id, std::string{name} + " is not an integer");
  }
  std::int64_t const v = s.int64(col);
  if (v < 0) return bad_row(id, std::string{name} + " is negative");
  return static_cast<std::uint64_t>(v);
}

}  // namespace

Result<ExecutionRecord> decode_row(sql::Stmt const& s) {
  ExecutionRecord r;
  r.execution_id = s.text(0);
  auto const& id = r.execution_id;
  r.action_id = s.text(1);
  r.process_id = s.text(2);
  r.session_id = s.text(3);
  r.plan_canonical = s.blob(4);
  r.plan_digest = s.text(5);
  r.backend = s.text(6);
  auto bk = boundary_kind_from_wire(s.text(7));
  if (!bk) return bad_row(id, "unknown boundary kind '" + s.text(7) + "'");
  r.boundary.kind = *bk;
  r.boundary.cgroup_path = s.text(8);
  r.boundary.marker_hex = s.text(9);
  r.boundary.marker_ns_ino = s.is_null(38) ? 0 : to_u64(s.int64(38));
  auto ph = core::phase_from_wire(s.text(10));
  if (!ph) return bad_row(id, "unknown phase '" + s.text(10) + "'");
  r.phase = *ph;
  auto own = ownership_state_from_wire(s.text(29));
  if (!own) return bad_row(id, "unknown ownership state '" + s.text(29) + "'");
  r.ownership.state = *own;
  if (r.ownership.has_pid()) {
    if (s.is_null(11)) return bad_row(id, "assigned ownership without a pid");
    std::int64_t const pid = s.int64(11);
    if (pid <= 0 || pid > 0x3fffffff) return bad_row(id, "pid out of range");
    r.ownership.pid = static_cast<std::int32_t>(pid);
    r.ownership.start_time_ticks = s.is_null(12) ? 0 : to_u64(s.int64(12));
  } else if (!s.is_null(11)) {
    return bad_row(id, "unassigned ownership with a pid");
  } else if (r.ownership.state == OwnershipState::marked && !s.is_null(12)) {
    r.ownership.start_time_ticks = to_u64(s.int64(12));
  }
  if (r.ownership.has_pidfs_authority()) {
    r.ownership.boot_id = s.text(30);
    r.ownership.pidfs_dev = to_u64(s.int64(31));
    r.ownership.pidfs_ino = to_u64(s.int64(32));
    r.ownership.pid_ns_ino = s.is_null(33) ? 0 : to_u64(s.int64(33));
  }
  if (auto t = s.opt_text(13)) {
    auto tr = core::trigger_from_wire(*t);
    if (!tr) return bad_row(id, "unknown trigger '" + *t + "'");
    r.trigger = *tr;
  }
  auto load_stream = [&](int base, int pub_base, int v7_base, StreamProgress& p) -> Result<void> {
    p.accounting.observed = CUSTOS_TRY(counter(s, base, id, "observed"));
    p.accounting.retained = CUSTOS_TRY(counter(s, base + 1, id, "retained"));
    p.accounting.dropped = CUSTOS_TRY(counter(s, base + 2, id, "dropped"));
    p.accounting.complete = s.int64(base + 3) != 0;
    p.published_bytes = CUSTOS_TRY(counter(s, pub_base, id, "published"));
    p.publication_done = s.int64(pub_base + 1) != 0;
    if (auto st = s.opt_text(v7_base)) {
      auto state = publication_state_from_wire(*st);
      if (!state) return bad_row(id, "unknown publication state '" + *st + "'");
      p.publication = *state;
    }
    p.artifact = s.opt_text(v7_base + 1).value_or("");
    p.publication_error = s.opt_text(v7_base + 2).value_or("");
    return ok();
  };
  CUSTOS_TRYV(load_stream(14, 34, 39, r.out));
  CUSTOS_TRYV(load_stream(18, 36, 42, r.err));
  if (!s.is_null(22)) {
    TerminalBlob t;
    t.bytes = s.blob(22);
    t.digest = s.text(23);
    t.classification = s.text(24);
    t.recovery = s.text(25);
    r.terminal = std::move(t);
  }
  r.checksum = s.text(26);
  r.created_ns = s.int64(27);
  r.updated_ns = s.int64(28);
  return r;
}

namespace {

// Columns an existing record may change; the identity, plan and creation time never change.
// Parameter numbers are the column's position + 1 (the numbering of kColumns), so the INSERT
// and the UPDATE share one binding routine.
constexpr std::string_view kUpdateSql =
    "UPDATE executions SET boundary_kind=?8, cgroup_path=?9, marker=?10, phase=?11, pid=?12, "
    "start_time=?13, trigger=?14, out_observed=?15, out_retained=?16, out_dropped=?17, "
    "out_complete=?18, err_observed=?19, err_retained=?20, err_dropped=?21, err_complete=?22, "
    "terminal=?23, terminal_digest=?24, classification=?25, recovery=?26, checksum=?27, "
    "updated_ns=?29, ownership=?30, boot_id=?31, pidfs_dev=?32, pidfs_ino=?33, pid_ns_ino=?34, "
    "out_published=?35, out_pub_done=?36, err_published=?37, err_pub_done=?38, "
    "marker_ns_ino=?39, out_pub_state=?40, out_artifact=?41, out_pub_error=?42, "
    "err_pub_state=?43, err_artifact=?44, err_pub_error=?45 "
    "WHERE execution_id=?1";

std::string insert_sql() {
  std::string sql = "INSERT INTO executions (";
  sql += kColumns;
  sql += ") VALUES (?1";
  for (int i = 2; i <= kColumnCount; ++i) sql += ",?" + std::to_string(i);
  sql += ")";
  return sql;
}

}  // namespace

Result<void> write_row(sql::Db& db, ExecutionRecord const& r, bool insert) {
  // An UPDATE of the changing columns only rewrites the row and the indexes of those columns
  // (not the primary key and session indexes), which keeps the WAL bytes per write small:
  // fewer bytes for the next fsync to flush (docs/durability.md).
  static std::string const kInsert = insert_sql();
  sql::StmtLease lease = CUSTOS_TRY(db.cached(insert ? std::string_view{kInsert} : kUpdateSql));
  sql::Stmt& s = *lease;
  auto const& o = r.ownership;
  bool const assigned = o.has_pid();
  bool const pidfs = o.has_pidfs_authority();
  auto opt_str = [](bool present, std::string_view v) {
    return present ? std::optional<std::string_view>{v} : std::nullopt;
  };
  auto opt_int = [](bool present, std::int64_t v) {
    return present ? std::optional<std::int64_t>{v} : std::nullopt;
  };
  // Every text and blob is the record's own (or a static wire name), alive for the one run:
  // borrowed, not copied (sqlite3 copies nothing; the lease's reset clears the bindings).
  constexpr auto kBorrowed = sql::Stmt::Bytes::borrowed;
  CUSTOS_TRYV(s.bind(1, std::string_view{r.execution_id}, kBorrowed));
  if (insert) {
    // The identity, the plan and the creation time never change: the UPDATE does not name them.
    CUSTOS_TRYV(s.bind(2, std::string_view{r.action_id}, kBorrowed));
    CUSTOS_TRYV(s.bind(3, std::string_view{r.process_id}, kBorrowed));
    CUSTOS_TRYV(s.bind(4, std::string_view{r.session_id}, kBorrowed));
    CUSTOS_TRYV(s.bind_blob(5, r.plan_canonical, kBorrowed));
    CUSTOS_TRYV(s.bind(6, std::string_view{r.plan_digest}, kBorrowed));
    CUSTOS_TRYV(s.bind(7, std::string_view{r.backend}, kBorrowed));
    CUSTOS_TRYV(s.bind(28, r.created_ns));
  }
  CUSTOS_TRYV(s.bind(8, boundary_kind_wire(r.boundary.kind), kBorrowed));
  CUSTOS_TRYV(s.bind(9, std::string_view{r.boundary.cgroup_path}, kBorrowed));
  CUSTOS_TRYV(s.bind(10, std::string_view{r.boundary.marker_hex}, kBorrowed));
  CUSTOS_TRYV(s.bind(11, core::phase_wire(r.phase), kBorrowed));
  CUSTOS_TRYV(s.bind(12, opt_int(assigned, o.pid)));
  bool const marked_since = o.state == OwnershipState::marked && o.start_time_ticks != 0;
  CUSTOS_TRYV(s.bind(13, opt_int(assigned || marked_since, to_i64(o.start_time_ticks))));
  CUSTOS_TRYV(
      s.bind(14, opt_str(r.trigger.has_value(), r.trigger ? core::trigger_wire(*r.trigger) : ""),
             kBorrowed));
  auto bind_stream = [&](int base, int pub_base, int v7_base,
                         StreamProgress const& p) -> Result<void> {
    CUSTOS_TRYV(s.bind(base, to_i64(p.accounting.observed)));
    CUSTOS_TRYV(s.bind(base + 1, to_i64(p.accounting.retained)));
    CUSTOS_TRYV(s.bind(base + 2, to_i64(p.accounting.dropped)));
    CUSTOS_TRYV(s.bind(base + 3, std::int64_t{p.accounting.complete ? 1 : 0}));
    CUSTOS_TRYV(s.bind(pub_base, to_i64(p.published_bytes)));
    CUSTOS_TRYV(s.bind(pub_base + 1, std::int64_t{p.publication_done ? 1 : 0}));
    CUSTOS_TRYV(s.bind(
        v7_base,
        opt_str(p.publication != PublicationState::pending, publication_state_wire(p.publication)),
        kBorrowed));
    CUSTOS_TRYV(s.bind(v7_base + 1, opt_str(!p.artifact.empty(), p.artifact), kBorrowed));
    CUSTOS_TRYV(
        s.bind(v7_base + 2, opt_str(!p.publication_error.empty(), p.publication_error), kBorrowed));
    return ok();
  };
  CUSTOS_TRYV(bind_stream(15, 35, 40, r.out));
  CUSTOS_TRYV(bind_stream(19, 37, 43, r.err));
  if (r.terminal) {
    CUSTOS_TRYV(s.bind_blob(23, r.terminal->bytes, kBorrowed));
    CUSTOS_TRYV(s.bind(24, std::string_view{r.terminal->digest}, kBorrowed));
    CUSTOS_TRYV(s.bind(25, std::string_view{r.terminal->classification}, kBorrowed));
    CUSTOS_TRYV(s.bind(26, std::string_view{r.terminal->recovery}, kBorrowed));
  } else {
    for (int i = 23; i <= 26; ++i) CUSTOS_TRYV(s.bind_null(i));
  }
  CUSTOS_TRYV(s.bind(27, std::string_view{r.checksum}, kBorrowed));
  CUSTOS_TRYV(s.bind(29, r.updated_ns));
  CUSTOS_TRYV(s.bind(30, ownership_state_wire(o.state), kBorrowed));
  CUSTOS_TRYV(s.bind(31, opt_str(pidfs, o.boot_id), kBorrowed));
  CUSTOS_TRYV(s.bind(32, opt_int(pidfs, to_i64(o.pidfs_dev))));
  CUSTOS_TRYV(s.bind(33, opt_int(pidfs, to_i64(o.pidfs_ino))));
  CUSTOS_TRYV(s.bind(34, opt_int(pidfs && o.pid_ns_ino != 0, to_i64(o.pid_ns_ino))));
  CUSTOS_TRYV(s.bind(39, opt_int(r.boundary.marker_ns_ino != 0, to_i64(r.boundary.marker_ns_ino))));
  CUSTOS_TRYV(s.run());
  if (!insert && db.changes() != 1) {
    return Error{Errc::registry_not_found, "no execution " + r.execution_id + " to update"};
  }
  return ok();
}

}  // namespace custos::registry::detail
