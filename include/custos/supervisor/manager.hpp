// ExecutionManager: owns one Supervisor per execution, all on ONE boost::asio::io_context (the
// daemon's loop, single-threaded). Every method must be called on that loop's thread, and every
// callback is invoked on it. docs/supervisor.md describes the life of an execution in detail.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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

#include "custos/core/result.hpp"
#include "custos/supervisor/ownership_sink.hpp"
#include "custos/supervisor/types.hpp"
#include "custos/sys/cgroup.hpp"

namespace custos::supervisor {

class Supervisor;

class ExecutionManager {
 public:
  ExecutionManager(boost::asio::io_context& io, ManagerConfig config);
  ~ExecutionManager();
  ExecutionManager(ExecutionManager const&) = delete;
  ExecutionManager& operator=(ExecutionManager const&) = delete;

  // Launches the plan. A spawn failure is NOT an error here: the execution exists and is
  // terminal with classification spawn_failed (phase terminal in the result). Errors:
  // internal when the sink's record_authorized fails (nothing was launched), daemon_shutting_down
  // after shutdown(), plan_invalid_user when a non-root caller names another user.
  [[nodiscard]] Result<StartResult> start(LaunchRequest request);

  // exec_not_found for an unknown id.
  [[nodiscard]] Result<ExecutionView> get(std::string const& execution_id) const;
  // Newest first, at most filter.limit.
  [[nodiscard]] std::vector<ExecutionView> list(ListFilter const& filter) const;

  // Completes with the terminal record, immediately when already terminal, or with
  // exec_wait_timeout after `timeout`, or exec_not_found.
  void wait(std::string const& execution_id, std::optional<std::chrono::milliseconds> timeout,
            std::function<void(Result<core::TerminalRecord>)> done);

  // Offers a trigger (first accepted wins). accepted=false when another trigger was first or the
  // exit was already observed. exec_not_found; exec_not_running once terminal.
  [[nodiscard]] Result<CancelResult> cancel(std::string const& execution_id, core::Trigger trigger,
                                            std::string reason);

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

  // Reaps orphans reparented to this process (subreaper) now; the manager also does it every
  // config.reap_interval. The daemon may call it on SIGCHLD.
  void reap_orphans_now();

  [[nodiscard]] ManagerStats const& stats() const noexcept { return stats_; }
  [[nodiscard]] ManagerConfig const& config() const noexcept { return config_; }
  // Number of executions not yet terminal.
  [[nodiscard]] std::size_t live_count() const noexcept;

 private:
  friend class Supervisor;
  void on_terminal(std::string const& execution_id);
  void schedule_reap();
  void poll_shutdown(std::chrono::steady_clock::time_point deadline, std::function<void()> done);
  [[nodiscard]] std::shared_ptr<Supervisor> find(std::string const& execution_id) const;
  [[nodiscard]] bool is_direct_child(std::int32_t pid) const;
  [[nodiscard]] std::map<std::int32_t, std::string> attribute_zombies() const;
  // One inotify instance for every execution's tree-empty wait (created on first use): closing an
  // inotify instance waits for an SRCU grace period (milliseconds), so one per execution would
  // cost more than the polling it replaces. Returns the watch descriptor, -1 when unavailable.
  [[nodiscard]] int watch_cgroup_events(std::string const& events_path,
                                        std::weak_ptr<Supervisor> supervisor);
  void unwatch_cgroup_events(int wd);
  void arm_inotify();
  void on_inotify();
  // The execution whose cgroup holds `pid` (read from /proc/<pid>/cgroup), if any.
  [[nodiscard]] std::optional<std::string> owner_by_cgroup(std::int32_t pid) const;

  boost::asio::io_context& io_;
  ManagerConfig config_;
  ManagerStats stats_;
  std::map<std::string, std::shared_ptr<Supervisor>> executions_;
  std::vector<std::string> terminal_order_;  // oldest first, for terminal_history eviction
  std::vector<std::uint8_t> scratch_;        // shared read buffer (one loop thread)
  boost::asio::steady_timer reap_timer_;
  boost::asio::steady_timer shutdown_timer_;
  std::optional<sys::CgroupDir> subtree_;            // where per-execution cgroups are created
  std::string cgroup_mount_;                         // the cgroup2 mount point (for relative paths)
  std::map<std::string, std::string> cgroup_owner_;  // cgroup path below the mount -> execution
  std::map<std::int32_t, std::string> roots_;        // root pid of a live execution -> its id
  std::optional<boost::asio::posix::stream_descriptor> inotify_;
  std::map<int, std::weak_ptr<Supervisor>> inotify_watches_;
  bool inotify_waiting_ = false;
  bool nsdelegate_ = false;
  bool shutting_down_ = false;
  std::shared_ptr<bool> alive_;  // guards callbacks against a destroyed manager
  // Blocking scans (the final /proc marker sweep, the orphan settle wait, workspace disk walks)
  // run here, never on the loop thread; their completions are posted back to io_. One thread:
  // the loop keeps the other core of a small host. Declared last so it is joined first.
  boost::asio::thread_pool workers_{1};
};

}  // namespace custos::supervisor
