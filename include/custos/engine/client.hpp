// The Docker Engine API client (and Podman's Docker-compatible API) over a Unix socket, for an
// event loop: every call is asynchronous on the caller's io_context, completes exactly once on
// that loop (never inside the call that started it), and has a deadline after which it
// completes with engine.unavailable. The supervisor is single-threaded and must never block, so
// nothing here blocks it; SyncClient (sync.hpp) wraps the same calls for `custos doctor`.
//
// One connection per call: a Unix-socket connect costs microseconds, and a connection that is
// never reused cannot carry a half-read answer into the next call. The exec start call keeps
// its connection: after the response header it is the exec's raw stream (ExecStream).
//
// Version negotiation: the first call that needs the API version asks GET /_ping once (calls
// made meanwhile wait for that answer), reads the engine's newest version from its Api-Version
// header (GET /version when an engine does not send it), and then speaks min(engine's newest,
// kMaxApiVersion) to it, prefixing every path with "/v<version>". A failed negotiation is not
// remembered: the next call asks again (the engine may have been restarted).
//
// Errors of every call: engine.unavailable (no socket, refused, no answer before the deadline,
// connection lost, cancel()), engine.failed (malformed or oversized answers, refusals with the
// engine's message), and the container errors classify_failure() names.
#pragma once

// See src/engine/http.hpp: an Asio finding of GCC 12 at -O2, silenced for Boost's headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#pragma GCC diagnostic pop

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/engine/wire.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::engine {

// Which engine, and where it listens.
struct Endpoint {
  EngineKind kind = EngineKind::docker;
  std::string socket;  // absolute path of the API's Unix socket
};

// Where the host's view of a container's processes is read (tests point these at a fake tree).
struct HostPaths {
  std::string proc_root = "/proc";
  std::string mountinfo = "/proc/self/mountinfo";
};

// What the host says about a running container's init (State.Pid). Read through a pidfd opened
// before the reads and checked alive after them, so every field belongs to that one process.
struct ContainerProcess {
  std::int32_t pid = 0;             // a host pid
  sys::PidfsIdentity identity{};    // the init's pidfs identity
  std::uint64_t pid_namespace = 0;  // inode of /proc/PID/ns/pid: the container's PID namespace
  // The init's cgroup v2 path, as /proc/PID/cgroup's `0::` line shows it ("/docker/<id>"), and
  // the directory under the v2 mount. Empty when the host has no v2 hierarchy.
  std::string cgroup;
  std::string cgroup_dir;
  // Whether that cgroup is the container's own (cgroup_names_container): Docker's is; a
  // rootless Podman without delegation leaves its containers in the service's cgroup.
  bool cgroup_own = false;
};

struct ContainerInfo {
  ContainerInspect inspect;
  // Set when the container is running and its init could be read on the host.
  std::optional<ContainerProcess> init;
  // Why `init` is not set although the engine says the container runs: the init exited
  // meanwhile (engine.container_not_running) or the host could not be read (procfs, pidfd).
  std::optional<Error> init_error;
};

// Reads ContainerProcess for `pid` (the init of container `id`). Errors:
// engine.container_not_running when no such process exists or it exited during the reads;
// pidfd.failed, procfs.failed, sys.* from the reads.
[[nodiscard]] Result<ContainerProcess> read_container_process(std::int32_t pid, std::string_view id,
                                                              HostPaths const& paths = {});

// How one exec stream ended.
struct StreamEnd {
  enum class Kind : std::uint8_t {
    eof,     // the engine closed the stream on a frame boundary: every byte arrived
    closed,  // this side closed it (ExecStream::close)
    failed,  // a malformed stream, an error frame from the engine, or a broken connection
  };
  Kind kind = Kind::eof;
  std::optional<Error> error;  // set for `failed`
};

// What a non-blocking write of stdin did.
struct WriteResult {
  std::size_t written = 0;
  bool would_block = false;  // nothing could be written now: await_writable()
  bool closed = false;       // the stream cannot take input any more (closed, broken, half-closed)
};

// Where an exec's stream stands on its connection, for another process image to go on reading
// it (a handover, docs/supervisor.md): ExecStream::release() gives it with the connection, and
// Client::resume_stream() takes both back.
struct ExecStreamState {
  bool tty = false;
  FrameDemuxer::Position position;   // the demuxer's (non-TTY)
  std::vector<std::uint8_t> unread;  // read from the connection, not delivered yet
  std::string engine_message;        // an error frame's text collected so far
  bool input_closed = false;         // the write half was shut (the exec read end-of-file)
  std::uint64_t bytes_read = 0;
};

// The hijacked connection of a started exec: stdout/stderr as multiplexed frames (Tty false)
// or the terminal's raw bytes (Tty true), and stdin the other way. Owned through a shared_ptr
// (its asynchronous reads hold one); every callback runs on the client's io_context.
class ExecStream : public std::enable_shared_from_this<ExecStream> {
 public:
  using OutputFn = std::function<void(StdStream, std::span<std::uint8_t const>)>;
  using EndFn = std::function<void(StreamEnd)>;

  // Made by Client::start_exec: `socket` is the connection after the response header and
  // `early` the stream bytes that arrived with it; `io` is the socket's io_context.
  ExecStream(boost::asio::io_context& io, boost::asio::local::stream_protocol::socket socket,
             std::vector<std::uint8_t> early, bool tty, std::string what, Limits const& limits);
  ExecStream(ExecStream const&) = delete;
  ExecStream& operator=(ExecStream const&) = delete;
  ~ExecStream();

  [[nodiscard]] bool tty() const noexcept { return tty_; }

  // Starts delivering output: `on_output` for each piece (StdStream::out for a TTY; at most
  // Limits::read_chunk_bytes at a time, in order), then `on_end` exactly once. Call once; the
  // callbacks are dropped after on_end, so they may hold the stream's owner.
  void start(OutputFn on_output, EndFn on_end);

  // Writes what the socket takes now, never blocking.
  [[nodiscard]] WriteResult try_write(std::span<std::uint8_t const> bytes);
  // One wake-up when the socket can take input again: `done` gets success, or an error once the
  // stream is closed (close(), or the connection broke). At most one wait at a time.
  void await_writable(std::function<void(Result<>)> done);
  // Ends the input: the exec reads end-of-file (shutdown of the write half); output keeps
  // flowing. Idempotent. Errors: engine.unavailable when the connection is already broken.
  [[nodiscard]] Result<> close_input();

  // Stops reading and writing at once and closes the connection; a pending wait completes
  // with an error and on_end (if started and not yet called) follows with Kind::closed. The
  // exec itself is not affected: ending it is the caller's business. Idempotent.
  void close();

  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return bytes_read_; }

  // Gives the connection up, open, with where the stream stands on it, and stops as close()
  // does (on_end, if started, follows with Kind::closed; the connection is not shut). Every
  // byte read from the connection so far was either delivered or is in `unread`: reads happen
  // only when the connection is readable, never ahead in a pending operation. Errors:
  // engine.unavailable when the stream already ended (a malformed stream ends it too) or was
  // closed, or the connection cannot be released (it is then closed).
  struct Released {
    sys::UniqueFd connection;
    ExecStreamState state;
  };
  [[nodiscard]] Result<Released> release();

 private:
  friend class Client;
  void read_more();
  void on_readable();
  void deliver(std::span<std::uint8_t const> bytes);
  void finish(StreamEnd end);

  boost::asio::io_context& io_;
  boost::asio::local::stream_protocol::socket socket_;
  std::vector<std::uint8_t> early_;  // stream bytes that arrived with the response header
  bool tty_;
  std::string what_;
  Limits limits_;
  FrameDemuxer demux_;
  std::vector<std::uint8_t> chunk_;
  std::string system_message_;  // an error frame's text, collected up to its limit
  OutputFn on_output_;
  EndFn on_end_;
  bool started_ = false;
  bool ended_ = false;
  bool closed_ = false;
  bool input_closed_ = false;
  bool reading_ = false;
  std::uint64_t bytes_read_ = 0;
};

class Client {
 public:
  template <class T>
  using Handler = std::function<void(Result<T>)>;
  using Timeout = std::chrono::milliseconds;

  Client(boost::asio::io_context& io, Endpoint endpoint, Limits limits = {}, HostPaths host = {});
  Client(Client const&) = delete;
  Client& operator=(Client const&) = delete;
  // Calls still in flight complete with engine.unavailable (as by cancel()).
  ~Client();

  [[nodiscard]] Endpoint const& endpoint() const noexcept;
  [[nodiscard]] Limits const& limits() const noexcept;
  // The API version spoken to the engine, once a call negotiated it.
  [[nodiscard]] std::optional<ApiVersion> const& negotiated() const noexcept;

  // GET /version: what the engine is, and a negotiation (refreshes what negotiated() says).
  void version(Timeout timeout, Handler<EngineVersion> done);
  // GET /_ping: the engine is serving. engine.unavailable for any other answer.
  void ping(Timeout timeout, Handler<void> done);
  // GET /containers/<ref>/json, then the init's host facts when it runs (ContainerInfo).
  // `ref` is a name or an id (core::is_valid_container_ref; anything else is
  // engine.container_not_found without asking).
  void inspect_container(std::string const& ref, Timeout timeout, Handler<ContainerInfo> done);
  // POST /containers/<ref>/exec: the exec id.
  void create_exec(std::string const& ref, ExecConfig config, Timeout timeout,
                   Handler<std::string> done);
  // POST /exec/<id>/start on a connection that becomes the exec's stream. The deadline covers
  // the request and the response header; the stream itself has none (the exec may run for
  // days: ending it is the caller's).
  void start_exec(std::string const& id, bool tty, Timeout timeout,
                  Handler<std::shared_ptr<ExecStream>> done);
  // GET /exec/<id>/json.
  void inspect_exec(std::string const& id, Timeout timeout, Handler<ExecInspect> done);
  // POST /exec/<id>/resize?h=rows&w=cols.
  void resize_exec(std::string const& id, std::uint16_t rows, std::uint16_t cols, Timeout timeout,
                   Handler<void> done);
  // Inspects the exec until the engine reports it ended (the stream's end and the recorded exit
  // code are not simultaneous), every `interval` at first, backing off to 8×; the deadline
  // covers the whole wait. engine.unavailable when it still runs at the deadline.
  void wait_exec(std::string id, Timeout timeout, Handler<ExecInspect> done,
                 Timeout interval = Timeout{5});

  // The stream of exec `id` on a connection another image released (ExecStream::release), from
  // where `state` says it stood. Errors: engine.failed when the state is not a position the
  // demuxer can be at (or `id` is not an exec id); engine.unavailable when the connection cannot
  // be taken over.
  [[nodiscard]] Result<std::shared_ptr<ExecStream>> resume_stream(std::string const& id,
                                                                  sys::UniqueFd connection,
                                                                  ExecStreamState state);

  // Ends every call in flight now: each completes with engine.unavailable ("cancelled").
  // Streams already handed out are not affected (close them).
  void cancel();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace custos::engine
