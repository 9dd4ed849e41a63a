// `custos daemon`: the start-up reads as a list of named steps (load config → lock state dir →
// open registry → recover → create subtree → listen → notify READY), then one io_context runs
// everything until a signal asks for shutdown or a handover (daemon_loop.cpp).
#include <boost/asio/post.hpp>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <grp.h>
#include <sys/resource.h>
#include <unistd.h>

#include "custos/daemon/version.hpp"
#include "custos/registry/failpoint.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/sys/identity.hpp"

#include "daemon_impl.hpp"
#include "logging.hpp"
#include "metrics.hpp"
#include "socket_path.hpp"

namespace custos::daemon {

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

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

Result<void> Daemon::start() {
  CUSTOS_TRYV(step("load config", [&] { return load_config(); }));
  CUSTOS_TRYV(step("raise descriptor limit", [&] { return raise_fd_limit(); }));
  CUSTOS_TRYV(step("take descriptors from systemd", [&] { return take_systemd_fds(); }));
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
  handover_.inherited = nullptr;  // run() closes what it passed: second descriptors are held
  notify_ready();
  return ok();
}

Result<void> Daemon::load_config() {
  auto admin = CUSTOS_TRY(resolve_group(config_.admin_group));
  auth_.daemon_uid = ::geteuid();
  auth_.admin_gid = admin;
  spdlog::info("custos {} starting (pid {}, uid {}), state {}, socket {}", kVersion, ::getpid(),
               auth_.daemon_uid, config_.state_dir.native(), config_.socket_path.native());
  return ok();
}

Result<void> Daemon::raise_fd_limit() {
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

Result<void> Daemon::take_systemd_fds() {
  passed_ = fd_store::take_passed();
  if (!passed_.kept.empty() || passed_.other > 0) {
    spdlog::info("systemd passed {} execution(s)' kept output descriptors{}", passed_.kept.size(),
                 passed_.other > 0
                     ? fmt::format(" and {} other descriptor(s), closed", passed_.other)
                     : std::string{});
  }
  if (config_.fd_store) fd_store_ = fd_store::Store::from_environment();
  if (fd_store_) spdlog::info("descriptor store: executions' output is kept in systemd's");
  return ok();
}

Result<void> Daemon::lock_state() {
  if (handover_.inherited != nullptr) {
    auto const path = (config_.state_dir / "custos.lock").native();
    if (auto held = handover::verified_lock(handover_.inherited->fds.state_lock, path)) {
      state_lock_ = std::move(*held);
      return ok();
    } else {
      spdlog::warn("handover: the state lock is taken again: {}", held.error().message());
    }
  }
  state_lock_ = CUSTOS_TRY(lock_state_dir(config_.state_dir));
  return ok();
}

Result<void> Daemon::open_registry() {
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

Result<void> Daemon::open_secrets() {
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

Result<void> Daemon::recover() {
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
    spdlog::info("recovery: {} {}: {}", e.execution_id, core::recovery_path_wire(e.classification),
                 e.detail);
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

Result<void> Daemon::adopt_recovered() {
  if (!recovered_) return ok();
  // A handover keeps its executions whatever restart-policy says: it is not a restart.
  auto const policy =
      handover_.inherited != nullptr ? supervisor::RestartPolicy::adopt : config_.restart_policy;
  if (handover_.inherited != nullptr) attach_carried(handover_.inherited->executions);
  attach_restored();
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

void Daemon::attach_carried(std::vector<supervisor::Carried>& carried) {
  for (auto& c : carried) {
    auto it = std::find_if(recovered_->executions.begin(), recovered_->executions.end(),
                           [&c](auto const& e) { return e.execution_id == c.execution_id; });
    if (it == recovered_->executions.end() || !it->adopt) {
      // Recovery did not find it live by pidfs identity: nothing it carried is trusted.
      spdlog::warn("handover: {} was carried but is not live by its identity; its stdio is closed",
                   c.execution_id);
      continue;
    }
    it->adopt->carried = std::make_shared<supervisor::Carried>(std::move(c));
  }
  carried.clear();  // what was not attached closes here
}

void Daemon::give_back_carried(handover::Inherited& in) {
  if (!manager_) return;  // failed before the executions were adopted: `in` still has them
  auto back = manager_->give_back();
  spdlog::info("handover: {} execution(s) give their stdio back for the old image", back.size());
  for (auto& c : back) in.executions.push_back(std::move(c));
}

void Daemon::attach_restored() {
  auto kept = std::move(passed_.kept);
  passed_.kept.clear();
  // What is re-attached stays in the store under its names, forgotten at its terminal record.
  for (auto& [id, stdio] : kept) {
    auto it = std::find_if(recovered_->executions.begin(), recovered_->executions.end(),
                           [&id](auto const& e) { return e.execution_id == id; });
    if (it == recovered_->executions.end() || !it->adopt) {
      // Ended while no daemon ran, or not provably ours: nothing kept for it is used.
      spdlog::info("descriptor store: {} is not live by its identity; its kept output is dropped",
                   id);
      if (fd_store_) fd_store_->forget(id);
      continue;
    }
    if (it->adopt->carried) continue;  // a handover carried the same pipes
    auto const& req = *it->adopt;
    auto c = fd_store::restored(id, std::move(stdio), req.plan.io.mode == core::IoMode::pty,
                                req.out, req.err, config_.state_dir);
    if (!c) {
      spdlog::warn("descriptor store: {}: not re-attached, adopted without its output: {}", id,
                   c.error().message());
      if (fd_store_) fd_store_->forget(id);
      continue;
    }
    spdlog::info("descriptor store: {} re-attached to its kept output", id);
    ++restored_from_store_;
    it->adopt->carried = std::make_shared<supervisor::Carried>(std::move(*c));
  }
}

Result<void> Daemon::create_subtree() {
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

Result<fs::path> Daemon::subtree_path() const {
  fs::path path = config_.cgroup_subtree;
  if (path.empty()) {
    auto mount = CUSTOS_TRY(sys::find_cgroup2_mount());
    auto own = CUSTOS_TRY(sys::own_cgroup());
    path = fs::path{mount.path} / fs::path{own}.relative_path() / "custos";
  }
  return path.lexically_normal();
}

Result<sys::CgroupDir> Daemon::make_subtree() {
  std::set<std::string> const wanted{"cpu", "memory", "pids"};
  fs::path const path = CUSTOS_TRY(subtree_path());
  auto parent = CUSTOS_TRY(sys::CgroupDir::open(path.parent_path().native()));
  if (config_.cgroup_subtree.empty() && under_systemd()) delegate_controllers(parent, wanted);
  std::error_code ec;
  // Created by this daemon, or by the image that handed over to it (removed at the last stop).
  subtree_created_ = !fs::exists(path, ec) ||
                     (handover_.inherited != nullptr && handover_.inherited->subtree_created &&
                      handover_.inherited->subtree_path == path.native());
  return sys::ensure_subtree(parent, path.filename().native(), wanted);
}

void Daemon::delegate_controllers(sys::CgroupDir const& own, std::set<std::string> const& wanted) {
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

Result<void> Daemon::probe() {
  sys::ProbeOptions options;
  if (subtree_) options.scratch_cgroup_parent = subtree_->path();
  caps_ = sys::probe_host(options);
  if (!caps_) spdlog::warn("host probe failed: {}", caps_.error().message());
  auto boot = sys::read_boot_id();
  if (boot) boot_id_ = *boot;
  return ok();
}

Result<void> Daemon::start_manager() {
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
  mc.stdio_keeper = fd_store_.get();
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

Result<void> Daemon::register_methods() {
  dispatcher_.emplace(auth_);
  rpc::register_host_methods(*dispatcher_, [this] { return describe_host(); });
  rpc::register_introspection(*dispatcher_);
  rpc::register_exec_methods(*dispatcher_, *manager_, registry_.get());
  rpc::register_output_methods(*dispatcher_, *manager_, *publisher_);
  rpc::register_gateway_methods(*dispatcher_, *gateway_);
  rpc::register_secret_methods(*dispatcher_, *gateway_, *secrets_);
  return ok();
}

Result<void> Daemon::serve_metrics() {
  auto* in = handover_.inherited;
  if (config_.metrics_listen.empty()) {
    // No longer configured: what a previous image served is closed with the inherited
    // descriptors (a Unix socket's file stays, stale, until something claims the path).
    if (in != nullptr && in->fds.metrics_listener.valid()) {
      spdlog::info("metrics: no longer configured; the handed-over endpoint is closed");
    }
    return ok();
  }
  auto const endpoint = CUSTOS_TRY(parse_metrics_listen(config_.metrics_listen));
  // Read on the loop at each scrape; the server comes up in the next step.
  metrics_.emplace(io_, [this] {
    return render_metrics(MetricsSources{manager_.get(), server_ ? &*server_ : nullptr,
                                         registry_.get(), publisher_.get()});
  });
  if (in != nullptr && in->fds.metrics_listener.valid()) {
    // A handover's: served on, if it is still the configured endpoint (its lock with it).
    sys::UniqueFd lock;
    bool usable = true;
    if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
      auto held = handover::verified_lock(in->fds.metrics_lock, endpoint.path + ".lock");
      if (held) {
        lock = std::move(*held);
      } else {
        usable = false;
      }
    }
    auto listener = in->fds.metrics_listener.dup();
    if (usable && listener) {
      if (auto r = metrics_->adopt(endpoint, std::move(*listener)); r) {
        if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
          metrics_lock_ = std::move(lock);
          metrics_socket_ = endpoint.path;
        }
        spdlog::info("metrics: serving {} (handed over)", metrics_->url());
        return ok();
      } else {
        spdlog::warn("metrics: {}; listening anew", r.error().message());
      }
    }
    // Not the configured endpoint any more (it closes with the inherited descriptors): the
    // configured one is listened on afresh, by the same server.
  }
  sys::UniqueFd lock;
  if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
    lock = CUSTOS_TRY(claim_socket_path(endpoint.path));
  }
  CUSTOS_TRYV(metrics_->listen(endpoint, config_.socket_mode));
  if (endpoint.kind == MetricsEndpoint::Kind::unix_socket) {
    metrics_lock_ = std::move(lock);
    metrics_socket_ = endpoint.path;
  }
  spdlog::info("metrics: serving {}", metrics_->url());
  return ok();
}

Result<void> Daemon::listen() {
  rpc::ServerLimits limits;
  limits.max_line_bytes = config_.max_line_bytes;
  limits.max_connections = config_.max_connections;
  limits.max_subscriptions_per_connection = config_.max_subscriptions;
  limits.event_queue_bytes = config_.event_queue_bytes;
  limits.max_write_queue_bytes = config_.write_queue_bytes;
  limits.idle_timeout = config_.idle_timeout;
  dispatcher_->set_max_batch_entries(config_.max_batch_entries);
  server_.emplace(io_, *dispatcher_, limits);
  if (registry::failpoint_set("handover_start_fails") && handover_.inherited != nullptr &&
      !handover_.inherited->origin.fallback) {
    return Error{Errc::daemon_handover_failed, "failpoint handover_start_fails"};
  }
  if (handover_.inherited != nullptr && handover_.inherited->fds.listener.valid()) {
    if (auto r = listen_inherited(); r || handover_.inherited->fds.listener_from_systemd) return r;
  }
  if (config_.socket_activation && passed_.listener.valid()) {
    CUSTOS_TRYV(server_->adopt(passed_.listener.release()));
    handover_.listener_from_systemd = true;
    spdlog::info("listening on the socket passed by systemd (socket activation)");
    return ok();
  }
  passed_.listener.reset();  // --no-socket-activation: not served
  socket_lock_ = CUSTOS_TRY(claim_socket_path(config_.socket_path));
  CUSTOS_TRYV(server_->listen(config_.socket_path.native(), config_.socket_mode));
  bound_socket_ = true;
  spdlog::info("listening on {} (mode {:o})", config_.socket_path.native(), config_.socket_mode);
  return ok();
}

Result<void> Daemon::listen_inherited() {
  auto const& path = config_.socket_path.native();
  auto listener = handover::verified_listener(*handover_.inherited, path);
  if (!listener) {
    spdlog::warn("handover: the listening socket is not used: {}", listener.error().message());
    return listener.error();
  }
  if (!handover_.inherited->fds.listener_from_systemd) {
    auto lock = handover::verified_lock(handover_.inherited->fds.socket_lock, path + ".lock");
    if (!lock) {
      spdlog::warn("handover: the listening socket is not used: {}", lock.error().message());
      return lock.error();
    }
    socket_lock_ = std::move(*lock);
    bound_socket_ = true;
  }
  handover_.listener_from_systemd = handover_.inherited->fds.listener_from_systemd;
  CUSTOS_TRYV(server_->adopt(listener->release()));
  spdlog::info("listening on the socket the previous image handed over ({})", path);
  return ok();
}

}  // namespace custos::daemon
