// The container backends (Docker, rootless Podman): descriptor, admission, the engine preflight
// and the gate probe. One ContainerBackend per engine kind; container_execution.cpp runs execs.
#include <boost/asio/post.hpp>

#include <algorithm>
#include <sys/stat.h>

#include "custos/backend/native.hpp"
#include "custos/engine/client.hpp"

#include "container_execution.hpp"

namespace custos::backend {
namespace {

namespace asio = boost::asio;

// The gate. "$1" is the descriptor limit ("-" for none), "$2" the executable path, then its
// arguments (argv[0] of the target is that path). It refuses an executable that is missing or not
// executable for the exec's user (exit 120) and a limit it cannot set (exit 121), both before it
// stops — its own statuses, not the 126/127 engines give an exec they could not start; then it
// stops itself, and once continued runs the target.
constexpr std::string_view kGate =
    "n=$1; shift; [ -f \"$1\" ] && [ -x \"$1\" ] || exit 120; "
    "[ \"$n\" = - ] || ulimit -n \"$n\" || exit 121; kill -STOP $$; exec \"$@\"";

// The probe: can this container run the gate's program at all (a /bin/sh with kill, ulimit and
// exec)?
constexpr std::string_view kProbe = "kill -0 $$ && ulimit -n >/dev/null && exec true";

using GateCache = std::shared_ptr<std::map<std::string, std::string>>;
using Clock = std::chrono::steady_clock;

// How long a preflight's inspect stands in for the acquire's own.
constexpr std::chrono::milliseconds kRecentInspect{2000};

// Runs the gate's program once in the container; `ok` remembers a container that passed.
void probe_gate(std::shared_ptr<engine::Client> const& c, engine::ContainerInspect const& in,
                std::chrono::milliseconds timeout, GateCache const& ok,
                std::function<void(Result<>)> done) {
  // Any refusal of the probe other than the engine or the container going away means the
  // container cannot run the gate: engine.gate_unavailable, the engine's message kept.
  auto refuse = [name = in.name](Error const& e) -> Error {
    if (e.code == Errc::engine_unavailable || e.code == Errc::engine_container_not_running ||
        e.code == Errc::engine_container_not_found) {
      return e;
    }
    return Error(Errc::engine_gate_unavailable,
                 "container " + name + " cannot run the exec gate (/bin/sh): " + e.message());
  };
  engine::ExecConfig cfg;
  cfg.cmd = {"/bin/sh", "-c", std::string{kProbe}};
  c->create_exec(
      in.id, std::move(cfg), timeout,
      [c, in, refuse, timeout, ok, done = std::move(done)](Result<std::string> id) mutable {
        if (!id) return done(refuse(id.error()));
        c->start_exec(
            *id, false, timeout,
            [c, in, refuse, timeout, ok, exec = *id,
             done = std::move(done)](Result<std::shared_ptr<engine::ExecStream>> s) mutable {
              if (!s) return done(refuse(s.error()));
              // Its output is discarded; the stream is kept open until the exec ends.
              auto stream = *s;
              stream->start([](engine::StdStream, std::span<std::uint8_t const>) {},
                            [stream](engine::StreamEnd const&) {});
              c->wait_exec(
                  exec, timeout,
                  [in, refuse, stream, ok,
                   done = std::move(done)](Result<engine::ExecInspect> r) mutable {
                    stream->close();
                    if (!r) return done(refuse(r.error()));
                    if (r->exit_code.value_or(-1) != 0) {
                      return done(refuse(Error(Errc::engine_failed,
                                               "the probe exited with status " +
                                                   std::to_string(r->exit_code.value_or(-1)))));
                    }
                    (*ok)[in.id] = in.started_at;
                    done({});
                  });
            });
      });
}

}  // namespace

std::string_view container_gate_script() noexcept {
  return kGate;
}

struct ContainerBackend::Recent {
  Clock::time_point at;
  engine::ContainerInfo info;
};

ContainerBackend::ContainerBackend(boost::asio::io_context& io, ContainerConfig config,
                                   NativeBackend& native)
    : io_(io),
      config_(std::move(config)),
      native_(native),
      recent_(std::make_shared<std::map<std::string, Recent>>()) {}

std::optional<engine::ContainerInfo> ContainerBackend::take_recent(std::string const& socket,
                                                                   std::string const& ref) {
  auto it = recent_->find((socket.empty() ? config_.socket : socket) + "\n" + ref);
  if (it == recent_->end()) return std::nullopt;
  auto r = std::move(it->second);
  recent_->erase(it);
  if (Clock::now() - r.at > kRecentInspect) return std::nullopt;
  return std::move(r.info);
}

ContainerBackend::~ContainerBackend() {
  for (auto& [socket, c] : clients_) c->cancel();
}

core::BackendKind ContainerBackend::kind() const noexcept {
  return config_.engine == engine::EngineKind::docker ? core::BackendKind::docker
                                                      : core::BackendKind::podman;
}

std::shared_ptr<engine::Client> ContainerBackend::client(std::string const& socket) {
  std::string const path = socket.empty() ? config_.socket : socket;
  auto it = clients_.find(path);
  if (it != clients_.end()) return it->second;
  auto c = std::make_shared<engine::Client>(io_, engine::Endpoint{config_.engine, path});
  clients_.emplace(path, c);
  return c;
}

Descriptor ContainerBackend::descriptor() const {
  Descriptor d;
  d.kind = kind();
  struct stat st {};
  d.available = ::stat(config_.socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  if (!d.available) d.unavailable_reason = "no engine socket at " + config_.socket;
  bool const cg = config_.boundary != BoundaryPreference::marker;
  d.add("boundary.cgroup", cg ? ControlFidelity::hard : ControlFidelity::none,
        cg ? "a per-exec cgroup v2 beneath the container's own cgroup, else beneath the daemon's "
             "subtree; cgroup.kill"
           : "boundary=marker");
  d.add("boundary.marker", ControlFidelity::sampled,
        "a random marker in the exec's environment, swept from the host's /proc within the "
        "container's PID namespace (cooperative)");
  d.add("io.pipes", ControlFidelity::hard, "the engine's multiplexed exec stream");
  d.add("io.pty", ControlFidelity::hard, "the engine's exec TTY, resized through the engine");
  d.add("resources.cpu_ms", ControlFidelity::sampled, "sampled from the exec's cgroup or /proc");
  // Per process, not the tree's total: not `hard` (API.md).
  d.add("resources.descriptors", ControlFidelity::sampled,
        "RLIMIT_NOFILE (soft and hard) set by the gate before the target runs (per process; the "
        "tree's total is sampled)");
  d.add("resources.disk_bytes", ControlFidelity::none, "the workspace is the container's");
  d.add("resources.memory_bytes", ControlFidelity::sampled, "sampled RSS of the exec's tree");
  d.add("resources.output_bytes", ControlFidelity::hard, "cut at the exact byte by the supervisor");
  d.add("resources.processes", ControlFidelity::sampled, "sampled process count of the tree");
  d.add("resources.wall_ms", ControlFidelity::hard, "the supervisor's deadline timer");
  // No sandbox control is enforced inside a container by this version: a sandboxed container
  // plan is refused with every missing control.
  sandbox::add_unenforced(d, "not enforced in a container by this version");
  return d;
}

Admission ContainerBackend::admit(core::ExecutionPlan const& plan) const {
  Admission a;
  if (plan.backend.kind != kind()) {
    a.admitted = false;
    a.missing.emplace_back("backend." + std::string{core::to_string(plan.backend.kind)});
    a.detail = "the " + std::string{core::to_string(kind())} + " backend runs its own plans only";
    return a;
  }
  if (plan.limits.disk_bytes) {
    a.admitted = false;
    a.missing.emplace_back("resources.disk_bytes");
    a.detail = "the workspace is the container's: no disk limit";
  }
  return a;
}

void ContainerBackend::preflight(core::ExecutionPlan const& plan,
                                 std::function<void(Result<>)> done) {
  auto c = client(plan.backend.socket.value_or(""));
  std::string const ref = plan.backend.container.value_or("");
  std::string const key = c->endpoint().socket + "\n" + ref;
  c->inspect_container(
      ref, config_.call_timeout,
      [c, ok = gate_ok_, recent = recent_, key, timeout = config_.call_timeout,
       gate = plan.backend.gate,
       done = std::move(done)](Result<engine::ContainerInfo> info) mutable {
        if (!info) return done(info.error());
        auto const& in = info->inspect;
        if (!in.accepts_exec()) {
          return done(Error(Errc::engine_container_not_running,
                            "container " + in.name + " is " + in.status_text));
        }
        if (!info->init) {
          return done(
              info->init_error.value_or(Error(Errc::engine_container_not_running, in.name)));
        }
        // Bounded: one entry per container reference in use.
        (*recent)[key] = Recent{Clock::now(), *info};
        auto it = ok->find(in.id);
        if (it != ok->end() && it->second == in.started_at) return done({});
        probe_gate(c, in, timeout, ok, [gate, done = std::move(done)](Result<> r) mutable {
          // A plan that accepts the marker boundary runs ungated where the gate cannot run
          // (acquire sees no probe pass).
          if (!r && gate == core::GatePolicy::optional &&
              r.error().code == Errc::engine_gate_unavailable) {
            return done({});
          }
          done(std::move(r));
        });
      });
}

bool ContainerBackend::gate_ok(std::string const& id, std::string const& started_at) const {
  auto it = gate_ok_->find(id);
  return it != gate_ok_->end() && it->second == started_at;
}

std::shared_ptr<BackendExecution> ContainerBackend::create(std::string execution_id) {
  return std::make_shared<ContainerExecution>(*this, std::move(execution_id));
}

}  // namespace custos::backend
