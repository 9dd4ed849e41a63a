// The container backends: an execution inside an existing Docker or rootless Podman container,
// owned as a native one is. docs/containers.md describes the mechanism; in short:
//
//   1. preflight (before any claim is consumed): the engine answers, the container exists and
//      runs, and it can run the gate (/bin/sh; probed once per container start, then cached);
//   2. acquire: an exec is created and started *gated*: its first process is
//      `/bin/sh -c <gate> custos-gate <executable> <args...>`, which checks the executable, stops
//      itself (SIGSTOP) and, once continued, execs the target. It carries a fresh random marker
//      in its environment. The daemon finds its host pid (exec inspect), opens a pidfd, and
//      through that pidfd checks the marker, the container's PID namespace and that the process
//      is stopped at the gate; then it creates a per-exec cgroup — beneath the container's own
//      v2 cgroup where it has one, else beneath the daemon's subtree — moves the process into
//      it, and checks through the pidfd that it is still the same process, now in that cgroup;
//   3. release: SIGCONT through the pidfd opens the gate;
//   4. from there the tree is the native backend's, taken over like an adopted root (signal,
//      kill, cgroup.kill, the marker sweep limited to the container's PID namespace, the final
//      scan, sampling), and the exec's output and input travel over the engine's hijacked
//      stream. A container that stops mid-exec ends the execution with trigger backend_failure.
//
// Nothing is ever signalled by a bare pid number: every signal goes through a pidfd opened and
// checked as above. Where no cgroup can be written the marker boundary applies, and an
// incomplete final scan gives cleanup `unconfirmed`.
#pragma once

#include <map>
#include <memory>
#include <string>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/backend.hpp"
#include "custos/engine/client.hpp"
#include "custos/engine/wire.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::backend {

class NativeBackend;

struct ContainerConfig {
  engine::EngineKind engine = engine::EngineKind::docker;
  // The engine's API socket when a plan names none ("/var/run/docker.sock",
  // "/run/podman/podman.sock" by default; the daemon's --docker-socket / --podman-socket).
  std::string socket;
  // automatic: a cgroup (the container's own, else the daemon's subtree) when one can be
  // written, else the marker; marker: always the marker; cgroup: refuse where none can be made.
  BoundaryPreference boundary = BoundaryPreference::automatic;
  // Every engine call's deadline, and the bound on the gate's arrival.
  std::chrono::milliseconds call_timeout{10000};
};

class ContainerBackend final : public Backend {
 public:
  // `native` holds the tree machinery the container executions reuse (its subtree, inotify,
  // worker and marker sweeper); it outlives this backend.
  ContainerBackend(boost::asio::io_context& io, ContainerConfig config, NativeBackend& native);
  ~ContainerBackend() override;
  ContainerBackend(ContainerBackend const&) = delete;
  ContainerBackend& operator=(ContainerBackend const&) = delete;

  [[nodiscard]] core::BackendKind kind() const noexcept override;
  [[nodiscard]] Descriptor descriptor() const override;
  // Refuses what no container exec can enforce: a disk limit (the workspace is the container's).
  // (boundary=cgroup without a cgroup to make is refused at acquire: whether the container has
  // its own cgroup is known only from the engine.)
  [[nodiscard]] Admission admit(core::ExecutionPlan const& plan) const override;
  // The engine checks that need an answer: engine.unavailable, engine.container_not_found,
  // engine.container_not_running, engine.gate_unavailable.
  void preflight(core::ExecutionPlan const& plan, std::function<void(Result<>)> done) override;
  [[nodiscard]] bool asks_before_claim() const noexcept override { return true; }
  [[nodiscard]] std::shared_ptr<BackendExecution> create(std::string execution_id) override;

  [[nodiscard]] ContainerConfig const& config() const noexcept { return config_; }
  // The client of `socket` (the configured one when empty), made on first use.
  [[nodiscard]] std::shared_ptr<engine::Client> client(std::string const& socket);
  // What the preflight of a start just read of its container (socket + reference), handed to
  // that start's acquire once and only while fresh (kRecentInspect): one engine round trip
  // less per exec. Acquire checks it again through the init's pidfd.
  [[nodiscard]] std::optional<engine::ContainerInfo> take_recent(std::string const& socket,
                                                                 std::string const& ref);
  [[nodiscard]] NativeBackend& native() noexcept { return native_; }
  // Whether the gate probe passed for container `id` in its start `started_at`.
  [[nodiscard]] bool gate_ok(std::string const& id, std::string const& started_at) const;
  [[nodiscard]] boost::asio::io_context& io() noexcept { return io_; }

 private:
  boost::asio::io_context& io_;
  ContainerConfig config_;
  NativeBackend& native_;
  std::map<std::string, std::shared_ptr<engine::Client>> clients_;  // by socket path
  // Containers whose gate probe passed, by full id, with the start time it passed for (a
  // restarted container is probed again). Shared with the probes in flight, which may complete
  // after this backend is gone.
  std::shared_ptr<std::map<std::string, std::string>> gate_ok_ =
      std::make_shared<std::map<std::string, std::string>>();
  struct Recent;
  std::shared_ptr<std::map<std::string, Recent>> recent_;
};

// The gate's shell program (argv after "/bin/sh", "-c"), for tests and the docs.
[[nodiscard]] std::string_view container_gate_script() noexcept;

// One look at the process behind `candidate` (the one the engine named for a gated exec): `gate`
// when it carries `marker` in its environment, lives in the container's PID namespace `pid_ns`
// and is stopped; `not_yet` when it does not (yet): the runtime has not exec'd the gate, the gate
// has not stopped, it ended; `unreadable` when its environment is refused to the daemon while it
// lives. Errors: identity.mismatch (the marker outside that namespace: never the gate), the
// namespace unreadable while the process lives.
enum class GateCheck : std::uint8_t { gate, not_yet, unreadable };
// `stopped` false: the same checks but the stop (an ungated exec's process).
[[nodiscard]] Result<GateCheck> check_gate_identity(sys::Pidfd const& candidate,
                                                    sys::Marker const& marker, std::uint64_t pid_ns,
                                                    bool stopped = true);

}  // namespace custos::backend
