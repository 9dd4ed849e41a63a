// The execution registry: one SQLite database (WAL) under the daemon's state directory that
// remembers every execution from its one-use claim to its single terminal record.
//
// What it guarantees (docs/registry.md, docs/durability.md):
//   - exactly one opener per state directory (flock on <state_dir>/registry.lock);
//   - schema identity "custos-registry" + version in `meta`; older versions are migrated by
//     append-only steps, a newer version is refused;
//   - every record carries a SHA-256 checksum over its canonical bytes; a record whose checksum,
//     encoding, digest or phase/ownership consistency fails at open is quarantined: kept, listed,
//     never acted on, and the open still succeeds;
//   - one-use claims (action_id, process_id), consumed in their own synchronous=FULL transaction;
//   - ownership slots unassigned -> staged -> committed (pidfs identity); legacy_unverified
//     (pid/start time only) is kept and shown but refused for any process action;
//   - every phase change is checked with core::is_legal_progression before it is written;
//   - concurrent writers share transactions and fsyncs (group commit);
//   - writes that gate nothing may be deferred (WriteMode::deferred): queued in order and
//     committed with the next immediate write or flush(), one transaction for all of them;
//   - a claim may be committed with Durability::group: in the WAL when the call returns, made
//     power-loss durable by the registry's flusher thread (fdatasync of the WAL) without the
//     writer waiting; await_durable() is the wait, paid where it gates something;
//   - the records of live executions this Registry wrote or loaded are kept in a bounded
//     write-through cache (the daemon holds the file exclusively), so a write does not re-read
//     and re-verify the row it wrote last.
//
// Thread safety: every public member may be called from any thread. Writes are queued and
// committed in batches by whichever caller becomes the batch leader. The only background thread
// is the durability flusher, started by the first group commit (a Registry that never makes one
// has none, so a forked child may open its own Registry) and joined by the destructor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "custos/core/accounting.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/latency_histogram.hpp"
#include "custos/core/lifecycle.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/registry/sqlite.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::registry {

inline constexpr std::string_view kSchemaId = "custos-registry";
// Version history (append-only; docs/registry.md "Migrations"):
//   1  executions with a bare pid + start time as process identity, claims, meta
//   2  pidfs ownership slots (state, boot id, pidfs dev/ino, pid namespace); v1 pid/start values
//      become legacy_unverified
//   3  artifact publication progress per stream, the quarantine table
//   4  the gateway's authority tables: epoch, principals, grants, budgets, lease epochs,
//      leases, authority uses (docs/authority.md "Storage")
//   5  the index on executions.phase is dropped (no query used it; each phase write paid a page)
//   6  the PID namespace of a container execution's marker sweep
//   7  per-stream publication state, artifact digest and last publication error
inline constexpr int kSchemaVersion = 7;

// How hard a write is pushed to disk when its transaction commits (WAL mode):
//   full    synchronous=FULL: the WAL is fsync'ed at commit; survives power loss.
//   normal  synchronous=NORMAL: the commit is in the WAL (page cache) without fsync; survives a
//           crash of the daemon process, not of the machine. The next FULL commit or checkpoint
//           makes it durable, in order.
//   group   committed like `normal` (the WAL frames are written with pwrite before the call
//           returns), then the registry's flusher thread makes them power-loss durable with an
//           fdatasync of the WAL file: the very bytes a FULL commit syncs, without the writer
//           waiting. One fdatasync covers every group commit that returned before it started.
//           Registry::await_durable() waits for it; until it returned the write is as durable
//           as `normal` (docs/durability.md "Group durability").
// Strictness (what a shared transaction commits with): normal < group < full.
enum class Durability : std::uint8_t { normal, full, group };

// When a write is committed (docs/durability.md, "What each write must survive"):
//   now       before the call returns (group commit with whatever else is queued).
//   deferred  queued in order and committed by the next `now` write (in its transaction, ahead
//             of it), by flush(), or when the Registry is destroyed. The call only checks what
//             it can check without the database; a refusal found at commit is kept per
//             execution for take_deferred_error(). A daemon crash loses queued writes: use it
//             only for writes whose loss recovery handles (the record is then older than
//             reality, which recovery never turns into success), and only with a caller that
//             flushes promptly (RegistrySink: once per event-loop turn).
enum class WriteMode : std::uint8_t { now, deferred };

struct OpenOptions {
  // Create the state directory and database when missing.
  bool create_if_missing = true;
  // Group commit: at most this many queued writes share one transaction.
  std::size_t max_batch = 64;
  // Durability of ownership/phase/accounting writes and of the terminal record. Claims are
  // always `full` (a consumed authorization must never come back); not configurable.
  Durability ownership_durability = Durability::normal;
  Durability terminal_durability = Durability::normal;
  // The WAL is extended to this size with written zeros at open (0: never). Sized to hold the
  // checkpoint window (wal_autocheckpoint: ~8 MiB of pages + frame headers) so the WAL does
  // not grow in operation and a FULL commit has no file size to sync (docs/durability.md).
  std::uint64_t wal_presize_bytes = 9ULL << 20;
  // Run PRAGMA quick_check at open (detects a truncated or damaged file before any record is
  // trusted). Costs O(database size); on by default.
  bool integrity_check = true;
  // At most this many records of non-terminal executions are kept in the write-through cache
  // (the oldest written is evicted first; 0 disables the cache).
  std::size_t record_cache_entries = 4096;
};

// The boundary as stored: core's enum, or none before the root exists ("none" on the wire).
using BoundaryKind = std::optional<core::Boundary>;
[[nodiscard]] std::string_view boundary_kind_wire(BoundaryKind k) noexcept;
// nullopt for an unknown name; a known one gives the (possibly empty) kind.
[[nodiscard]] std::optional<BoundaryKind> boundary_kind_from_wire(std::string_view w) noexcept;

// Where the execution's process tree lives: a per-execution cgroup (absolute path of its v2
// directory) and/or the marker carried in its environment (32 hex digits). The marker is kept
// for every execution because the final sweep of a cgroup execution uses it too.
struct BoundaryInfo {
  BoundaryKind kind;
  std::string cgroup_path;
  std::string marker_hex;
  // The PID namespace the marker sweep is limited to: a container's (since v6); 0: the daemon's.
  std::uint64_t marker_ns_ino = 0;

  friend bool operator==(BoundaryInfo const&, BoundaryInfo const&) = default;
};

// modelled: the root is the reference backend's model, which lives in the daemon's memory only:
// no process, no pid, nothing for recovery to re-acquire (it is absent after any restart).
// marked: an ungated container exec (its plan accepted the marker boundary for an image that
// cannot run the gate): its processes are known by the recorded marker and PID namespace only;
// no pidfs identity was recorded before it started, so recovery sweeps it and never adopts it.
enum class OwnershipState : std::uint8_t {
  unassigned,
  staged,
  committed,
  legacy_unverified,
  modelled,
  marked
};
[[nodiscard]] std::string_view ownership_state_wire(OwnershipState s) noexcept;
[[nodiscard]] std::optional<OwnershipState> ownership_state_from_wire(std::string_view w) noexcept;

// The process slot of an execution. Staged and committed hold a pidfs identity: boot id +
// pidfs device + inode are the only positive authority; pid is a locator and start time / pid
// namespace inode are negative evidence only. legacy_unverified holds pid + start time and
// nothing else; it is never promoted to pidfs authority by observation.
struct Ownership {
  OwnershipState state = OwnershipState::unassigned;
  std::string boot_id;          // staged/committed
  std::uint64_t pidfs_dev = 0;  // staged/committed
  std::uint64_t pidfs_ino = 0;  // staged/committed
  std::int32_t pid = 0;         // all but unassigned and modelled
  // all but unassigned and modelled (0 = unknown); marked: a time before the exec started
  std::uint64_t start_time_ticks = 0;
  std::uint64_t pid_ns_ino = 0;  // staged/committed: the pid namespace pid is valid in

  [[nodiscard]] bool has_pidfs_authority() const noexcept {
    return state == OwnershipState::staged || state == OwnershipState::committed;
  }
  // A pid is recorded (staged, committed, legacy_unverified).
  [[nodiscard]] bool has_pid() const noexcept {
    return state != OwnershipState::unassigned && state != OwnershipState::modelled &&
           state != OwnershipState::marked;
  }
  // A phase past starting is allowed: the ownership committed, a model or a marked exec
  // released (neither has a slot to commit), or a legacy record.
  [[nodiscard]] bool started() const noexcept {
    return state == OwnershipState::committed || state == OwnershipState::modelled ||
           state == OwnershipState::marked || state == OwnershipState::legacy_unverified;
  }
  friend bool operator==(Ownership const&, Ownership const&) = default;
};

// Where a stream's publication to the artifact store stands (docs/durability.md, "Output"):
//   pending    not attempted yet (every stream until its execution is terminal)
//   published  its retained bytes are the artifact `artifact` (complete or incomplete evidence,
//              as the stream's accounting says)
//   empty      it retained no byte: done, and no artifact exists for it
//   failed     the last attempt failed (publication_error); the next one retries it
//   lost       its spool is gone: nothing can be published, ever (publication_error says why)
enum class PublicationState : std::uint8_t { pending, published, empty, failed, lost };
[[nodiscard]] std::string_view publication_state_wire(PublicationState s) noexcept;
[[nodiscard]] std::optional<PublicationState> publication_state_from_wire(
    std::string_view w) noexcept;

// Output accounting and artifact publication progress of one stream.
struct StreamProgress {
  core::StreamAccounting accounting;
  std::uint64_t published_bytes = 0;  // bytes of the spool published to the artifact store
  bool publication_done = false;      // published, empty or lost: nothing left to do
  PublicationState publication = PublicationState::pending;  // since v7
  std::string artifact;           // since v7: "sha256:<hex>" of the published bytes
  std::string publication_error;  // since v7: "<code>: <message>" of a failed or lost stream

  friend bool operator==(StreamProgress const&, StreamProgress const&) = default;
};

// One publication outcome of a stream, as Registry::record_publication takes it.
struct StreamPublication {
  PublicationState state = PublicationState::pending;
  std::uint64_t bytes = 0;  // published: the artifact's size (= the stream's retained bytes)
  std::string artifact;     // published: "sha256:<hex>"
  std::string error;        // failed, lost: "<code>: <message>"
};

// The terminal record as stored: core canonical bytes + digest, and two denormalized columns
// for listing without decoding.
struct TerminalBlob {
  std::vector<std::uint8_t> bytes;  // core::canonical_bytes(TerminalRecord)
  std::string digest;               // "sha256:<hex>" of bytes
  std::string classification;       // core::classification_wire
  std::string recovery;             // core::recovery_path_wire

  friend bool operator==(TerminalBlob const&, TerminalBlob const&) = default;
};

// What the registry needs to create a record (phase `authorized`).
struct NewExecution {
  std::string execution_id;
  std::string action_id;
  std::string process_id;
  std::string session_id;
  std::vector<std::uint8_t> plan_canonical;  // core canonical bytes of identity + effective plan
  std::string plan_digest;                   // "sha256:<hex>" of plan_canonical
  std::string backend;                       // "native", "reference", "docker", "podman"
};

struct ExecutionRecord {
  std::string execution_id;
  std::string action_id;
  std::string process_id;
  std::string session_id;
  std::vector<std::uint8_t> plan_canonical;
  std::string plan_digest;
  std::string backend;
  BoundaryInfo boundary;
  core::Phase phase = core::Phase::authorized;
  Ownership ownership;
  std::optional<core::Trigger> trigger;  // first accepted cancellation trigger
  StreamProgress out;                    // stdout, or the pty stream in PTY mode
  StreamProgress err;                    // stderr (unused in PTY mode)
  std::optional<TerminalBlob> terminal;
  std::string checksum;         // "sha256:<hex>" of record_canonical_bytes()
  std::int64_t created_ns = 0;  // CLOCK_REALTIME, informational (not checksummed)
  std::int64_t updated_ns = 0;

  friend bool operator==(ExecutionRecord const&, ExecutionRecord const&) = default;
};

// The canonical bytes the checksum covers: every durable field above except checksum and the
// timestamps, in core's canonical encoding (record kind 0x0300). Fields equal to their default
// are omitted, so a column added by a later schema version with its default does not change the
// bytes of records written before it (docs/registry.md "Checksum").
[[nodiscard]] std::vector<std::uint8_t> record_canonical_bytes(ExecutionRecord const& rec);
[[nodiscard]] std::string record_checksum(ExecutionRecord const& rec);
// "sha256:<64 lowercase hex>" of bytes.
[[nodiscard]] std::string sha256_tagged(std::span<std::uint8_t const> bytes);

// Structural checks a record must pass before it is trusted: checksum, plan digest, terminal
// digest, phase/ownership/terminal consistency, accounting invariants; with `deep`, also that
// the canonical plan bytes decode (core::decode_execution) and name the same action, process
// and session as the record's columns. Open and record creation check deep; the write path
// re-checks the checksum only (it covers the same bytes).
// Errors: registry.corrupt_record (checksum, digest, encoding), registry.illegal_phase
// (a phase the record could not legally be in).
[[nodiscard]] Result<void> validate_record(ExecutionRecord const& rec, bool deep = true);
// validate_record without the two checks over the whole bytes (checksum, plan digest): for a
// record the caller has just verified or sealed itself (the write path: loaded and verified,
// changed, checksum recomputed from the very bytes that are stored).
[[nodiscard]] Result<void> validate_record_content(ExecutionRecord const& rec, bool deep);

struct Claim {
  std::string action_id;
  std::string process_id;
  std::string execution_id;
  std::int64_t consumed_ns = 0;

  friend bool operator==(Claim const&, Claim const&) = default;
};

struct QuarantinedRecord {
  std::string execution_id;
  std::string code;    // stable error code, e.g. "registry.corrupt_record"
  std::string reason;  // human detail
  std::int64_t detected_ns = 0;
};

struct ListFilter {
  std::optional<core::Phase> phase;
  std::optional<std::string> session_id;
  std::string after_id;  // cursor: only ids greater than this
  std::size_t limit = 1000;
};

// Counters of the write path, for benchmarks and doctor output.
struct WriteStats {
  std::uint64_t writes = 0;           // jobs committed or failed
  std::uint64_t transactions = 0;     // transactions committed
  std::uint64_t full_commits = 0;     // of which synchronous=FULL
  std::uint64_t deferred = 0;         // of the writes, queued as WriteMode::deferred
  std::uint64_t deferred_failed = 0;  // deferred writes refused at commit
  std::uint64_t flushes = 0;          // fdatasyncs the durability flusher started (group commits)
  std::uint64_t durable_waits = 0;    // await_durable() calls that had to wait for a flush
  std::uint64_t cache_hits = 0;       // record writes that found their record in the cache
  std::uint64_t cache_misses = 0;     // record writes that loaded and verified it from the file
};

class Registry {
 public:
  // Opens (creating when allowed) <state_dir>/registry.db, holding <state_dir>/registry.lock.
  // Order: lock -> open -> integrity check -> schema id/version -> migrate -> validate every
  // record (quarantine failures). No process is inspected here (recovery.hpp).
  // Errors: registry.locked (another opener; the message names its pid when known),
  // registry.corrupt_database (not a SQLite file, truncated, damaged),
  // registry.schema_unknown (a SQLite file that is not a custos registry),
  // registry.schema_newer (written by a newer custos), registry.migration_failed,
  // registry.open_failed / registry.io.
  [[nodiscard]] static Result<std::unique_ptr<Registry>> open(
      std::filesystem::path const& state_dir, OpenOptions const& options = {});
  ~Registry();
  Registry(Registry const&) = delete;
  Registry& operator=(Registry const&) = delete;

  [[nodiscard]] std::filesystem::path const& state_dir() const noexcept { return state_dir_; }
  [[nodiscard]] std::filesystem::path db_path() const;
  // The schema version the file had before this open migrated it (== kSchemaVersion if none).
  [[nodiscard]] int opened_version() const noexcept { return opened_version_; }

  // ---- claims ---------------------------------------------------------------------------------
  // Consumes (action_id, process_id) for execution_id in its own BEGIN IMMEDIATE transaction
  // committed with synchronous=FULL (concurrent claims share one fsync), or with `group`: in the
  // WAL on return, power-loss durable once the flusher's fdatasync covered it (await_durable()).
  // Errors: registry.claim_consumed when the pair was ever consumed before.
  [[nodiscard]] Result<void> consume_claim(std::string_view action_id, std::string_view process_id,
                                           std::string_view execution_id,
                                           Durability d = Durability::full);
  [[nodiscard]] Result<std::optional<Claim>> find_claim(std::string_view action_id,
                                                        std::string_view process_id);
  // Claims whose execution record does not exist (a crash between claim and record). Kept
  // forever: the pair stays consumed.
  [[nodiscard]] Result<std::vector<Claim>> orphan_claims();

  // ---- records --------------------------------------------------------------------------------
  // Creates the record in phase `authorized`. The claim must already be consumed for this
  // execution_id. Errors: registry.not_found (no claim for it), registry.corrupt_record (an
  // execution with that id exists), registry.io. Deferred: the digest is checked now, the rest
  // at commit (record_staged of the same execution commits it, in its transaction, first).
  [[nodiscard]] Result<void> create_execution(NewExecution const& ex,
                                              WriteMode mode = WriteMode::now);
  // consume_claim + create_execution as ONE job of a synchronous=FULL transaction (or `group`:
  // see Durability; the caller then awaits await_durable() before it acts on the claim): the
  // claim and its record are durable together (no orphan claim can come from this path; the
  // gateway's path, claim with its authority use and then the record, still can). The failpoint
  // after_claim fires after the commit. Errors: as consume_claim and create_execution; on any
  // error neither is written.
  [[nodiscard]] Result<void> record_authorized(NewExecution const& ex,
                                               Durability d = Durability::full);
  // record_authorized without waiting for its transaction: the digest is checked now, the job
  // queued and committed by the next flush() or immediate write, ahead of every write queued
  // after it. `done` gets its result once that transaction ended (the claim and record are in
  // the WAL then; with `group`, await their fsync before acting on the claim), on the
  // committing thread with no registry lock held; exactly once, before return when refused at
  // once. The failpoint after_claim fires after the commit, before `done`.
  void record_authorized_async(NewExecution ex, Durability d,
                               std::function<void(Result<void>)> done);
  // `before`, then record_authorized's claim and record, as ONE job of that same transaction:
  // the gateway's authorizing transaction (its checks and authority writes in `before`), so
  // the claim, the authority it consumed and the record are committed together or not at all.
  // Errors: `before`'s; as record_authorized. `d` as for record_authorized.
  [[nodiscard]] Result<void> record_authorized_with(NewExecution const& ex,
                                                    std::function<Result<void>(sql::Db&)> before,
                                                    Durability d = Durability::full);

  // Ownership unassigned -> staged with the child's pidfs identity (child waits at its barrier),
  // and the boundary it was created in. Moves the phase authorized -> starting if needed.
  // Errors: registry.illegal_phase (not authorized/starting, or ownership not unassigned),
  // registry.legacy_unverified (the slot holds a legacy value), registry.not_found,
  // registry.corrupt_record (quarantined).
  [[nodiscard]] Result<void> record_staged(std::string_view execution_id, Ownership const& staged,
                                           BoundaryInfo const& boundary);
  // Ownership staged -> committed (same identity, exactly). Phase stays starting; the caller
  // records `running` next (deferred committed + immediate running = one transaction).
  // The write itself (never its order) may be deferred; the failpoints of these writes fire
  // after the commit for `now` and right after queueing for `deferred` (a crash then loses the
  // queued write: that is the case the deferred crash tests exercise).
  [[nodiscard]] Result<void> record_committed(std::string_view execution_id,
                                              WriteMode mode = WriteMode::now);
  // record_staged without waiting for its transaction: queued (deferred) and committed by the
  // next flush() or immediate write, after every write queued before it. `done` gets its
  // result once that transaction ended — the record is in the WAL then — on the committing
  // thread with no registry lock held (post it to your loop); exactly once, before return when
  // refused at once. The failpoint after_staged fires after the commit, before `done`. Release
  // the barrier from `done` only.
  void record_staged_async(std::string_view execution_id, Ownership staged, BoundaryInfo boundary,
                           std::function<void(Result<void>)> done);
  // record_committed + record_phase(running) as ONE change (both or neither), asynchronously
  // like record_staged_async; after_committed and while_running fire after the commit.
  void record_running_async(std::string_view execution_id, std::function<void(Result<void>)> done);
  // One phase step, checked with core::is_legal_progression. `running` and later phases need
  // committed ownership. Errors: registry.illegal_phase, registry.not_found, corrupt_record.
  [[nodiscard]] Result<void> record_phase(std::string_view execution_id, core::Phase phase,
                                          WriteMode mode = WriteMode::now);
  // The first accepted trigger; a second different trigger is refused (registry.illegal_phase).
  [[nodiscard]] Result<void> record_trigger(std::string_view execution_id, core::Trigger trigger,
                                            WriteMode mode = WriteMode::now);
  // Output accounting of one stream (checked with StreamAccounting::check()).
  // `stream_index` 0 = stdout/pty, 1 = stderr.
  [[nodiscard]] Result<void> record_output(std::string_view execution_id, int stream_index,
                                           core::StreamAccounting const& accounting,
                                           WriteMode mode = WriteMode::now);
  // Artifact publication progress of one stream; never goes backwards.
  [[nodiscard]] Result<void> record_publication(std::string_view execution_id, int stream_index,
                                                std::uint64_t published_bytes, bool done,
                                                WriteMode mode = WriteMode::now);
  // The outcome of publishing one stream of a terminal execution (docs/durability.md, "Output"). A
  // stream whose publication is done (published, empty, lost) keeps it: recording the same outcome
  // again is accepted and changes nothing, any other is refused. published needs bytes equal to
  // the stream's retained bytes and a digest; empty needs no retained byte; lost needs some.
  // Errors: registry.illegal_phase (not terminal, or a done stream changing),
  // accounting.invariant (an outcome the accounting contradicts), registry.not_found.
  [[nodiscard]] Result<void> record_publication(std::string_view execution_id, int stream_index,
                                                StreamPublication const& outcome);
  // The one terminal record; `via` is how it was reached (observed normally). Phase moves to
  // terminal with core::is_legal_progression(from, terminal, via). Always immediate: every write
  // deferred before it is committed in the same transaction, ahead of it, so when this returns
  // the record and everything that led to it are in the WAL (tell waiters only after that).
  // Errors: registry.illegal_phase (already terminal, or not reachable), corrupt_record when the
  // digest does not match the bytes.
  [[nodiscard]] Result<void> record_terminal(std::string_view execution_id, TerminalBlob const& t,
                                             core::RecoveryPath via = core::RecoveryPath::observed);
  // record_terminal without waiting for its transaction: checked and queued now (the failpoint
  // before_terminal fires here), committed like a deferred write (by flush(), or ahead of the
  // next immediate write, in its transaction), after every write queued before it. `done` gets
  // this write's own result once its transaction ended, on the thread that committed it, with
  // no registry lock held: keep it short (post to your event loop). It is called exactly once,
  // before return when the record is refused at once. Waiters learn the result from `done`
  // only: by then the record and everything that led to it are in the WAL.
  void record_terminal_async(std::string_view execution_id, TerminalBlob t, core::RecoveryPath via,
                             std::function<void(Result<void>)> done);

  // Startup recovery's single transaction for one record: walks `steps` (each checked with
  // core::is_legal_progression; running and later need committed ownership) and writes the
  // terminal record reached `via`. Atomic: a crash leaves the record as it was. Fires no
  // failpoint (a daemon restarted with CUSTOS_FAILPOINT set must still be able to recover).
  [[nodiscard]] Result<void> record_recovered(std::string_view execution_id,
                                              std::vector<core::Phase> const& steps,
                                              TerminalBlob const& t, core::RecoveryPath via);

  // A record that passed validation. Errors: registry.not_found; registry.corrupt_record for a
  // quarantined record, with the quarantine reason in the context.
  [[nodiscard]] Result<ExecutionRecord> get(std::string_view execution_id);
  [[nodiscard]] Result<std::vector<ExecutionRecord>> list(ListFilter const& filter = {});
  // Records that are not terminal and not quarantined (what recovery looks at).
  [[nodiscard]] Result<std::vector<ExecutionRecord>> non_terminal();
  // Terminal records (not quarantined) with a stream whose publication is not done, oldest id
  // first, at most `limit`, and only ids greater than `after_id`.
  [[nodiscard]] Result<std::vector<ExecutionRecord>> unpublished(std::string_view after_id,
                                                                 std::size_t limit);
  // How many records are terminal (quarantined ones included).
  [[nodiscard]] Result<std::size_t> count_terminal();
  [[nodiscard]] Result<std::vector<QuarantinedRecord>> quarantined();
  // Re-validates every record and quarantines new failures (done by open(); public for doctor).
  // Returns the number of records newly quarantined.
  [[nodiscard]] Result<std::size_t> revalidate();

  [[nodiscard]] WriteStats write_stats() const;
  // How long each committed write transaction took, BEGIN IMMEDIATE to the end of COMMIT (the
  // WAL's fsync included for a synchronous=FULL commit; a group commit's fdatasync is the
  // flusher's, not counted here). Lock-free to read from any thread (metrics).
  [[nodiscard]] core::LatencyHistogram::Snapshot commit_latency() const noexcept {
    return commit_latency_.snapshot();
  }

  // ---- group durability (docs/durability.md "Group durability") --------------------------------
  // Blocks until every Durability::group commit made before this call is on stable storage
  // (starts a flush when none covers it). Returns at once when none is pending. Errors:
  // registry.io when fdatasync failed — then the registry refuses every later write (an fsync
  // failure may have dropped dirty pages: never retry it, never report durable).
  [[nodiscard]] Result<void> await_durable();
  // True when a group commit is not yet known durable (for tests and the sink).
  [[nodiscard]] bool durability_pending() const;
  // await_durable() without blocking: `done` is called once every group commit made before
  // this call is on stable storage (ok), or with registry.io when the flusher's fdatasync
  // failed. Called at once, on the calling thread, when nothing is pending (or the registry
  // already failed); otherwise on the flusher thread, with no registry lock held: keep it
  // short (post to your event loop). For a launch that goes back to its loop after
  // record_staged and releases the barrier from this completion.
  void when_durable(std::function<void(Result<void>)> done);
  // The same for one execution: waits only for the group commit that holds its claim and
  // record (noted when it committed), not for the group commits other executions made since.
  // An execution with no group commit noted (none was made for it, its terminal record was
  // written, or the note was dropped) waits as when_durable(done) does.
  void when_durable(std::string_view execution_id, std::function<void(Result<void>)> done);
  // when_durable(execution_id, ...) without waiting: ok or registry.io when the answer is
  // known now, nullopt while that execution's group commit is not yet durable.
  [[nodiscard]] std::optional<Result<void>> durable_now(std::string_view execution_id);
  // The blocking form of when_durable(execution_id, ...).
  [[nodiscard]] Result<void> await_durable(std::string_view execution_id);

  // The cached copy of a record (write-through cache of live executions), if it is cached.
  // For tests and diagnostics: the write path is the only user of the cache.
  [[nodiscard]] std::optional<ExecutionRecord> cached_record(std::string_view execution_id) const;

  // ---- deferred writes ----------------------------------------------------------------------
  // Commits every write deferred so far (one transaction per max_batch writes; nothing when
  // none is queued). The failpoint `flush_with_writes_queued` fires first when writes are
  // queued. Errors: registry.io when the transaction itself failed (each deferred write's own
  // refusal goes to take_deferred_error instead).
  [[nodiscard]] Result<void> flush();
  // flush() on the calling thread only if it need not wait for another writer: true when it
  // committed every queued write (their completions were called, as by any leader); false when
  // nothing was queued, another thread is committing (that leader, or the next, takes them),
  // or more than one batch was queued (one was committed; the rest wait for the next leader).
  // For a caller that must not block, like the event loop.
  [[nodiscard]] bool try_flush();
  // Deferred writes queued and not yet committed.
  [[nodiscard]] std::size_t deferred_pending() const;
  // The first refusal of a deferred write of this execution since the last call, if any.
  [[nodiscard]] std::optional<Error> take_deferred_error(std::string_view execution_id);

  // ---- hooks for the gateway's authority tables (docs/authority.md "Storage") -------------------
  // `fn` as one job of the write queue: its own savepoint inside a BEGIN IMMEDIATE transaction,
  // committed with durability `d` (group commit applies). `fn` failing rolls back all it did.
  [[nodiscard]] Result<void> transact(Durability d, std::function<Result<void>(sql::Db&)> fn);
  // `fn` reading under the connection lock (no write transaction).
  [[nodiscard]] Result<void> read(std::function<Result<void>(sql::Db&)> const& fn);
  // `also`, then the one-use claim of (action_id, process_id) for execution_id, as ONE job of a
  // synchronous=FULL transaction: both are committed or neither. The failpoint after_claim fires
  // after the commit, as for consume_claim. Errors: `also`'s; registry.claim_consumed.
  // `d` as for consume_claim (full, or group with await_durable() before acting on it).
  [[nodiscard]] Result<void> consume_claim_with(std::string_view action_id,
                                                std::string_view process_id,
                                                std::string_view execution_id,
                                                std::function<Result<void>(sql::Db&)> also,
                                                Durability d = Durability::full);
  // `fn` as a deferred write of `execution_id` (WriteMode::deferred for a plain job): queued in
  // order and committed with the next immediate write, in its transaction and ahead of it (or by
  // flush()), in its own savepoint. Its refusal is kept per execution like other deferred
  // writes (take_deferred_error; `what` names it in the message). `fn` must own what it uses.
  void transact_deferred(std::string execution_id, char const* what,
                         std::function<Result<void>(sql::Db&)> fn);

 private:
  using JobFn = std::function<Result<void>(sql::Db&)>;
  // One write to one execution record. Consecutive changes of the same record queued behind
  // each other share one job: the record is loaded and verified once, each change is applied
  // in order (a refused one is skipped, the others stay), and it is stored once.
  struct Change {
    std::function<Result<void>(ExecutionRecord&)> fn;
    bool deferred = false;
    char const* what = "";
    bool atomic = true;  // refuses before it changes anything: applied without a copy
    Result<void> result = ok();
    // Queued without a waiter (counted as deferred) and told of its result: gets `result`
    // once its job is done, instead of keeping a refusal in queue_.deferred_errors.
    std::function<void(Result<void>)> done;
  };
  struct Job {
    JobFn fn;                     // a plain job (claims, creation, transact, flush marker)
    std::vector<Change> changes;  // or a record job: the changes of `execution_id`
    std::string execution_id;     // record job; deferred plain job: whose error it is
    Durability durability = Durability::normal;
    Result<void> result = ok();
    bool done = false;
    std::size_t deferred = 0;         // deferred writes in this job: nobody waits for their results
    char const* what = "";            // deferred plain job: which write, for the error message
    bool transaction_failed = false;  // its transaction could not begin or commit
    bool refused_only = false;        // record job whose every change was refused: nothing written
    // A queued plain job's completion (record_authorized_async): told its result, like a
    // change's `done`, instead of keeping a refusal as a deferred error.
    std::function<void(Result<void>)> on_done;
  };
  struct CacheEntry {
    ExecutionRecord rec;
    std::list<std::string>::iterator order;  // position in RecordCache::order (oldest first)
  };

  Registry(std::filesystem::path state_dir, OpenOptions options, sys::UniqueFd lock_fd, sql::Db db);

  // `group_id`: whose claim the job commits, noted with its group commit's number (when_durable).
  Result<void> write(Durability d, JobFn fn, std::string group_id = {});
  // `before`, the one-use claim, `after`: one job of a transaction committed with `d`.
  Result<void> claim_job(std::string_view action_id, std::string_view process_id,
                         std::string_view execution_id, JobFn before, JobFn after, Durability d);
  // claim_job's work as a job function that owns what it uses (it may run after return).
  JobFn claim_fn(std::string action_id, std::string process_id, std::string execution_id,
                 JobFn before, JobFn after);
  // Inserts the record of `ex` (phase authorized) inside a job; its claim must exist (checked
  // here unless the same job has just inserted it).
  Result<void> create_record_job(sql::Db& db, NewExecution const& ex, bool claim_checked);
  void enqueue_deferred(Durability d, std::string execution_id, char const* what, JobFn fn,
                        std::function<void(Result<void>)> on_done = nullptr);
  // flush() when deferred writes are queued: called by every read first.
  Result<void> settle_deferred();
  // Runs batches until `job` is done (leading or waiting); `lk` holds queue_.mu.
  void drive(std::shared_ptr<Job> const& job, std::unique_lock<std::mutex>& lk);
  // One batch as the leader (no leader may be active): takes up to max_batch queued jobs,
  // commits them, calls their completions (without the lock). `lk` holds queue_.mu.
  void lead(std::unique_lock<std::mutex>& lk);
  void run_batch(std::vector<std::shared_ptr<Job>> const& batch);
  // A record job inside the transaction: load + verify once, apply, store once.
  Result<void> apply_changes(sql::Db& db, Job& job);
  // Moves the refusals of the deferred writes of a finished job to queue_.deferred_errors.
  void keep_deferred_errors(Job const& job);
  Result<void> set_synchronous(Durability d);
  // Loads a record inside a write job, refusing quarantined ones.
  Result<ExecutionRecord> load_for_update(sql::Db& db, std::string_view execution_id);
  Result<void> store(sql::Db& db, ExecutionRecord& rec);
  // Cache bookkeeping (db_mu_ held). Records stored by the running transaction wait in
  // cache_.staged until COMMIT; a failed job drops what it staged and its cache entry.
  void cache_drop(std::string_view execution_id);
  void cache_put(ExecutionRecord rec);
  void unstage_failed(std::size_t mark, Job const& job);
  void commit_staged();
  // After a batch committed (db_mu_ held): group bookkeeping for the flusher.
  void note_commit(Durability d, std::vector<std::shared_ptr<Job>> const& batch);
  // The commit number `execution_id` must see durable (dur_.mu held).
  [[nodiscard]] std::uint64_t durable_target(std::string_view execution_id) const;
  void forget_group_note(std::string_view execution_id);
  // Calls `done` now when `target` is durable (or the flusher failed), else queues it for the
  // flusher; unlocks `lk` either way.
  void wait_for(std::unique_lock<std::mutex>& lk, std::uint64_t target,
                std::function<void(Result<void>)> done);
  Result<void> await_target(std::unique_lock<std::mutex>& lk, std::uint64_t target);
  void flusher_main();
  // Load, `change`, validate and store one record as one job. Deferred: queued (the change
  // must own everything it uses) and ok() is returned at once.
  // `atomic`: `change` refuses before it changes anything (else it runs on a copy when it
  // shares its job with other changes).
  // `done` (deferred mode only): called with this change's result once its job is done.
  Result<void> modify(Durability d, WriteMode mode, std::string_view execution_id, char const* what,
                      std::function<Result<void>(ExecutionRecord&)> change, bool atomic = true,
                      std::function<void(Result<void>)> done = {});

  std::filesystem::path state_dir_;
  OpenOptions options_;
  sys::UniqueFd lock_fd_;
  int opened_version_ = kSchemaVersion;

  // db_mu_ guards db_ (one connection; SQLite is opened NOMUTEX). queue_.mu guards the queue and
  // the leader flag; a leader takes db_mu_ only after leaving queue_.mu.
  mutable std::mutex db_mu_;
  sql::Db db_;
  std::optional<Durability> current_sync_;
  WriteStats stats_;
  core::LatencyHistogram commit_latency_;
  // Ids in the quarantine table (guarded by db_mu_; set by revalidate(), the table's only
  // writer while the registry is open).
  std::set<std::string, std::less<>> quarantined_ids_;

  // The write queue (guarded by its `mu`; mutable: deferred_pending() is const).
  struct WriteQueue {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Job>> jobs;
    bool leader_active = false;
    std::size_t deferred_queued = 0;
    std::uint64_t deferred_total = 0;
    std::uint64_t deferred_failed = 0;
    std::map<std::string, Error, std::less<>> deferred_errors;
  };
  WriteQueue queue_;

  // Write-through cache (guarded by db_mu_).
  struct RecordCache {
    std::map<std::string, CacheEntry, std::less<>> entries;
    std::list<std::string> order;
    std::vector<ExecutionRecord> staged;
  };
  RecordCache cache_;

  // Group durability (guarded by its `mu`; taken after db_mu_ when both are held). Group commits
  // are numbered in commit order; every one numbered <= durable_seq is on stable storage.
  struct GroupDurability {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::uint64_t commit_seq = 0;
    std::uint64_t durable_seq = 0;
    // The commit number of each execution's group-committed claim, until its terminal record is
    // written (bounded: past kGroupNotesMax, notes already durable are dropped).
    std::map<std::string, std::uint64_t, std::less<>> group_seq;
    std::uint64_t flushes = 0;
    std::uint64_t durable_waits = 0;
    std::optional<Error> error;
    bool stop_flusher = false;
    // when_durable() completions waiting for durable_seq to reach their commit number (not
    // sorted: a wait for one execution's claim may name an older commit than the wait before it).
    std::deque<std::pair<std::uint64_t, std::function<void(Result<void>)>>> waiters;
    std::thread flusher;
    // Set once an fdatasync failed: every later write is refused (read without `mu`).
    std::atomic<bool> writes_refused{false};
  };
  static constexpr std::size_t kGroupNotesMax = 4096;
  GroupDurability dur_;
};

// The pid namespace inode of the calling process (/proc/self/ns/pid), 0 when unreadable.
[[nodiscard]] std::uint64_t current_pid_ns_ino() noexcept;

}  // namespace custos::registry
