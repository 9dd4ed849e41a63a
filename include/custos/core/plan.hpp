// The execution plan (docs/api.md "The request: identity and plan") as checked C++ values.
//
// An ExecutionPlan is always the *effective* plan: every optional JSON member has been replaced
// by its documented default, so the canonical bytes and the digest cover exactly what will run.
// parse_plan (plan_json.hpp) is the usual way to build one; validate_plan states every rule and
// is run again by the canonical encoder and decoder, so an invalid plan can never be digested.
//
// Each struct's kFieldCount is its number of data members; the canonical encoder destructures
// each struct into exactly that many bindings (a new member breaks the build until it is
// encoded) and tests/core/plan_digest_test.cpp has one mutator per member.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "custos/core/digest.hpp"
#include "custos/core/error.hpp"

namespace custos::core {

// ------------------------------------------------------------------------------ bounds
// Every size a caller controls is bounded here; exceeding one is plan.too_large.

// Paths (executable, workspace root, cwd): Linux PATH_MAX (4096) including the terminator.
inline constexpr std::size_t kMaxPathBytes = 4095;
// argv: element count, bytes of one element (MAX_ARG_STRLEN minus the NUL), and the total of
// (length + 1) over all elements. Well under the kernel's ARG_MAX so exec cannot fail on size.
inline constexpr std::size_t kMaxArgvCount = 4096;
inline constexpr std::size_t kMaxArgBytes = 131071;
inline constexpr std::size_t kMaxArgvTotalBytes = 1U << 20U;
// env: entry count, name bytes, literal value bytes, and the total of name + '=' + value + NUL
// over all entries (inherited entries count their name and separator only: their value is only
// known at launch and is bounded by the daemon's own environment).
inline constexpr std::size_t kMaxEnvCount = 1024;
inline constexpr std::size_t kMaxEnvNameBytes = 255;
inline constexpr std::size_t kMaxEnvValueBytes = 131071;
inline constexpr std::size_t kMaxEnvTotalBytes = 1U << 20U;
// Supplementary groups of a user spec.
inline constexpr std::size_t kMaxGroups = 64;
// Docker/Podman container id or name.
inline constexpr std::size_t kMaxContainerBytes = 255;
// An engine socket path must fit sockaddr_un.sun_path (108 bytes including the terminator).
inline constexpr std::size_t kMaxSocketPathBytes = 107;
// Every numeric limit and policy value is at most 2^53 - 1 so that it survives a round trip
// through any JSON implementation (IEEE double) unchanged.
inline constexpr std::uint64_t kMaxPlanNumber = (std::uint64_t{1} << 53U) - 1;
// PTY size: struct winsize fields are unsigned short.
inline constexpr std::uint32_t kMaxPtyDimension = 65535;
// Output policy: one chunk at most 16 MiB; retained (in-memory) output at most 256 MiB.
inline constexpr std::uint64_t kMaxChunkBytes = 16U << 20U;
inline constexpr std::uint64_t kMaxRetainedBytes = 256U << 20U;
// Escalation intervals at most one hour.
inline constexpr std::uint64_t kMaxEscalationMs = 3'600'000;

// ------------------------------------------------------------------------------ the plan

struct Command {
  static constexpr std::size_t kFieldCount = 2;
  // Absolute, normalized (no empty, "." or ".." component, no trailing '/'), never "/" alone.
  std::string executable;
  // Non-empty; passed to execve as is, never through a shell.
  std::vector<std::string> argv;
  friend bool operator==(Command const&, Command const&) = default;
};

enum class WorkspaceAccess : std::uint8_t { read_only = 1, writable = 2 };

struct Workspace {
  static constexpr std::size_t kFieldCount = 2;
  // Absolute and normalized like Command::executable ("/" itself is allowed).
  std::string root;
  WorkspaceAccess access = WorkspaceAccess::read_only;
  friend bool operator==(Workspace const&, Workspace const&) = default;
};

// One environment entry of a child environment built from nothing. The two kinds stay distinct
// all the way into the canonical bytes: authority to inherit a name is not authority to set it.
struct EnvEntry {
  static constexpr std::size_t kFieldCount = 2;
  // [A-Za-z_][A-Za-z0-9_]*, at most kMaxEnvNameBytes; unique within a plan.
  std::string name;
  // Empty: inherited by name from the daemon's environment. Set: this literal value.
  std::optional<std::string> value;

  [[nodiscard]] bool inherits() const noexcept { return !value.has_value(); }
  friend bool operator==(EnvEntry const&, EnvEntry const&) = default;
};

enum class IoMode : std::uint8_t { pipes = 1, pty = 2 };

struct IoPolicy {
  static constexpr std::size_t kFieldCount = 4;
  IoMode mode = IoMode::pipes;
  // pty only (zero/false for pipes): window size 1..kMaxPtyDimension, defaults 24 x 80, and
  // whether exec.resize is allowed (default false: a resize is an effect, so it is opt-in).
  std::uint32_t rows = 0;
  std::uint32_t cols = 0;
  bool resize = false;
  friend bool operator==(IoPolicy const&, IoPolicy const&) = default;
};

inline constexpr std::uint32_t kDefaultPtyRows = 24;
inline constexpr std::uint32_t kDefaultPtyCols = 80;

// A limit value: empty means unlimited (JSON "unlimited"), else 1..kMaxPlanNumber.
using Limit = std::optional<std::uint64_t>;

// Defaults when the JSON omits a key. Unlimited where the host cannot meaningfully pick a number
// for the caller (cpu, memory, disk); finite where an unbounded default would let a forgotten
// process or a chatty one hold the daemon's resources (wall clock, output, stdin, fds, tasks).
inline constexpr Limit kDefaultWallMs = 3'600'000;          // one hour
inline constexpr Limit kDefaultCpuMs = std::nullopt;        // unlimited
inline constexpr Limit kDefaultMemoryBytes = std::nullopt;  // unlimited
inline constexpr Limit kDefaultProcesses = 1024;
inline constexpr Limit kDefaultOpenFiles = 1024;
inline constexpr Limit kDefaultDiskBytes = std::nullopt;    // unlimited
inline constexpr Limit kDefaultOutputBytes = 64ULL << 20U;  // 64 MiB over all streams
inline constexpr Limit kDefaultStdinBytes = 1ULL << 20U;    // 1 MiB

struct Limits {
  static constexpr std::size_t kFieldCount = 8;
  Limit wall_ms = kDefaultWallMs;
  Limit cpu_ms = kDefaultCpuMs;
  Limit memory_bytes = kDefaultMemoryBytes;
  Limit processes = kDefaultProcesses;
  Limit open_files = kDefaultOpenFiles;
  Limit disk_bytes = kDefaultDiskBytes;
  Limit output_bytes = kDefaultOutputBytes;
  Limit stdin_bytes = kDefaultStdinBytes;
  friend bool operator==(Limits const&, Limits const&) = default;
};

// JSON names of the Limits members, in member (and canonical tag) order.
inline constexpr std::string_view kLimitNames[] = {"wall_ms",      "cpu_ms",     "memory_bytes",
                                                   "processes",    "open_files", "disk_bytes",
                                                   "output_bytes", "stdin_bytes"};
[[nodiscard]] std::vector<Limit*> limit_members(Limits& l);
[[nodiscard]] std::vector<Limit const*> limit_members(Limits const& l);

enum class OnLimit : std::uint8_t { truncate = 1, cancel = 2 };

struct OutputPolicy {
  static constexpr std::size_t kFieldCount = 5;
  std::uint64_t chunk_bytes = 65536;         // 1..kMaxChunkBytes
  std::uint64_t retained_bytes = 1U << 20U;  // 0..kMaxRetainedBytes per stream
  std::uint64_t spool_bytes = 64U << 20U;    // 0..kMaxPlanNumber per stream; 0 = no spool
  std::uint64_t max_events = 100000;         // 1..kMaxPlanNumber
  OnLimit on_limit = OnLimit::truncate;
  friend bool operator==(OutputPolicy const&, OutputPolicy const&) = default;
};

// Stopping: send `signal` to the tree, wait `grace_ms` (0..kMaxEscalationMs), then kill the
// whole tree (cgroup.kill) and wait up to `kill_after_ms` (1..kMaxEscalationMs) for it to be
// empty; a tree still not empty then is recorded as cleanup "unconfirmed".
struct Escalation {
  static constexpr std::size_t kFieldCount = 3;
  std::uint32_t signal = 15;  // SIGTERM; see signal_from_name for the allowed set
  std::uint64_t grace_ms = 2000;
  std::uint64_t kill_after_ms = 5000;
  friend bool operator==(Escalation const&, Escalation const&) = default;
};

// Allowed graceful signals by name, with their Linux numbers (identical on every architecture
// custos builds for): SIGHUP 1, SIGINT 2, SIGQUIT 3, SIGUSR1 10, SIGUSR2 12, SIGTERM 15.
// SIGKILL/SIGSTOP are excluded (a graceful step that cannot be handled is no grace) and so are
// signals that only make sense from the kernel (SIGSEGV, SIGCHLD, ...).
[[nodiscard]] std::optional<std::uint32_t> signal_from_name(std::string_view name) noexcept;
[[nodiscard]] std::optional<std::string_view> signal_name(std::uint32_t number) noexcept;

// Credentials the execution runs with. uid/gid 0..4294967294 ((uid_t)-1 means "unchanged" to
// the kernel and is refused); groups strictly ascending (parse_plan sorts them; a duplicate is
// an error), at most kMaxGroups.
struct UserSpec {
  static constexpr std::size_t kFieldCount = 3;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::vector<std::uint32_t> groups;
  friend bool operator==(UserSpec const&, UserSpec const&) = default;
};

enum class BackendKind : std::uint8_t { native = 1, reference = 2, docker = 3, podman = 4 };

// ------------------------------------------------------------------------------ reference script
// The reference backend runs no process: it walks a script, in order (API.md "The reference
// backend"). The rules, all checked by validate_backend:
//   - a step does exactly one thing, and something: an empty write, sleep_ms 0, spawn 0,
//     read_stdin 0 and a `use` naming no resource are refused;
//   - `exit` or `signal` ends the script and may only be its last step; a script without one
//     ends as if its last step were {"exit": 0} (an empty script exits 0 at once);
//   - `ignore` names a signal a graceful stop may send (signal_from_name; SIGKILL cannot be
//     ignored); `signal` names a signal that ends a process by default (terminating_signal_*);
//   - the bounds below hold over the whole script (each is plan.too_large).
inline constexpr std::size_t kMaxScriptSteps = 1024;
// Output the script writes, decoded, over every write step: enough to cross any small output
// limit a test sets, small next to the plan's other bounds (argv and env are 1 MiB each).
inline constexpr std::size_t kMaxScriptWriteBytes = std::size_t{1} << 20U;
// Time the script sleeps, summed: the default wall_ms (one hour).
inline constexpr std::uint64_t kMaxScriptSleepMs = 3'600'000;
// Descendants the script spawns, summed: four times the default processes limit, so a script
// can exceed any limit the plan may reasonably set without the model's count being unbounded.
inline constexpr std::uint64_t kMaxScriptSpawn = 4096;
// stdin the script reads, summed, and every `use` value: the plan's number bound.

enum class ScriptStream : std::uint8_t { stdout_stream = 1, stderr_stream = 2 };

namespace script {
// Writes `data` to stdout or stderr (with io mode pty both reach the pty stream).
struct Write {
  static constexpr std::size_t kFieldCount = 2;
  ScriptStream stream = ScriptStream::stdout_stream;
  std::vector<std::uint8_t> data;  // 1.. bytes
  friend bool operator==(Write const&, Write const&) = default;
};
// Waits `ms` milliseconds of the daemon's clock.
struct Sleep {
  static constexpr std::size_t kFieldCount = 1;
  std::uint64_t ms = 1;  // 1..kMaxScriptSleepMs
  friend bool operator==(Sleep, Sleep) = default;
};
// Starts `count` more descendants: the observed processes are 1 + everything spawned so far.
struct Spawn {
  static constexpr std::size_t kFieldCount = 1;
  std::uint64_t count = 1;  // 1..kMaxScriptSpawn
  friend bool operator==(Spawn, Spawn) = default;
};
// From now on the model ignores this signal (a graceful stop with it is not honoured).
struct Ignore {
  static constexpr std::size_t kFieldCount = 1;
  std::uint32_t signal = 15;  // one of signal_from_name
  friend bool operator==(Ignore, Ignore) = default;
};
// Sets the observed resources it names (a peak the sampler would see); absent ones keep theirs.
struct Use {
  static constexpr std::size_t kFieldCount = 4;
  std::optional<std::uint64_t> cpu_ms;  // each 0..kMaxPlanNumber; at least one present
  std::optional<std::uint64_t> memory_bytes;
  std::optional<std::uint64_t> disk_bytes;
  std::optional<std::uint64_t> descriptors;
  friend bool operator==(Use const&, Use const&) = default;
};
// Reads `bytes` of stdin (waits until they arrived, or stdin's EOF).
struct ReadStdin {
  static constexpr std::size_t kFieldCount = 1;
  std::uint64_t bytes = 1;  // 1..kMaxPlanNumber, summed over the script as well
  friend bool operator==(ReadStdin, ReadStdin) = default;
};
// The root exits with this code. Last step only.
struct Exit {
  static constexpr std::size_t kFieldCount = 1;
  std::uint8_t code = 0;
  friend bool operator==(Exit, Exit) = default;
};
// The root is killed by this signal (as if it had raised it). Last step only.
struct Signal {
  static constexpr std::size_t kFieldCount = 1;
  std::uint32_t signal = 11;  // one of terminating_signal_from_name
  friend bool operator==(Signal, Signal) = default;
};
}  // namespace script

using ScriptStep = std::variant<script::Write, script::Sleep, script::Spawn, script::Ignore,
                                script::Use, script::ReadStdin, script::Exit, script::Signal>;

// JSON key of a step's kind ("write", "sleep_ms", "spawn", "ignore", "use", "read_stdin", "exit",
// "signal"), indexed like ScriptStep.
inline constexpr std::string_view kScriptStepKeys[] = {"write", "sleep_ms",   "spawn", "ignore",
                                                       "use",   "read_stdin", "exit",  "signal"};
[[nodiscard]] std::string_view script_step_key(ScriptStep const& step) noexcept;
// JSON names of the Use members, in member (and canonical tag) order.
inline constexpr std::string_view kScriptUseNames[] = {"cpu_ms", "memory_bytes", "disk_bytes",
                                                       "descriptors"};

struct ReferenceScript {
  static constexpr std::size_t kFieldCount = 1;
  std::vector<ScriptStep> steps;  // 0..kMaxScriptSteps, in order
  friend bool operator==(ReferenceScript const&, ReferenceScript const&) = default;
};

// How a valid script ends: its exit or signal step, else exit 0 after the last step.
[[nodiscard]] std::variant<script::Exit, script::Signal> script_end(ReferenceScript const& s);

// Signals that end a process by default, by name, with their Linux numbers (asm-generic, the
// same on x86_64 and arm64): SIGHUP 1, SIGINT 2, SIGQUIT 3, SIGILL 4, SIGTRAP 5, SIGABRT 6,
// SIGBUS 7, SIGFPE 8, SIGKILL 9, SIGUSR1 10, SIGSEGV 11, SIGUSR2 12, SIGPIPE 13, SIGALRM 14,
// SIGTERM 15, SIGSTKFLT 16, SIGXCPU 24, SIGXFSZ 25, SIGVTALRM 26, SIGPROF 27, SIGIO 29,
// SIGPWR 30, SIGSYS 31. Stop, continue and ignored-by-default signals are not among them.
[[nodiscard]] std::optional<std::uint32_t> terminating_signal_from_name(
    std::string_view name) noexcept;
[[nodiscard]] std::optional<std::string_view> terminating_signal_name(
    std::uint32_t number) noexcept;

// Whether a container exec must start behind the gate (docs/containers.md). optional: where the
// container cannot run the gate (no /bin/sh), the exec starts ungated under the marker boundary.
enum class GatePolicy : std::uint8_t { required = 1, optional = 2 };

struct Backend {
  static constexpr std::size_t kFieldCount = 5;
  BackendKind kind = BackendKind::native;
  // docker/podman: required, 1..kMaxContainerBytes of [A-Za-z0-9_.-], first alphanumeric.
  // native/reference: must be empty.
  std::optional<std::string> container;
  // docker/podman: optional absolute engine socket path (empty: the daemon's configured engine
  // socket). native/reference: must be empty.
  std::optional<std::string> socket;
  // reference: required (the script the model walks). native/docker/podman: must be empty.
  std::optional<ReferenceScript> script;
  // docker/podman only (anything but `required` elsewhere is refused).
  GatePolicy gate = GatePolicy::required;
  friend bool operator==(Backend const&, Backend const&) = default;
};

struct ExecutionPlan {
  static constexpr std::size_t kFieldCount = 11;
  Command command;
  Workspace workspace;
  // Relative to the workspace root and normalized: "." for the root itself, else components
  // joined by '/' with no empty, "." or ".." component (".." is refused outright rather than
  // folded: lexical folding is wrong when a component is a symlink; sys/ resolves with
  // openat2 RESOLVE_BENEATH).
  std::string cwd = ".";
  std::vector<EnvEntry> env;
  IoPolicy io;
  Limits limits;
  OutputPolicy output;
  Escalation escalation;
  std::optional<UserSpec> user;  // empty: run as the calling uid/gid
  // The plan's sandbox, as core carries it: the digest of its checked sandbox plan
  // (custos/sandbox/checked.hpp: the requirements of JSON `plan.sandbox`, compiled with every
  // default filled in). Empty: JSON `plan.sandbox` absent, an unsandboxed execution. Core knows
  // no more of the sandbox than this digest; it is part of the canonical bytes, so plan_digest
  // covers it. The sandbox layer parses `plan.sandbox` (sandbox::parse_plan) and sets it.
  std::optional<Digest> sandbox_digest;
  Backend backend;
  friend bool operator==(ExecutionPlan const&, ExecutionPlan const&) = default;
};

// ------------------------------------------------------------------------------ rules

// Every rule violation of the plan, each with its JSON pointer below `pointer_base`
// (e.g. "/plan"). Empty when the plan is valid.
[[nodiscard]] std::vector<Diagnostic> validate_plan(ExecutionPlan const& plan,
                                                    std::string_view pointer_base = "");

// The per-section rules validate_plan is made of (parse_plan runs each on the sections that
// parsed structurally, so one mistake yields one diagnostic). Each appends to `out`.
void validate_command(Command const& c, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_workspace(Workspace const& w, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_cwd(std::string const& cwd, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_env(std::vector<EnvEntry> const& env, std::string const& ptr,
                  std::vector<Diagnostic>& out);
void validate_io(IoPolicy const& io, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_limits(Limits const& l, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_output(OutputPolicy const& o, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_escalation(Escalation const& e, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_user(UserSpec const& u, std::string const& ptr, std::vector<Diagnostic>& out);
void validate_backend(Backend const& b, std::string const& ptr, std::vector<Diagnostic>& out);
// The script rules above; `ptr` is the script's pointer (".../backend/script").
void validate_script(ReferenceScript const& s, std::string const& ptr,
                     std::vector<Diagnostic>& out);

// Normalizes a JSON cwd ("" and "." → "."; empty and "." components dropped). Returns nullopt
// with a reason when the cwd is absolute or has a ".." component.
[[nodiscard]] std::optional<std::string> normalize_cwd(std::string_view cwd, std::string* why);

// Path and name predicates used by the rules above.
[[nodiscard]] bool is_normalized_absolute_path(std::string_view p) noexcept;
[[nodiscard]] bool is_valid_env_name(std::string_view name) noexcept;
[[nodiscard]] bool is_valid_container_ref(std::string_view c) noexcept;

// Wire names of the enums (the JSON spellings) and their inverses.
[[nodiscard]] std::string_view to_string(WorkspaceAccess a) noexcept;
[[nodiscard]] std::string_view to_string(IoMode m) noexcept;
[[nodiscard]] std::string_view to_string(OnLimit o) noexcept;
[[nodiscard]] std::string_view to_string(BackendKind k) noexcept;
[[nodiscard]] std::string_view to_string(ScriptStream s) noexcept;
[[nodiscard]] std::string_view to_string(GatePolicy g) noexcept;
[[nodiscard]] std::optional<WorkspaceAccess> workspace_access_from(std::string_view s) noexcept;
[[nodiscard]] std::optional<IoMode> io_mode_from(std::string_view s) noexcept;
[[nodiscard]] std::optional<OnLimit> on_limit_from(std::string_view s) noexcept;
[[nodiscard]] std::optional<BackendKind> backend_kind_from(std::string_view s) noexcept;
[[nodiscard]] std::optional<ScriptStream> script_stream_from(std::string_view s) noexcept;
[[nodiscard]] std::optional<GatePolicy> gate_policy_from(std::string_view s) noexcept;

}  // namespace custos::core
