// Supervisor: one execution, from launch to its one terminal record, on the manager's event loop,
// driving a backend (custos/backend/backend.hpp). Internal to the supervisor layer; the public
// surface is ExecutionManager (docs/supervisor.md).
//
// The concerns live in their own files and types:
//   launch.cpp          the claim, acquire at the barrier, the staged record, release, the answer
//   pumps.{hpp,cpp}     output accounting, spools, output events and limits; the stdin queue
//   teardown.{hpp,cpp}  graceful → grace → kill → wait until empty → final scan
//   resource_watch.*    deadline, sampler, disk, resource limits and the resource report
//   supervisor.cpp      lifecycle, events, cancellation, close and the terminal record
//   adopt.cpp           taking over a live execution a previous daemon launched (restart)
//
// Concurrency: everything runs on the manager's single-threaded io_context. Each asynchronous
// operation of this execution — its own timers and every task the backend starts
// (ExecutionPort::task_begun) — is counted in pending_, and its completion decrements it first
// thing. An execution is closed only when the root's exit was observed, the tree teardown
// finished, every stream ended (or was closed at its bound), and pending_ is zero — every support
// task has completed, none is merely abandoned.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

// Asio through manager.hpp first: it silences a GCC 12 -O2 false positive inside Asio.
#include "custos/backend/backend.hpp"
#include "custos/backend/plan_view.hpp"
#include "custos/core/cancellation.hpp"
#include "custos/core/lifecycle.hpp"
#include "custos/core/terminal.hpp"
#include "custos/supervisor/event_log.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/types.hpp"

#include "pumps.hpp"
#include "resource_watch.hpp"
#include "teardown.hpp"

namespace custos::supervisor {

using backend::PlanView;

class Supervisor final : public backend::ExecutionPort,
                         public std::enable_shared_from_this<Supervisor> {
 public:
  Supervisor(ExecutionManager& manager, std::string execution_id, LaunchRequest request,
             PlanView plan, std::string plan_digest,
             std::shared_ptr<backend::BackendExecution> backend);
  ~Supervisor() override;
  Supervisor(Supervisor const&) = delete;
  Supervisor& operator=(Supervisor const&) = delete;

  // The launch: the claim and record (OwnershipSink::record_authorized_async), acquire at the
  // barrier, the staged record and the claim's durability, release, the verdict, the committed
  // record — none of it holding the loop. `done` gets the answer exactly once: an error only when
  // nothing was launched and no record exists; a spawn failure is a terminal StartResult.
  // Meanwhile the execution is `starting`: a cancel is accepted and acted on once it runs.
  using LaunchDone = std::function<void(Result<StartResult>)>;
  void launch(std::size_t live_executions, LaunchDone done);

  // Instead of launch(): takes over the live execution `request` describes (a previous daemon
  // launched it; recovery re-acquired its root by exact pidfs identity). Nothing is claimed or
  // authorized again: the record exists, in request.phase. Events start at seq 1 with
  // `adopted`; from there it is supervised, cancelled, timed and closed like any other, and its
  // terminal record says recovery live_owned. Errors: the backend's adopt() (nothing is then
  // changed: the root is left as it was). adopt.cpp.
  [[nodiscard]] Result<> adopt(AdoptRequest request, std::size_t live_executions);
  [[nodiscard]] ExecutionView view() const;
  [[nodiscard]] std::string const& id() const noexcept { return id_; }
  [[nodiscard]] bool terminal() const noexcept { return terminal_.has_value(); }
  [[nodiscard]] core::Phase phase() const noexcept { return life_.phase; }
  [[nodiscard]] std::string const& session_id() const { return request_.identity.session_id; }
  [[nodiscard]] std::chrono::system_clock::time_point started_at() const noexcept {
    return watch_.started_wall();
  }

  [[nodiscard]] Result<CancelResult> cancel(core::Trigger trigger, std::string reason,
                                            bool force = false);
  [[nodiscard]] Result<std::uint64_t> input(std::span<std::uint8_t const> data, bool eof);
  [[nodiscard]] Result<> resize(std::uint16_t rows, std::uint16_t cols);
  [[nodiscard]] Result<SubscriptionHandle> subscribe(std::optional<std::uint64_t> from_seq,
                                                     std::function<bool(Event const&)> sink);
  void unsubscribe(std::uint64_t id);
  [[nodiscard]] Result<OutputSlice> output(StreamId stream, std::uint64_t offset,
                                           std::uint64_t max_bytes) const;
  // Stops observing without signalling anything: every descriptor and timer is released.
  void detach();
  // A handover, just before detach(): what the next image needs to go on with this execution
  // (its stdio descriptors, given up open; where its streams and input stand; its events).
  // nullopt when it cannot be carried (ended, a launch not answered yet, a backend that keeps no
  // stdio): recovery then adopts it without its output.
  [[nodiscard]] std::optional<Carried> hand_over();
  // Before hand_over(): the root's exit is left for the next image (the backend stops reaping
  // it). True when this execution's root already exited and it is closing: the handover waits
  // for its terminal record rather than carry it half-closed.
  bool hold_exit();
  // Its root's exit was collected and it is not terminal yet.
  [[nodiscard]] bool closing() const noexcept { return exit_.has_value() && !terminal_; }
  void count_orphan() noexcept { ++orphans_reaped_; }

  // backend::ExecutionPort
  void on_output(core::Stream stream, std::span<std::uint8_t const> bytes) override;
  void on_stream_end(core::Stream stream, bool complete) override;
  void on_root_exit(std::optional<core::ExitStatus> status) override;
  void on_tree_change() override;
  void on_input_writable() override;
  void on_usage_changed() override { watch_.sample_now(); }
  void on_backend_failure(std::string reason) override;
  void on_sandbox_denied(std::string control, std::string detail) override;
  void task_begun() override { ++pending_; }
  void task_ended() override;

 private:
  friend class OutputPumps;
  friend class Teardown;
  friend class ResourceWatch;

  // launch.cpp
  // A launch's answer waits for its result and for the committed write (either may come first).
  struct PendingStart {
    LaunchDone done;
    std::optional<StartResult> result;
    std::optional<Result<>> committed;
    std::function<void()> then;  // the terminal record's publication, held until the answer
  };
  void acquire(LaunchDone done);
  void on_acquired(backend::Step<backend::Acquired> acquired, LaunchDone done);
  void on_released(backend::Step<std::monostate> verdict, LaunchDone done);
  // A launch that ends before its target ran: the staged root (if any) is dropped, the claim made
  // durable, the terminal record written and published, then `done` answered.
  void fail_launch(core::SpawnFailure failure, LaunchDone done);
  void answer_start(PendingStart& p);
  void on_commit_failed(Error const& e);
  [[nodiscard]] StartResult start_result() const;
  [[nodiscard]] backend::LaunchContext launch_context(std::size_t live_executions) const;

  // adopt.cpp: an adopted root whose launch was never committed ends on the spawn-failure path
  // (spawn_error "barrier"), which records no exit and never reaches `closed`.
  void unreleased_root_exited(std::optional<core::ExitStatus> status);
  void close_unreleased();

  // supervisor.cpp
  [[nodiscard]] Result<CancelResult> offer(core::Trigger trigger, std::string const& reason);
  void maybe_close();
  void close_and_record();
  // The terminal record is written (off the loop), then published; `then` runs after.
  void finish_terminal(core::TerminalRecord record, std::function<void()> then = {});
  void publish_terminal(core::TerminalRecord record);
  void advance(core::LifecycleEvent const& ev);
  void emit(std::string kind, boost::json::object fields, std::vector<std::uint8_t> data = {});
  void sink_error(std::string const& what, Error const& e);
  // Adds to the manager's spool byte counter (ManagerStats::spool_bytes): a plain add, as
  // everything here runs on the loop thread.
  void count_spooled(std::uint64_t bytes) noexcept {
    if (manager_ != nullptr) manager_->stats_.spool_bytes += bytes;
  }
  [[nodiscard]] OwnershipSink* sink() const noexcept;
  [[nodiscard]] ManagerConfig const& config() const noexcept;
  [[nodiscard]] bool root_gone() const noexcept;
  // A counted one-shot wait on `timer`: `fn` runs unless cancelled or detached.
  void arm(boost::asio::steady_timer& timer, std::chrono::milliseconds after,
           std::function<void()> fn);

  ExecutionManager* manager_;
  boost::asio::io_context& io_;
  std::string id_;
  LaunchRequest request_;
  PlanView plan_;
  std::string plan_digest_;
  std::shared_ptr<backend::BackendExecution> backend_;
  EventLog events_;

  core::LifecycleState life_;
  core::CancellationState cancel_;
  std::optional<core::ExitStatus> exit_;
  std::optional<core::SpawnFailure> spawn_failure_;
  std::optional<core::TerminalRecord> terminal_;
  std::optional<std::string> sink_error_;
  backend::Acquired acquired_;  // what the backend reported at acquire (pid 0 before)

  OutputPumps pumps_;
  Teardown teardown_;
  ResourceWatch watch_;

  // The first sandbox denial the backend observed (it decides the classification unless a
  // trigger came first).
  struct Denial {
    std::string control;
    std::string detail;
  };
  std::optional<Denial> denial_;
  bool adopted_ = false;        // taken over after a restart (adopt.cpp): recovery live_owned
  bool claim_durable_ = false;  // the launch awaited the claim's durability
  bool stdio_kept_ = false;     // its output descriptors are with the StdioKeeper
  bool running_ = false;        // released: the target program started
  // The launch's answer while it waits for the committed write (null otherwise).
  std::shared_ptr<PendingStart> pending_start_;
  bool detached_ = false;
  std::size_t pending_ = 0;
  std::uint64_t orphans_reaped_ = 0;
};

}  // namespace custos::supervisor
