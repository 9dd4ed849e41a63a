// The daemon's loop: serving until a signal, the shutdown policies, the handover to a new
// image (handover.hpp), and run(), which starts, serves and replaces the image.
#include <boost/asio/post.hpp>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "custos/daemon/daemon.hpp"
#include "custos/daemon/version.hpp"
#include "custos/registry/failpoint.hpp"

#include "daemon_impl.hpp"
#include "logging.hpp"
#include "metrics_server.hpp"

namespace custos::daemon {

int Daemon::serve() {
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

void Daemon::stop_metrics() {
  if (metrics_) metrics_->stop();
  if (metrics_socket_.empty()) return;
  // Removed while its lock is held, like the API socket.
  (void)::unlink(metrics_socket_.c_str());
  metrics_socket_.clear();
}

Result<void> Daemon::handle_signals() {
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.add(SIGHUP);
  signals_.add(SIGUSR1);
  signals_.add(SIGCHLD);
  // A client that disappears mid-write must not kill the daemon.
  (void)std::signal(SIGPIPE, SIG_IGN);
  // Blocked by a handing-over image (stop_signals()); whatever arrived meanwhile is delivered
  // to the handlers now.
  sigset_t const set = stop_signals();
  (void)::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  wait_signal();
  return ok();
}

void Daemon::wait_signal() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    if (sig == SIGCHLD) {
      schedule_orphan_reap();
    } else if (sig == SIGUSR1) {
      auto r = reopen_logs(config_);
      if (!r)
        spdlog::error("SIGUSR1: reopening logs failed: {}", r.error().message());
      else
        spdlog::info("SIGUSR1: logs reopened");
    } else if (sig == SIGHUP) {
      begin_handover();
    } else if (handover_.outgoing) {
      // Meant for the image being handed over to: raised again once this one is gone (the
      // signal then waits, blocked, across the execve).
      spdlog::info("signal {} during the handover: passed on to the next image", sig);
      handover_.pending_signal = sig;
    } else {
      begin_shutdown(sig);
    }
    wait_signal();
  });
}

void Daemon::schedule_orphan_reap() {
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

void Daemon::notify_ready() {
  notify("READY=1\nSTATUS=serving on " + config_.socket_path.native() +
         "\nMAINPID=" + std::to_string(::getpid()));
  spdlog::info("ready");
}

void Daemon::begin_shutdown(int sig) {
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

void Daemon::begin_handover() {
  if (shutting_down_) {
    spdlog::warn("SIGHUP during {}: ignored", handover_.outgoing ? "a handover" : "shutdown");
    return;
  }
  if (handover_.checking) {
    spdlog::warn("SIGHUP during a handover's configuration check: ignored");
    return;
  }
  if (!handover_.image) return refuse_handover(handover_.image.error().message());
  spdlog::info("SIGHUP: handing over to {} (its configuration check first)", handover_.image->path);
  auto check = handover::start_check(*handover_.image);
  if (!check) return refuse_handover(check.error().message());
  // The check runs on its own thread while the loop serves on; its child is spared by the
  // orphan reaper (on this loop) until it is reaped there.
  std::int32_t const pid = check->pid;
  manager_->spare_child(pid);
  handover_.checking = true;
  if (handover_.check_thread.joinable()) handover_.check_thread.join();  // a finished one
  handover_.check_thread = std::thread([this, pid, c = std::move(*check)]() mutable {
    (void)pthread_setname_np(pthread_self(), "custos-check");
    auto checked = handover::finish_check(std::move(c), kHandoverCheckBound);
    // Failpoint builds: a check as slow as a loaded machine's.
    if (registry::failpoint_set("handover_slow"))
      std::this_thread::sleep_for(std::chrono::seconds{1});
    asio::post(io_, [this, pid, checked = std::move(checked)]() mutable {
      on_checked(pid, std::move(checked));
    });
  });
}

void Daemon::on_checked(std::int32_t pid, Result<sys::UniqueFd> checked) {
  handover_.checking = false;
  if (manager_) manager_->release_child(pid);
  if (shutting_down_) {
    spdlog::info("handover: the check ended during shutdown; not handed over");
    return;
  }
  if (!checked) return refuse_handover(checked.error().message());
  // The running image, to fall back to should the new one fail to start.
  sys::UniqueFd old_image{::open("/proc/self/exe", O_RDONLY | O_CLOEXEC)};
  if (!old_image.valid()) {
    return refuse_handover("/proc/self/exe cannot be opened (errno " + std::to_string(errno) + ")");
  }
  auto listener = server_->release_listener();
  if (!listener) {
    // Nothing listens any more (cannot happen while serving): stop as for SIGTERM.
    spdlog::error("handover: {}", listener.error().message());
    return begin_shutdown(SIGTERM);
  }
  sigset_t const set = stop_signals();
  (void)::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  shutting_down_ = true;
  handover_.outgoing.emplace();
  auto& out = *handover_.outgoing;
  out.origin.version = std::string{kVersion};
  out.origin.started_ns = handover_.started_ns;
  out.origin.count = (handover_.from ? handover_.from->count : 0) + 1;
  out.state_dir = config_.state_dir.native();
  out.socket_path = config_.socket_path.native();
  out.fds.listener = std::move(*listener);
  out.fds.listener_from_systemd = handover_.listener_from_systemd;
  out.fds.old_image = std::move(old_image);
  out.image = *handover_.image;
  out.new_image = std::move(*checked);
  notify("RELOADING=1\nSTATUS=handing over to a new image");
  // The metrics endpoint goes across like the API socket: scrapes meanwhile wait in its backlog.
  if (metrics_) {
    if (auto held = metrics_->release_listener()) {
      out.fds.metrics_listener = std::move(*held);
      out.fds.metrics_lock = std::move(metrics_lock_);
      metrics_socket_.clear();  // still bound: the next image serves it
    }
  }
  stop_metrics();
  spdlog::info("handover: {} live execution(s) detached for the next image",
               manager_->live_count());
  // The consistent point: no root exit is collected any more (each stays for the next image),
  // and those already collected get their terminal records. Then each live execution gives up
  // its stdio (every byte read was delivered) with where its streams, input and events stand,
  // and supervision detaches.
  auto settle = [this] {
    manager_->prepare_handover(config_.shutdown_timeout, [this] {
      handover_.outgoing->executions = manager_->hand_over();
      spdlog::info("handover: {} execution(s) carry their stdio to the next image",
                   handover_.outgoing->executions.size());
      manager_->shutdown(supervisor::ShutdownPolicy::detach, config_.shutdown_timeout, [this] {
        spdlog::info("handover: executions detached");
        stop_loop();
      });
    });
  };
  if (gateway_) return gateway_->drain(config_.shutdown_timeout, std::move(settle));
  settle();
}

void Daemon::refuse_handover(std::string reason) {
  spdlog::error("handover refused, still serving: {}", reason);
  notify("STATUS=handover refused: " + reason);
  handover_.refused = json::object{{"at_ns", now_ns()}, {"reason", std::move(reason)}};
}

void Daemon::stop_loop() {
  if (server_) server_->close_all();
  signals_.cancel();
  io_.stop();
}

void Daemon::unlink_socket() {
  if (!bound_socket_) return;
  bound_socket_ = false;
  // Removed while we still hold its lock, so no newer daemon's socket can be unlinked here.
  (void)::unlink(config_.socket_path.c_str());
}

void Daemon::finish() {
  if (handover_.outgoing) {
    // The socket's path stays bound and both locks stay held: they go to the next image.
    handover_.outgoing->fds.socket_lock = std::move(socket_lock_);
    handover_.outgoing->fds.state_lock = std::move(state_lock_);
    handover_.outgoing->subtree_created = subtree_ && subtree_created_;
    if (subtree_) handover_.outgoing->subtree_path = subtree_->path();
    bound_socket_ = false;
  }
  unlink_socket();
  stop_metrics();
  if (server_) server_->close_all();
  // With the detach policy the executions must outlive us: the manager's destructor only
  // releases its handles (supervisor-api.md), it never signals.
  if (sink_) sink_->set_solo_probe(nullptr);  // it asks the manager
  manager_.reset();
  if (subtree_ && subtree_created_ && !handover_.outgoing) {
    // Only an empty subtree can be removed; with the detach policy it keeps its executions.
    auto r = subtree_->remove();
    if (!r) spdlog::info("cgroup subtree {} kept: {}", subtree_->path(), r.error().message());
  }
  spdlog::info(handover_.outgoing ? "handing over" : "stopped");
}

int check(DaemonConfig const& config) {
  auto resolved = resolve(config, ::geteuid(), fs::current_path());
  Result<void> r = ok();
  if (!resolved) {
    r = resolved.error();
  } else if (auto group = resolve_group(resolved->admin_group); !group) {
    r = group.error();
  } else if (!resolved->metrics_listen.empty()) {
    if (auto m = parse_metrics_listen(resolved->metrics_listen); !m) r = m.error();
  }
  if (!r) {
    (void)std::fprintf(stderr, "custos %s: configuration refused: %s\n", kVersion.data(),
                       r.error().message().c_str());
    return 1;
  }
  (void)std::printf("custos %s: configuration ok (state %s, socket %s)\n", kVersion.data(),
                    resolved->state_dir.c_str(), resolved->socket_path.c_str());
  return 0;
}

// Start, serve, and — after a handover — replace the image (handover.hpp). The loop turns again
// only when neither the new image nor the old one could be executed: the daemon then starts
// afresh in this process from what it was about to hand over.
int run(DaemonConfig const& config) {
  auto started_ns = now_ns();
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
  auto taken = handover::take_inherited();
  if (!taken) {
    // Written by the previous image and sealed: only a bug gets here. Nothing it names is
    // trusted; the executions stay for the next start's recovery.
    spdlog::critical("handover: {}", taken.error().message());
    notify("STATUS=handover failed: " + taken.error().message());
    return 1;
  }
  std::optional<handover::Inherited> inherited = std::move(*taken);
  auto const image = handover::own_image();
  for (;;) {
    if (inherited) {
      spdlog::info("handover #{} from custos {}{}", inherited->origin.count,
                   inherited->origin.version,
                   inherited->origin.fallback ? " (fallback: " + inherited->origin.reason + ")"
                                              : std::string{});
    }
    auto daemon =
        std::make_unique<Daemon>(*resolved, inherited ? &*inherited : nullptr, started_ns, image);
    if (auto r = daemon->start(); !r) {
      if (inherited) daemon->give_back_carried(*inherited);
      daemon.reset();  // releases what it adopted; nothing is signalled
      notify("STATUS=start-up failed: " + r.error().message());
      if (!inherited) return 1;
      auto const e = handover::fall_back(std::move(*inherited), r.error().message(),
                                         image ? image->argv : std::vector<std::string>{});
      spdlog::critical("handover: {}; the executions stay for the next start's recovery",
                       e.message());
      return 1;
    }
    inherited.reset();  // the daemon holds second descriptors of what it verified
    int const rc = daemon->serve();
    auto out = daemon->take_handover();
    int const pending = daemon->pending_stop_signal();
    daemon.reset();
    if (!out) return rc;
    // Blocked since the handover began: it waits across the execve for the next image.
    if (pending != 0) (void)::raise(pending);
    // Failpoint builds: a handover that takes long (tests of executions ending meanwhile).
    if (registry::failpoint_set("handover_slow"))
      std::this_thread::sleep_for(std::chrono::seconds{2});
    inherited = handover::replace_image(std::move(*out));
    started_ns = now_ns();
  }
}

}  // namespace custos::daemon
