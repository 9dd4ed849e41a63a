// `custos daemon`: the start-up reads as a list of named steps (load config → lock state dir →
// open registry → recover → create subtree → listen → notify READY), then one io_context runs
// everything until a signal asks for shutdown.
#include "custos/daemon/daemon.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <grp.h>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/daemon/version.hpp"
#include "custos/gateway/gateway.hpp"
#include "custos/gateway/store.hpp"
#include "custos/registry/registry.hpp"
#include "custos/rpc/dispatcher.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/rpc/server.hpp"
#include "custos/secrets/store.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/publisher.hpp"
#include "custos/supervisor/recovery.hpp"
#include "custos/supervisor/registry_sink.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/probes.hpp"
#include "custos/sys/unique_fd.hpp"

#include "logging.hpp"
#include "metrics.hpp"
#include "metrics_server.hpp"
#include "socket_path.hpp"

namespace custos::daemon {

namespace asio = boost::asio;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

Result<std::optional<std::uint32_t>> resolve_group(std::string const& name) {
  if (name.empty()) return std::optional<std::uint32_t>{};
  if (name.find_first_not_of("0123456789") == std::string::npos) {
    return std::optional<std::uint32_t>{static_cast<std::uint32_t>(std::stoul(name))};
  }
  group grp{};
  group* found = nullptr;
  std::string buf(16384, '\0');
  if (::getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return Error{Errc::daemon_config_invalid, "admin-group " + name + " does not exist"};
  }
  return std::optional<std::uint32_t>{found->gr_gid};
}

void notify(std::string const& state) {
  (void)::sd_notify(0, state.c_str());
}

class Daemon {
 public:
  explicit Daemon(DaemonConfig config) : config_(std::move(config)) {}
  // Whatever way start() or serve() ended: the sink's probe asks the manager, which the members'
  // destruction removes before the sink (finish() does the same on the orderly path).
  ~Daemon() {
    if (sink_) sink_->set_solo_probe(nullptr);
  }
  Daemon(Daemon const&) = delete;
  Daemon& operator=(Daemon const&) = delete;

  Result<void> start() {
    CUSTOS_TRYV(step("load config", [&] { return load_config(); }));
    CUSTOS_TRYV(step("raise descriptor limit", [&] { return raise_fd_limit(); }));
    CUSTOS_TRYV(step("lock state dir", [&] { return lock_state(); }));
    CUSTOS_TRYV(step("open registry", [&] { return open_registry(); }));
    CUSTOS_TRYV(step("open secret store", [&] { return open_secrets(); }));
    CUSTOS_TRYV(step("recover", [&] { return recover(); }));
    CUSTOS_TRYV(step("create subtree", [&] { return create_subtree(); }));
    CUSTOS_TRYV(step("probe host", [&] { return probe(); }));
    CUSTOS_TRYV(step("start execution manager", [&] { return start_manager(); }));
    CUSTOS_TRYV(step("adopt recovered executions", [&] { return adopt_recovered(); }));
    CUSTOS_TRYV(step("register methods", [&] { return register_methods(); }));
    CUSTOS_TRYV(step("serve metrics", [&] { return serve_metrics(); }));
    CUSTOS_TRYV(step("listen", [&] { return listen(); }));
    CUSTOS_TRYV(step("handle signals", [&] { return handle_signals(); }));
    notify_ready();
    return ok();
  }

  int serve() {
    // Handlers catch their own errors; anything that still escapes one completion is logged and
    // the loop resumes (run() may be re-entered after an exception without restart()), so one
    // bad completion never takes the daemon and every other client down.
    for (;;) {
      try {
        io_.run();
        break;
      } catch (std::exception const& ex) {
        spdlog::error("a completion handler threw (the loop keeps serving): {}", ex.what());
      } catch (...) {
        spdlog::error(
            "a completion handler threw a non-standard exception (the loop keeps "
            "serving)");
      }
    }
    finish();
    return exit_code_;
  }

 private:
  template <class F>
  Result<void> step(char const* name, F&& f) {
    spdlog::debug("start-up: {}", name);
    auto r = f();
    if (!r) spdlog::critical("start-up step '{}' failed: {}", name, r.error().message());
    return r;
  }

  Result<void> load_config() {
    auto admin = CUSTOS_TRY(resolve_group(config_.admin_group));
    auth_.daemon_uid = ::geteuid();
    auth_.admin_gid = admin;
    spdlog::info("custos {} starting (pid {}, uid {}), state {}, socket {}", kVersion, ::getpid(),
                 auth_.daemon_uid, config_.state_dir.native(), config_.socket_path.native());
    return ok();
  }

  // Every live execution holds a handful of descriptors (pidfd, cgroup directory, pipes, spool
  // files) and each one kept in the terminal history still holds its pidfd and cgroup directory,
  // so the common soft limit of 1024 runs out after a few hundred executions. The soft limit is
  // raised to the hard one (what the administrator allows; custos.service sets 65536). A launched
  // process gets its plan's limits.open_files (1024 unless the plan says otherwise); only a plan
  // that asks for no limit (null) inherits this soft limit, still within the hard one.
  static Result<void> raise_fd_limit() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return ok();
    if (lim.rlim_cur >= lim.rlim_max) return ok();
    auto const before = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      spdlog::warn("descriptor limit stays {}: raising it to {} failed (errno {})", before,
                   lim.rlim_max, errno);
      return ok();
    }
    spdlog::info("descriptor limit raised from {} to {}", before, lim.rlim_max);
    return ok();
  }

  Result<void> lock_state() {
    state_lock_ = CUSTOS_TRY(lock_state_dir(config_.state_dir));
    return ok();
  }

  Result<void> open_registry() {
    registry_ = CUSTOS_TRY(registry::Registry::open(config_.state_dir));
    // With the loop, writes that gate nothing are committed once per loop turn for every
    // execution (docs/durability.md).
    sink_ = std::make_unique<supervisor::RegistrySink>(*registry_, io_);
    // The gateway's authority tables are the registry's (schema v4), on its connection.
    authority_db_ = std::make_unique<gateway::RegistryDatabase>(*registry_);
    authority_ = std::make_unique<gateway::AuthorityStore>(*authority_db_);
    spdlog::info("registry {} (schema opened at version {})", registry_->db_path().native(),
                 registry_->opened_version());
    return ok();
  }

  // <state-dir>/secrets (created 0700 when absent; refused, never repaired, with another owner
  // or mode: secret.store_unsafe stops the start) and, under systemd, $CREDENTIALS_DIRECTORY as
  // a read-only second source (docs/sandbox.md, "Secrets").
  Result<void> open_secrets() {
    secrets::SecretStoreOptions options;
    options.dir = config_.state_dir / "secrets";
    if (char const* creds = std::getenv("CREDENTIALS_DIRECTORY"); creds != nullptr && *creds != 0) {
      options.credentials_dir = creds;
    }
    std::string const credentials = options.credentials_dir.native();
    secrets_ = CUSTOS_TRY(secrets::SecretStore::open(std::move(options)));
    spdlog::info("secret store {}{}{}", secrets_->dir().native(),
                 credentials.empty() ? "" : ", credentials from ", credentials);
    return ok();
  }

  // Every record left non-terminal by a previous daemon is classified here, before any call is
  // accepted: the ones whose root is gone or cannot be proven ours get their terminal record
  // now; the ones provably still ours (exact pidfs identity) are held by their recovered pidfds
  // until the manager adopts them (adopt_recovered, below).
  Result<void> recover() {
    supervisor::RecoveryOptions options;
    // Where this daemon's executions get their cgroups (created after recovery, or left by the
    // previous daemon): a launch that crashed between creating its cgroup and recording it left
    // one there, which recovery removes.
    if (config_.boundary != BoundaryMode::marker) {
      if (auto path = subtree_path()) options.execution_cgroup_parent = path->native();
    }
    recovered_ = CUSTOS_TRY(supervisor::recover(*registry_, options));
    auto const& report = *recovered_;
    spdlog::info(
        "recovery: {} record(s) already terminal, {} re-acquired by pidfs identity, {} gone "
        "without a terminal record, {} indeterminate, {} orphan claim(s), {} quarantined",
        report.already_terminal, report.count(core::RecoveryPath::live_owned),
        report.count(core::RecoveryPath::absent_without_terminal),
        report.count(core::RecoveryPath::indeterminate), report.orphan_claims.size(),
        report.quarantined.size());
    for (auto const& e : report.executions) {
      spdlog::info("recovery: {} {}: {}", e.execution_id,
                   core::recovery_path_wire(e.classification), e.detail);
    }
    for (auto const& l : report.leftover_cgroups) {
      if (l.cleanup == core::Cleanup::confirmed) {
        spdlog::info("recovery: the cgroup terminal execution {} left was removed{}{}",
                     l.execution_id, l.detail.empty() ? "" : ": ", l.detail);
      } else {
        spdlog::warn("recovery: the cgroup terminal execution {} left could not be removed: {}",
                     l.execution_id, l.detail);
      }
    }
    return ok();
  }

  // The executions recovery re-acquired are adopted by the manager: supervised from here on like
  // any other (cancellable, deadline-bound, one terminal record with recovery live_owned), or,
  // with restart-policy cancel, adopted and cancelled at once through the same teardown.
  Result<void> adopt_recovered() {
    if (!recovered_) return ok();
    auto const policy = config_.restart_policy;
    auto const failed = supervisor::adopt_recovered(*manager_, *recovered_, policy);
    for (auto const& e : recovered_->executions) {
      if (!e.adopted) continue;
      // Its grant and lease still bind it: revoked, expired or ended, it is fenced.
      if (auto r = gateway_->adopted(e.execution_id); !r) {
        spdlog::warn("recovery: {}: its authority could not be read, so nothing fences it: {}",
                     e.execution_id, r.error().message());
      }
      spdlog::info("recovery: {} adopted{}", e.execution_id,
                   policy == supervisor::RestartPolicy::cancel
                       ? ", and cancelled (restart-policy cancel)"
                       : "");
    }
    // Left as it is (running, its record non-terminal) for the next start; nothing signalled.
    for (auto const& [id, error] : failed) {
      spdlog::warn("recovery: {} could not be adopted and stays unsupervised: {}", id,
                   error.message());
    }
    recovery_view_ = recovery_json(*recovered_);
    recovered_.reset();
    return ok();
  }

  Result<void> create_subtree() {
    if (config_.boundary == BoundaryMode::marker) {
      spdlog::warn("boundary: marker (configured); processes are tracked cooperatively");
      return ok();
    }
    auto r = make_subtree();
    if (r) {
      subtree_ = std::move(*r);
      spdlog::info("boundary: cgroup, per-execution cgroups under {}", subtree_->path());
      return ok();
    }
    if (config_.boundary == BoundaryMode::cgroup) return r.error();
    spdlog::warn(
        "boundary: marker — no writable cgroup v2 subtree ({}); executions are tracked "
        "by a cooperative /proc marker scan, not by the kernel",
        r.error().message());
    return ok();
  }

  // The subtree's path: configured, or `custos` beside the daemon's own cgroup.
  Result<fs::path> subtree_path() const {
    fs::path path = config_.cgroup_subtree;
    if (path.empty()) {
      auto mount = CUSTOS_TRY(sys::find_cgroup2_mount());
      auto own = CUSTOS_TRY(sys::own_cgroup());
      path = fs::path{mount.path} / fs::path{own}.relative_path() / "custos";
    }
    return path.lexically_normal();
  }

  Result<sys::CgroupDir> make_subtree() {
    std::set<std::string> const wanted{"cpu", "memory", "pids"};
    fs::path const path = CUSTOS_TRY(subtree_path());
    auto parent = CUSTOS_TRY(sys::CgroupDir::open(path.parent_path().native()));
    if (config_.cgroup_subtree.empty() && under_systemd()) delegate_controllers(parent, wanted);
    std::error_code ec;
    subtree_created_ = !fs::exists(path, ec);
    return sys::ensure_subtree(parent, path.filename().native(), wanted);
  }

  // Under systemd (Delegate=yes) the service cgroup has the controllers available but not
  // enabled, and cgroup v2 forbids enabling them while the daemon itself sits in that cgroup
  // ("no internal processes"). So the daemon moves into a leaf `<own>/daemon` first, then
  // enables what it can; executions then get memory/pids/cpu limits. Best effort: whatever
  // fails is logged and the limits of those dimensions stay sampled only.
  static void delegate_controllers(sys::CgroupDir const& own, std::set<std::string> const& wanted) {
    auto avail = own.controllers();
    auto enabled = own.subtree_control();
    if (!avail || !enabled) return;
    std::set<std::string> missing;
    for (auto const& c : wanted) {
      if (avail->count(c) != 0 && enabled->count(c) == 0) missing.insert(c);
    }
    if (missing.empty()) return;
    auto leaf = sys::CgroupDir::open_child(own, "daemon");
    if (!leaf) leaf = sys::CgroupDir::create(own, "daemon");
    if (!leaf) {
      spdlog::warn("cgroup: cannot create {}/daemon: {}", own.path(), leaf.error().message());
      return;
    }
    if (auto r = leaf->attach(::getpid()); !r) {
      spdlog::warn("cgroup: cannot move the daemon into {}: {}", leaf->path(), r.error().message());
      return;
    }
    if (auto r = own.enable_controllers(missing); !r) {
      spdlog::warn("cgroup: cannot enable controllers in {}: {}", own.path(), r.error().message());
      return;
    }
    spdlog::info("cgroup: daemon moved to {}, controllers enabled for executions", leaf->path());
  }

  // The clone3 and writability probes create a short-lived scratch cgroup: it goes inside the
  // daemon's own subtree (the prepared execution root, also under systemd), never beside it
  // under the v2 mount or the service cgroup. Without a subtree (marker boundary) the probe
  // uses the daemon's own cgroup as before: there is no subtree for it to stay inside.
  Result<void> probe() {
    sys::ProbeOptions options;
    if (subtree_) options.scratch_cgroup_parent = subtree_->path();
    caps_ = sys::probe_host(options);
    if (!caps_) spdlog::warn("host probe failed: {}", caps_.error().message());
    auto boot = sys::read_boot_id();
    if (boot) boot_id_ = *boot;
    return ok();
  }

  Result<void> start_manager() {
    supervisor::ManagerConfig mc;
    mc.cgroup_subtree = subtree_ ? subtree_->path() : std::string{};
    mc.boundary = config_.boundary == BoundaryMode::cgroup ? supervisor::BoundaryPreference::cgroup
                  : config_.boundary == BoundaryMode::marker
                      ? supervisor::BoundaryPreference::marker
                      : supervisor::BoundaryPreference::automatic;
    mc.state_dir = config_.state_dir;
    mc.docker_socket = config_.docker_socket;
    mc.podman_socket = config_.podman_socket;
    // A sandbox's secrets are read at spawn, on the loop thread; the value goes into the
    // execution only (docs/sandbox.md, "Secrets"): never a record, an event, a log or an error.
    mc.read_secret = [store = secrets_.get()](std::string_view ref) -> Result<std::string> {
      auto value = CUSTOS_TRY(store->read(ref));
      auto const bytes = value.bytes();
      return std::string(reinterpret_cast<char const*>(bytes.data()), bytes.size());
    };
    // Terminal executions' spools go to the artifact store on the publisher's thread; what a
    // previous daemon left unpublished (or half published) is resumed first.
    supervisor::PublisherOptions po;
    po.retention =
        registry::RetentionPolicy{config_.spool_retention_age, config_.spool_retention_bytes};
    po.sweep_interval = config_.spool_sweep_interval;
    po.log = [](std::string const& message) { spdlog::warn("output: {}", message); };
    publisher_ =
        std::make_unique<supervisor::OutputPublisher>(*registry_, config_.state_dir, std::move(po));
    publisher_->resume();
    mc.terminal_recorded = [p = publisher_.get()](std::string const& id) { p->publish(id); };
    // Every launch goes through the gateway: it is the manager's sink and authorizes each
    // record_authorized (docs/authority.md); everything after is forwarded to the registry.
    // The store answers sandbox.secret_unknown; it is thread-safe, as the gateway needs.
    gateway_ = std::make_unique<gateway::ExecutionGateway>(
        io_, *authority_,
        gateway::GatewayOptions{
            registry_.get(), sink_.get(),
            [store = secrets_.get()](std::string_view ref) { return store->contains(ref); }});
    mc.sink = &gateway_->sink();
    // Becomes PR_SET_CHILD_SUBREAPER here, so orphaned descendants reparent to the daemon.
    mc.become_subreaper = true;
    manager_ = std::make_unique<supervisor::ExecutionManager>(io_, std::move(mc));
    gateway_->attach(*manager_);
    // One execution in flight: the loop commits the writes it waits for itself.
    sink_->set_solo_probe([m = manager_.get()] { return m->live_count() <= 1; });
    // Budgets a previous daemon left reserved for executions recovery has since ended.
    auto settled = CUSTOS_TRY(gateway_->settle_recovered());
    if (settled > 0)
      spdlog::info("gateway: settled the budget of {} recovered execution(s)", settled);
    return ok();
  }

  // What start-up recovery found and kept for an operator: quarantined records (never acted on)
  // and orphan claims (never re-usable), the executions it adopted, and the leftover cgroups it
  // removed. It is a snapshot of this start, shown by host.info and `custos doctor`.
  static json::object recovery_json(supervisor::RecoveryReport const& report) {
    json::array quarantined;
    for (auto const& q : report.quarantined) {
      quarantined.push_back(json::object{{"execution_id", q.execution_id},
                                         {"code", q.code},
                                         {"reason", q.reason},
                                         {"detected_ns", q.detected_ns}});
    }
    json::array orphans;
    for (auto const& c : report.orphan_claims) {
      orphans.push_back(json::object{{"action_id", c.action_id},
                                     {"process_id", c.process_id},
                                     {"execution_id", c.execution_id},
                                     {"consumed_ns", c.consumed_ns}});
    }
    json::array adopted;
    for (auto const& e : report.executions) {
      if (e.adopted) adopted.emplace_back(e.execution_id);
    }
    json::array leftovers;
    for (auto const& l : report.leftover_cgroups) {
      leftovers.push_back(json::object{{"execution_id", l.execution_id},
                                       {"cleanup", core::cleanup_wire(l.cleanup)},
                                       {"detail", l.detail}});
    }
    return json::object{{"quarantined", std::move(quarantined)},
                        {"orphan_claims", std::move(orphans)},
                        {"adopted", std::move(adopted)},
                        {"leftover_cgroups", std::move(leftovers)}};
  }

  // The container engines this daemon would use when a plan names no socket, as configured and
  // as found at this start: the socket, whether it is there, and the boundary an exec gets.
  // Whether each answers (and its version) is live, not static: `custos doctor` asks them.
  json::array describe_engines() const {
    json::array engines;
    auto const served = manager_->backends();
    for (auto const& [kind, socket] :
         {std::pair{core::BackendKind::docker, config_.docker_socket},
          std::pair{core::BackendKind::podman, config_.podman_socket}}) {
      // The backend's descriptor already looked: available = a socket is there.
      auto const d = std::find_if(served.begin(), served.end(),
                                  [k = kind](backend::Descriptor const& x) { return x.kind == k; });
      bool const present = d != served.end() && d->available;
      std::string boundary = "marker";
      if (config_.boundary != BoundaryMode::marker) {
        boundary = subtree_ ? "cgroup (beneath the container's own cgroup, else beneath " +
                                  subtree_->path() + ")"
                            : "cgroup beneath the container's own cgroup where it has one, "
                              "else marker";
      }
      engines.push_back(json::object{{"engine", core::to_string(kind)},
                                     {"socket", socket},
                                     {"socket_present", present},
                                     {"boundary", boundary}});
    }
    return engines;
  }

  // host.info is static for the daemon's lifetime (capabilities are probed once at start-up)
  // but for the output store's figure: the rest is serialized once, and each call appends only
  // the figure's member to that text (no copy of the object, no second serialization).
  Result<std::shared_ptr<std::string const>> describe_host() {
    if (host_info_prefix_.empty()) {
      host_info_prefix_ = json::serialize(describe_static());
      host_info_prefix_.pop_back();  // the closing brace: the output member goes before it
    }
    auto output = rpc::store_json(publisher_->figures());
    auto const& policy = publisher_->retention();
    output["retention"] = json::object{{"age_s", policy.age.count()}, {"bytes", policy.bytes}};
    auto text = std::make_shared<std::string>(host_info_prefix_);
    *text += R"(,"output":)";
    *text += json::serialize(output);
    *text += '}';
    return std::shared_ptr<std::string const>(std::move(text));
  }

  json::object describe_static() const {
    json::object out{{"version", kVersion},
                     {"boot_id", boot_id_},
                     {"default_boundary", subtree_ ? "cgroup" : "marker"},
                     {"pid", ::getpid()}};
    if (caps_) {
      out["capabilities"] = sys::to_json(*caps_);
    } else {
      out["capabilities"] = json::object{};
    }
    if (subtree_) out["cgroup_subtree"] = subtree_->path();
    out["shutdown_policy"] = config_.shutdown == ShutdownMode::cancel ? "cancel" : "detach";
    out["restart_policy"] = supervisor::restart_policy_wire(config_.restart_policy);
    out["registry"] = recovery_view_;
    json::array backends;
    for (auto const& d : manager_->backends()) backends.push_back(backend::to_json(d));
    out["backends"] = std::move(backends);
    out["engines"] = describe_engines();
    return out;
  }

  Result<void> register_methods() {
    dispatcher_.emplace(auth_);
    rpc::register_host_methods(*dispatcher_, [this] { return describe_host(); });
    rpc::register_introspection(*dispatcher_);
    rpc::register_exec_methods(*dispatcher_, *manager_, registry_.get());
    rpc::register_output_methods(*dispatcher_, *manager_, *publisher_);
    rpc::register_gateway_methods(*dispatcher_, *gateway_);
    rpc::register_secret_methods(*dispatcher_, *gateway_, *secrets_);
    return ok();
  }

  // The Prometheus endpoint, when metrics-listen names one (docs/metrics.md): a Unix socket
  // (claimed like the API socket) or a loopback port; any other address stops the start.
  Result<void> serve_metrics() {
    if (config_.metrics_listen.empty()) return ok();
    auto const endpoint = CUSTOS_TRY(parse_metrics_listen(config_.metrics_listen));
    sys::UniqueFd lock;
    if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
      lock = CUSTOS_TRY(claim_socket_path(endpoint.path));
    }
    // Read on the loop at each scrape; the server comes up in the next step.
    metrics_.emplace(io_, [this] {
      return render_metrics(MetricsSources{manager_.get(), server_ ? &*server_ : nullptr,
                                           registry_.get(), publisher_.get()});
    });
    CUSTOS_TRYV(metrics_->listen(endpoint, config_.socket_mode));
    if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
      metrics_lock_ = std::move(lock);
      metrics_socket_ = endpoint.path;
    }
    spdlog::info("metrics: serving {}", metrics_->url());
    return ok();
  }

  void stop_metrics() {
    if (metrics_) metrics_->stop();
    if (metrics_socket_.empty()) return;
    // Removed while its lock is held, like the API socket.
    (void)::unlink(metrics_socket_.c_str());
    metrics_socket_.clear();
  }

  Result<void> listen() {
    rpc::ServerLimits limits;
    limits.max_line_bytes = config_.max_line_bytes;
    limits.max_connections = config_.max_connections;
    limits.max_subscriptions_per_connection = config_.max_subscriptions;
    limits.event_queue_bytes = config_.event_queue_bytes;
    limits.max_write_queue_bytes = config_.write_queue_bytes;
    limits.idle_timeout = config_.idle_timeout;
    dispatcher_->set_max_batch_entries(config_.max_batch_entries);
    server_.emplace(io_, *dispatcher_, limits);
    if (config_.socket_activation) {
      int const n = ::sd_listen_fds(1);
      if (n > 0 && ::sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, nullptr, 0) > 0) {
        CUSTOS_TRYV(server_->adopt(SD_LISTEN_FDS_START));
        spdlog::info("listening on the socket passed by systemd (socket activation)");
        return ok();
      }
    }
    socket_lock_ = CUSTOS_TRY(claim_socket_path(config_.socket_path));
    CUSTOS_TRYV(server_->listen(config_.socket_path.native(), config_.socket_mode));
    bound_socket_ = true;
    spdlog::info("listening on {} (mode {:o})", config_.socket_path.native(), config_.socket_mode);
    return ok();
  }

  Result<void> handle_signals() {
    signals_.add(SIGTERM);
    signals_.add(SIGINT);
    signals_.add(SIGHUP);
    signals_.add(SIGCHLD);
    // A client that disappears mid-write must not kill the daemon.
    (void)std::signal(SIGPIPE, SIG_IGN);
    wait_signal();
    return ok();
  }

  void wait_signal() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGCHLD) {
        schedule_orphan_reap();
      } else if (sig == SIGHUP) {
        auto r = reopen_logs(config_);
        if (!r)
          spdlog::error("SIGHUP: reopening logs failed: {}", r.error().message());
        else
          spdlog::info("SIGHUP: logs reopened");
      } else {
        begin_shutdown(sig);
      }
      wait_signal();
    });
  }

  // Orphans reparented to us (subreaper) are reaped and attributed promptly, but every launch
  // ends with a SIGCHLD for the execution's own root, which the manager already reaps through
  // its pidfd: a full orphan pass (a read of every thread's /proc children list, then waitid)
  // for it is wasted loop time. So the pass is posted behind the handlers already queued (the
  // root's pidfd wait usually among them), several SIGCHLDs share one pass, and it only runs
  // when a peek (WNOWAIT: nothing is reaped) shows an exited child is still waiting. The
  // manager's periodic reap stays the backstop.
  void schedule_orphan_reap() {
    if (!manager_ || orphan_reap_posted_) return;
    orphan_reap_posted_ = true;
    asio::post(io_, [this] {
      orphan_reap_posted_ = false;
      if (!manager_) return;
      siginfo_t info{};
      int r = 0;
      do {
        r = ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT);
      } while (r != 0 && errno == EINTR);
      // ECHILD: no children at all; si_pid 0: children, none exited.
      if (r != 0 || info.si_pid == 0) return;
      manager_->reap_orphans_now();
    });
  }

  void notify_ready() {
    notify("READY=1\nSTATUS=serving on " + config_.socket_path.native() +
           "\nMAINPID=" + std::to_string(::getpid()));
    spdlog::info("ready");
  }

  void begin_shutdown(int sig) {
    if (shutting_down_) {
      spdlog::warn("signal {} during shutdown: still waiting for executions", sig);
      return;
    }
    shutting_down_ = true;
    bool const cancel = config_.shutdown == ShutdownMode::cancel;
    spdlog::info("signal {}: stopping (policy {})", sig, cancel ? "cancel" : "detach");
    notify("STOPPING=1\nSTATUS=stopping");
    server_->stop_accepting();
    unlink_socket();
    stop_metrics();
    if (!manager_) {
      stop_loop();
      return;
    }
    auto const policy =
        cancel ? supervisor::ShutdownPolicy::cancel : supervisor::ShutdownPolicy::detach;
    spdlog::info("{} live execution(s); {}", manager_->live_count(),
                 cancel ? "cancelling them and waiting for their terminal records"
                        : "leaving them running for recovery by the next start");
    auto settle = [this, policy] {
      manager_->shutdown(policy, config_.shutdown_timeout, [this] {
        spdlog::info("executions settled");
        stop_loop();
      });
    };
    // Authorizations in flight finish first (their launches join the executions the manager
    // then cancels or leaves); new starts are refused from here on.
    if (gateway_) return gateway_->drain(config_.shutdown_timeout, std::move(settle));
    settle();
  }

  void stop_loop() {
    if (server_) server_->close_all();
    signals_.cancel();
    io_.stop();
  }

  void unlink_socket() {
    if (!bound_socket_) return;
    bound_socket_ = false;
    // Removed while we still hold its lock, so no newer daemon's socket can be unlinked here.
    (void)::unlink(config_.socket_path.c_str());
  }

  void finish() {
    unlink_socket();
    stop_metrics();
    if (server_) server_->close_all();
    // With the detach policy the executions must outlive us: the manager's destructor only
    // releases its handles (supervisor-api.md), it never signals.
    if (sink_) sink_->set_solo_probe(nullptr);  // it asks the manager
    manager_.reset();
    if (subtree_ && subtree_created_) {
      // Only an empty subtree can be removed; with the detach policy it keeps its executions.
      auto r = subtree_->remove();
      if (!r) spdlog::info("cgroup subtree {} kept: {}", subtree_->path(), r.error().message());
    }
    spdlog::info("stopped");
  }

  DaemonConfig config_;
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

}  // namespace

int run(DaemonConfig const& config) {
  auto resolved = resolve(config, ::geteuid(), fs::current_path());
  if (!resolved) {
    spdlog::critical("configuration: {}", resolved.error().message());
    return 1;
  }
  if (auto r = setup_logging(*resolved); !r) {
    spdlog::critical("logging: {}", r.error().message());
    return 1;
  }
  ::umask(0077);
  Daemon daemon{std::move(*resolved)};
  if (auto r = daemon.start(); !r) {
    notify("STATUS=start-up failed: " + r.error().message());
    return 1;
  }
  return daemon.serve();
}

}  // namespace custos::daemon
