// A container execution without the gate (container.hpp, "ungated"): its exec started at the
// release and its process identified afterwards.
#include <boost/asio/post.hpp>

#include "custos/backend/native.hpp"
#include "custos/sys/identity.hpp"

#include "container_execution.hpp"

namespace custos::backend {

namespace {
using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;
}  // namespace

// `gate: optional` and no /bin/sh in the container: the exec is created at acquire, started at
// release once the record (marker, PID namespace, `marked`) is durable, then identified as a gate
// would be (marker, namespace, through a pidfd) and taken over as the root. One that ends before
// or while it is identified leaves no root: its status is the engine's, its tree the marker's.

void ContainerExecution::answer_ungated_acquire() {
  Acquired a;
  a.boundary = core::Boundary::marker;
  a.kernel_enforced = false;
  a.marker_value = marker_->env_value();
  a.marker_ns_ino = pid_ns_;
  // No process yet; nothing that started before now can carry the marker (it bounds the sweeps,
  // recovery's included).
  if (auto now = sys::boot_ticks_now()) a.identity.start_time_ticks = *now;
  launching_->start_ticks = a.identity.start_time_ticks;
  // Only the gate sets RLIMIT_NOFILE: the container's own limit applies, and the record says so.
  a.descriptors_hard = false;
  // launching_ stays: the release starts the exec and identifies its process.
  auto done = std::move(launching_->done);
  launching_->done = nullptr;
  done(std::move(a));
}

void ContainerExecution::release_ungated(std::function<void(Step<std::monostate>)> done) {
  if (!launching_) {
    Step<std::monostate> f = core::SpawnFailure{"exec_start", ECANCELED, "the launch was dropped"};
    return asio::post(io_,
                      [done = std::move(done), f = std::move(f)]() mutable { done(std::move(f)); });
  }
  launching_->release_done = std::move(done);
  start_exec();
}

void ContainerExecution::on_ungated_inspected(Result<engine::ExecInspect> inspect) {
  if (!inspect) return fail("identify", inspect.error());
  if (!inspect->running && inspect->exit_code) {
    // Ended before it was identified (the engine's shim reaps a short program at once).
    return enter_ungated(std::nullopt);
  }
  if (inspect->pid > 0) {
    if (!candidate_ || candidate_->pid() != inspect->pid) {
      auto fd = sys::Pidfd::open(inspect->pid);
      if (fd) {
        candidate_ = std::move(*fd);
      } else if (fd.error().sys_errno != ESRCH) {
        return fail("identify", fd.error());
      }
    }
    if (candidate_) {
      auto verdict = check_gate_identity(*candidate_, *marker_, pid_ns_, false);
      // The engine's exec process ended while it was read: it ran, as one that ended unseen.
      if (!verdict && verdict.error().sys_errno == ESRCH) return enter_ungated(std::nullopt);
      if (!verdict) return fail("identify", verdict.error());
      if (*verdict == GateCheck::gate) {
        auto root = std::move(candidate_);
        candidate_.reset();
        return enter_ungated(std::move(root));
      }
      if (*verdict == GateCheck::unreadable) launching_->unreadable = true;
    }
  }
  if (Clock::now() >= launching_->gate_deadline) {
    return fail("identify",
                Error(Errc::identity_mismatch,
                      std::string{"the ungated exec's process did not show (marker, namespace) "
                                  "within the call timeout"} +
                          (launching_->unreadable ? "; its /proc entries were unreadable" : "")));
  }
  poll_gate();
}

void ContainerExecution::enter_ungated(std::optional<sys::Pidfd> root) {
  AdoptContext a;
  a.execution_id = id_;
  a.plan = launching_->ctx.plan;
  a.view = launching_->ctx.view;
  if (root) {
    auto identity = sys::read_identity(*root);
    if (!identity && identity.error().sys_errno != ESRCH) return fail("identify", identity.error());
    if (!identity) root.reset();  // it ended while read: as one that ended before it was seen
    if (identity) a.identity = *identity;
  }
  if (root) {
    a.root = std::move(*root);
  } else {
    a.root_exited = true;
    a.identity.start_time_ticks = launching_->start_ticks;
    root_unseen_ = true;
  }
  a.boundary = core::Boundary::marker;
  a.marker_hex = marker_->env_value();
  a.pid_ns_inode = pid_ns_;
  a.after_restart = false;
  tree_ = host_->native().create(id_);
  auto acq = tree_->adopt(std::move(a));
  if (!acq) return fail("identify", acq.error());
  launching_->timer.cancel();
  auto done = std::move(launching_->release_done);
  launching_.reset();
  done(std::monostate{});
}

}  // namespace custos::backend
