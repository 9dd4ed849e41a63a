// The daemon's loop: serving until a signal, the shutdown policies, and run().
#include <boost/asio/post.hpp>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "custos/daemon/daemon.hpp"
#include "custos/daemon/version.hpp"

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
  signals_.add(SIGCHLD);
  // A client that disappears mid-write must not kill the daemon.
  (void)std::signal(SIGPIPE, SIG_IGN);
  wait_signal();
  return ok();
}

void Daemon::wait_signal() {
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
