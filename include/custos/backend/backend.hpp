// The backend seam: what the supervisor needs from whatever creates and holds an execution's
// process tree. The supervisor owns the *policy* of an execution's life (lifecycle, events,
// accounting, cancellation, escalation, the terminal record); a backend owns the *mechanism*
// (how a root is created at a barrier, how its output and input travel, how its tree is
// signalled, killed and confirmed empty). docs/backends.md says how to add one.
//
// Implementations: native (clone3 into a per-execution cgroup v2, pidfds, the /proc marker) and
// reference (a deterministic scripted model of a process; no process at all, the conformance
// oracle). Both are driven by the same supervisor code.
//
// Threading: every call below is made on the execution manager's event loop, and every
// callback a backend makes (ExecutionPort, the done functions) is made on that loop too — never
// from inside the call that started it unless the comment says "may complete at once".
//
// The life of one BackendExecution, in the order the supervisor drives it:
//   acquire    the root exists, held at a barrier; its identity and boundary are reported
//   (the supervisor records them durably: no target code may run before that)
//   release    the barrier opens; the verdict says whether the target program started
//   start      output, exit and tree notifications begin to flow into the ExecutionPort
//   signal_tree / kill_tree / tree_state / watch_tree    teardown
//   final_scan the last confirmation that nothing of the tree survived
//   close      every handle is released; observations() describes what the backend saw
// abort() may replace release() (nothing of the target ever runs); detach() may come at any
// point (the daemon stops supervising without acting on the processes).
//
// A live execution a previous daemon launched (re-acquired after a restart by exact pidfs
// identity) enters with adopt() instead of acquire/release: the root already runs; start and
// everything after follow as above.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "custos/backend/plan_view.hpp"
#include "custos/core/accounting.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/core/terminal.hpp"
#include "custos/sandbox/admission.hpp"
#include "custos/sandbox/types.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::backend {

// How a backend that can give either boundary chooses: `automatic` = cgroup when it can write
// one, else marker.
enum class BoundaryPreference : std::uint8_t { automatic, cgroup, marker };

// What a backend can enforce on this host: the sandbox layer's descriptor (custos/sandbox/
// admission.hpp), one Control per mechanism with its fidelity. The same type for every layer:
// the backends fill it, the supervisor admits against it, host.info and doctor show it.
using ControlFidelity = sandbox::ControlFidelity;
using Control = sandbox::Control;
using Descriptor = sandbox::Descriptor;
using sandbox::control_fidelity_wire;
using sandbox::to_json;

// The answer of admission: a plan this backend can run, or every control it lacks.
struct Admission {
  bool admitted = true;
  std::vector<std::string> missing;  // control names, sorted; empty when admitted
  std::string detail;                // why, for the error message
};

// Credentials of the root: the caller's unless the plan names a user.
struct RunAs {
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  bool explicit_user = false;         // the plan named a user
  std::vector<std::uint32_t> groups;  // supplementary groups (plan user only)
};

// Everything a backend needs to create one execution's root: one value instead of argument
// lists repeated through every launch step.
struct LaunchContext {
  std::string execution_id;
  core::ExecutionPlan const* plan = nullptr;  // the validated plan (outlives the execution)
  PlanView const* view = nullptr;             // its effective values
  // The environment, resolved: literal entries and inherited ones (from the daemon's snapshot),
  // in plan order, without any backend-private entry (a backend adds its own, e.g. the marker).
  std::vector<std::string> env;
  RunAs run_as;
  std::size_t live_executions = 0;  // executions live before this one (concurrency)
  // The plan's checked sandbox plan (admitted: the backend's descriptor lists every one of its
  // controls at fidelity hard), or null for an unsandboxed plan. Outlives the execution. A
  // backend enforces all of it, from the root's first instruction, or fails the launch.
  sandbox::CheckedSandboxPlan const* sandbox = nullptr;
};

// The root exists and waits at its barrier: what the supervisor records as staged ownership.
struct Acquired {
  std::int32_t pid = 0;           // 0 for a backend without a host process (reference)
  sys::PidfsIdentity identity{};  // the positive process authority (zero for reference)
  core::Boundary boundary = core::Boundary::marker;
  bool kernel_enforced = false;  // the tree cannot leave its boundary
  std::string cgroup_path;       // absolute, empty without a cgroup
  std::string cgroup_rel;        // below the cgroup2 mount, as /proc/PID/cgroup shows it
  std::string marker_value;      // empty without a marker
  // The PID namespace the marker sweep is limited to (a container's); 0: the daemon's.
  std::uint64_t marker_ns_ino = 0;
  // Limits the kernel enforces for the whole tree from birth (a cgroup controller).
  bool memory_hard = false;
  bool pids_hard = false;
  // limits.open_files is RLIMIT_NOFILE of every process of the tree (false: an ungated container
  // exec, where only the container's own limit applies: the record says sampled).
  bool descriptors_hard = true;
};

// The stdio of a live execution as one daemon image hands it to the next (a handover,
// docs/supervisor.md): this side's ends, kept open across the execve, so the program never sees
// its output or input break. Every one is verified by the next image before it is used.
struct CarriedStdio {
  bool pty = false;
  sys::UniqueFd out;  // stdout's read end, or the terminal's master (pty); none: already ended
  sys::UniqueFd err;  // stderr's read end (pipe mode); none: already ended
  sys::UniqueFd in;   // stdin's write end (a descriptor of the master with a pty); none: closed
  // A backend whose output and input travel over one connected stream socket (a container
  // exec's hijacked engine stream) carries that instead of out/err/in, with `state`: where its
  // stream stands on the connection and what else it needs to go on, in its own format (the
  // daemon stores it as it is).
  sys::UniqueFd connection;
  boost::json::object state;
};

// A live root a previous daemon launched, re-acquired after a restart by exact pidfs identity
// (custos/backend/native_recovery.hpp): what adopt() takes over, with its stdio when a handover
// carried it or a keeper kept its output (`stdio`); without, its output is not kept.
struct AdoptContext {
  std::string execution_id;
  core::ExecutionPlan const* plan = nullptr;  // decoded from the stored record
  PlanView const* view = nullptr;             // its effective values
  sys::Pidfd root;                            // the recovered pidfd: every later action uses it
  sys::PidfsIdentity identity;                // as recorded (boot id, pidfs dev/ino, pid, start)
  core::Boundary boundary = core::Boundary::marker;
  std::string cgroup_path;  // absolute, as recorded; empty without a cgroup
  std::string marker_hex;   // as recorded; empty without a marker
  // The PID namespace the marker sweep is limited to (a container's); nullopt: every process.
  std::optional<std::uint64_t> pid_ns_inode;
  // true: re-acquired after a daemon restart (no stdio kept, the disk measured from here);
  // false: a root another backend created and hands over (a container exec at its gate).
  bool after_restart = true;
  // true: the root ended before anyone could hold it (an ungated container exec whose program
  // finished before its process was identified): `root` is empty, and the tree is what carries
  // the marker. identity.start_time_ticks then bounds the marker sweep (the exec's start).
  bool root_exited = false;
  // A handover's kept stdio (hand_over_stdio() of the previous image): output and input continue
  // through it. Empty after a crash or a plain restart: the output was not kept.
  std::optional<CarriedStdio> stdio;
  // A handover's: the workspace's size before the program ran (disk_baseline() of the previous
  // image), so disk growth still counts from the launch. None: growth counts from here.
  std::optional<std::uint64_t> disk_baseline;
};

// The result of a step that may fail before the target program runs: the failure names its
// step (SpawnFailure::code), never a message to parse.
template <class T>
using Step = std::variant<T, core::SpawnFailure>;

// The failure of launch step `step` (a backend's own: "cgroup", "gate", ...) with `e`'s errno
// and message.
[[nodiscard]] core::SpawnFailure step_failure(std::string step, Error const& e);

// Whether a backend can still tell that the tree is empty.
enum class TreeState : std::uint8_t {
  empty,      // seen empty (a cgroup's populated=0, a model with nothing alive)
  populated,  // something is still there, or the state could not be read
  unknown,    // this boundary cannot tell before the final scan (the marker)
};

// One sample of the tree's resources; nullopt where this backend cannot say.
struct Usage {
  std::optional<std::uint64_t> cpu_ms;
  std::optional<std::uint64_t> rss_bytes;
  std::optional<std::uint64_t> processes;
  std::optional<std::uint64_t> open_fds;
  // Growth of the disk the execution writes; native measures it with measure_disk instead.
  std::optional<std::uint64_t> disk_bytes;
};

// What the final confirmation found.
struct FinalScan {
  std::vector<std::string> unconfirmed;  // every reason the cleanup cannot be confirmed
  std::uint32_t signalled = 0;           // processes the final sweep had to kill
  // The tree's usage as the backend knows it at the end (whole-tree CPU from the cgroup, a
  // model's peaks): the supervisor keeps the peaks.
  Usage usage;
};

// What writing stdin did.
struct InputWrite {
  std::size_t written = 0;
  bool would_block = false;  // wait with await_input_writable
  bool closed = false;       // the reader is gone (EPIPE, EIO): the input is over
};

// The execution side of the seam: implemented by the supervisor, called by the backend.
class ExecutionPort {
 public:
  virtual ~ExecutionPort() = default;
  // Bytes the tree wrote on `stream`, in order. The backend has bounded each call to the
  // plan's chunk size.
  virtual void on_output(core::Stream stream, std::span<std::uint8_t const> bytes) = 0;
  // The stream ended (EOF). `complete` false: it ended on a read failure, so bytes may be lost.
  virtual void on_stream_end(core::Stream stream, bool complete) = 0;
  // The root ended. nullopt: it ended but its status could not be read.
  virtual void on_root_exit(std::optional<core::ExitStatus> status) = 0;
  // The tree may have changed (emptied) while a watch_tree() was active.
  virtual void on_tree_change() = 0;
  // The input channel became writable again after InputWrite::would_block.
  virtual void on_input_writable() = 0;
  // What runs the tree failed under it (a container stopped mid-exec): the execution ends with
  // trigger backend_failure. Called before the root's exit it causes, so that exit cannot decide
  // the outcome as an ordinary one.
  virtual void on_backend_failure(std::string reason) = 0;
  // The tree's usage changed in a way the backend saw at once (a model's `use` or `spawn`): the
  // supervisor samples now instead of at its next tick.
  virtual void on_usage_changed() = 0;
  // The backend saw the tree hit a denial its checked sandbox plan enforces, one that ends the
  // run (`control`: the control that denied, controls.hpp; `detail`: what was attempted). Called
  // before the root exit it causes: unless a cancellation trigger came first, the execution is
  // classified sandbox_denied. A denial the backend cannot observe is simply the error the
  // program sees (EACCES, EPERM).
  virtual void on_sandbox_denied(std::string control, std::string detail) = 0;
  // Every asynchronous operation a backend starts for an execution is counted here (begun
  // before it is started, ended when its completion ran): the execution closes only once all of
  // them ended.
  virtual void task_begun() = 0;
  virtual void task_ended() = 0;
};

class BackendExecution {
 public:
  virtual ~BackendExecution() = default;

  // Creates the root held at its barrier. `done` may complete at once.
  virtual void acquire(LaunchContext const& ctx, std::function<void(Step<Acquired>)> done) = 0;
  // Opens the barrier once the staged ownership is durable; `done` gets the verdict: the
  // target started (monostate), or the step that failed (the root is gone, reaped).
  virtual void release(std::function<void(Step<std::monostate>)> done) = 0;
  // Drops a root still held at its barrier: nothing of the target runs. Idempotent.
  virtual void abort() = 0;
  // What abort() (or a failed acquire) left behind: confirmed when the root was seen gone and
  // nothing of it can remain; unconfirmed when that could not be seen (an engine's exec whose
  // gate was never identified). Read by the spawn failure's terminal record.
  [[nodiscard]] virtual core::Cleanup abort_cleanup() const { return core::Cleanup::confirmed; }
  // The target runs: output, exit and tree notifications start flowing into `port`, which
  // outlives this object.
  virtual void start(ExecutionPort& port) = 0;
  // Takes over a live root instead of acquire/release (see AdoptContext); start() follows. The
  // Acquired reports the boundary the root is in. Errors: sys.unsupported for a backend whose
  // executions cannot outlive the daemon (the default); the backend's own when the recorded
  // boundary cannot be used.
  [[nodiscard]] virtual Result<Acquired> adopt(AdoptContext ctx) {
    return Error(Errc::sys_unsupported, ctx.execution_id + ": this backend cannot adopt");
  }

  // Input. write_input never blocks; on would_block, await_input_writable arms one wake-up.
  [[nodiscard]] virtual bool has_input() const noexcept = 0;
  [[nodiscard]] virtual InputWrite write_input(std::span<std::uint8_t const> bytes) = 0;
  virtual void await_input_writable() = 0;
  // Ends the input (eof: the program reads end-of-file). Idempotent.
  virtual void close_input(bool eof) = 0;
  // exec_not_pty / sys errors; the execution is unaffected by a refusal.
  [[nodiscard]] virtual Result<> resize(std::uint16_t rows, std::uint16_t cols) = 0;

  // Sends `sig` to the root and every process of the tree, once. Returns how many got it.
  [[nodiscard]] virtual std::uint32_t signal_tree(int sig) = 0;
  // Kills the whole tree (SIGKILL, cgroup.kill, the marker sweep). Returns how many were hit
  // (at least 1 when anything was there).
  [[nodiscard]] virtual std::uint32_t kill_tree() = 0;
  [[nodiscard]] virtual TreeState tree_state() const = 0;
  // True once the root is known to have ended.
  [[nodiscard]] virtual bool root_gone() const noexcept = 0;
  // While watched, a change of the tree calls ExecutionPort::on_tree_change. Returns false when
  // no notification is available (the supervisor then polls tree_state).
  virtual bool watch_tree() = 0;
  virtual void unwatch_tree() = 0;
  // The final confirmation (a last sweep, orphans, the cgroup re-read). Asynchronous: counts
  // as a task of the port, `done` on the loop.
  virtual void final_scan(std::function<void(FinalScan)> done) = 0;

  [[nodiscard]] virtual Usage sample() = 0;
  // The growth of the disk the execution may write, measured off the loop; nullopt: unknown.
  // Returns false when no measurement was started.
  virtual bool measure_disk(std::function<void(std::optional<std::uint64_t>)> done) = 0;

  // Stops reading every stream still open (a process outside the tree holds its write end past
  // the bound): returns those streams, whose output is therefore incomplete.
  [[nodiscard]] virtual std::vector<core::Stream> close_streams() = 0;
  // Every handle is released (after the final scan): the boundary is removed where empty.
  virtual void close() = 0;
  // Stops observing without acting on anything; no callback follows.
  virtual void detach() = 0;
  // A handover, just before detach(): gives up this side's stdio descriptors without closing
  // them, at a point where every byte read so far was delivered to the port. nullopt: this
  // backend cannot carry its stdio (its output is then not kept across the handover).
  [[nodiscard]] virtual std::optional<CarriedStdio> hand_over_stdio() { return std::nullopt; }
  // Second descriptors of this side's output still being read (stdout's and stderr's read ends,
  // or the terminal's master), for a keeper outside the process (supervisor::StdioKeeper) that
  // gives them back to a daemon started after this one died. Never the input: a copy held
  // elsewhere would keep the program's stdin from ever ending. nullopt: nothing to copy (this
  // backend's output is not a descriptor of ours).
  [[nodiscard]] virtual std::optional<CarriedStdio> copy_output() { return std::nullopt; }
  // The workspace's size the disk growth is measured from (limits.disk_bytes); none when not
  // measured (yet), or by a backend that does not measure it.
  [[nodiscard]] virtual std::optional<std::uint64_t> disk_baseline() const { return std::nullopt; }
  // A handover is coming: the root's exit is no longer collected here (no wait reaps it), so an
  // exit from now on stays for the next image to read. No callback about the exit follows.
  virtual void hold_exit() {}

  // Facts the backend observed, bound into the terminal record ("backend observations").
  [[nodiscard]] virtual core::Observations observations() const = 0;
};

// One kind of backend on this host: shared by all of its executions.
class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual core::BackendKind kind() const noexcept = 0;
  [[nodiscard]] virtual Descriptor descriptor() const = 0;
  // Before any claim is consumed: can this backend run `plan` here? No effect.
  [[nodiscard]] virtual Admission admit(core::ExecutionPlan const& plan) const = 0;
  // Before any claim is consumed, after admit: the checks that need an answer from outside the
  // daemon (an engine: is the container there and running?). No effect; `done` may complete at
  // once (the default: nothing to ask).
  // NOLINTNEXTLINE(performance-unnecessary-value-param): overriders keep `done` for later
  virtual void preflight(core::ExecutionPlan const& plan, std::function<void(Result<>)> done) {
    (void)plan;
    done(Result<>{});
  }
  // Whether preflight asks anyone (the gateway then checks the authority first, read-only, so
  // that a caller it refuses learns nothing from the answer).
  [[nodiscard]] virtual bool asks_before_claim() const noexcept { return false; }
  // The per-execution side (nothing is created until acquire).
  [[nodiscard]] virtual std::shared_ptr<BackendExecution> create(std::string execution_id) = 0;
  // Host-wide upkeep the manager asks for: is `pid` the live root of one of this backend's
  // executions (orphan reaping must leave it to the execution), and which execution's boundary
  // holds `pid` (orphan attribution).
  [[nodiscard]] virtual bool is_root(std::int32_t pid) const { return (void)pid, false; }
  [[nodiscard]] virtual std::optional<std::string> owner_of(std::int32_t pid) const {
    return (void)pid, std::nullopt;
  }
};

}  // namespace custos::backend
