// One native execution: its root from clone3 to its last handle (private to the native backend).
//
// Concurrency: everything runs on the daemon's single loop thread. Every asynchronous operation
// started here (reader waits, the stdin wait, the exit observer, the exit retry, a worker scan)
// is counted with ExecutionPort::task_begun/task_ended, so the supervisor closes the execution
// only once each of them completed. Blocking scans (the final marker sweep with its orphan
// settle wait, disk walks) run on the backend's worker thread with copies of what they need and
// post their result back to the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "custos/backend/native.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/pty.hpp"
#include "custos/sys/spawn.hpp"
#include "custos/sys/unique_fd.hpp"

#include "native_sandbox.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/steady_timer.hpp>
#pragma GCC diagnostic pop

namespace custos::backend {

// What an adopted native execution keeps (native_adopt.cpp): a root taken over after a restart,
// or handed over by another backend (a container's gate). Outside NativeExecution so that its
// default member initializers are complete where std::optional needs them.
struct NativeAdoption {
  std::optional<std::chrono::steady_clock::time_point> status_until;  // PIDFD_GET_INFO wait
  std::chrono::milliseconds status_poll{0};                           // the last pause of that wait
  std::string unconfirmed;              // a reason the final scan cannot confirm (cgroup unusable)
  bool after_restart = true;            // AdoptContext::after_restart
  std::optional<std::uint64_t> pid_ns;  // the marker sweep's PID namespace, if limited
  bool stdio_kept = false;              // a handover carried its stdio (AdoptContext::stdio)
};

class NativeExecution final : public BackendExecution,
                              public std::enable_shared_from_this<NativeExecution> {
 public:
  NativeExecution(NativeBackend& host, std::string execution_id);
  ~NativeExecution() override;
  NativeExecution(NativeExecution const&) = delete;
  NativeExecution& operator=(NativeExecution const&) = delete;

  void acquire(LaunchContext const& ctx, std::function<void(Step<Acquired>)> done) override;
  void release(std::function<void(Step<std::monostate>)> done) override;
  void abort() override;
  void start(ExecutionPort& port) override;
  // A root a previous daemon launched, through its recovered pidfd (native_adopt.cpp).
  [[nodiscard]] Result<Acquired> adopt(AdoptContext ctx) override;

  [[nodiscard]] bool has_input() const noexcept override { return io_state_.input.has_value(); }
  [[nodiscard]] InputWrite write_input(std::span<std::uint8_t const> bytes) override;
  void await_input_writable() override;
  void close_input(bool eof) override;
  [[nodiscard]] Result<> resize(std::uint16_t rows, std::uint16_t cols) override;

  [[nodiscard]] std::uint32_t signal_tree(int sig) override;
  [[nodiscard]] std::uint32_t kill_tree() override;
  [[nodiscard]] TreeState tree_state() const override;
  [[nodiscard]] bool root_gone() const noexcept override;
  bool watch_tree() override;
  void unwatch_tree() override;
  void final_scan(std::function<void(FinalScan)> done) override;

  [[nodiscard]] Usage sample() override;
  bool measure_disk(std::function<void(std::optional<std::uint64_t>)> done) override;

  [[nodiscard]] std::vector<core::Stream> close_streams() override;
  void close() override;
  void detach() override;
  [[nodiscard]] std::optional<CarriedStdio> hand_over_stdio() override;
  [[nodiscard]] std::optional<CarriedStdio> copy_output() override;
  [[nodiscard]] std::optional<std::uint64_t> disk_baseline() const override {
    return disk_.baseline;
  }
  void hold_exit() override;
  [[nodiscard]] core::Observations observations() const override;

  // The backend's indexes: true while `pid` is this execution's unreaped root (the orphan
  // reaper must leave it to the pidfd waiter, or to the launch's StagedChild).
  [[nodiscard]] bool is_root_pid(std::int32_t pid) const noexcept;
  [[nodiscard]] std::string const& id() const noexcept { return id_; }
  // The backend's inotify saw this execution's cgroup.events change.
  void on_events_changed();

 private:
  struct Reader {
    core::Stream stream = core::Stream::stdout_stream;
    std::optional<boost::asio::posix::stream_descriptor> sd;
    bool waiting = false;
    bool pipe_grown = false;  // F_SETPIPE_SZ done (or not applicable): see on_readable
  };
  // Both ends of the root's stdio: three pipes, or one terminal.
  struct Stdio {
    sys::UniqueFd child_in, child_out, child_err, our_in, our_out, our_err;
    std::optional<sys::Pty> pty;
  };
  // The launch between acquire and the verdict: the child at its barrier and its stdio.
  struct Launching;

  [[nodiscard]] std::vector<std::string> build_env(LaunchContext const& ctx) const;
  [[nodiscard]] Step<Acquired> stage(LaunchContext const& ctx);
  // The per-execution cgroup where the host has a subtree (its kernel limits noted in `acq`).
  [[nodiscard]] std::optional<core::SpawnFailure> enter_boundary(LaunchContext const& ctx,
                                                                 Acquired& acq);
  [[nodiscard]] static Step<Stdio> open_stdio(PlanView const& plan);
  [[nodiscard]] sys::SpawnSpec spawn_spec(LaunchContext const& ctx, Stdio const& stdio) const;
  void await_verdict();
  void on_verdict();
  void finish_release(sys::SpawnResult<sys::RunningChild> running);
  // This side's stdio ends become the readers and the input (a launch, or a handover's).
  void attach_stdio(sys::UniqueFd out, sys::UniqueFd err, sys::UniqueFd in);
  void arm_reader(std::size_t index);
  void on_readable(std::size_t index);
  void end_reader(std::size_t index, bool complete);
  void arm_exit_observer();
  void on_exit_ready();
  // An adopted root is not our child: its status becomes readable (PIDFD_GET_INFO) once its own
  // parent reaped it. True when a bounded retry was armed for that (native_adopt.cpp).
  bool await_adopted_status();
  [[nodiscard]] sys::MarkerSweepOptions sweep_options(int sig, std::uint32_t rounds) const;
  // Children of the daemon (the subreaper) no live execution owns: with the marker boundary they
  // may be descendants that scrubbed their marker. `looked` false: could not list them.
  void collect_orphan_candidates(std::vector<sys::Pidfd>& out, bool& looked) const;
  // What the final scan found: the sweep's result (none without a marker), the cgroup re-read,
  // the root, the orphans.
  [[nodiscard]] FinalScan scan_result(std::optional<Result<sys::MarkerSweepResult>> const& sweep,
                                      bool orphans_alive);
  [[nodiscard]] bool live() const noexcept { return port_ != nullptr && !detached_; }
  [[nodiscard]] bool host_alive() const noexcept {
    auto a = host_alive_.lock();
    return a && *a;
  }

  NativeBackend* host_;
  std::weak_ptr<bool> host_alive_;  // the backend outlives every live execution, not every handler
  boost::asio::io_context& io_;
  std::string id_;
  ExecutionPort* port_ = nullptr;
  bool detached_ = false;
  bool exit_held_ = false;  // hold_exit(): a handover reads the root's exit, not this image

  core::Boundary boundary_ = core::Boundary::marker;
  bool kernel_enforced_ = false;
  std::optional<sys::Marker> marker_;  // none for a sandbox (its boundary is the cgroup)
  std::optional<PreparedSandbox> sandbox_;
  std::optional<sys::CgroupDir> cgroup_;
  std::string cgroup_rel_;
  std::optional<sys::Pidfd> root_;
  std::int32_t root_pid_ = 0;
  std::uint64_t root_start_ticks_ = 0;
  bool root_reaped_ = false;
  std::unique_ptr<Launching> launching_;
  // The root's stdio as this side holds it.
  struct IoState {
    std::size_t chunk_bytes = 65536;
    bool pty_mode = false;
    std::optional<sys::Pty> pty;  // kept for resize; I/O goes through dups of the master
    std::vector<Reader> readers;
    std::optional<boost::asio::posix::stream_descriptor> input;
    bool input_waiting = false;
  };
  IoState io_state_;
  std::optional<boost::asio::posix::stream_descriptor> exit_sd_;
  boost::asio::steady_timer exit_retry_timer_;  // exit ready but not yet waitable (ptrace)
  int events_wd_ = -1;  // cgroup.events watch in the backend's inotify, -1: none
  // The workspace disk measurement (plan.disk_bytes): its directory, a walk in flight, and the
  // usage before the launch.
  struct Disk {
    sys::UniqueFd workspace;
    bool walk_running = false;
    std::optional<std::uint64_t> baseline;
  };
  Disk disk_;
  std::uint64_t final_signalled_ = 0;
  // Set when adopted (native_adopt.cpp): no stdio, the root not our child.
  std::optional<NativeAdoption> adoption_;
};

}  // namespace custos::backend
