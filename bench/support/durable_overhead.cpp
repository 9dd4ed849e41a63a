// The registry's durable-writes model: durable overhead per execution vs one FULL commit.
#include "custos/bench/durable_overhead.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/core/plan_json.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"
#include "custos/registry/sqlite.hpp"
#include "custos/registry/wal_vfs.hpp"

namespace custos::bench {

// The registry's own vocabulary: this model drives the registry exactly as RegistrySink does.
namespace sql = registry::sql;
using registry::Durability;
using registry::make_new_execution;
using registry::NewExecution;
using registry::OpenOptions;
using registry::Ownership;
using registry::OwnershipState;
using registry::Registry;
using registry::sha256_tagged;
using registry::TerminalBlob;
using registry::WriteMode;

namespace {

using Clock = std::chrono::steady_clock;

double median_us(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU time of the calling thread (the daemon's loop thread, in the model), in microseconds.
double thread_cpu_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One FULL commit of a one-row transaction, the unit every ratio is expressed in.
Result<double> measure_floor(std::filesystem::path const& dir, std::size_t n) {
  auto db = CUSTOS_TRY(sql::Db::open((dir / "floor.db").string(), true));
  CUSTOS_TRYV(db.exec("PRAGMA journal_mode = WAL"));
  CUSTOS_TRYV(db.exec("PRAGMA synchronous = FULL"));
  CUSTOS_TRYV(db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)"));
  auto ins = CUSTOS_TRY(db.prepare("INSERT INTO t (v) VALUES (?)"));
  std::vector<std::uint8_t> const payload(200, 0x5a);
  std::vector<double> samples;
  samples.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto const t0 = Clock::now();
    CUSTOS_TRYV(db.exec("BEGIN IMMEDIATE"));
    CUSTOS_TRYV(ins.bind_blob(1, payload));
    CUSTOS_TRYV(ins.run());
    ins.reset();
    CUSTOS_TRYV(db.exec("COMMIT"));
    samples.push_back(us_since(t0));
  }
  return median_us(std::move(samples));
}

Ownership bench_owner(std::size_t i) {
  Ownership o;
  o.state = OwnershipState::staged;
  o.boot_id = "01234567-89ab-cdef-0123-456789abcdef";
  o.pidfs_dev = 15;
  o.pidfs_ino = 1'000'000 + i;
  o.pid = static_cast<std::int32_t>(1000 + i % 30000);
  o.start_time_ticks = 42;
  return o;
}

// The durable writes of one execution's life, as the supervisor makes them through
// supervisor::RegistrySink with an event loop (docs/durability.md, "Which writes wait"):
//   claim + record (group durability, its fsync awaited after the staged write) |
//   starting + staged | committed + running | exited + closed + 2 x output accounting +
//   terminal.
// Four transactions and ten writes. The exit is a lazy write (RegistrySink::kLazyFlushBound):
// in the daemon the close follows it within a millisecond or two, and the terminal record
// (which somebody waits for) takes it along.
struct Request {
  std::string id;
  core::ExecutionIdentity identity;
  core::ExecutionPlan plan;
};

// What the RPC layer hands the supervisor: parsed identity and plan (outside the timed part; the
// registry's work starts at the canonical encoding of the new record).
Result<Request> bench_request(std::string id) {
  // A real plan (core-encoded), so the record passes the same checks as a daemon's.
  boost::json::object ident{
      {"project_id", "bench"},    {"session_id", "bench"}, {"run_id", "r1"},
      {"attempt_id", "a1"},       {"turn_id", "t1"},       {"action_id", "act-" + id},
      {"process_id", "proc-1"},   {"workspace_id", "w1"},  {"resource_id", "res1"},
      {"environment_id", "env1"}, {"generation", 1},       {"revision", 1}};
  boost::json::object plan{
      {"command", {{"executable", "/bin/true"}, {"argv", boost::json::array{"true", id}}}},
      {"workspace", {{"root", "/tmp"}, {"access", "read_only"}}},
      {"cwd", "."},
      {"env", boost::json::array{}},
      {"io", {{"mode", "pipes"}}}};
  Request r;
  r.identity = CUSTOS_TRY(core::parse_identity(ident));
  r.plan = CUSTOS_TRY(core::parse_plan(plan));
  r.id = std::move(id);
  return r;
}

Result<std::vector<Request>> bench_requests(std::string const& prefix, std::size_t n) {
  std::vector<Request> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(CUSTOS_TRY(bench_request(prefix + std::to_string(i))));
  return out;
}

// SQLite's own cost of the write a waited registry transaction makes: the registry's file,
// opened as the registry opens it (its WAL VFS, exclusive locking, NORMAL, in-memory statement
// journals), one `BEGIN IMMEDIATE` + UPDATE of a record's changing columns (the phase, four
// accounting columns, the checksum and the time: SQLite rewrites the row's whole cell whatever
// the SET list names) + `COMMIT` per execution of the sequential phase, on this thread's CPU.
Result<double> measure_sqlite_update(std::filesystem::path const& state_dir,
                                     std::vector<Request> const& rows) {
  auto db = CUSTOS_TRY(
      sql::Db::open((state_dir / "registry.db").string(), false, sql::wal_coalescing_vfs()));
  CUSTOS_TRYV(db.exec("PRAGMA locking_mode = EXCLUSIVE"));
  CUSTOS_TRYV(db.exec("PRAGMA journal_mode = WAL"));
  CUSTOS_TRYV(db.exec("PRAGMA synchronous = NORMAL"));
  CUSTOS_TRYV(db.exec("PRAGMA temp_store = MEMORY"));
  auto begin = CUSTOS_TRY(db.prepare("BEGIN IMMEDIATE"));
  auto commit = CUSTOS_TRY(db.prepare("COMMIT"));
  auto update = CUSTOS_TRY(
      db.prepare("UPDATE executions SET phase = ?2, out_observed = ?3, out_retained = ?3, "
                 "err_observed = ?3, err_retained = ?3, checksum = ?4, updated_ns = ?5 "
                 "WHERE execution_id = ?1"));
  std::string const checksum = "sha256:" + std::string(64, '0');
  std::vector<double> cpu;
  cpu.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double const c0 = thread_cpu_us();
    CUSTOS_TRYV(begin.run());
    begin.reset();
    CUSTOS_TRYV(update.bind(1, std::string_view{rows[i].id}));
    CUSTOS_TRYV(update.bind(2, std::string_view{"terminal"}));
    CUSTOS_TRYV(update.bind(3, static_cast<std::int64_t>(i)));
    CUSTOS_TRYV(update.bind(4, std::string_view{checksum}));
    CUSTOS_TRYV(update.bind(5, static_cast<std::int64_t>(i)));
    CUSTOS_TRYV(update.run());
    update.reset();
    CUSTOS_TRYV(commit.run());
    commit.reset();
    cpu.push_back(thread_cpu_us() - c0);
  }
  return median_us(std::move(cpu));
}

// A/B aids (development only; the rows use the defaults): CUSTOS_BENCH_REGISTRY_CLAIM=full
// commits the claim with synchronous=FULL as before group durability,
// CUSTOS_BENCH_REGISTRY_CACHE=0 opens the registry without its record cache.
bool env_is(char const* name, std::string_view value) {
  char const* v = std::getenv(name);
  return v != nullptr && value == v;
}

// The writing thread's CPU clock spent in two of the transactions (zero when not asked).
struct TransactionCpu {
  double running = 0;
  double terminal = 0;
};

Result<void> one_execution(Registry& reg, Request const& req, std::size_t i,
                           TerminalBlob const& terminal, Durability claim,
                           TransactionCpu* cpu = nullptr) {
  std::string const& id = req.id;
  NewExecution const ex = CUSTOS_TRY(make_new_execution(id, req.identity, req.plan));
  constexpr auto deferred = WriteMode::deferred;
  // As RegistrySink: the claim with group durability, its fdatasync awaited after the staged
  // write (make_durable, before the barrier release).
  CUSTOS_TRYV(reg.record_authorized(ex, claim));
  CUSTOS_TRYV(reg.record_phase(id, core::Phase::starting, deferred));
  CUSTOS_TRYV(
      reg.record_staged(id, bench_owner(i), {core::Boundary::marker, "", std::string(32, 'b')}));
  CUSTOS_TRYV(reg.await_durable());
  CUSTOS_TRYV(reg.record_committed(id, deferred));
  double const running0 = cpu != nullptr ? thread_cpu_us() : 0;
  CUSTOS_TRYV(reg.record_phase(id, core::Phase::running));
  if (cpu != nullptr) cpu->running = thread_cpu_us() - running0;
  CUSTOS_TRYV(reg.record_phase(id, core::Phase::exited, deferred));
  CUSTOS_TRYV(reg.record_phase(id, core::Phase::closed, deferred));
  core::StreamAccounting const acc{0, 0, 0, true};
  CUSTOS_TRYV(reg.record_output(id, 0, acc, deferred));
  CUSTOS_TRYV(reg.record_output(id, 1, acc, deferred));
  double const terminal0 = cpu != nullptr ? thread_cpu_us() : 0;
  CUSTOS_TRYV(reg.record_terminal(id, terminal));
  if (cpu != nullptr) cpu->terminal = thread_cpu_us() - terminal0;
  if (auto e = reg.take_deferred_error(id)) return *e;
  return ok();
}

}  // namespace

Result<DurableOverheadResult> durable_overhead(std::filesystem::path const& scratch_dir,
                                               std::size_t executions, std::size_t threads) {
  DurableOverheadResult out;
  out.threads = std::max<std::size_t>(threads, 1);
  out.executions = std::max<std::size_t>(executions, 1);
  auto const dir = scratch_dir / ("custos-registry-bench-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error{Errc::registry_io, "create " + dir.string() + ": " + ec.message()};
  struct Cleanup {
    std::filesystem::path p;
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(p, e);
    }
  } const cleanup{dir};

  out.full_commit_us = CUSTOS_TRY(measure_floor(dir, out.executions));

  TerminalBlob terminal;
  std::string const body(400, 't');
  terminal.bytes.assign(body.begin(), body.end());
  terminal.digest = sha256_tagged(terminal.bytes);
  terminal.classification = "exited";
  terminal.recovery = "observed";

  OpenOptions options;
  if (env_is("CUSTOS_BENCH_REGISTRY_CACHE", "0")) options.record_cache_entries = 0;
  Durability const claim =
      env_is("CUSTOS_BENCH_REGISTRY_CLAIM", "full") ? Durability::full : Durability::group;
  auto reg = CUSTOS_TRY(Registry::open(dir / "state", options));
  auto const seq = CUSTOS_TRY(bench_requests("seq-", out.executions));
  auto const par = CUSTOS_TRY(bench_requests("par-", out.executions));
  std::vector<double> samples;
  std::vector<double> cpu;
  std::vector<double> running_cpu;
  std::vector<double> terminal_cpu;
  samples.reserve(out.executions);
  cpu.reserve(out.executions);
  for (std::size_t i = 0; i < out.executions; ++i) {
    auto const t0 = Clock::now();
    double const c0 = thread_cpu_us();
    TransactionCpu txn;
    CUSTOS_TRYV(one_execution(*reg, seq[i], i, terminal, claim, &txn));
    cpu.push_back(thread_cpu_us() - c0);
    samples.push_back(us_since(t0));
    running_cpu.push_back(txn.running);
    terminal_cpu.push_back(txn.terminal);
  }
  out.running_txn_cpu_us = median_us(std::move(running_cpu));
  out.terminal_txn_cpu_us = median_us(std::move(terminal_cpu));
  out.sequential_us = median_us(std::move(samples));
  out.sequential_cpu_us = median_us(std::move(cpu));

  auto const before = reg->write_stats();
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto const t0 = Clock::now();
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < out.threads; ++t) {
    pool.emplace_back([&] {
      for (;;) {
        std::size_t const i = next.fetch_add(1);
        if (i >= out.executions) return;
        if (!one_execution(*reg, par[i], i + out.executions, terminal, claim)) {
          failed = true;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  out.concurrent_us = us_since(t0) / static_cast<double>(out.executions);
  if (failed) return Error{Errc::registry_io, "a concurrent benchmark execution failed"};
  auto const after = reg->write_stats();
  out.concurrent_transactions = after.transactions - before.transactions;
  out.concurrent_full_commits = after.full_commits - before.full_commits;
  out.concurrent_flushes = after.flushes - before.flushes;
  out.concurrent_writes = after.writes - before.writes;
  reg.reset();  // releases the file (flock, exclusive lock) for the floor below
  out.sqlite_txn_cpu_us = CUSTOS_TRY(measure_sqlite_update(dir / "state", seq));

  if (out.full_commit_us > 0) {
    out.sequential_ratio = out.sequential_us / out.full_commit_us;
    out.concurrent_ratio = out.concurrent_us / out.full_commit_us;
  }
  return out;
}

}  // namespace custos::bench
