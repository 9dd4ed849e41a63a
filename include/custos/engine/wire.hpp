// The pure half of the engine client: what goes on the wire to the Docker Engine API (and
// Podman's Docker-compatible API) and how each answer is read. No I/O here: everything is a
// function of bytes, so it is unit-tested against captured answers of both engines and fuzzed
// (fuzz/fuzz_engine_response.cpp, fuzz/fuzz_engine_frames.cpp).
//
// The rules the client keeps, all decided here:
//   * every answer is bounded: response header, body, stream frame and kept engine message each
//     have a limit (Limits), and exceeding one is a typed error, never a larger buffer;
//   * every failure is a typed engine.* error whose context keeps the engine's own message
//     (classify_failure), decided by the HTTP status and, for Podman, its `cause` field, never
//     by matching message text;
//   * names and ids that go into a request path are validated first (a container reference by
//     core::is_valid_container_ref, an exec id as 1..128 alphanumerics), so nothing a caller or
//     an engine says can change which endpoint is called.
#pragma once

#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"

namespace custos::engine {

enum class EngineKind : std::uint8_t { docker, podman };

// "docker" / "podman".
[[nodiscard]] std::string_view to_string(EngineKind k) noexcept;

// An Engine API version ("1.41").
struct ApiVersion {
  std::uint16_t major = 1;
  std::uint16_t minor = 0;

  friend auto operator<=>(ApiVersion const&, ApiVersion const&) = default;
  [[nodiscard]] std::string str() const;
};

// "1.41" → {1, 41}; nullopt for anything else (no sign, no spaces, no third part, ≤ 65535).
[[nodiscard]] std::optional<ApiVersion> parse_api_version(std::string_view s) noexcept;

// The API versions this client is written against: every request it sends exists with the
// meaning it relies on since kMinApiVersion (exec WorkingDir arrived in 1.35), and it has been
// read against the reference up to kMaxApiVersion. A newer engine is spoken to at
// kMaxApiVersion (engines keep serving older versions), an older one at its own.
inline constexpr ApiVersion kMinApiVersion{1, 35};
inline constexpr ApiVersion kMaxApiVersion{1, 43};

// The version both sides speak: min(engine's newest, kMaxApiVersion), if that is at least both
// kMinApiVersion and the engine's oldest. Errors: engine.failed naming the three versions.
[[nodiscard]] Result<ApiVersion> negotiate(ApiVersion engine_max, ApiVersion engine_min);

// Bounds on everything read from an engine.
struct Limits {
  std::size_t header_bytes = std::size_t{16} * 1024;       // one response's status line + fields
  std::size_t body_bytes = std::size_t{4} * 1024 * 1024;   // one response body (inspect JSON)
  std::size_t frame_bytes = std::size_t{1} * 1024 * 1024;  // one multiplexed stream frame
  std::size_t message_bytes = 2048;                        // the engine message kept in an Error
  std::size_t read_chunk_bytes = std::size_t{64} * 1024;   // one read of an exec stream
  std::chrono::milliseconds timeout{10000};                // a call's deadline when none is given
};

// ---- responses ------------------------------------------------------------------------------

// One HTTP response as the client uses it.
struct Response {
  unsigned status = 0;
  std::string reason;
  std::string content_type;
  std::string api_version;  // the Api-Version header, when sent
  bool libpod = false;      // a Libpod-Api-Version header was sent: Podman answered
  std::string body;
};

// Parses one complete response from `bytes` (everything the engine sent before closing), with
// the client's limits. For tests and fuzzing: the client reads with the same parser settings.
// Errors: engine.failed for malformed HTTP, a header or body over its limit, or a truncated
// message; engine.unavailable when `bytes` is empty (the engine closed without answering).
[[nodiscard]] Result<Response> parse_response(std::string_view bytes, Limits const& limits);

// What the client asked for, for classification and messages.
enum class Operation : std::uint8_t {
  version,
  ping,
  container_inspect,
  exec_create,
  exec_start,
  exec_inspect,
  exec_resize,
};

// "version", "ping", "container inspect", "exec create", ...
[[nodiscard]] std::string_view to_string(Operation op) noexcept;

// An engine's error body: Docker sends {"message": ...}, Podman {"cause", "message",
// "response"}. A body that is not such JSON is kept as text. Both strings are cut to
// `max_bytes` (marking the cut with "...") and every control character becomes a space, so a
// message is safe to log and to put in an error.
struct EngineMessage {
  std::string message;
  std::string cause;  // Podman's machine-readable cause ("no such container"), else empty
};
[[nodiscard]] EngineMessage parse_engine_message(std::string_view body, std::size_t max_bytes);

// Whether `status` is a success for `op`: 2xx, and for exec start also 101 (the upgraded,
// hijacked connection; Docker without the Upgrade header answers 200 and hijacks too).
[[nodiscard]] bool is_success(Operation op, unsigned status) noexcept;

// The typed error for an unsuccessful answer to `op` about `subject` (a container reference
// or an exec id) from engine `kind`:
//   version, ping: any status → engine.unavailable (the engine is not serving);
//   404 on container inspect / exec create → engine.container_not_found; on the exec
//     operations → engine.container_not_found when Podman's cause says so, else engine.failed
//     (the exec instance is gone);
//   409 on exec create / exec start (Docker: not running, paused, restarting) →
//     engine.container_not_running;
//   500 with Podman's cause "container state improper" on exec create / start →
//     engine.container_not_running;
//   anything else → engine.failed.
// The context is "<kind> <op> <subject>: HTTP <status>: <engine message>".
[[nodiscard]] Error classify_failure(EngineKind kind, Operation op, std::string_view subject,
                                     unsigned status, std::string_view body,
                                     std::size_t max_message_bytes);

// ---- request targets ------------------------------------------------------------------------

// An exec id as engines make them (64 hex digits); accepted: 1..128 ASCII alphanumerics.
[[nodiscard]] bool is_valid_exec_id(std::string_view id) noexcept;

// "/v1.41/containers/<ref>/json" and so on. The caller has validated `ref` / `id`.
[[nodiscard]] std::string container_inspect_target(ApiVersion v, std::string_view ref);
[[nodiscard]] std::string exec_create_target(ApiVersion v, std::string_view ref);
[[nodiscard]] std::string exec_start_target(ApiVersion v, std::string_view id);
[[nodiscard]] std::string exec_inspect_target(ApiVersion v, std::string_view id);
[[nodiscard]] std::string exec_resize_target(ApiVersion v, std::string_view id, std::uint16_t rows,
                                             std::uint16_t cols);

// ---- bodies ---------------------------------------------------------------------------------

// GET /version.
struct EngineVersion {
  EngineKind kind =
      EngineKind::docker;  // what answered: podman when a component is "Podman Engine"
  std::string product;     // that component's name ("Engine", "Podman Engine")
  std::string version;     // the engine's release ("20.10.24", "4.3.1")
  ApiVersion api;          // the newest API version the engine speaks
  ApiVersion min_api;      // the oldest
  ApiVersion negotiated;   // what this client speaks to it (negotiate())
  std::string os;
  std::string arch;
  std::string kernel;
};
// Errors: engine.failed when the body is not the version object or no version is common.
[[nodiscard]] Result<EngineVersion> parse_version(std::string_view body);

enum class ContainerStatus : std::uint8_t {
  created,
  running,
  paused,
  restarting,
  removing,
  exited,
  dead,
  unknown,  // a status this client does not know; the text is kept in status_text
};
[[nodiscard]] std::string_view to_string(ContainerStatus s) noexcept;

// GET /containers/<ref>/json, the parts custos uses.
struct ContainerInspect {
  std::string id;    // the full id
  std::string name;  // without Docker's leading '/'
  ContainerStatus status = ContainerStatus::unknown;
  std::string status_text;
  bool running = false;  // State.Running: true for a paused container too (Docker)
  bool paused = false;
  bool restarting = false;
  std::int32_t pid = 0;  // State.Pid: the init's host pid; 0 when not running
  std::string started_at;
  std::string user;           // Config.User, the container's configured user ("" = root)
  std::string cgroup_parent;  // HostConfig.CgroupParent as configured ("" = the engine's)
  std::string cgroupns_mode;  // HostConfig.CgroupnsMode ("host", "private", "")
  std::string image;
  // Whether an exec can run now: running, and neither paused nor restarting.
  [[nodiscard]] bool accepts_exec() const noexcept {
    return running && !paused && !restarting && status == ContainerStatus::running;
  }
};
// Errors: engine.failed when the body is not a container object (no Id, no State).
[[nodiscard]] Result<ContainerInspect> parse_container_inspect(std::string_view body);

// POST /containers/<ref>/exec.
struct ExecConfig {
  std::vector<std::string> cmd;  // argv; cmd[0] is looked up in the container's PATH
  std::vector<std::string> env;  // "NAME=value", added to the container's environment
  std::string user;              // "uid", "uid:gid" or a name; empty: the container's user
  std::string working_dir;       // absolute, inside the container; empty: the container's
  bool tty = false;
  bool attach_stdin = false;
  bool attach_stdout = true;
  bool attach_stderr = true;
  // The terminal size the first program sees (engines at API 1.42 and later take it at
  // create; below that the caller resizes right after the start).
  std::optional<std::pair<std::uint16_t, std::uint16_t>> console_size;  // rows, cols
};
// The JSON body for `config` at API version `v`.
[[nodiscard]] std::string exec_create_body(ExecConfig const& config, ApiVersion v);
// {"Id": "..."} → the exec id. Errors: engine.failed (no Id, or not a valid exec id).
[[nodiscard]] Result<std::string> parse_exec_create(std::string_view body);

// The JSON body of exec start ({"Detach": false, "Tty": tty}).
[[nodiscard]] std::string exec_start_body(bool tty);

// GET /exec/<id>/json.
struct ExecInspect {
  std::string id;
  std::string container_id;
  bool running = false;
  // Set once the exec ended. Docker reports null while it runs, Podman 0: both read nullopt.
  std::optional<int> exit_code;
  std::int32_t pid = 0;  // the exec's first process as a host pid; 0 when unknown or ended
  bool tty = false;
  bool open_stdin = false;
};
// Errors: engine.failed when the body is not an exec object.
[[nodiscard]] Result<ExecInspect> parse_exec_inspect(std::string_view body);

// Whether a v2 cgroup path (as /proc/PID/cgroup shows it) is a container's own: one of its
// components names the container's full id ("/docker/<id>", "/system.slice/docker-<id>.scope",
// ".../libpod-<id>.scope/container"). A rootless Podman without cgroup delegation leaves its
// containers in the service's cgroup, which names no container.
[[nodiscard]] bool cgroup_names_container(std::string_view cgroup, std::string_view id) noexcept;

// ---- the hijacked stream ---------------------------------------------------------------------

// Stream numbers of Docker's multiplexed stream (stdcopy): 0 stdin, 1 stdout, 2 stderr, and 3
// for an error the engine reports in the stream itself.
enum class StdStream : std::uint8_t { in = 0, out = 1, err = 2, system = 3 };

// A contiguous part of one frame's payload.
struct FramePiece {
  StdStream stream = StdStream::out;
  std::span<std::uint8_t const> bytes;  // a view into the input given to next()
};

// Splits the multiplexed stream of a non-TTY exec: 8-byte headers [stream, 0, 0, 0, size as
// big-endian uint32] each followed by `size` payload bytes. Payloads are handed out as they
// arrive, without copying or waiting for a whole frame, so memory use does not depend on the
// frame size; a header announcing more than `max_frame_bytes` is refused all the same (a stream
// that is not framed, or is hostile). A header split across inputs is kept (at most 7 bytes).
class FrameDemuxer {
 public:
  explicit FrameDemuxer(std::size_t max_frame_bytes) noexcept : max_frame_(max_frame_bytes) {}

  // The next payload piece from `in`, advancing `in` past what it consumed (headers included);
  // nullopt once `in` is used up. Errors: engine.failed for an unknown stream number, non-zero
  // padding or an oversized frame; after an error every call returns it again.
  [[nodiscard]] Result<std::optional<FramePiece>> next(std::span<std::uint8_t const>& in);

  // True between frames: the stream may end here without losing a part of a frame.
  [[nodiscard]] bool at_boundary() const noexcept { return header_fill_ == 0 && remaining_ == 0; }
  [[nodiscard]] std::uint64_t frames() const noexcept { return frames_; }

  // Where the demuxer stands between two inputs, so that another one (another process image,
  // after a handover) goes on from there: the part of a header read so far, or the payload
  // bytes still owed to the current frame and its stream.
  struct Position {
    std::vector<std::uint8_t> header;  // at most 7 bytes; non-empty only between frames
    std::size_t remaining = 0;         // of the current frame's payload
    StdStream stream = StdStream::out;
    std::uint64_t frames = 0;
  };
  [[nodiscard]] Position position() const;
  // A demuxer at `p`. Errors: engine.failed when `p` is not a position any demuxer with this
  // limit can be at (a header of 8 or more bytes, a header and a payload both pending, a frame
  // over the limit, an unknown stream). A failed demuxer has no position to go on from.
  [[nodiscard]] static Result<FrameDemuxer> resume(std::size_t max_frame_bytes, Position const& p);

 private:
  std::size_t max_frame_;
  std::uint8_t header_[8] = {};
  std::size_t header_fill_ = 0;
  std::size_t remaining_ = 0;
  StdStream stream_ = StdStream::out;
  std::uint64_t frames_ = 0;
  std::optional<Error> failed_;
};

// The inverse, for tests and the fuzzer's round trip: one frame of `payload` on `stream`.
[[nodiscard]] std::vector<std::uint8_t> encode_frame(StdStream stream,
                                                     std::span<std::uint8_t const> payload);

}  // namespace custos::engine
