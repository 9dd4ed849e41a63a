// A container execution: the gated exec (container.hpp has the steps), its stream and its end.
#include "container_execution.hpp"

#include <boost/asio/post.hpp>

#include <charconv>
#include <csignal>

#include "custos/backend/native.hpp"
#include "custos/sys/identity.hpp"

namespace custos::backend {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often the gate's arrival is looked at (the host's /proc, not the engine).
constexpr milliseconds kGatePoll{1};
// The gate's own exit statuses (container_backend.cpp): the executable is missing or not
// executable for the exec's user; the descriptor limit cannot be set. Not 126/127, which the
// engines use for an exec their runtime could not start (a missing working directory).
constexpr int kGateNoExecutable = 120;
constexpr int kGateNoLimit = 121;
// How long an aborted gate may take to be seen dead after its SIGKILL (a stopped process dies
// at once; this bounds a blocking wait on the loop of a failure path).
constexpr milliseconds kGateDeathWait{50};
// PF_EXITING in /proc/PID/stat's flags: the process is inside exit(2).
constexpr std::uint64_t kPfExiting = 0x4;

// State (field 3) and flags (field 9) of a /proc/PID/stat line; nullopt when malformed.
struct StatFields {
  char state = '?';
  std::uint64_t flags = 0;
};
std::optional<StatFields> parse_stat(std::string_view line) {
  auto const close = line.rfind(')');
  if (close == std::string_view::npos || close + 2 >= line.size()) return std::nullopt;
  std::string_view rest = line.substr(close + 2);
  StatFields f;
  f.state = rest.front();
  // Fields after the state: ppid pgrp session tty_nr tpgid flags.
  for (int skip = 0; skip < 6; ++skip) {
    auto const sp = rest.find(' ');
    if (sp == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(sp + 1);
  }
  auto const [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), f.flags);
  if (ec != std::errc{} || end == rest.data()) return std::nullopt;
  return f;
}

Result<StatFields> read_stat(std::int32_t pid) {
  auto dir = CUSTOS_TRY(sys::open_dir_path("/proc/" + std::to_string(pid)));
  auto text = CUSTOS_TRY(sys::read_shown_file_at(dir, "stat"));
  auto f = parse_stat(text);
  if (!f) return Error(Errc::procfs_failed, "malformed /proc/" + std::to_string(pid) + "/stat");
  return *f;
}

// "<root>/<cwd>" inside the container ("." is the root itself).
std::string working_dir(PlanView const& plan) {
  if (plan.cwd.empty() || plan.cwd == ".") return plan.workspace_root;
  std::string dir = plan.workspace_root;
  if (!dir.ends_with('/')) dir += '/';
  return dir + plan.cwd;
}

}  // namespace

Result<GateCheck> check_gate_identity(sys::Pidfd const& candidate, sys::Marker const& marker,
                                      std::uint64_t pid_ns, bool stopped) {
  std::int32_t const pid = candidate.pid();
  // Everything below is read by pid, then the pidfd is checked alive: a live process holds its
  // pid, so what was read belongs to the process behind the pidfd.
  auto dir = sys::open_dir_path("/proc/" + std::to_string(pid));
  if (!dir) return GateCheck::not_yet;
  // Before the engine's runtime execs /bin/sh the process is the runtime's own (no marker yet,
  // and briefly not readable: the runtime makes itself non-dumpable while it sets up).
  auto env = sys::read_file_at(*dir, "environ", std::size_t{1} << 20);
  if (!env) {
    bool const denied = env.error().sys_errno == EACCES || env.error().sys_errno == EPERM;
    return denied && candidate.alive() ? GateCheck::unreadable : GateCheck::not_yet;
  }
  if (!sys::environ_has_marker(*env, marker)) return GateCheck::not_yet;
  auto ns = sys::pid_namespace_inode(std::to_string(pid));
  if (!ns) return candidate.alive() ? Result<GateCheck>{ns.error()} : GateCheck::not_yet;
  if (*ns != pid_ns) {
    return Error(Errc::identity_mismatch, "pid " + std::to_string(pid) +
                                              " carries the exec's marker outside the "
                                              "container's PID namespace");
  }
  auto st = read_stat(pid);
  if (!st) return GateCheck::not_yet;
  if (stopped && st->state != 'T') return GateCheck::not_yet;  // not stopped at the gate yet
  if (!candidate.alive()) return GateCheck::not_yet;
  return GateCheck::gate;
}

ContainerExecution::ContainerExecution(ContainerBackend& host, std::string execution_id)
    : host_(&host), io_(host.io()), id_(std::move(execution_id)), engine_(host.config().engine) {}

ContainerExecution::~ContainerExecution() {
  if (io_state_.stream) io_state_.stream->close();
}

// ------------------------------------------------------------------------------ acquire

void ContainerExecution::acquire(LaunchContext const& ctx,
                                 std::function<void(Step<Acquired>)> done) {
  launching_ = std::make_unique<Launching>(io_);
  launching_->ctx = ctx;
  launching_->done = std::move(done);
  PlanView const& plan = *ctx.view;
  io_state_.chunk_bytes = static_cast<std::size_t>(plan.chunk_bytes);
  io_state_.tty = plan.pty;
  client_ = host_->client(ctx.plan->backend.socket.value_or(""));
  auto m = sys::Marker::generate();
  if (!m) return fail("marker", m.error());
  marker_ = *m;
  if (auto recent = host_->take_recent(ctx.plan->backend.socket.value_or(""),
                                       ctx.plan->backend.container.value_or(""))) {
    return on_inspected(std::move(*recent));
  }
  client_->inspect_container(ctx.plan->backend.container.value_or(""), host_->config().call_timeout,
                             [self = shared_from_this()](Result<engine::ContainerInfo> info) {
                               self->on_inspected(std::move(info));
                             });
}

void ContainerExecution::on_inspected(Result<engine::ContainerInfo> info) {
  if (!launching_) return;
  if (!info) return fail("engine", info.error());
  auto const& c = info->inspect;
  if (!c.accepts_exec()) {
    return fail("engine", Error(Errc::engine_container_not_running,
                                "container " + c.name + " is " + c.status_text));
  }
  if (!info->init) {
    return fail("engine", info->init_error.value_or(Error(Errc::engine_container_not_running,
                                                          "container " + c.name + ": no init")));
  }
  launching_->container_id = c.id;
  container_id_ = c.id;
  launching_->init = *info->init;
  pid_ns_ = info->init->pid_namespace;
  // The init's pidfd: its end is the container's (on_root_exit asks). Opened and then checked
  // against the identity the client read, so it names that very process.
  auto init = sys::Pidfd::open(info->init->pid);
  if (!init) return fail("engine", init.error());
  auto ident = sys::read_identity(*init);
  if (!ident || !(*ident == info->init->identity)) {
    return fail("engine", Error(Errc::engine_container_not_running,
                                "container " + c.name + ": its init changed while it was read"));
  }
  init_ = std::move(*init);

  PlanView const& plan = *launching_->ctx.view;
  // Ungated only where the plan accepts it and this container start's gate probe did not pass
  // (the preflight refused the start otherwise).
  ungated_ = launching_->ctx.plan->backend.gate == core::GatePolicy::optional &&
             !host_->gate_ok(c.id, c.started_at);
  if (ungated_ && host_->config().boundary == BoundaryPreference::cgroup) {
    return fail("cgroup", Error(Errc::cgroup_unavailable,
                                "boundary=cgroup, but container " + c.name +
                                    " cannot run the gate: an ungated exec has the marker only"));
  }
  engine::ExecConfig cfg;
  if (ungated_) {
    cfg.cmd = {plan.executable};
  } else {
    cfg.cmd = {"/bin/sh",
               "-c",
               std::string{container_gate_script()},
               "custos-gate",
               plan.open_files ? std::to_string(*plan.open_files) : std::string{"-"},
               plan.executable};
  }
  for (std::size_t i = 1; i < plan.argv.size(); ++i) cfg.cmd.push_back(plan.argv[i]);
  std::string const prefix = std::string{sys::Marker::env_name()} + "=";
  for (auto const& e : launching_->ctx.env) {
    if (!e.starts_with(prefix)) cfg.env.push_back(e);  // the marker is the backend's, always
  }
  cfg.env.push_back(marker_->env_entry());
  if (plan.user) cfg.user = std::to_string(plan.user->uid) + ":" + std::to_string(plan.user->gid);
  cfg.working_dir = working_dir(plan);
  cfg.tty = plan.pty;
  cfg.attach_stdin = true;
  if (plan.pty) cfg.console_size = std::make_pair(plan.rows, plan.cols);
  client_->create_exec(
      c.id, std::move(cfg), host_->config().call_timeout,
      [self = shared_from_this()](Result<std::string> id) { self->on_created(std::move(id)); });
}

void ContainerExecution::on_created(Result<std::string> exec_id) {
  if (!launching_) return;
  if (!exec_id) return fail("engine", exec_id.error());
  exec_id_ = *exec_id;
  if (ungated_) return answer_ungated_acquire();
  start_exec();
}

void ContainerExecution::start_exec() {
  exec_started_ = true;
  client_->start_exec(exec_id_, io_state_.tty, host_->config().call_timeout,
                      [self = shared_from_this()](Result<std::shared_ptr<engine::ExecStream>> s) {
                        self->on_started(std::move(s));
                      });
}

void ContainerExecution::on_started(Result<std::shared_ptr<engine::ExecStream>> stream) {
  if (!launching_) return;
  if (!stream) return fail("engine", stream.error());
  io_state_.stream = std::move(*stream);
  io_state_.open = true;
  PlanView const& plan = *launching_->ctx.view;
  auto inspect = [self = shared_from_this()] {
    if (!self->launching_) return;
    self->launching_->gate_deadline = Clock::now() + self->host_->config().call_timeout;
    self->client_->inspect_exec(
        self->exec_id_, self->host_->config().call_timeout,
        [self](Result<engine::ExecInspect> r) { self->on_exec_inspected(std::move(r)); });
  };
  if (!plan.pty) return inspect();
  // Docker may start the exec before it applies the size given at create (and below API 1.42
  // ignores it): set it while the gate holds, and release nothing before the engine answered.
  client_->resize_exec(exec_id_, plan.rows, plan.cols, host_->config().call_timeout,
                       [inspect](Result<void> const&) { inspect(); });
}

void ContainerExecution::on_exec_inspected(Result<engine::ExecInspect> inspect) {
  if (!launching_) return;
  if (ungated_) return on_ungated_inspected(std::move(inspect));
  if (!inspect) return fail("gate", inspect.error());
  if (!inspect->running && inspect->exit_code) {
    // The gate ended before it stopped: it found no executable, could not set the limit, or the
    // engine could not start it at all.
    if (*inspect->exit_code == kGateNoExecutable) {
      PlanView const& plan = *launching_->ctx.view;
      return fail(
          "execve",
          Error(Errc::spawn_failed,
                plan.executable + ": not found or not executable in the container", ENOENT));
    }
    if (*inspect->exit_code == kGateNoLimit && launching_->ctx.view->open_files) {
      PlanView const& plan = *launching_->ctx.view;
      return fail("rlimit", Error(Errc::spawn_failed,
                                  "the container refuses RLIMIT_NOFILE " +
                                      std::to_string(plan.open_files.value_or(0)) +
                                      " (above its hard limit?)",
                                  EPERM));
    }
    return fail("exec_start",
                Error(Errc::engine_failed,
                      "the exec ended with status " + std::to_string(*inspect->exit_code) +
                          " before its gate stopped (the engine could not start it: a missing "
                          "working directory or user?)"));
  }
  if (inspect->pid > 0) return gate_step(inspect->pid);
  if (Clock::now() >= launching_->gate_deadline) {
    return fail("gate", Error(Errc::engine_failed,
                              "the engine named no process for the exec "
                              "within the call timeout"));
  }
  poll_gate();
}

void ContainerExecution::gate_step(std::int32_t pid) {
  auto ok = check_gate(pid);
  if (!ok) return fail("gate", ok.error());
  if (*ok) {
    launching_->timer.cancel();
    auto acq = enter_boundary();
    auto done = std::move(launching_->done);
    launching_.reset();
    if (std::holds_alternative<core::SpawnFailure>(acq)) discard();
    return done(std::move(acq));
  }
  if (Clock::now() >= launching_->gate_deadline) {
    return fail("gate", Error(Errc::identity_mismatch,
                              std::string{"the exec's process did not show as the gate (marker, "
                                          "namespace, stopped) within the call timeout"} +
                                  (launching_->unreadable
                                       ? "; its /proc entries were unreadable to the daemon "
                                         "(no CAP_SYS_PTRACE over it?)"
                                       : "")));
  }
  poll_gate();
}

void ContainerExecution::poll_gate() {
  launching_->timer.expires_after(kGatePoll);
  launching_->timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || !self->launching_) return;
    // The engine is asked each time: an exited gate's status shows there before a recycled pid
    // could be mistaken for it.
    self->client_->inspect_exec(
        self->exec_id_, self->host_->config().call_timeout,
        [self](Result<engine::ExecInspect> r) { self->on_exec_inspected(std::move(r)); });
  });
}

Result<bool> ContainerExecution::check_gate(std::int32_t pid) {
  // A candidate until every check passed: only a verified gate is ever signalled.
  if (!candidate_ || candidate_->pid() != pid) {
    auto fd = sys::Pidfd::open(pid);
    if (!fd) return fd.error().sys_errno == ESRCH ? Result<bool>{false} : Result<bool>{fd.error()};
    candidate_ = std::move(*fd);
  }
  auto const verdict = CUSTOS_TRY(check_gate_identity(*candidate_, *marker_, pid_ns_, !ungated_));
  if (verdict != GateCheck::gate) {
    if (verdict == GateCheck::unreadable) launching_->unreadable = true;
    return false;
  }
  gate_ = std::move(candidate_);
  candidate_.reset();
  return true;
}

Result<std::optional<sys::CgroupDir>> ContainerExecution::make_cgroup(std::string& placement) {
  auto const pref = host_->config().boundary;
  if (pref == BoundaryPreference::marker) return std::optional<sys::CgroupDir>{};
  std::string why;
  // Beneath the container's own cgroup, so its limits still apply to the exec.
  auto const& init = launching_->init;
  if (init.cgroup_own && !init.cgroup_dir.empty()) {
    auto parent = sys::CgroupDir::open(init.cgroup_dir);
    if (parent) {
      auto cg = sys::CgroupDir::create(*parent, "custos-" + id_);
      if (cg) {
        placement = "container";
        return std::optional<sys::CgroupDir>{std::move(*cg)};
      }
      why = cg.error().message();
    } else {
      why = parent.error().message();
    }
  }
  // Else beneath the daemon's subtree, named by the execution as a native one is (so a restart's
  // recovery finds it the same way).
  if (auto const* subtree = host_->native().subtree()) {
    auto cg = sys::CgroupDir::create(*subtree, id_);
    if (cg) {
      placement = "daemon";
      return std::optional<sys::CgroupDir>{std::move(*cg)};
    }
    why += (why.empty() ? "" : "; ") + cg.error().message();
  }
  if (pref == BoundaryPreference::cgroup) {
    return Error(Errc::cgroup_unavailable,
                 "boundary=cgroup but no cgroup could be made for the exec" +
                     (why.empty() ? std::string{} : ": " + why));
  }
  return std::optional<sys::CgroupDir>{};
}

Step<Acquired> ContainerExecution::enter_boundary() {
  std::int32_t const pid = gate_->pid();
  auto cg = make_cgroup(placement_);
  if (!cg) return step_failure("cgroup", cg.error());
  cgroup_ = std::move(*cg);
  if (cgroup_) {
    auto const& mount = host_->native().cgroup_mount();
    std::string const rel = cgroup_->path().substr(mount.size());
    // A process stopped at the gate cannot end by itself, so the pid still names it here; the
    // move is then checked through the pidfd (alive, and its cgroup is the new one).
    if (!gate_->alive()) {
      return step_failure("gate", Error(Errc::identity_mismatch, "the gate ended before its move"));
    }
    if (auto a = cgroup_->attach(pid); !a) return step_failure("cgroup", a.error());
    auto dir = sys::open_dir_path("/proc/" + std::to_string(pid));
    auto text = dir ? sys::read_file_at(*dir, "cgroup") : Result<std::string>{dir.error()};
    auto own = text ? sys::parse_own_cgroup(*text) : Result<std::string>{text.error()};
    if (!own || *own != rel || !gate_->alive()) {
      // What moved in is not known to be ours: never cgroup.kill it. Only an empty cgroup goes.
      (void)cgroup_->remove();
      cgroup_.reset();
      return step_failure("cgroup", Error(Errc::identity_mismatch,
                                          "the gate is not in " + rel + " after the move"));
    }
  }
  auto identity = sys::read_identity(*gate_);
  if (!identity) return step_failure("gate", identity.error());
  auto keep = gate_->dup();
  if (!keep) return step_failure("gate", keep.error());

  AdoptContext a;
  a.execution_id = id_;
  a.plan = launching_->ctx.plan;
  a.view = launching_->ctx.view;
  a.root = std::move(*gate_);
  a.identity = *identity;
  a.boundary = cgroup_ ? core::Boundary::cgroup : core::Boundary::marker;
  a.cgroup_path = cgroup_ ? cgroup_->path() : std::string{};
  a.marker_hex = marker_->env_value();
  a.pid_ns_inode = pid_ns_;
  a.after_restart = false;
  gate_ = std::move(*keep);  // kept for the release (SIGCONT)
  tree_ = host_->native().create(id_);
  auto acq = tree_->adopt(std::move(a));
  if (!acq) return step_failure("gate", acq.error());
  if (cgroup_ && acq->cgroup_path.empty()) {
    return step_failure(
        "cgroup",
        Error(Errc::cgroup_failed, "the tree could not open " + cgroup_->path() + " it was given"));
  }
  // The tree half removes the cgroup when it closes: one owner.
  cgroup_.reset();
  // A process in a container may hold CAP_SYS_ADMIN over a cgroup namespace of its own: the
  // weaker claim, as for an adopted root.
  acq->kernel_enforced = false;
  // Recorded, so recovery sweeps the container's namespace for a gone exec's leftovers.
  acq->marker_ns_ino = pid_ns_;
  return *acq;
}

void ContainerExecution::fail(std::string step, Error const& e) {
  if (!launching_) return;
  auto done = std::move(launching_->done);
  auto release_done = std::move(launching_->release_done);
  launching_.reset();
  discard();
  auto f = step_failure(std::move(step), e);
  // Never inside the call that started the launch's step (acquire may complete at once, but a
  // completion of the engine client is already on the loop).
  if (done) return done(std::move(f));
  if (release_done) release_done(std::move(f));
}

void ContainerExecution::discard() {
  std::vector<std::string> why;
  if (gate_) {
    (void)gate_->send_signal(SIGKILL);
    auto const until = Clock::now() + kGateDeathWait;
    while (gate_->alive() && Clock::now() < until) ::usleep(500);
    if (gate_->alive()) why.emplace_back("the gate was not seen dead after its SIGKILL");
  } else if (exec_started_) {
    why.emplace_back("the engine's exec " + exec_id_.substr(0, 12) + " was started but its " +
                     (ungated_ ? "process" : "gate") + " never identified");
  }
  if (tree_) {
    (void)tree_->kill_tree();
  } else if (marker_ && pid_ns_ != 0) {
    // Whatever of the exec carries its marker in the container (the gate, had it not been
    // identified yet): killed through pidfds after the marker is re-read.
    sys::MarkerSweepOptions o;
    o.pid_ns_inode = pid_ns_;
    o.max_rounds = 4;
    auto sw = sys::marker_sweep(*marker_, o);
    if (!sw || !sw->confirmed)
      why.emplace_back("the marker sweep of the container was not confirmed");
  }
  if (io_state_.stream) io_state_.stream->close();
  io_state_.open = false;
  if (cgroup_) {
    (void)cgroup_->kill();
    if (!cgroup_->remove()) why.emplace_back("the exec's cgroup " + cgroup_->path() + " remained");
    cgroup_.reset();
  }
  for (auto& w : why) discard_unconfirmed_ += (discard_unconfirmed_.empty() ? "" : "; ") + w;
}

// ------------------------------------------------------------------------------ release

void ContainerExecution::release(std::function<void(Step<std::monostate>)> done) {
  released_ = true;
  if (ungated_) return release_ungated(std::move(done));
  // A zombie still takes a signal: a gate that died after its checks did not start anything.
  auto sent = gate_ && gate_->alive() ? gate_->send_signal(SIGCONT) : Result<bool>{false};
  gate_.reset();
  Step<std::monostate> verdict = std::monostate{};
  if (!sent || !*sent) {
    verdict = core::SpawnFailure{"gate", ESRCH, "the gate ended before it was opened"};
  }
  asio::post(io_, [done = std::move(done), verdict = std::move(verdict)]() mutable {
    done(std::move(verdict));
  });
}

void ContainerExecution::abort() {
  launching_.reset();
  discard();
}

// ------------------------------------------------------------------------------ running

void ContainerExecution::start(ExecutionPort& port) {
  port_ = &port;
  tree_->start(*this);
  if (root_unseen_) {
    // An ungated program that ended before its process was identified: nothing will report the
    // root's end but this (its status is the engine's).
    port_->task_begun();
    asio::post(io_, [self = shared_from_this()] {
      if (self->port_ != nullptr) self->on_root_exit(std::nullopt);
      if (self->port_ != nullptr) self->port_->task_ended();
    });
  }
  if (!io_state_.stream) {
    // Adopted after a crash (the supervisor accounts the streams lost), or carried across a
    // handover with its stream already ended. A carried stream that could not go on ends
    // incomplete here.
    if (!handover_lost_.empty()) {
      if (io_state_.tty) {
        port_->on_stream_end(core::Stream::pty, false);
      } else {
        port_->on_stream_end(core::Stream::stdout_stream, false);
        port_->on_stream_end(core::Stream::stderr_stream, false);
      }
    }
    return;
  }
  port_->task_begun();
  io_state_.stream->start(
      [self = shared_from_this()](engine::StdStream s, std::span<std::uint8_t const> bytes) {
        self->deliver(s, bytes);
      },
      [self = shared_from_this()](engine::StreamEnd const& end) {
        bool const was_open = self->io_state_.open;
        self->io_state_.open = false;
        if (self->port_ == nullptr) return;
        if (was_open) {
          bool const complete = end.kind == engine::StreamEnd::Kind::eof;
          if (self->io_state_.tty) {
            self->port_->on_stream_end(core::Stream::pty, complete);
          } else {
            self->port_->on_stream_end(core::Stream::stdout_stream, complete);
            self->port_->on_stream_end(core::Stream::stderr_stream, complete);
          }
        }
        self->port_->task_ended();
      });
}

void ContainerExecution::deliver(engine::StdStream s, std::span<std::uint8_t const> bytes) {
  if (port_ == nullptr || !io_state_.open) return;
  core::Stream const stream = io_state_.tty                 ? core::Stream::pty
                              : s == engine::StdStream::err ? core::Stream::stderr_stream
                                                            : core::Stream::stdout_stream;
  // The supervisor takes at most chunk_bytes at a time.
  while (!bytes.empty() && port_ != nullptr && io_state_.open) {
    std::size_t const n = std::min(bytes.size(), io_state_.chunk_bytes);
    port_->on_output(stream, bytes.first(n));
    bytes = bytes.subspan(n);
  }
}

void ContainerExecution::on_output(core::Stream stream, std::span<std::uint8_t const> bytes) {
  port_->on_output(stream, bytes);
}

void ContainerExecution::on_stream_end(core::Stream stream, bool complete) {
  port_->on_stream_end(stream, complete);
}

void ContainerExecution::on_root_exit(std::optional<core::ExitStatus> status) {
  if (port_ == nullptr) return;
  // A container stopped (or killed) mid-exec kills every process of its PID namespace, our root
  // among them: that is a failure of what ran the exec, never the exec's own exit.
  if (!backend_failed_ && container_went_away()) {
    backend_failed_ = true;
    port_->on_backend_failure("container " + container_id_.substr(0, 12) +
                              " stopped while the exec ran");
  }
  if (status || exec_id_.empty()) return port_->on_root_exit(status);
  // The kernel could not say (no PIDFD_INFO_EXIT before Linux 6.15: the root is the engine
  // shim's child, not ours): the engine's recorded exit code is the next best witness.
  port_->task_begun();
  client_->wait_exec(exec_id_, host_->config().call_timeout,
                     [self = shared_from_this()](Result<engine::ExecInspect> r) {
                       if (self->port_ == nullptr) return;
                       std::optional<core::ExitStatus> st;
                       if (r && r->exit_code) st = core::ExitStatus{*r->exit_code, std::nullopt};
                       self->observed_engine_exit_ = st.has_value();
                       self->port_->on_root_exit(st);
                       self->port_->task_ended();
                     });
}

bool ContainerExecution::container_went_away() const {
  if (init_gone_) return true;
  if (!init_) return false;
  if (!init_->alive()) return true;
  // The kernel kills the rest of a PID namespace from inside its init's exit: while that runs,
  // the init is still alive to a pidfd but already PF_EXITING.
  auto st = read_stat(init_->pid());
  if (!st) return !init_->alive();
  return (st->flags & kPfExiting) != 0 && init_->alive();
}

bool ContainerExecution::has_input() const noexcept {
  return io_state_.stream != nullptr && io_state_.open;
}

InputWrite ContainerExecution::write_input(std::span<std::uint8_t const> bytes) {
  if (!io_state_.stream) return InputWrite{0, false, true};
  auto const w = io_state_.stream->try_write(bytes);
  return InputWrite{w.written, w.would_block, w.closed};
}

void ContainerExecution::await_input_writable() {
  if (!io_state_.stream || port_ == nullptr || io_state_.input_waiting) return;
  io_state_.input_waiting = true;
  port_->task_begun();
  io_state_.stream->await_writable([self = shared_from_this()](Result<> const&) {
    self->io_state_.input_waiting = false;
    if (self->port_ == nullptr) return;
    // Writable, or closed: the next write tells which.
    self->port_->on_input_writable();
    self->port_->task_ended();
  });
}

void ContainerExecution::close_input(bool eof) {
  if (!io_state_.stream) return;
  if (io_state_.tty) {
    // A terminal reads end-of-file from its EOF character (shutting the write half is a hangup
    // to some engines). Closed for good (the teardown, its output over): a wait for a stalled
    // terminal to take input would hold the close for ever, so the connection goes.
    std::uint8_t const veof = 0x04;
    if (eof) (void)io_state_.stream->try_write(std::span<std::uint8_t const>{&veof, 1});
    if (!eof && io_state_.input_waiting) io_state_.stream->close();
    return;
  }
  (void)io_state_.stream->close_input();
}

Result<> ContainerExecution::resize(std::uint16_t rows, std::uint16_t cols) {
  if (exec_id_.empty() || port_ == nullptr) {
    return Error(Errc::exec_not_running,
                 id_ + ": no engine exec to resize (adopted after a restart)");
  }
  if (!io_state_.tty) return Error(Errc::exec_not_pty, id_ + " has no terminal");
  port_->task_begun();
  client_->resize_exec(exec_id_, rows, cols, host_->config().call_timeout,
                       [self = shared_from_this()](Result<void> const&) {
                         if (self->port_ != nullptr) self->port_->task_ended();
                       });
  return {};
}

// ------------------------------------------------------------------------------ end

void ContainerExecution::final_scan(std::function<void(FinalScan)> done) {
  tree_->final_scan(std::move(done));
}

std::vector<core::Stream> ContainerExecution::close_streams() {
  std::vector<core::Stream> open;
  if (io_state_.stream && io_state_.open) {
    io_state_.open = false;
    if (io_state_.tty) {
      open.push_back(core::Stream::pty);
    } else {
      open = {core::Stream::stdout_stream, core::Stream::stderr_stream};
    }
    io_state_.stream->close();  // its end arrives later and only ends its task
  }
  return open;
}

void ContainerExecution::close() {
  if (io_state_.stream) io_state_.stream->close();
  io_state_.open = false;
  if (tree_) tree_->close();
  gate_.reset();
  init_.reset();
}

void ContainerExecution::detach() {
  if (detached_) return;
  detached_ = true;
  // A launch still at the gate (acquiring, or acquired and not yet released) is abandoned:
  // nothing of the target ran, so it is ended, and its cgroup goes with it.
  if (launching_ || (gate_ && !released_)) {
    abort();
    if (tree_) tree_->close();
  }
  port_ = nullptr;
  if (tree_) tree_->detach();
  if (io_state_.stream) io_state_.stream->close();
}

core::Observations ContainerExecution::observations() const {
  core::Observations o = tree_ ? tree_->observations() : core::Observations{};
  std::string const engine{engine::to_string(engine_)};
  o["launch"] =
      engine + (ungated_ ? " exec (ungated: the container cannot run the gate)" : " exec (gated)");
  if (root_unseen_) o["root"] = "ended before it was identified";
  if (!container_id_.empty()) o["container"] = container_id_;
  if (!exec_id_.empty()) o["exec"] = exec_id_;
  o["cgroup_placement"] = placement_.empty() ? "none" : placement_;
  if (backend_failed_) o["container_stopped"] = "true";
  if (observed_engine_exit_) o["exit_status_from"] = "engine";
  if (carried_) {
    // Handed over by the previous image with its engine stream (the tree half only saw an
    // adoption): output and input went on, unless the stream could not.
    o["root"] = "handed_over";
    o["output"] = handover_lost_.empty() ? "kept" : "not_kept";
  }
  if (!handover_lost_.empty()) o["output_handover"] = "lost: " + handover_lost_;
  return o;
}

}  // namespace custos::backend
