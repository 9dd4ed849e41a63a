// The daemon behind `custos daemon` (private to src/daemon/). Its start-up steps are in
// daemon.cpp, what host.info describes in daemon_describe.cpp, and the loop, the signals, the
// shutdown and the handover in daemon_loop.cpp (with run() and check()).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "custos/daemon/config.hpp"
#include "custos/gateway/gateway.hpp"
#include "custos/gateway/store.hpp"
#include "custos/registry/registry.hpp"
#include "custos/rpc/dispatcher.hpp"
#include "custos/rpc/server.hpp"
#include "custos/secrets/store.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/publisher.hpp"
#include "custos/supervisor/recovery.hpp"
#include "custos/supervisor/registry_sink.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/probes.hpp"
#include "custos/sys/unique_fd.hpp"

#include "fd_store.hpp"
#include "handover.hpp"
#include "metrics_server.hpp"

namespace custos::daemon {

namespace asio = boost::asio;
namespace json = boost::json;
namespace fs = std::filesystem;

// The admin-group setting as a gid: a number as is, a name looked up. Errors:
// daemon.config_invalid for a group that does not exist.
[[nodiscard]] Result<std::optional<std::uint32_t>> resolve_group(std::string const& name);
// sd_notify, when systemd listens (nothing otherwise).
void notify(std::string const& state);
[[nodiscard]] std::int64_t now_ns();
// The signals that stop or hand over the daemon. A handover blocks them on the loop's thread
// before the execve (the mask and anything pending survive it) and the next image unblocks them
// once its handlers are installed: none of them can meet a default disposition meanwhile.
[[nodiscard]] sigset_t stop_signals();
// How long the new image's configuration check may take before a handover is refused.
inline constexpr std::chrono::milliseconds kHandoverCheckBound{10000};

class Daemon {
 public:
  // `inherited`: what a handing-over image passed (null for an ordinary start); it outlives the
  // start, and the daemon uses second descriptors of what it verified there. Its executions'
  // carried state is moved out to the adoptions.
  Daemon(DaemonConfig config, handover::Inherited* inherited, std::int64_t started_ns,
         Result<handover::Image> image)
      : config_(std::move(config)) {
    handover_.inherited = inherited;
    if (inherited != nullptr) handover_.from = inherited->origin;
    handover_.started_ns = started_ns;
    handover_.image = std::move(image);
  }
  // Whatever way start() or serve() ended: the sink's probe asks the manager, which the members'
  // destruction removes before the sink (finish() does the same on the orderly path).
  ~Daemon() {
    // A check still under way ends within its bound; its result is not wanted any more.
    if (handover_.check_thread.joinable()) handover_.check_thread.join();
    if (sink_) sink_->set_solo_probe(nullptr);
  }
  Daemon(Daemon const&) = delete;
  Daemon& operator=(Daemon const&) = delete;

  Result<void> start();

  int serve();

  // After serve(): what a handover passes on to the next image (nullopt after a shutdown).
  std::optional<handover::Outgoing> take_handover() { return std::move(handover_.outgoing); }
  // After a failed start(): what a handover carried and this image already adopted goes back
  // into `in` (each live execution's stdio, streams and events as they stand), so the image it
  // falls back to re-attaches it instead of finding it closed.
  void give_back_carried(handover::Inherited& in);
  // A SIGTERM or SIGINT that came during the handover, for the next image (0: none).
  [[nodiscard]] int pending_stop_signal() const noexcept { return handover_.pending_signal; }

 private:
  template <class F>
  Result<void> step(char const* name, F&& f) {
    spdlog::debug("start-up: {}", name);
    auto r = f();
    if (!r) spdlog::critical("start-up step '{}' failed: {}", name, r.error().message());
    return r;
  }

  Result<void> load_config();

  // Every live execution holds a handful of descriptors (pidfd, cgroup directory, pipes, spool
  // files) and each one kept in the terminal history still holds its pidfd and cgroup directory,
  // so the common soft limit of 1024 runs out after a few hundred executions. The soft limit is
  // raised to the hard one (what the administrator allows; custos.service sets 65536). A launched
  // process gets its plan's limits.open_files (1024 unless the plan says otherwise); only a plan
  // that asks for no limit (null) inherits this soft limit, still within the hard one.
  static Result<void> raise_fd_limit();

  // What systemd passed (LISTEN_FDS): the activated socket, taken by listen(), and the
  // descriptors its store kept for executions a previous daemon ran, taken by adopt_recovered.
  // Under systemd's notify socket the store keeps this daemon's from here on (fd_store.hpp).
  Result<void> take_systemd_fds();

  Result<void> lock_state();

  Result<void> open_registry();

  // <state-dir>/secrets (created 0700 when absent; refused, never repaired, with another owner
  // or mode: secret.store_unsafe stops the start) and, under systemd, $CREDENTIALS_DIRECTORY as
  // a read-only second source (docs/sandbox.md, "Secrets").
  Result<void> open_secrets();

  // Every record left non-terminal by a previous daemon is classified here, before any call is
  // accepted: the ones whose root is gone or cannot be proven ours get their terminal record
  // now; the ones provably still ours (exact pidfs identity) are held by their recovered pidfds
  // until the manager adopts them (adopt_recovered, below).
  Result<void> recover();

  // The executions recovery re-acquired are adopted by the manager: supervised from here on like
  // any other (cancellable, deadline-bound, one terminal record with recovery live_owned), or,
  // with restart-policy cancel, adopted and cancelled at once through the same teardown.
  Result<void> adopt_recovered();
  // A handover's carried executions go with the recovered ones of the same id (handover.hpp).
  void attach_carried(std::vector<supervisor::Carried>& carried);
  // The descriptors systemd's store kept go with the recovered executions of the same id that
  // a handover did not carry; the rest are removed from the store.
  void attach_restored();

  Result<void> create_subtree();

  // The subtree's path: configured, or `custos` beside the daemon's own cgroup.
  Result<fs::path> subtree_path() const;

  Result<sys::CgroupDir> make_subtree();

  // Under systemd (Delegate=yes) the service cgroup has the controllers available but not
  // enabled, and cgroup v2 forbids enabling them while the daemon itself sits in that cgroup
  // ("no internal processes"). So the daemon moves into a leaf `<own>/daemon` first, then
  // enables what it can; executions then get memory/pids/cpu limits. Best effort: whatever
  // fails is logged and the limits of those dimensions stay sampled only.
  static void delegate_controllers(sys::CgroupDir const& own, std::set<std::string> const& wanted);

  // The clone3 and writability probes create a short-lived scratch cgroup: it goes inside the
  // daemon's own subtree (the prepared execution root, also under systemd), never beside it
  // under the v2 mount or the service cgroup. Without a subtree (marker boundary) the probe
  // uses the daemon's own cgroup as before: there is no subtree for it to stay inside.
  Result<void> probe();

  Result<void> start_manager();

  // What start-up recovery found and kept for an operator: quarantined records (never acted on)
  // and orphan claims (never re-usable), the executions it adopted, and the leftover cgroups it
  // removed. It is a snapshot of this start, shown by host.info and `custos doctor`.
  static json::object recovery_json(supervisor::RecoveryReport const& report);

  // The container engines this daemon would use when a plan names no socket, as configured and
  // as found at this start: the socket, whether it is there, and the boundary an exec gets.
  // Whether each answers (and its version) is live, not static: `custos doctor` asks them.
  json::array describe_engines() const;

  // host.info is static for the daemon's lifetime (capabilities are probed once at start-up)
  // but for the output store's figure: the rest is serialized once, and each call appends only
  // the figure's member to that text (no copy of the object, no second serialization).
  Result<std::shared_ptr<std::string const>> describe_host();

  json::object describe_static() const;

  Result<void> register_methods();

  // The Prometheus endpoint, when metrics-listen names one (docs/metrics.md): a Unix socket
  // (claimed like the API socket) or a loopback port; any other address stops the start.
  Result<void> serve_metrics();

  void stop_metrics();

  Result<void> listen();

  // The listening socket the previous image kept open across the execve: connects made during
  // the handover waited in its backlog and are accepted now. Its path stays bound (and locked)
  // throughout. Errors: daemon.handover_failed when it fails verification (the caller then
  // claims the path afresh, unless systemd owns it).
  Result<void> listen_inherited();

  Result<void> handle_signals();

  void wait_signal();

  // Orphans reparented to us (subreaper) are reaped and attributed promptly, but every launch
  // ends with a SIGCHLD for the execution's own root, which the manager already reaps through
  // its pidfd: a full orphan pass (a read of every thread's /proc children list, then waitid)
  // for it is wasted loop time. So the pass is posted behind the handlers already queued (the
  // root's pidfd wait usually among them), several SIGCHLDs share one pass, and it only runs
  // when a peek (WNOWAIT: nothing is reaped) shows an exited child is still waiting. The
  // manager's periodic reap stays the backstop.
  void schedule_orphan_reap();

  void notify_ready();

  void begin_shutdown(int sig);

  // SIGHUP (`custos daemon --reexec`, `systemctl reload`): hand over to a new image of the
  // binary this daemon was started from. The new image must pass its configuration check first;
  // a refused check changes nothing (the daemon keeps serving). Then, as for shutdown = detach:
  // no new connection is accepted (connects wait in the listening socket's backlog, which is
  // kept, not closed), authorizations in flight finish, and every execution is detached at a
  // consistent point; once the loop ends, run() replaces the image (handover.hpp).
  void begin_handover();
  // The configuration check's result, on the loop: the handover goes on, or is refused.
  void on_checked(std::int32_t pid, Result<sys::UniqueFd> checked);

  // Nothing changed: the daemon keeps serving; host.info says why (`custos daemon --reexec`).
  void refuse_handover(std::string reason);

  void stop_loop();

  void unlink_socket();

  void finish();

  DaemonConfig config_;
  // This image's place in the chain of handovers (handover.hpp).
  struct HandoverState {
    // What the previous image passed: set only during start() (null for an ordinary start).
    handover::Inherited* inherited = nullptr;
    std::optional<handover::Origin> from;  // which image handed over to this one
    std::int64_t started_ns = 0;           // when this image started
    // What a handover starts again, as this image was started.
    Result<handover::Image> image{Error{Errc::internal, "not read"}};
    std::optional<handover::Outgoing> outgoing;  // set once a handover began
    int pending_signal = 0;                      // a SIGTERM/SIGINT that came meanwhile
    bool listener_from_systemd = false;          // the listening socket is systemd's
    bool checking = false;                       // a configuration check is under way
    std::thread check_thread;                    // runs it (handover::finish_check)
    json::value refused;                         // the last refused handover {at_ns, reason}
  };
  HandoverState handover_;
  fd_store::Passed passed_;                    // from systemd, until used (take_systemd_fds)
  std::unique_ptr<fd_store::Store> fd_store_;  // null: not under systemd, or switched off
  std::uint64_t restored_from_store_ = 0;      // executions re-attached to kept descriptors
  asio::io_context io_;
  asio::signal_set signals_{io_};
  rpc::AuthPolicy auth_;
  // Declaration order is destruction order reversed: the server goes first (its connections
  // unsubscribe from the manager), then the manager (it writes through the sink), then the
  // registry.
  std::unique_ptr<registry::Registry> registry_;
  // What recovery found, from the recover step until the manager adopted the live ones.
  std::optional<supervisor::RecoveryReport> recovered_;
  std::unique_ptr<supervisor::RegistrySink> sink_;
  std::unique_ptr<gateway::RegistryDatabase> authority_db_;
  // Told of every terminal record by the manager's supervisors: outlives the manager, and is
  // stopped before the registry it writes to.
  std::unique_ptr<supervisor::OutputPublisher> publisher_;
  std::unique_ptr<gateway::AuthorityStore> authority_;
  std::unique_ptr<secrets::SecretStore> secrets_;       // the gateway asks it: outlives it
  std::unique_ptr<gateway::ExecutionGateway> gateway_;  // the manager's sink: outlives it
  std::unique_ptr<supervisor::ExecutionManager> manager_;
  std::optional<rpc::Dispatcher> dispatcher_;
  std::optional<rpc::Server> server_;
  // Reads the manager, the server and the registry at each scrape: destroyed before them.
  std::optional<MetricsServer> metrics_;
  sys::UniqueFd metrics_lock_;
  std::string metrics_socket_;
  sys::UniqueFd state_lock_;
  sys::UniqueFd socket_lock_;
  bool bound_socket_ = false;
  std::optional<sys::CgroupDir> subtree_;
  bool subtree_created_ = false;
  Result<sys::HostCapabilities> caps_{Error{Errc::internal, "not probed"}};
  // host.info's static part, serialized at first use without its closing brace.
  std::string host_info_prefix_;
  json::object recovery_view_{{"quarantined", json::array{}},
                              {"orphan_claims", json::array{}},
                              {"adopted", json::array{}},
                              {"leftover_cgroups", json::array{}}};
  std::string boot_id_;
  bool shutting_down_ = false;
  bool orphan_reap_posted_ = false;
  int exit_code_ = 0;
};

}  // namespace custos::daemon
