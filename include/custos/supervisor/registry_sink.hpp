// RegistrySink: the OwnershipSink backed by the SQLite registry — the wiring the daemon passes
// in ManagerConfig::sink. The registry decides durability (the claim is on stable storage before
// the barrier release, through its flusher's fdatasync; ownership and phases survive a daemon
// crash) and fires its crash failpoints (docs/durability.md).
//
// With an event loop, writes that gate nothing are deferred and committed promptly by a
// background thread, in one transaction shared by every execution (docs/durability.md, "Which
// writes wait"):
//   record_authorized   claim + record, one transaction with group durability:
//                       in the WAL now, fdatasync'ed by the registry's flusher
//                       while the child is created                           now
//   make_durable        waits for that fdatasync: before the barrier release
//                       and before any launch outcome is reported             wait
//   phase starting      deferred: record_staged commits it, in its transaction  deferred
//   record_staged       before the barrier is released                         now
//   record_committed    with phase running, one transaction (the supervisor
//                       records running right after it; that call is then
//                       already done), so a failure of either fails this call   now
//   record_trigger      before the graceful signal (recovery classifies by it) now
//   phases stopping, exited, closed; output accounting                         deferred
//                       (committed by the sink's background flusher thread, so the
//                       transaction is not paid on the loop; an immediate write
//                       queued meanwhile takes them into its own transaction)
//   record_terminal     commits everything queued before it, then returns, so
//                       waiters learn the result only once it is in the WAL    now
//   (record_terminal_async: the same write, committed by the flush thread; its
//    completion is posted to the loop, so the loop never waits for it)        deferred
// Without a loop every write is immediate (one transaction each).
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "custos/registry/registry.hpp"
#include "custos/supervisor/ownership_sink.hpp"

namespace custos::supervisor {

class RegistrySink final : public OwnershipSink {
 public:
  // How long a write nobody waits for may stay queued (docs/durability.md): a daemon crash in
  // that window loses it, and recovery walks the phases it would have recorded itself.
  static constexpr std::chrono::milliseconds kLazyFlushBound{10};

  // `registry` must outlive the sink (the daemon owns both). `loop`: the event loop the
  // manager runs on; non-null turns deferral on: writes that gate nothing are queued and
  // committed by the sink's flush thread (started with the first of them, joined by the
  // destructor). Null: no write is deferred.
  explicit RegistrySink(registry::Registry& registry,
                        boost::asio::io_context* loop = nullptr) noexcept
      : registry_(&registry), loop_(loop) {}
  ~RegistrySink() override;
  RegistrySink(RegistrySink const&) = delete;
  RegistrySink& operator=(RegistrySink const&) = delete;

  // consume_claim(action_id, process_id) + create the record (phase authorized), one
  // transaction committed with Durability::group (power-loss durable once make_durable
  // returned). A claim that was ever consumed before is registry.claim_consumed: nothing is
  // launched.
  [[nodiscard]] Result<> record_authorized(std::string const& execution_id,
                                           core::ExecutionIdentity const& identity,
                                           core::ExecutionPlan const& plan,
                                           std::string const& plan_digest) override;
  // With a loop: the same job queued (Registry::record_authorized_async) and committed by the
  // commit thread, its completion posted to the loop. Without: record_authorized.
  void record_authorized_async(std::string const& execution_id,
                               core::ExecutionIdentity const& identity,
                               core::ExecutionPlan const& plan, std::string const& plan_digest,
                               std::function<void(Result<>)> done) override;
  [[nodiscard]] Result<> record_staged(std::string const& execution_id,
                                       sys::PidfsIdentity const& identity, Boundary boundary,
                                       std::string const& cgroup_path,
                                       std::string const& marker_value) override;
  // With a loop: Registry::record_staged_async, committed by the flush thread (with whatever
  // else is queued), its completion posted to the loop. Without: record_staged.
  void record_staged_async(std::string const& execution_id, sys::PidfsIdentity const& identity,
                           Boundary boundary, std::string const& cgroup_path,
                           std::string const& marker_value,
                           std::function<void(Result<>)> done) override;
  // Registry::await_durable(): every group commit so far (this execution's claim among them)
  // is on stable storage.
  [[nodiscard]] Result<> make_durable(std::string const& execution_id) override;
  // With a loop: Registry::when_durable, its completion posted to the loop. Without: make_durable.
  void when_durable(std::string const& execution_id, std::function<void(Result<>)> done) override;
  [[nodiscard]] Result<> record_committed(std::string const& execution_id) override;
  // With a loop: committed + running as one queued change (Registry::record_running_async),
  // committed by the flush thread; the supervisor's record_phase(running) right after is then
  // already done. Without: record_committed.
  void record_committed_async(std::string const& execution_id,
                              std::function<void(Result<>)> done) override;
  [[nodiscard]] Result<> record_phase(std::string const& execution_id, core::Phase phase) override;
  [[nodiscard]] Result<> record_trigger(std::string const& execution_id,
                                        core::Trigger trigger) override;
  [[nodiscard]] Result<> record_output(std::string const& execution_id, StreamId stream,
                                       core::StreamAccounting const& accounting) override;
  // Also reports (as its error) the first refusal of a deferred write of this execution; the
  // terminal record itself is written either way.
  [[nodiscard]] Result<> record_terminal(std::string const& execution_id,
                                         core::TerminalRecord const& record) override;
  // With a loop: queued (Registry::record_terminal_async) and committed by the flush thread
  // with the deferred writes before it; `done` runs on the loop once it is in the WAL, with the
  // same result record_terminal would give. Without a loop: record_terminal, then `done`.
  void record_terminal_async(std::string const& execution_id, core::TerminalRecord const& record,
                             std::function<void(Result<>)> done) override;

  // Commits whatever is deferred now (the posted handler does the same).
  [[nodiscard]] Result<> flush();

 private:
  [[nodiscard]] registry::WriteMode deferrable() const noexcept {
    return loop_ != nullptr ? registry::WriteMode::deferred : registry::WriteMode::now;
  }
  // `done` as a handler of the loop: a registry completion (called on whichever thread
  // committed) always answers through the loop, never from inside another write.
  [[nodiscard]] std::function<void(Result<>)> on_loop(std::function<void(Result<>)> done) const;
  // record_terminal's answer from the write's result and this execution's deferred refusals.
  [[nodiscard]] Result<> terminal_result(std::string const& execution_id, Result<> written);
  // Wakes the flush thread (starting it the first time) unless a flush is requested already.
  // `now`: a write someone waits for (a completion hangs on it): committed at once. `lazy`: a
  // write nobody waits for (phases after running, output accounting): committed with the next
  // urgent write, or after kLazyFlushBound at the latest.
  enum class Urgency { now, lazy };
  void schedule_flush(Urgency urgency);
  void flush_thread_main();

  registry::Registry* registry_;
  boost::asio::io_context* loop_;
  // Executions whose `running` was written with their committed slot.
  std::set<std::string, std::less<>> running_recorded_;
  // The flush thread: commits the deferred writes while the loop goes on. The registry
  // serializes it with the loop's immediate writes (one write queue, FIFO), so a deferred
  // write still commits before, or in the same transaction as, any immediate write queued
  // after it.
  std::mutex flush_mu_;
  std::condition_variable flush_cv_;
  bool flush_urgent_ = false;
  std::optional<std::chrono::steady_clock::time_point> lazy_due_;  // a lazy write is queued
  bool flush_stop_ = false;
  std::thread flush_thread_;
};

}  // namespace custos::supervisor
