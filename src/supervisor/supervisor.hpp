// Supervisor: one execution, from launch to its one terminal record, on the manager's event loop.
// Internal to the supervisor layer; the public surface is ExecutionManager (docs/supervisor.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

// Asio through manager.hpp first: it silences a GCC 12 -O2 false positive inside Asio.
#include "custos/core/accounting.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/lifecycle.hpp"
#include "custos/core/resources.hpp"
#include "custos/core/terminal.hpp"
#include "custos/supervisor/event_log.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/types.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/pty.hpp"
#include "custos/sys/spawn.hpp"
#include "custos/sys/unique_fd.hpp"

#include "plan_view.hpp"

namespace custos::supervisor {

class Supervisor : public std::enable_shared_from_this<Supervisor> {
 public:
  Supervisor(ExecutionManager& manager, std::string execution_id, LaunchRequest request,
             PlanView plan, std::string plan_digest);
  ~Supervisor();
  Supervisor(Supervisor const&) = delete;
  Supervisor& operator=(Supervisor const&) = delete;

  // The whole launch (authorize record, stage, record, durability, release, verdict), the
  // waits included. Errors only when nothing was launched and no record exists
  // (record_authorized failed); a spawn failure is a terminal StartResult.
  [[nodiscard]] Result<StartResult> launch(Boundary boundary, sys::CgroupDir const* subtree,
                                           std::string const& cgroup_mount, bool nsdelegate,
                                           std::size_t live_executions);
  // The same launch for the event loop: up to the staged record now, then the waits for the
  // claim's durability (OwnershipSink::when_durable) and for the child's verdict (execve, or
  // the step that failed) without holding the loop. `done` gets what launch() would return,
  // exactly once: before this returns when decided at once, else as a handler of the loop.
  // Meanwhile the execution is `starting`, its root known (is_root_pid): a cancel is accepted
  // and acted on as soon as the target runs.
  using LaunchDone = std::function<void(Result<StartResult>)>;
  void launch_async(Boundary boundary, sys::CgroupDir const* subtree,
                    std::string const& cgroup_mount, bool nsdelegate, std::size_t live_executions,
                    LaunchDone done);
  // The root's pid once the child exists (staged or running), 0 before.
  [[nodiscard]] std::int32_t root_pid() const noexcept { return root_pid_; }

  [[nodiscard]] ExecutionView view() const;
  [[nodiscard]] std::string const& id() const noexcept { return id_; }
  [[nodiscard]] bool terminal() const noexcept { return terminal_.has_value(); }
  [[nodiscard]] core::TerminalRecord const* terminal_record() const noexcept {
    return terminal_ ? &*terminal_ : nullptr;
  }
  [[nodiscard]] core::Phase phase() const noexcept { return life_.phase; }
  [[nodiscard]] std::string const& session_id() const { return session_of(request_.identity); }
  [[nodiscard]] std::chrono::system_clock::time_point started_at() const noexcept {
    return started_wall_;
  }
  // True while this supervisor's root process is its unreaped direct child (orphan reaping must
  // leave it to the pidfd waiter).
  [[nodiscard]] bool is_root_pid(std::int32_t pid) const noexcept;

  [[nodiscard]] Result<CancelResult> cancel(core::Trigger trigger, std::string reason);
  [[nodiscard]] Result<std::uint64_t> input(std::span<std::uint8_t const> data, bool eof);
  [[nodiscard]] Result<> resize(std::uint16_t rows, std::uint16_t cols);
  [[nodiscard]] Result<SubscriptionHandle> subscribe(std::optional<std::uint64_t> from_seq,
                                                     std::function<bool(Event const&)> sink);
  void unsubscribe(std::uint64_t id);
  [[nodiscard]] Result<OutputSlice> output(StreamId stream, std::uint64_t offset,
                                           std::uint64_t max_bytes) const;
  // Stops observing without signalling anything: every descriptor and timer is released.
  void detach();
  [[nodiscard]] std::string const& cgroup_rel() const noexcept { return cgroup_rel_; }
  // The manager's inotify reported a change of this execution's cgroup.events.
  void on_cgroup_events();
  void count_orphan() noexcept { ++orphans_reaped_; }
  // Removes the spool directory (history eviction).
  void discard_spool();

 private:
  struct Reader {
    core::Stream stream = core::Stream::stdout_stream;
    std::optional<boost::asio::posix::stream_descriptor> sd;
    bool eof = false;
    bool waiting = false;
    core::StreamAccounting acc;
    sys::UniqueFd spool;
    std::uint64_t spool_size = 0;
    bool limit_reported = false;
    bool pipe_grown = false;  // F_SETPIPE_SZ done (or not applicable): see on_readable
  };
  struct Writer {
    std::optional<boost::asio::posix::stream_descriptor> sd;
    std::deque<std::vector<std::uint8_t>> queue;
    std::size_t front_offset = 0;
    std::size_t queued = 0;
    std::uint64_t accepted = 0;
    bool eof_requested = false;
    bool closed = false;
    bool waiting = false;
  };
  enum class Stage : std::uint8_t { none, graceful, killing, done };

  // launch helpers
  struct Launching;
  // launch_async once the claim and record are written (or with no sink): up to the staged
  // record, then the durability wait, the go byte and the verdict, each from a completion.
  void launch_authorized(Boundary boundary, sys::CgroupDir const* subtree,
                         std::string const& cgroup_mount, bool nsdelegate,
                         std::size_t live_executions, LaunchDone done);
  // Up to the staged record: an error when nothing was launched, a StartResult when the launch
  // ended already (spawn_failed), nothing when the child is staged (launching_).
  [[nodiscard]] Result<std::optional<StartResult>> begin_launch(Boundary boundary,
                                                                sys::CgroupDir const* subtree,
                                                                std::string const& cgroup_mount,
                                                                bool nsdelegate,
                                                                std::size_t live_executions);
  // After the verdict: ownership committed (record_committed; with `committed`,
  // record_committed_async, which then gets it), stdio wired, I/O started (or spawn_failed).
  using CommitDone = std::function<void(Result<>)>;
  [[nodiscard]] StartResult finish_launch(Result<sys::RunningChild> running,
                                          CommitDone committed = {});
  // The committed write failed: the running target is stopped (backend_failure).
  void on_commit_failed(Error const& e);
  struct PendingStart;
  // Answers the event-loop launch once both its result and its committed write are known.
  void answer_start(PendingStart& p);
  [[nodiscard]] std::string cgroup_path() const;
  [[nodiscard]] StartResult spawn_failed_result(core::SpawnFailure failure);
  // What the launch answers: this execution as it is now, with root `pid` (0: none runs).
  [[nodiscard]] StartResult start_result(std::int32_t pid) const;
  void on_durable(Result<> durable);
  void await_verdict();
  void on_verdict();
  // An async launch that ends before its verdict: the staged child is killed, `done` told.
  void fail_launch(core::SpawnFailure failure);
  void fail_spawn(core::SpawnFailure failure);
  [[nodiscard]] Result<std::vector<std::string>> build_env() const;
  void start_io();

  // async plumbing
  void arm_reader(std::size_t index);
  void on_readable(std::size_t index);
  void handle_chunk(Reader& r, std::uint8_t const* data, std::size_t n);
  void reader_eof(Reader& r);
  void arm_exit_observer();
  void on_root_exit();
  void kick_writer();
  void close_writer(std::string_view reason);
  void arm_deadline();
  void arm_sampler();
  void sample();

  // teardown
  [[nodiscard]] Result<CancelResult> offer(core::Trigger trigger, std::string reason);
  void begin_stop();
  void arm_poll(std::chrono::milliseconds every);
  void on_poll();
  void kill_stage();
  void watch_cgroup_events();
  void unwatch_cgroup_events();
  void final_stage();
  struct FinalScan;
  void finish_final_stage(FinalScan const& scan);
  void start_disk_walk();
  [[nodiscard]] bool root_gone() const noexcept;
  [[nodiscard]] bool tree_populated() const;
  [[nodiscard]] std::uint32_t signal_tree(int sig);
  [[nodiscard]] sys::MarkerSweepOptions sweep_options(int sig, std::uint32_t rounds) const;
  // Children of this process no live supervisor owns (marker boundary); pidfds, so the worker
  // can wait for them to finish dying without reading any manager state. `looked` false: the
  // children could not be listed, so nothing can be confirmed.
  void collect_orphan_candidates(std::vector<sys::Pidfd>& out, bool& looked) const;
  void force_close_readers();
  void maybe_close();
  void close_and_record();
  // How the terminal record is written: `now` waits for the sink (a spawn failure, reported
  // by the launch itself), `async` lets the loop go on (the close of a launched execution).
  enum class TerminalWrite : std::uint8_t { now, async };
  void finish_terminal(core::TerminalRecord record, TerminalWrite write);
  // The record is written: the lifecycle, the terminal event, the manager (waits).
  void publish_terminal(core::TerminalRecord record);

  void advance(core::LifecycleEvent const& ev);
  void emit(std::string kind, boost::json::object fields, std::vector<std::uint8_t> data = {});
  void sink_error(std::string what, Error const& e);
  [[nodiscard]] bool all_readers_eof() const noexcept;
  [[nodiscard]] Reader* reader_for(core::Stream s) noexcept;
  [[nodiscard]] Reader const* reader_for(core::Stream s) const noexcept;
  [[nodiscard]] std::filesystem::path spool_path(core::Stream s) const;
  [[nodiscard]] core::ResourceReport resource_report() const;
  [[nodiscard]] core::OutputAccounting accounting() const;
  void done_op();  // one async operation completed

  ExecutionManager* manager_;
  boost::asio::io_context& io_;
  std::string id_;
  LaunchRequest request_;
  PlanView plan_;
  std::string plan_digest_;
  EventLog events_;

  core::LifecycleState life_;
  core::CancellationState cancel_;
  std::optional<core::ExitStatus> exit_;
  std::optional<core::SpawnFailure> spawn_failure_;
  std::optional<core::TerminalRecord> terminal_;
  std::optional<std::string> sink_error_;

  Boundary boundary_ = Boundary::marker;
  bool kernel_enforced_ = false;
  std::optional<sys::Marker> marker_;
  std::optional<sys::CgroupDir> cgroup_;
  std::optional<sys::Pidfd> root_;
  std::int32_t root_pid_ = 0;
  std::uint64_t root_start_ticks_ = 0;
  bool root_reaped_ = false;
  sys::UniqueFd workspace_fd_;
  std::optional<sys::Pty> pty_;  // kept for resize; I/O goes through dups of the master
  std::string cgroup_rel_;       // the cgroup's path below the mount, as /proc/PID/cgroup shows it

  std::unique_ptr<Launching> launching_;  // between the staged child and its verdict
  bool claim_durable_ = false;            // the launch awaited the claim's durability
  bool authorized_ = false;               // record_authorized_async already wrote the claim
  // The event-loop launch's answer while it waits for the committed write (null otherwise).
  std::shared_ptr<PendingStart> pending_start_;

  std::vector<Reader> readers_;
  Writer writer_;
  std::optional<boost::asio::posix::stream_descriptor> exit_sd_;
  // Watch descriptor of this cgroup's cgroup.events in the manager's inotify instance during the
  // kill stage (-1: none): the tree-empty wait wakes on the kernel's change notification.
  int events_wd_ = -1;
  boost::asio::steady_timer deadline_;
  boost::asio::steady_timer stage_timer_;  // grace, then the kill bound
  boost::asio::steady_timer poll_timer_;   // tree-empty polling during teardown
  boost::asio::steady_timer drain_timer_;  // root exited, readers still open
  boost::asio::steady_timer sampler_timer_;
  boost::asio::steady_timer reader_timer_;      // readers still open after the tree is gone
  boost::asio::steady_timer exit_retry_timer_;  // exit ready but not yet waitable (ptrace)

  Stage stage_ = Stage::none;
  bool graceful_sent_ = false;
  bool forced_ = false;
  bool tree_done_ = false;
  bool support_cancelled_ = false;
  bool detached_ = false;
  bool closing_ = false;
  bool readers_forced_ = false;
  bool disk_walk_running_ = false;  // one workspace walk on the worker at a time
  core::Cleanup cleanup_ = core::Cleanup::unconfirmed;
  std::string cleanup_detail_;  // why the cleanup is unconfirmed (empty when confirmed)
  std::size_t pending_ = 0;
  std::uint64_t output_events_ = 0;
  bool max_events_reported_ = false;
  std::uint64_t total_observed_allowed_ = 0;  // output bytes within limits.output_bytes
  bool cpu_from_cgroup_ = false;
  std::chrono::steady_clock::time_point started_{};
  std::chrono::steady_clock::time_point kill_deadline_{};
  std::chrono::steady_clock::time_point last_disk_sample_{};
  std::optional<std::chrono::steady_clock::time_point> exited_at_;
  std::chrono::system_clock::time_point started_wall_{};
  std::size_t concurrency_ = 0;
  std::uint64_t orphans_reaped_ = 0;

  // Peaks from the sampler.
  std::optional<std::uint64_t> cpu_ms_;
  std::optional<std::uint64_t> rss_peak_;
  std::optional<std::uint64_t> procs_peak_;
  std::optional<std::uint64_t> fds_peak_;
  std::optional<std::uint64_t> disk_growth_peak_;
  std::optional<std::uint64_t> disk_baseline_;
  bool memory_hard_ = false;
  bool pids_hard_ = false;
};

}  // namespace custos::supervisor
