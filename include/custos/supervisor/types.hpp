// Value types of the supervisor API (docs/supervisor.md): what the rpc layer passes in and gets
// back from the ExecutionManager. Everything here is plain data; no I/O.
#pragma once

#include <boost/json/object.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/backend/backend.hpp"
#include "custos/core/accounting.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/identity.hpp"
#include "custos/core/lifecycle.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/terminal.hpp"
#include "custos/sandbox/plan.hpp"

namespace custos::supervisor {

class OwnershipSink;

// Who asked, as the kernel reported it on the socket (SO_PEERCRED).
struct CallerCreds {
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::int32_t pid = 0;
};

struct LaunchRequest {
  core::ExecutionIdentity identity;
  core::ExecutionPlan plan;
  // The plan's sandbox, compiled (custos/sandbox/plan.hpp): null exactly when the plan has no
  // sandbox_digest. The manager checks that it is the one the plan's digest names, admits its
  // controls against the backend's descriptor, and hands its checked plan to the backend.
  std::shared_ptr<sandbox::PlanSandbox const> sandbox;
  CallerCreds caller;
  // No environment values travel with a request: a plan entry `inherit: true` takes its value
  // from ManagerConfig::inherit_source (the daemon's own environment), never from the caller.
  // Authority to inherit a name therefore cannot be used to inject a caller-chosen value.
};

struct Carried;

// Where copies of an execution's output descriptors are kept outside this process, so that a
// daemon started after this one died without a handover (a crash, kill -9, a restart) gets them
// back, goes on reading and loses nothing still in the pipes (docs/supervisor.md, "Descriptor
// store"). Called on the loop; a keeper that cannot keep logs it, and the execution then has
// nothing kept.
class StdioKeeper {
 public:
  virtual ~StdioKeeper() = default;
  // `copies`: backend::Execution::copy_output() of a launched execution.
  virtual void keep(std::string const& execution_id, backend::CarriedStdio const& copies) = 0;
  // Its terminal record is written: what was kept for it goes.
  virtual void forget(std::string const& execution_id) = 0;
};

// A live execution a previous daemon launched, which startup recovery re-acquired by exact pidfs
// identity (supervisor/recovery.hpp): what ExecutionManager::adopt takes over. Everything but
// the pidfd comes from its stored record.
struct AdoptRequest {
  core::ExecutionIdentity identity;
  core::ExecutionPlan plan;  // decoded from the record's canonical bytes
  std::string plan_digest;   // the record's
  // The stored phase: starting, running or stopping (a root in any other phase is not live).
  core::Phase phase = core::Phase::running;
  // Ownership committed: the launch was answered. false: only staged — the previous daemon died
  // between the barrier release and the commit's write, so nobody was told the execution
  // started; it is ended at once on the spawn-failure path (spawn_error "barrier").
  bool launch_committed = true;
  std::optional<core::Trigger> trigger;  // the first accepted trigger, as recorded
  core::StreamAccounting out;            // stored accounting of stdout (or the PTY stream)
  core::StreamAccounting err;            // of stderr
  // How long the root has run (its deadline counts from its start, not from the adoption).
  std::chrono::milliseconds age{0};
  // The execution id, the recovered pidfd, the recorded identity and boundary; the manager
  // fills in the plan pointers.
  backend::AdoptContext root;
  // A handover's: what the previous image carried for it (its stdio, where each stream stood,
  // its events). Null after a crash or a plain restart: the output was not kept.
  std::shared_ptr<Carried> carried;
};

// Which ownership boundary an execution got (part of its record): core's enum.
using Boundary = core::Boundary;

// What holds a staged root's tree, as its record keeps it.
struct StagedBoundary {
  Boundary kind = Boundary::marker;
  std::string cgroup_path;   // absolute; empty without a cgroup
  std::string marker_value;  // empty without a marker
  // The PID namespace the marker sweep is limited to (a container's); 0: the daemon's.
  std::uint64_t marker_ns_ino = 0;
};

// How the native backend chooses: `automatic` = cgroup when a writable subtree exists, else
// marker.
using BoundaryPreference = backend::BoundaryPreference;

// Output streams (core's enum): stdout and stderr in pipe mode, `pty` in PTY mode.
using StreamId = core::Stream;

// One numbered event of an execution. Kinds: started (or adopted, for an execution taken over
// after a restart), output, input_closed, limit, cancel_requested, signal_sent, exited, closed,
// terminal.
struct Event {
  std::string execution_id;
  std::uint64_t seq = 0;  // strictly increasing per execution from 1, no gaps
  std::string plan_digest;
  std::string sandbox_digest;  // the checked sandbox plan's; empty (null on the wire): none
  std::string kind;
  boost::json::object fields;      // kind-specific fields (stream, offset, trigger, exit, ...)
  std::vector<std::uint8_t> data;  // raw bytes of an `output` event (base64 only in to_json)

  // The `exec.event` params minus `subscription`: execution_id, seq, plan_digest,
  // sandbox_digest, kind, the fields, and `data_b64` for output events.
  [[nodiscard]] boost::json::object to_json() const;
};

// What one daemon image hands the next for a live execution (a handover, docs/supervisor.md
// "Handover"): this side's stdio, where each stream stood, the input still queued, and the
// retained events, so that output, input and seq go on with nothing lost or repeated.
// `restored`: not a handover but a start after the previous daemon died, with the output
// descriptors a StdioKeeper kept: the streams go on from their spools' sizes, marked incomplete
// (bytes the dead daemon had read but not spooled are unknown), with no input and no events.
struct Carried {
  struct Stream {
    core::Stream stream = core::Stream::stdout_stream;
    bool ended = false;
    bool limit_reported = false;
    core::StreamAccounting acc;
    std::uint64_t spool_size = 0;  // bytes in its spool file
  };
  std::string execution_id;
  backend::CarriedStdio stdio;
  std::vector<Stream> streams;
  std::uint64_t output_allowed = 0;  // bytes within limits.output_bytes so far, every stream
  std::uint64_t output_events = 0;   // output events sent (output.max_events)
  bool max_events_reported = false;
  std::vector<std::uint8_t> input_queued;  // accepted from callers, not yet written
  std::uint64_t input_accepted = 0;
  bool input_eof_requested = false;
  bool input_closed = false;
  bool restored = false;
  // The resource watch's peaks so far (a handover's; none restored), and the backend's disk
  // baseline, so that the terminal report and the limits go on from them.
  struct Peaks {
    std::optional<std::uint64_t> cpu_ms, rss_bytes, processes, open_fds, disk_growth;
  } peaks;
  std::optional<std::uint64_t> disk_baseline;
  std::uint64_t next_seq = 1;
  std::vector<Event> events;  // retained, oldest first
};

struct StartResult {
  std::string execution_id;
  std::string plan_digest;
  std::optional<core::Digest> sandbox_digest;  // the checked sandbox plan's; none: unsandboxed
  core::Phase phase = core::Phase::starting;
  Boundary boundary = Boundary::marker;
  std::int32_t pid = 0;  // 0 when the spawn failed

  [[nodiscard]] boost::json::object to_json() const;
};

struct ExecutionView {
  std::string execution_id;
  core::ExecutionIdentity identity;
  std::string plan_digest;
  std::optional<core::Digest> sandbox_digest;  // the checked sandbox plan's; none: unsandboxed
  core::Phase phase = core::Phase::authorized;
  Boundary boundary = Boundary::marker;
  bool kernel_enforced = false;  // containment: cgroup boundary the process cannot leave
  std::int32_t pid = 0;
  std::string executable;
  core::BackendKind backend = core::BackendKind::native;
  std::chrono::system_clock::time_point started_at{};
  std::optional<core::Trigger> trigger;  // the first accepted trigger
  core::OutputAccounting output;         // per stream of this execution's mode
  std::uint64_t events = 0;              // events emitted so far (= last seq)
  std::optional<core::TerminalRecord> terminal;
  std::optional<std::string> sink_error;      // a durable write after launch failed (see sink)
  std::uint64_t orphans_reaped = 0;           // reparented descendants reaped and attributed here
  std::optional<std::string> cleanup_detail;  // why cleanup is unconfirmed, when it is
  // The sampler's latest reading of the live tree (what `custos run --progress` shows); none
  // before the first sample and once the tree is done.
  std::optional<backend::Usage> usage;

  [[nodiscard]] boost::json::object to_json() const;
};

struct ListFilter {
  std::optional<core::Phase> phase;
  std::optional<std::string> session_id;
  std::size_t limit = 1000;
};

struct CancelResult {
  bool accepted = false;
  std::optional<core::Trigger> trigger;  // the first accepted trigger (this one or an earlier)
  // A forced cancel cut the grace short, or made a stop not yet begun skip it; false when there
  // was nothing graceful left to skip (the kill already went out, or the exit decided).
  bool forced = false;
};

struct OutputSlice {
  std::vector<std::uint8_t> data;
  bool eof = false;      // offset+data reached the end of what the stream will ever hold
  bool complete = true;  // false if anything of this stream was dropped
};

struct SubscriptionHandle {
  std::string execution_id;
  std::uint64_t id = 0;
  // The first seq actually replayed: larger than the requested from_seq when older events were
  // no longer retained (the client can fetch the missed output with exec.output).
  std::uint64_t replay_from = 0;
};

enum class ShutdownPolicy : std::uint8_t { cancel, detach };

struct ManagerConfig {
  // The daemon-owned cgroup v2 directory under which per-execution cgroups are created
  // (`<subtree>/<execution_id>`). Empty: no writable subtree, every execution uses the marker.
  std::string cgroup_subtree;
  BoundaryPreference boundary = BoundaryPreference::automatic;
  // Root of spool files: `<state_dir>/spool/<execution_id>/{stdout,stderr}`
  // (registry/artifacts.hpp). They outlive the execution's place in memory: retention removes
  // them (docs/durability.md, "Output").
  std::filesystem::path state_dir;
  OwnershipSink* sink = nullptr;
  // Keeps copies of each launched execution's output descriptors outside this process (the
  // daemon's: systemd's descriptor store), forgotten at its terminal record. Null: none kept.
  StdioKeeper* stdio_keeper = nullptr;
  // Called on the loop once an execution's terminal record is in the registry (after the sink
  // confirmed it): the daemon's publisher takes its spools from there (supervisor/publisher.hpp).
  // Empty: nothing is published.
  std::function<void(std::string const& execution_id)> terminal_recorded;
  // True when the cgroup2 mount has nsdelegate: then a root execution cannot leave its cgroup.
  // The manager detects it from sys::find_cgroup2_mount() when `detect_nsdelegate` is true.
  bool detect_nsdelegate = true;
  bool nsdelegate = false;
  // Become PR_SET_CHILD_SUBREAPER at construction so orphans reparent to this process.
  bool become_subreaper = true;

  std::chrono::milliseconds sample_interval{250};  // resource sampler cadence
  std::chrono::milliseconds disk_sample_interval{2000};
  std::uint64_t disk_walk_max_entries = 100000;
  std::chrono::milliseconds reap_interval{1000};  // periodic orphan reaping
  // After the root exits while descendants still hold its output pipes: how long the readers
  // may drain before the tree is killed.
  std::chrono::milliseconds exit_drain{1000};
  // After the tree was killed: how long the readers may still take to reach EOF before they
  // are closed and the stream (and the cleanup) is recorded incomplete/unconfirmed.
  std::chrono::milliseconds reader_close_bound{2000};
  std::size_t stdin_queue_bytes = std::size_t{256} * 1024;  // in-memory stdin queue bound
  std::size_t retained_event_count = 4096;                  // replay buffer bound in events
  std::size_t terminal_history = 4096;                      // terminal executions kept for get/wait
  std::uint32_t marker_sweep_rounds = 64;
  // Where `inherit: true` plan entries take their values: the daemon's environment as it was at
  // daemon start. nullopt: the manager snapshots its own process environment when constructed
  // (which, in the daemon, is at start). A name absent here is simply not set in the child.
  std::optional<std::map<std::string, std::string>> inherit_source;
  // The engine sockets a docker / podman plan uses when it names none (docs/containers.md).
  std::string docker_socket = "/var/run/docker.sock";
  std::string podman_socket = "/run/podman/podman.sock";
  // A secret's value by ref, for the native backend to deliver a sandbox's secrets at spawn
  // (backend::NativeConfig::read_secret); empty: no store.
  std::function<Result<std::string>(std::string_view ref)> read_secret;
  // Every engine call's deadline (and the bound on a gated exec's arrival).
  std::chrono::milliseconds engine_timeout{10000};
};

// The calling process's environment (`environ`) as a name -> value map; entries without '=' are
// skipped and the first of duplicate names wins (as getenv does).
[[nodiscard]] std::map<std::string, std::string> environment_snapshot();

struct ManagerStats {
  std::uint64_t started = 0;
  std::uint64_t spawn_failed = 0;
  std::uint64_t adopted = 0;  // live executions taken over after a restart (adopt())
  std::uint64_t terminal = 0;
  std::uint64_t dropped_subscribers = 0;  // sinks that returned false (the rpc tells clients)
  std::uint64_t orphans_reaped = 0;
  std::uint64_t orphans_attributed = 0;  // of those, attributed to a known execution
  std::uint64_t pending_waits = 0;       // wait() calls not yet answered nor withdrawn (a gauge)
  // Final marker sweeps: teardowns that asked for one, and the multi-marker /proc sweeps that
  // served them (fewer when teardowns ending together shared a sweep).
  std::uint64_t final_sweep_requests = 0;
  std::uint64_t final_sweeps = 0;
  // Terminal records published since start, by classification (index: core::Classification),
  // and those whose tree cleanup was unconfirmed (docs/metrics.md).
  std::array<std::uint64_t, core::kClassificationCount> terminal_by_classification{};
  std::uint64_t cleanup_unconfirmed = 0;
  std::uint64_t spool_bytes = 0;  // bytes written to spool files since start
};

}  // namespace custos::supervisor
