// ExecutionManager: owns one Supervisor per execution, all on ONE boost::asio::io_context (the
// daemon's loop, single-threaded). Every method must be called on that loop's thread, and every
// callback is invoked on it. docs/supervisor.md describes the life of an execution in detail.
#pragma once

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

// GCC 12 at -O2 reports a "potential null pointer dereference" inside Asio's executor
// comparison (io_context.hpp), which -Werror turns into a failed release build. The finding is
// in Boost's code, not ours; it is silenced for those headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/native.hpp"
#include "custos/core/result.hpp"
#include "custos/supervisor/launch_permit.hpp"
#include "custos/supervisor/ownership_sink.hpp"
#include "custos/supervisor/types.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/dir_chain.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::supervisor {

class Supervisor;

// Names one pending wait() so its owner can withdraw it (unwait) before the execution ends.
// id 0: nothing is pending (the answer was already posted).
struct WaitHandle {
  std::string execution_id;
  std::uint64_t id = 0;
};

class ExecutionManager {
 public:
  ExecutionManager(boost::asio::io_context& io, ManagerConfig config);
  ~ExecutionManager();
  ExecutionManager(ExecutionManager const&) = delete;
  ExecutionManager& operator=(ExecutionManager const&) = delete;

  // The refusals start_async() would make before it creates anything, checked without a
  // permit: daemon_shutting_down after shutdown(); sys_unsupported for a backend this daemon
  // does not serve; auth_digest_mismatch when the request's sandbox is not the one its plan's
  // sandbox_digest names; the backend's own admission (cgroup_unavailable when boundary=cgroup
  // has no subtree) and the sandbox's (sandbox_unsupported with Error::missing: every control of
  // the checked sandbox plan the backend's descriptor does not list at fidelity hard, sorted).
  // The gateway calls it before its authorizing transaction, so a permit is minted only for a
  // launch the manager will attempt (everything runs on the loop thread: nothing changes between
  // the two calls), and start_async() calls it again right before anything is created.
  [[nodiscard]] Result<> admit(LaunchRequest const& request) const;
  // The plan's workspace and cwd against this host, for every backend whose paths are the
  // host's (native, reference; a container's are the container's): workspace_state_dir when the
  // workspace is the daemon's state directory (ManagerConfig::state_dir, when given) or contains
  // it, by device and inode of the state directory and of every directory above it, and by
  // resolved path; workspace_escape when the cwd resolves outside the workspace
  // (openat2 RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS from the workspace root: `..` or a symlink
  // leading out, a magic link). Each with its diagnostic (/plan/workspace/root, /plan/cwd). A
  // workspace or cwd that does not exist passes: the launch fails at its step (spawn_failed),
  // resolving the cwd beneath the workspace again there. admit() runs it; exec.check calls it.
  [[nodiscard]] Result<> check_workspace(core::ExecutionPlan const& plan) const;
  // The backends this daemon serves, for host.info and doctor.
  [[nodiscard]] std::vector<backend::Descriptor> backends() const;
  // What admit() decides for the plan's backend, as data (exec.check): admitted, or every
  // missing control, sorted: the backend's own ("backend.<kind>" for a backend this daemon does
  // not serve) and those of `sandbox` (the plan's checked sandbox plan; null: unsandboxed).
  // No effect.
  [[nodiscard]] backend::Admission admission(
      core::ExecutionPlan const& plan, sandbox::CheckedSandboxPlan const* sandbox = nullptr) const;
  // After admit(), before the claim: the backend's checks that need an outside answer (an
  // engine: the container exists, runs and can run the gate). No effect; `done` on the loop
  // (or at once when there is nothing to ask).
  void preflight(core::ExecutionPlan const& plan, std::function<void(Result<>)> done);
  // Whether preflight() asks anyone outside the daemon for this plan's backend.
  [[nodiscard]] bool asks_before_claim(core::ExecutionPlan const& plan) const noexcept;

  // Launches the plan under `permit` (launch_permit.hpp), which must be valid and minted for this
  // request: its plan digest is the request's, its claim the identity's (action_id, process_id);
  // the execution gets the permit's execution id. The checks run now; the claim, the launch and
  // the waits for durability and for the root's verdict never hold the loop. `done` gets the
  // answer exactly once: before this returns when decided at once, else as a handler of the
  // loop. A spawn failure is NOT an error: the execution exists and is terminal with
  // classification spawn_failed (phase terminal in the result). Errors: admit()'s; auth_denied
  // for an empty (spent) permit or one minted for another claim or id already in use;
  // auth_digest_mismatch for another plan; auth_user when a non-root caller names another user
  // and the permit's minter did not check it; the sink's error when the claim could not be
  // written (nothing was launched).
  using StartDone = std::function<void(Result<StartResult>)>;
  void start_async(LaunchRequest request, LaunchPermit permit, StartDone done);

  // Takes over a live execution a previous daemon launched, which startup recovery re-acquired
  // by exact pidfs identity (supervisor/recovery.hpp): a supervisor drives it from its recorded
  // phase through the recovered pidfd — supervised, cancellable, deadline-bound (from its
  // original start), sampled, closed by the same teardown, and ended with one terminal record
  // (recovery live_owned) through the sink. No claim and no `authorized` are written. Its events
  // start at seq 1 with `adopted`. Returns its view. Errors: daemon_shutting_down;
  // auth_denied when the id is already in use; sys_unsupported for a backend this daemon does
  // not serve, or one that cannot adopt; the backend's refusal. On an error nothing was signalled.
  [[nodiscard]] Result<ExecutionView> adopt(AdoptRequest request);

  // exec_not_found for an unknown id.
  [[nodiscard]] Result<ExecutionView> get(std::string const& execution_id) const;
  // Newest first, at most filter.limit.
  [[nodiscard]] std::vector<ExecutionView> list(ListFilter const& filter) const;

  // Completes with the terminal record, immediately when already terminal, or with
  // exec_wait_timeout after `timeout`, or exec_not_found, or daemon_shutting_down when
  // supervision is detached. `done` always runs from the loop (posted), never inside this call.
  // The handle may be ignored by a caller that never withdraws its wait.
  WaitHandle wait(std::string const& execution_id, std::optional<std::chrono::milliseconds> timeout,
                  std::function<void(Result<core::TerminalRecord>)> done);
  // Withdraws a pending wait: `done` is destroyed without running and everything the wait held
  // (its callback, its timer) is freed now, not when the execution ends. No-op once answered.
  void unwait(WaitHandle const& handle);

  // Offers a trigger (first accepted wins). accepted=false when another trigger was first or the
  // exit was already observed. `force`: whichever trigger was first, the stop skips what is left
  // of the graceful step and kills the tree now (CancelResult::forced says whether that changed
  // anything). exec_not_found; exec_not_running once terminal.
  [[nodiscard]] Result<CancelResult> cancel(std::string const& execution_id, core::Trigger trigger,
                                            std::string reason, bool force = false);

  // Queues stdin bytes (eof closes the write end after the queue drains). Returns the bytes
  // accepted (may be fewer than offered when the in-memory queue is nearly full; 0 when full).
  // Errors: exec_not_found, exec_input_limit (would exceed limits.stdin_bytes; nothing taken),
  // exec_input_closed (after eof or once the child closed its stdin), exec_not_running.
  [[nodiscard]] Result<std::uint64_t> input(std::string const& execution_id,
                                            std::span<std::uint8_t const> data, bool eof);

  // exec_resize_refused (plan says resize:false), exec_not_pty (pipes), exec_not_running.
  // A refusal changes nothing about the execution.
  [[nodiscard]] Result<> resize(std::string const& execution_id, std::uint16_t rows,
                                std::uint16_t cols);

  // Replays retained events with seq >= from_seq (default: from the first retained), then
  // delivers live ones. A sink that returns false is dropped at once (stats().dropped_subscribers
  // counts it; the rpc layer tells its client). exec_not_found.
  [[nodiscard]] Result<SubscriptionHandle> subscribe(std::string const& execution_id,
                                                     std::optional<std::uint64_t> from_seq,
                                                     std::function<bool(Event const&)> sink);
  void unsubscribe(SubscriptionHandle const& handle);

  // Reads the spool file of a stream. exec_not_found.
  [[nodiscard]] Result<OutputSlice> output(std::string const& execution_id, StreamId stream,
                                           std::uint64_t offset, std::uint64_t max_bytes) const;

  // cancel: every live execution gets trigger supervisor_shutdown and `done` runs once all are
  // terminal or `bound` passed. detach: supervision stops without signalling anything (the
  // registry keeps ownership for recovery at the next start); `done` runs once every async task
  // was released. After shutdown, start() refuses.
  void shutdown(ShutdownPolicy policy, std::chrono::milliseconds bound, std::function<void()> done);
  // A handover, right before shutdown(detach): what each live execution carries to the next
  // image (Supervisor::hand_over), in id order. One that cannot be carried is absent: recovery
  // adopts it without its output.
  [[nodiscard]] std::vector<Carried> hand_over();
  // The consistent point of a handover, before hand_over(): no root exit is collected from here
  // on (each stays for the next image), and `done` runs once every execution whose root had
  // already exited has its terminal record, or `bound` passed (those left are then recovery's).
  void prepare_handover(std::chrono::milliseconds bound, std::function<void()> done);
  // A start that failed after it adopted what a handover carried gives it back for the image it
  // falls back to, with nothing run on the loop: no root exit is collected from here on, and
  // each live execution gives up its stdio as for hand_over().
  [[nodiscard]] std::vector<Carried> give_back();

  // Reaps orphans reparented to this process (subreaper) now; the manager also does it every
  // config.reap_interval. The daemon may call it on SIGCHLD.
  void reap_orphans_now();
  // A child of this process that is not an execution's (the daemon's handover check): the orphan
  // reaper leaves it to whoever waits for it, until released. On the loop.
  void spare_child(std::int32_t pid) { spared_.insert(pid); }
  void release_child(std::int32_t pid) { spared_.erase(pid); }

  [[nodiscard]] ManagerStats const& stats() const;
  [[nodiscard]] ManagerConfig const& config() const noexcept { return config_; }
  // The loop every method and callback runs on.
  [[nodiscard]] boost::asio::io_context& io() const noexcept { return io_; }
  // Number of executions not yet terminal.
  [[nodiscard]] std::size_t live_count() const noexcept;
  // Executions whose root exited and which are not terminal yet (prepare_handover()).
  [[nodiscard]] std::size_t closing_count() const;
  // Executions not yet terminal, by phase (index: core::Phase; the terminal entry stays 0).
  // Scans the executions held (live ones and the bounded terminal history).
  [[nodiscard]] std::array<std::size_t, core::kPhaseCount> live_by_phase() const;

 private:
  // start_async()'s checks and the supervisor they create (registered under its id).
  [[nodiscard]] Result<std::shared_ptr<Supervisor>> prepare_start(LaunchRequest request,
                                                                  LaunchPermit permit);
  [[nodiscard]] backend::Backend* backend_for(core::BackendKind kind) const noexcept;
  friend class Supervisor;
  void on_terminal(std::string const& execution_id, core::TerminalRecord const& record);
  struct PendingWait {
    std::string execution_id;
    std::function<void(Result<core::TerminalRecord>)> done;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  // Answers (posts) every pending wait of the execution, or of every execution when empty.
  void answer_waits(std::string const& execution_id, Result<core::TerminalRecord> const& answer);
  void answer_all_waits(Error const& error);
  void schedule_reap();
  // The synchronous part of prepare_handover(): no root exit is collected from here on.
  void hold_exits();
  // Runs `done` (posted) once `settled()` holds or `deadline` passed, looking every kShutdownPoll.
  void poll_until(std::function<bool()> settled, std::chrono::steady_clock::time_point deadline,
                  std::function<void()> done);
  [[nodiscard]] std::shared_ptr<Supervisor> find(std::string const& execution_id) const;
  // Orphan reaping must leave a live root to its execution.
  [[nodiscard]] bool is_direct_child(std::int32_t pid) const;
  [[nodiscard]] std::optional<std::string> owner_of(std::int32_t pid) const;

  boost::asio::io_context& io_;
  ManagerConfig config_;
  mutable ManagerStats stats_;
  // The backends, declared before the executions that drive them (destroyed after them).
  std::vector<std::unique_ptr<backend::Backend>> backends_;
  backend::NativeBackend* native_ = nullptr;  // one of backends_
  std::map<std::string, std::shared_ptr<Supervisor>> executions_;
  std::size_t terminal_in_map_ = 0;  // entries of executions_ that are terminal (live_count)
  std::vector<std::string> terminal_order_;  // oldest first, for terminal_history eviction
  boost::asio::steady_timer reap_timer_;
  boost::asio::steady_timer shutdown_timer_;
  // Pending exec.wait calls, held here (not by the supervisor) so unwait() can free them.
  std::map<std::uint64_t, PendingWait> waits_;
  std::multimap<std::string, std::uint64_t> waits_by_execution_;
  std::uint64_t next_wait_id_ = 0;
  bool shutting_down_ = false;
  // Set once a handover reached its consistent point: from then on every exited child, root or
  // orphan, stays a zombie for the next image (a reaped root could never be re-acquired).
  bool handing_over_ = false;
  std::set<std::int32_t> spared_;  // spare_child()
  // The state directory the workspace check guards (ManagerConfig::state_dir as given; without
  // one the manager's temporary spool root is nobody's registry and is not guarded). Its ids
  // are read again while it does not exist yet.
  bool guard_state_dir_ = false;
  mutable sys::DirChain state_chain_;
  std::shared_ptr<bool> alive_;  // guards callbacks against a destroyed manager
};

}  // namespace custos::supervisor
