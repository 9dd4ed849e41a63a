#include "native_execution.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fcntl.h>
#include <filesystem>
#include <signal.h>
#include <unistd.h>
#include <utility>

#include "custos/sandbox/controls.hpp"
#include "custos/sys/openat2.hpp"
#include "custos/sys/rlimits.hpp"
#include "custos/sys/sampler.hpp"

namespace custos::backend {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kExitRetry{10};
// Reads per readiness wake-up before yielding to other executions on the loop.
constexpr int kReadsPerWake = 16;
// Pipe size for a stream once it fills whole chunks (the default pipe-max-size for non-root).
constexpr int kBusyPipeBytes = 1 << 20;
constexpr ssize_t kBusyReadBytes = ssize_t{32} * 1024;

// A failure of sys's spawn: its step is a field of the error.
core::SpawnFailure failure(sys::SpawnError const& e) {
  return step_failure(std::string{sys::spawn_step_wire(e.step)}, e);
}

// Our ends of the stdio streams are read and written with plain read(2)/write(2), which must
// never block the loop. Set through asio (one FIONBIO ioctl) rather than fcntl: asio then knows
// the descriptor is non-blocking and does not issue its own ioctl at the first wait.
void set_nonblocking(asio::posix::stream_descriptor& sd) {
  boost::system::error_code ec;
  (void)sd.non_blocking(true, ec);  // a failure leaves it to asio's own attempt at its first wait
}

// Credentials of the root: none to switch when it runs as the daemon's own uid/gid. Without a
// plan user the caller's supplementary groups are unknown (SO_PEERCRED has only uid/gid), so
// they are cleared rather than inheriting the daemon's.
std::optional<sys::SpawnCredentials> credentials(RunAs const& run_as) {
  if (run_as.uid == ::geteuid() && run_as.gid == ::getegid() && !run_as.explicit_user) return {};
  sys::SpawnCredentials c;
  c.uid = run_as.uid;
  c.gid = run_as.gid;
  c.groups = run_as.groups;
  return c;
}

}  // namespace

struct NativeExecution::Launching {
  Launching(sys::StagedChild child, asio::io_context& io) : staged(std::move(child)), timer(io) {}
  sys::StagedChild staged;
  Stdio stdio;
  std::function<void(Step<std::monostate>)> done;
  std::optional<asio::posix::stream_descriptor> channel;
  asio::steady_timer timer;
  bool timed_out = false;
};

NativeExecution::NativeExecution(NativeBackend& host, std::string execution_id)
    : host_(&host),
      host_alive_(host.alive_),
      io_(host.io_),
      id_(std::move(execution_id)),
      exit_retry_timer_(io_) {
  io_state_.readers.reserve(2);
}

NativeExecution::~NativeExecution() {
  // A completion still queued on the loop may hold the last reference after the backend is gone.
  if (!host_alive()) return;
  detach();
  if (!cgroup_rel_.empty()) host_->forget_cgroup(cgroup_rel_);
}

// ------------------------------------------------------------------------------ launch

std::vector<std::string> NativeExecution::build_env(LaunchContext const& ctx) const {
  std::vector<std::string> env;
  env.reserve(ctx.env.size() + 1);
  std::string const prefix = std::string{sys::Marker::env_name()} + "=";
  for (auto const& e : ctx.env) {
    if (e.starts_with(prefix)) continue;  // the marker is the backend's, always
    env.push_back(e);
  }
  // A sandbox's environment is exactly the plan's entries and its env secrets (its boundary is
  // the cgroup: no marker is needed, so none is added).
  if (sandbox_ && sandbox_->exact_environment) {
    env.insert(env.end(), sandbox_->env_secrets.begin(), sandbox_->env_secrets.end());
    return env;
  }
  env.push_back(marker_->env_entry());
  return env;
}

// stdio: three pipes, or one terminal.
Step<NativeExecution::Stdio> NativeExecution::open_stdio(PlanView const& plan) {
  Stdio io;
  if (plan.pty) {
    auto p = sys::Pty::open(plan.rows, plan.cols);
    if (!p) return step_failure("pty", p.error());
    io.pty = std::move(*p);
    return io;
  }
  auto in = sys::make_pipe();
  if (!in) return step_failure("pipe", in.error());
  auto out = sys::make_pipe();
  if (!out) return step_failure("pipe", out.error());
  auto err = sys::make_pipe();
  if (!err) return step_failure("pipe", err.error());
  io.child_in = std::move(in->first);
  io.our_in = std::move(in->second);
  io.our_out = std::move(out->first);
  io.child_out = std::move(out->second);
  io.our_err = std::move(err->first);
  io.child_err = std::move(err->second);
  return io;
}

void NativeExecution::acquire(LaunchContext const& ctx, std::function<void(Step<Acquired>)> done) {
  done(stage(ctx));
}

std::optional<core::SpawnFailure> NativeExecution::enter_boundary(LaunchContext const& ctx,
                                                                  Acquired& acq) {
  PlanView const& plan = *ctx.view;
  boundary_ = core::Boundary::marker;
  if (host_->boundary() == core::Boundary::cgroup) {
    auto cg = sys::CgroupDir::create(*host_->subtree_, id_);
    if (cg) {
      cgroup_ = std::move(*cg);
      boundary_ = core::Boundary::cgroup;
      auto const& mount = host_->cgroup_mount_;
      if (cgroup_->path().size() > mount.size() &&
          cgroup_->path().compare(0, mount.size(), mount) == 0) {
        cgroup_rel_ = cgroup_->path().substr(mount.size());
      }
      // Kernel limits where this host has the controllers; elsewhere the sampler enforces them
      // (fidelity sampled) — sys.unsupported here is expected, not an error.
      if (plan.memory_bytes)
        acq.memory_hard = cgroup_->set_memory_max(*plan.memory_bytes).has_value();
      if (plan.processes) acq.pids_hard = cgroup_->set_pids_max(*plan.processes).has_value();
    } else if (host_->config_.boundary == BoundaryPreference::cgroup) {
      return step_failure("cgroup", cg.error());
    }
  }
  kernel_enforced_ =
      boundary_ == core::Boundary::cgroup && (ctx.run_as.uid != 0 || host_->config_.nsdelegate);
  return std::nullopt;
}

sys::SpawnSpec NativeExecution::spawn_spec(LaunchContext const& ctx, Stdio const& stdio) const {
  PlanView const& plan = *ctx.view;
  sys::SpawnSpec spec;
  spec.executable = plan.executable;
  spec.argv = plan.argv;
  spec.envp = build_env(ctx);
  if (stdio.pty) {
    spec.pty_slave_fd = stdio.pty->slave().get();
    spec.controlling_tty = true;
  } else {
    spec.stdin_fd = stdio.child_in.get();
    spec.stdout_fd = stdio.child_out.get();
    spec.stderr_fd = stdio.child_err.get();
  }
  spec.workspace_root_fd = disk_.workspace.get();
  spec.cwd = plan.cwd;
  if (plan.open_files) {
    spec.rlimits.push_back(sys::Rlimit{RLIMIT_NOFILE, *plan.open_files, *plan.open_files});
  }
  if (cgroup_) {
    spec.cgroup_fd = cgroup_->fd().get();
    spec.new_cgroup_namespace = true;
  }
  spec.credentials = credentials(ctx.run_as);
  spec.new_session = true;
  if (sandbox_) spec.sandbox = sandbox_->spawn_sandbox();
  // One wait on the child (in release) instead of two: the child sets itself up while the staged
  // ownership is recorded. The barrier still holds the target until release, so the record
  // precedes any of its code; a setup failure (credentials, limits, tty) becomes spawn_failed
  // with its step from the verdict, as an execve failure does, after the staged record.
  spec.wait_for_setup = false;
  return spec;
}

Step<Acquired> NativeExecution::stage(LaunchContext const& ctx) {
  PlanView const& plan = *ctx.view;
  io_state_.chunk_bytes = static_cast<std::size_t>(plan.chunk_bytes);
  io_state_.pty_mode = plan.pty;

  if (ctx.sandbox == nullptr) {  // a sandbox's boundary is its cgroup: no marker
    auto marker = sys::Marker::generate();
    if (!marker) return step_failure("marker", marker.error());
    marker_ = *marker;
  }

  auto ws = sys::open_directory(plan.workspace_root);
  if (!ws) return step_failure("workspace", ws.error());
  disk_.workspace = std::move(*ws);
  if (plan.disk_bytes) {
    // Disk growth is measured against the workspace as it was before the child ran.
    if (auto d = sys::walk_disk_usage(disk_.workspace, host_->config_.disk_walk_max_entries)) {
      disk_.baseline = d->bytes;
    }
  }

  Acquired acq;
  if (auto f = enter_boundary(ctx, acq)) return std::move(*f);
  auto undo = [this] {
    if (cgroup_) (void)cgroup_->remove();
    if (sandbox_) remove_pids_cgroup(sandbox_->pids_dir);
  };
  if (ctx.sandbox != nullptr) {
    if (boundary_ != core::Boundary::cgroup) {
      undo();
      return step_failure("sandbox", Error(Errc::sandbox_unsupported,
                                           "a sandbox needs the cgroup boundary, which this "
                                           "execution could not get"));
    }
    auto prepared = prepare_sandbox(*ctx.sandbox, plan, ctx.run_as, id_, *host_->sandbox_host_,
                                    host_->config_.read_secret);
    if (!prepared) {
      undo();
      return step_failure("sandbox", prepared.error());
    }
    sandbox_ = std::move(*prepared);
  } else if (ctx.plan != nullptr &&
             ctx.plan->workspace.access == core::WorkspaceAccess::read_only) {
    // A read-only workspace is read-only for the process, sandbox or not: in a mount namespace
    // of its own, the workspace is laid read-only over itself (the host's tree otherwise), and
    // the child changes into its cwd through that mount.
    auto ro = read_only_workspace(plan);
    if (!ro) {
      undo();
      return step_failure("workspace", ro.error());
    }
    sandbox_ = std::move(*ro);
  }
  auto stdio = open_stdio(plan);
  if (auto* f = std::get_if<core::SpawnFailure>(&stdio)) {
    undo();
    return std::move(*f);
  }
  auto staged = sys::spawn_staged(spawn_spec(ctx, std::get<Stdio>(stdio)));
  if (!staged) {
    undo();
    return failure(staged.error());
  }
  root_pid_ = staged->pid();
  root_start_ticks_ = staged->identity().start_time_ticks;
  acq.pid = root_pid_;
  acq.identity = staged->identity();
  acq.boundary = boundary_;
  acq.kernel_enforced = kernel_enforced_;
  acq.cgroup_path = cgroup_ ? cgroup_->path() : std::string{};
  acq.cgroup_rel = cgroup_rel_;
  acq.marker_value = marker_ ? marker_->env_value() : std::string{};

  launching_ = std::make_unique<Launching>(std::move(*staged), io_);
  launching_->stdio = std::get<Stdio>(std::move(stdio));
  // Staged: the root and its cgroup are this execution's from now on (orphan reaping leaves the
  // root to the launch, and attributes what dies in the cgroup here).
  host_->note_root(root_pid_, this);
  if (!cgroup_rel_.empty()) host_->note_cgroup(cgroup_rel_, id_);
  return acq;
}

void NativeExecution::release(std::function<void(Step<std::monostate>)> done) {
  Launching& l = *launching_;
  l.done = std::move(done);
  auto fail = [this](core::SpawnFailure f) {
    auto d = std::move(launching_->done);
    abort();
    d(std::move(f));
  };
  // The watch first: until the go byte is sent, a failure here still kills a child that ran
  // nothing of the target.
  auto watch = l.staged.watch_channel();
  if (!watch) return fail(step_failure("barrier", watch.error()));
  try {
    l.channel.emplace(io_, watch->get());
    (void)watch->release();  // the descriptor object owns it now
  } catch (std::exception const& ex) {
    return fail(step_failure(
        "barrier", Error(Errc::sys_error, std::string{"watching the child: "} + ex.what())));
  }
  l.staged.send_go();
  // A child that neither execs nor reports within the spawn bound is killed (dropping the
  // StagedChild) and the launch is spawn_failed.
  l.timer.expires_after(l.staged.timeout());
  l.timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->detached_ || !self->launching_ || !self->launching_->channel) return;
    self->launching_->timed_out = true;
    self->launching_->channel->cancel();
  });
  await_verdict();
}

void NativeExecution::await_verdict() {
  launching_->channel->async_wait(asio::posix::descriptor_base::wait_read,
                                  [self = shared_from_this()](boost::system::error_code) {
                                    if (self->detached_ || !self->launching_) return;
                                    self->on_verdict();
                                  });
}

void NativeExecution::on_verdict() {
  Launching& l = *launching_;
  auto verdict = l.staged.poll_verdict();
  if (verdict && !*verdict) {
    // The "ready" report only, or nothing yet: wait on, unless the bound has passed.
    if (!l.timed_out) return await_verdict();
    return finish_release(sys::SpawnError(
        sys::SpawnStep::execve,
        Error(Errc::spawn_failed, "step=execve: the child did not finish its setup in time",
              ETIMEDOUT)));
  }
  // The channel could not be read: the child is killed and reaped (dropping the StagedChild)
  // before the failure is reported, so the cleanup it reports is true.
  if (!verdict) return finish_release(verdict.error());
  l.timer.cancel();
  l.channel.reset();
  finish_release(std::move(l.staged).finish());
}

void NativeExecution::finish_release(sys::SpawnResult<sys::RunningChild> running) {
  // The launch's descriptors close when this returns (ours of the child's ends must go, or EOF
  // would never come).
  std::unique_ptr<Launching> const l = std::move(launching_);
  auto done = std::move(l->done);
  // The child has exec'd (or failed): what only the launch needed goes now. Not earlier: the
  // child attaches the view's detached mounts during its setup, which runs after clone3
  // returned here (SpawnSpec::wait_for_setup is false).
  if (sandbox_) sandbox_->release_launch();
  if (!running) {
    host_->forget_root(root_pid_, this);
    root_reaped_ = true;
    if (cgroup_) (void)cgroup_->remove();
    return done(failure(running.error()));
  }
  root_ = std::move(*running).take_pidfd();
  Stdio& io = l->stdio;
  sys::UniqueFd our_in = std::move(io.our_in);
  sys::UniqueFd our_out = std::move(io.our_out);
  sys::UniqueFd our_err = std::move(io.our_err);
  io.child_in.reset();
  io.child_out.reset();
  io.child_err.reset();
  if (io.pty) {
    auto master_read = io.pty->master().dup();
    auto master_write = io.pty->master().dup();
    if (master_read && master_write) {
      our_out = std::move(*master_read);
      our_in = std::move(*master_write);
    }
    io_state_.pty = std::move(io.pty);
    io_state_.pty->close_slave();
  }
  attach_stdio(std::move(our_out), std::move(our_err), std::move(our_in));
  done(std::monostate{});
}

void NativeExecution::attach_stdio(sys::UniqueFd out, sys::UniqueFd err, sys::UniqueFd in) {
  if (out.valid()) {
    io_state_.readers.push_back(Reader{});
    io_state_.readers.back().stream =
        io_state_.pty_mode ? core::Stream::pty : core::Stream::stdout_stream;
    set_nonblocking(io_state_.readers.back().sd.emplace(io_, out.release()));
  }
  if (err.valid()) {
    io_state_.readers.push_back(Reader{});
    io_state_.readers.back().stream = core::Stream::stderr_stream;
    set_nonblocking(io_state_.readers.back().sd.emplace(io_, err.release()));
  }
  if (in.valid()) set_nonblocking(io_state_.input.emplace(io_, in.release()));
}

void NativeExecution::abort() {
  if (!launching_) return;
  launching_.reset();  // kills the child still at its barrier and reaps it
  host_->forget_root(root_pid_, this);
  root_reaped_ = true;
  if (cgroup_) (void)cgroup_->remove();
}

void NativeExecution::start(ExecutionPort& port) {
  port_ = &port;
  for (std::size_t i = 0; i < io_state_.readers.size(); ++i) arm_reader(i);
  if (root_) {
    if (auto dup = root_->fd().dup()) {
      exit_sd_.emplace(io_, dup->release());
      arm_exit_observer();
    }
    // Without readiness the exit is still found by the teardown's polling (root_gone).
  }
}

// ------------------------------------------------------------------------------ output

void NativeExecution::arm_reader(std::size_t i) {
  Reader& r = io_state_.readers[i];
  if (!r.sd || r.waiting || !live()) return;
  r.waiting = true;
  port_->task_begun();
  r.sd->async_wait(asio::posix::descriptor_base::wait_read,
                   [self = shared_from_this(), i](boost::system::error_code ec) {
                     self->io_state_.readers[i].waiting = false;
                     if (!self->live()) return;
                     if (!ec) self->on_readable(i);
                     self->port_->task_ended();
                   });
}

void NativeExecution::on_readable(std::size_t i) {
  Reader& r = io_state_.readers[i];
  if (!r.sd) return;
  auto& buf = host_->scratch_;
  // One shared buffer for every execution (single loop thread): an idle execution owns none.
  if (buf.size() < io_state_.chunk_bytes) buf.resize(io_state_.chunk_bytes);
  int const fd = r.sd->native_handle();
  for (int k = 0; k < kReadsPerWake; ++k) {
    ssize_t const n = ::read(fd, buf.data(), io_state_.chunk_bytes);
    if (n >= kBusyReadBytes && !r.pipe_grown) {
      // A stream that delivers half a default pipe per read is busy: a larger pipe lets the
      // writer run ahead while we spool, and each wake-up then drains up to kReadsPerWake
      // chunks. Done only once data flows, so an idle execution keeps the default pipe. A PTY
      // or a refusal (pipe-max-size, the user's pipe quota) keeps its size.
      r.pipe_grown = true;
      if (r.stream != core::Stream::pty) (void)::fcntl(fd, F_SETPIPE_SZ, kBusyPipeBytes);
    }
    if (n > 0) {
      port_->on_output(r.stream,
                       std::span<std::uint8_t const>(buf.data(), static_cast<std::size_t>(n)));
      if (!r.sd || !live()) return;  // closed meanwhile (close_streams)
      continue;
    }
    if (n == 0) return end_reader(i, true);
    if (errno == EINTR) continue;
    if (errno == EAGAIN) break;
    // EIO on a PTY master: every slave end is closed, which is the terminal's EOF. Anything else
    // is a read failure: what was not read is lost, so the stream cannot be complete.
    return end_reader(i, errno == EIO && r.stream == core::Stream::pty);
  }
  arm_reader(i);
}

void NativeExecution::end_reader(std::size_t i, bool complete) {
  Reader& r = io_state_.readers[i];
  r.sd.reset();
  port_->on_stream_end(r.stream, complete);
}

std::vector<core::Stream> NativeExecution::close_streams() {
  std::vector<core::Stream> open;
  for (auto& r : io_state_.readers) {
    if (!r.sd) continue;
    open.push_back(r.stream);
    r.sd.reset();  // cancels its wait
  }
  return open;
}

// ------------------------------------------------------------------------------ input

InputWrite NativeExecution::write_input(std::span<std::uint8_t const> bytes) {
  InputWrite w;
  if (!io_state_.input) {
    w.closed = true;
    return w;
  }
  int const fd = io_state_.input->native_handle();
  while (w.written < bytes.size()) {
    ssize_t const n = ::write(fd, bytes.data() + w.written, bytes.size() - w.written);
    if (n > 0) {
      w.written += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      w.would_block = true;
      return w;
    }
    w.closed = true;  // EPIPE (SIGPIPE is ignored by the daemon), EIO
    return w;
  }
  return w;
}

void NativeExecution::await_input_writable() {
  if (!io_state_.input || io_state_.input_waiting || !live()) return;
  // Non-blocking: a terminal or pipe nobody reads only leaves this wait pending, and teardown
  // cancels it (close_input), so it can never hold the close.
  io_state_.input_waiting = true;
  port_->task_begun();
  io_state_.input->async_wait(asio::posix::descriptor_base::wait_write,
                              [self = shared_from_this()](boost::system::error_code ec) {
                                self->io_state_.input_waiting = false;
                                if (!self->live()) return;
                                if (!ec) self->port_->on_input_writable();
                                self->port_->task_ended();
                              });
}

void NativeExecution::close_input(bool eof) {
  if (!io_state_.input) return;
  if (eof && io_state_.pty_mode) {
    // A terminal has no write-end close: EOF is the VEOF character (^D), which the line
    // discipline turns into a zero-length read in canonical mode.
    std::uint8_t const veof = 0x04;
    (void)::write(io_state_.input->native_handle(), &veof, 1);
  }
  io_state_.input.reset();  // cancels a pending write wait
}

Result<> NativeExecution::resize(std::uint16_t rows, std::uint16_t cols) {
  if (!io_state_.pty) return Error(Errc::exec_not_running, id_);
  return io_state_.pty->resize(rows, cols);
}

// ------------------------------------------------------------------------------ exit

void NativeExecution::arm_exit_observer() {
  if (!exit_sd_ || !live() || exit_held_) return;
  port_->task_begun();
  exit_sd_->async_wait(asio::posix::descriptor_base::wait_read,
                       [self = shared_from_this()](boost::system::error_code ec) {
                         if (!self->live()) return;
                         if (!ec) self->on_exit_ready();
                         self->port_->task_ended();
                       });
}

void NativeExecution::on_exit_ready() {
  if (root_reaped_ || !root_ || exit_held_) return;
  auto st = root_->try_wait();
  std::optional<core::ExitStatus> status;
  if (st && *st) {
    status = core::ExitStatus{(*st)->code, (*st)->signal};
  } else if (st) {
    // Ready but not waitable: the root exited while another process ptraces it, and the kernel
    // reports it to the tracer first. Look again shortly instead of spinning on readiness.
    port_->task_begun();
    exit_retry_timer_.expires_after(kExitRetry);
    exit_retry_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!self->live()) return;
      if (!ec) self->on_exit_ready();
      self->port_->task_ended();
    });
    return;
  } else if (auto info = root_->get_exit_info(); info && *info) {
    // Someone else reaped it (orphan reaping skips our roots); the kernel still tells how.
    status = core::ExitStatus{(*info)->code, (*info)->signal};
  } else if (adoption_ && await_adopted_status()) {
    return;  // its own parent has not reaped it yet: looked at again shortly
  }
  exit_sd_.reset();
  root_reaped_ = true;
  host_->forget_root(root_pid_, this);
  // The one seccomp rule that kills (SECCOMP_RET_KILL_PROCESS, seen as SIGSYS) is the refusal of
  // process creation: a sandbox without descendants whose root died of SIGSYS was denied.
  if (sandbox_ && sandbox_->kills_on_process_creation && status && status->signal == SIGSYS) {
    port_->on_sandbox_denied(std::string{sandbox::control::process_no_descendants},
                             "a process-creating call (fork, vfork or clone without "
                             "CLONE_THREAD) killed the process");
  }
  port_->on_root_exit(status);
}

bool NativeExecution::is_root_pid(std::int32_t pid) const noexcept {
  // While a launch awaits its verdict the child is the StagedChild's to reap.
  return pid == root_pid_ && !root_reaped_ && (root_.has_value() || launching_ != nullptr);
}

bool NativeExecution::root_gone() const noexcept {
  return root_reaped_ || !root_ || !root_->alive();
}

// ------------------------------------------------------------------------------ close

void NativeExecution::close() {
  // The directory is empty when cleanup is confirmed; a failed rmdir leaves it for the next
  // start's recovery, which kills what is left in it.
  if (cgroup_) (void)cgroup_->remove();
  if (sandbox_) remove_pids_cgroup(sandbox_->pids_dir);
  // A closed execution stays in the terminal history but acts on nothing any more: its
  // descriptors go now (4,096 history entries must not pin 8,192 descriptors).
  unwatch_tree();
  host_->forget_root(root_pid_, this);
  cgroup_.reset();
  root_.reset();
  io_state_.pty.reset();
  disk_.workspace.reset();
  io_state_.readers.clear();
  io_state_.input.reset();
  exit_sd_.reset();
}

void NativeExecution::detach() {
  if (detached_) return;
  detached_ = true;
  port_ = nullptr;
  // A launch still awaiting its verdict is abandoned: its child is killed and reaped (its staged
  // record is recovery's), so its cgroup is empty and goes too.
  if (launching_) abort();
  exit_retry_timer_.cancel();
  for (auto& r : io_state_.readers) r.sd.reset();
  io_state_.input.reset();
  exit_sd_.reset();
  if (host_alive()) {
    unwatch_tree();
    host_->forget_root(root_pid_, this);
  }
  // The process, its cgroup and the pidfd's process are left as they are: the registry's
  // ownership records let the next daemon start recover them.
}

core::Observations NativeExecution::observations() const {
  core::Observations o;
  o["launch"] = "clone3";
  if (!cgroup_rel_.empty()) o["cgroup"] = cgroup_rel_;
  if (final_signalled_ > 0) o["final_sweep_killed"] = std::to_string(final_signalled_);
  if (adoption_ && adoption_->stdio_kept) {
    // Handed over by the previous image with its stdio: output and input went on.
    o["root"] = "handed_over";
    o["output"] = "kept";
  } else if (adoption_ && adoption_->after_restart) {
    // Taken over after a restart: the previous daemon's pipes died with it.
    o["root"] = "adopted";
    o["output"] = "not_kept";
  }
  return o;
}

}  // namespace custos::backend
