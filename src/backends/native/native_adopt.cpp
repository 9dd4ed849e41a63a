// Adoption: a native execution taken over after a daemon restart through the pidfd recovery
// re-acquired its root with (custos/backend/native_recovery.hpp). From here on it is driven like
// any other execution — signal_tree, kill_tree, tree_state, final_scan, sample — with two
// differences: its stdio is what a handover or the descriptor store kept (none otherwise: the
// previous daemon's pipes or terminal died with it), and its root is not this process's child, so
// its exit status is read with PIDFD_GET_INFO once its own parent reaped it.
#include <boost/asio/post.hpp>

#include <algorithm>
#include <fcntl.h>

#include "custos/sys/openat2.hpp"

#include "native_execution.hpp"

namespace custos::backend {
namespace {

using std::chrono::milliseconds;

// Systemd as PID 1 reaps at once; some inits poll (about every second on the build machines).
constexpr milliseconds kAdoptedStatusWait{5000};
// The first look comes soon (an engine's shim reaps its exec at once, and every container exec
// ends this way), then the pause doubles up to the last value.
constexpr milliseconds kAdoptedStatusFirstPoll{1};
constexpr milliseconds kAdoptedStatusPoll{20};

}  // namespace

Result<Acquired> NativeExecution::adopt(AdoptContext ctx) {
  if ((!ctx.root.valid() && !ctx.root_exited) || ctx.view == nullptr) {
    return Error(Errc::internal, id_ + ": adoption without a recovered pidfd or a plan");
  }
  PlanView const& plan = *ctx.view;
  io_state_.chunk_bytes = static_cast<std::size_t>(plan.chunk_bytes);
  io_state_.pty_mode = plan.pty;
  if (!ctx.marker_hex.empty()) {
    auto m = sys::Marker::from_hex(ctx.marker_hex);
    if (!m) return m.error();
    marker_ = *m;
  }
  adoption_.emplace();
  adoption_->after_restart = ctx.after_restart;
  adoption_->pid_ns = ctx.pid_ns_inode;
  boundary_ = ctx.boundary;
  if (ctx.boundary == core::Boundary::cgroup && !ctx.cgroup_path.empty()) {
    if (auto cg = sys::CgroupDir::open(ctx.cgroup_path)) {
      cgroup_ = std::move(*cg);
      auto const& mount = host_->cgroup_mount_;
      if (!mount.empty() && cgroup_->path().size() > mount.size() &&
          cgroup_->path().compare(0, mount.size(), mount) == 0) {
        cgroup_rel_ = cgroup_->path().substr(mount.size());
      }
    } else {
      // The root runs, so a cgroup it is still in exists: it left it, or the directory cannot be
      // read. The marker still finds what carries it; the cleanup cannot be confirmed.
      adoption_->unconfirmed =
          "the recorded cgroup " + ctx.cgroup_path + " cannot be opened: " + cg.error().message();
    }
  }
  // The disk limit is measured from the launch's baseline when a handover carried it, else from
  // here (the growth before a crash or restart is unknown).
  if (plan.disk_bytes && ctx.after_restart) {
    if (auto ws = sys::open_directory(plan.workspace_root)) disk_.workspace = std::move(*ws);
    disk_.baseline = ctx.disk_baseline;
  }
  // Nothing is known of the credentials or nsdelegate at launch: the weaker claim.
  kernel_enforced_ = false;
  root_start_ticks_ = ctx.identity.start_time_ticks;
  if (ctx.root.valid()) {
    root_pid_ = ctx.root.pid();
    root_ = std::move(ctx.root);
  }

  if (ctx.stdio) {
    // A handover's stdio: the previous image read every byte it delivered, the rest waits in
    // the pipes (or the terminal) for the readers armed at start().
    CarriedStdio& io = *ctx.stdio;
    if (io.pty) {
      auto const& master = io.out.valid() ? io.out : io.in;
      if (master.valid()) {
        auto kept = master.dup();
        if (!kept) return kept.error();
        auto pty = sys::Pty::from_master(std::move(*kept));
        if (!pty) return pty.error();
        io_state_.pty = std::move(*pty);
      }
    }
    attach_stdio(std::move(io.out), std::move(io.err), std::move(io.in));
    adoption_->stdio_kept = true;
  }

  Acquired acq;
  acq.pid = root_pid_;
  acq.identity = ctx.identity;
  acq.boundary = boundary_;
  acq.kernel_enforced = false;
  acq.cgroup_path = cgroup_ ? cgroup_->path() : std::string{};
  acq.cgroup_rel = cgroup_rel_;
  acq.marker_value = marker_ ? marker_->env_value() : std::string{};
  // Ours from now on: orphan reaping leaves the root to this execution (when it is the daemon's
  // child after all) and attributes what dies in its cgroup here.
  if (root_pid_ != 0) host_->note_root(root_pid_, this);
  if (!cgroup_rel_.empty()) host_->note_cgroup(cgroup_rel_, id_);
  return acq;
}

std::optional<CarriedStdio> NativeExecution::hand_over_stdio() {
  // A launch still at its barrier is abandoned by detach(): it has no stdio to carry.
  if (launching_ || detached_) return std::nullopt;
  CarriedStdio io;
  io.pty = io_state_.pty_mode;
  // release() ends a pending wait (its handler finds the execution detached) and gives the
  // descriptor back open. Every read so far was delivered: reads happen only in on_readable,
  // which hands each chunk to the port before the next.
  for (auto& r : io_state_.readers) {
    if (!r.sd) continue;  // ended: the pumps' state says so
    sys::UniqueFd fd{r.sd->release()};
    r.sd.reset();
    (r.stream == core::Stream::stderr_stream ? io.err : io.out) = std::move(fd);
  }
  if (io_state_.input) {
    io.in = sys::UniqueFd{io_state_.input->release()};
    io_state_.input.reset();
  }
  return io;
}

std::optional<CarriedStdio> NativeExecution::copy_output() {
  if (detached_) return std::nullopt;
  CarriedStdio io;
  io.pty = io_state_.pty_mode;
  for (auto& r : io_state_.readers) {
    if (!r.sd) continue;  // ended
    sys::UniqueFd fd{::fcntl(r.sd->native_handle(), F_DUPFD_CLOEXEC, 3)};
    if (!fd.valid()) return std::nullopt;  // out of descriptors: nothing kept rather than half
    (r.stream == core::Stream::stderr_stream ? io.err : io.out) = std::move(fd);
  }
  if (!io.out.valid() && !io.err.valid()) return std::nullopt;
  return io;
}

void NativeExecution::hold_exit() {
  exit_held_ = true;
  // A wait in flight ends (its handler sees exit_held_): the root, exited or not, stays
  // unreaped for the next image.
  if (exit_sd_) exit_sd_->cancel();
  exit_retry_timer_.cancel();
}

bool NativeExecution::await_adopted_status() {
  // Without PIDFD_INFO_EXIT (kernels before 6.15) the status can never be read: nothing to wait
  // for. Otherwise bounded: past it the end is recorded without a status.
  if (!sys::Pidfd::exit_info_supported()) return false;
  auto const now = std::chrono::steady_clock::now();
  auto& until = adoption_->status_until;
  if (!until) until = now + kAdoptedStatusWait;
  if (now >= *until) return false;
  auto& pause = adoption_->status_poll;
  pause = pause.count() == 0 ? kAdoptedStatusFirstPoll : std::min(pause * 2, kAdoptedStatusPoll);
  port_->task_begun();
  exit_retry_timer_.expires_after(pause);
  exit_retry_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!self->live()) return;
    if (!ec) self->on_exit_ready();
    self->port_->task_ended();
  });
  return true;
}

}  // namespace custos::backend
