// RegistrySink: the OwnershipSink backed by the SQLite registry — the wiring the daemon passes
// in ManagerConfig::sink. The registry decides durability (the claim is on stable storage before
// the barrier release, through its flusher's fdatasync; ownership and phases survive a daemon
// crash) and fires its crash failpoints (docs/durability.md).
//
// With an event loop the loop makes no transaction of its own but record_trigger's: every write
// is queued and committed by the sink's commit thread ("custos-commit", SCHED_BATCH), in one
// transaction shared by every execution's queued writes (docs/durability.md, "What each write
// must survive"). A write somebody waits for wakes it at the end of the loop's turn (below) and
// is told through a completion posted to the loop, after its COMMIT; a lazy one rides with the next
// of those, or waits kLazyFlushBound at most:
//   record_authorized_async  claim + record, group durability; the launch creates
//                            nothing before its completion                      completion
//   when_durable             that fdatasync (the registry's flusher): before the
//                            barrier release and before any outcome is reported   at once, or
//                                                                                 completion
//   phase starting           deferred: record_staged commits it, in its job        deferred
//   record_staged_async      the barrier is released only from its completion     completion
//   record_committed_async   with phase running, one change; the start is answered
//                            only from its completion (running: already done)    completion
//   record_trigger           before the graceful signal (recovery classifies by it) now
//   phases stopping, exited, closed; output accounting                            lazy
//   record_terminal_async    commits everything queued before it; its completion
//                            tells waiters, once it is in the WAL                  completion
//
// One execution at a time (set_solo_probe): the hand-off to the commit thread and the
// completion's way back are two cross-CPU wake-ups per write, most of its latency on an
// otherwise idle daemon. Then the loop commits a write somebody waits for itself, when no other
// thread is committing (Registry::try_flush: it never waits for one); the completion still
// comes as a handler of the loop. Under load, the commit thread batches as above, and is woken
// once per turn of the loop (a handler posted behind the turn's handlers), not once per write:
// every urgent write the turn queued is then one transaction.
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
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

  // `registry` must outlive the sink (the daemon owns both). `loop`: the event loop the manager
  // runs on, where every completion is delivered; writes that gate nothing are queued and
  // committed by the sink's commit thread (started with the first of them, joined by the
  // destructor).
  RegistrySink(registry::Registry& registry, boost::asio::io_context& loop) noexcept
      : registry_(&registry), loop_(&loop) {}
  ~RegistrySink() override;
  RegistrySink(RegistrySink const&) = delete;
  RegistrySink& operator=(RegistrySink const&) = delete;

  // consume_claim(action_id, process_id) + create the record (phase authorized), one job queued
  // (Registry::record_authorized_async), committed with Durability::group by the commit thread,
  // its completion posted to the loop. A claim that was ever consumed before is
  // registry.claim_consumed: nothing is launched.
  void record_authorized_async(std::string const& execution_id,
                               core::ExecutionIdentity const& identity,
                               core::ExecutionPlan const& plan, std::string const& plan_digest,
                               std::function<void(Result<>)> done) override;
  // Registry::record_staged_async, committed by the commit thread (with whatever else is
  // queued), its completion posted to the loop.
  void record_staged_async(std::string const& execution_id, sys::PidfsIdentity const& identity,
                           StagedBoundary const& boundary,
                           std::function<void(Result<>)> done) override;
  // The group commit of this execution's claim on stable storage (not those other launches made
  // since): `done` at once when it is durable already (the usual case: the fsync ran while the
  // root was created); else Registry::when_durable(execution_id), its completion posted to the
  // loop.
  void when_durable(std::string const& execution_id, std::function<void(Result<>)> done) override;
  // Committed + running as one queued change (Registry::record_running_async), committed by the
  // commit thread; the supervisor's record_phase(running) right after is then already done.
  void record_committed_async(std::string const& execution_id,
                              std::function<void(Result<>)> done) override;
  [[nodiscard]] Result<> record_phase(std::string const& execution_id, core::Phase phase) override;
  [[nodiscard]] Result<> record_trigger(std::string const& execution_id,
                                        core::Trigger trigger) override;
  [[nodiscard]] Result<> record_output(std::string const& execution_id, StreamId stream,
                                       core::StreamAccounting const& accounting) override;
  // Queued (Registry::record_terminal_async) and committed by the commit thread with the
  // deferred writes before it; `done` runs on the loop once it is in the WAL. Its result also
  // reports the first refusal of a deferred write of this execution; the terminal record itself
  // is written either way. Reached as record.recovery says: observed, or live_owned for an
  // execution adopted after a restart (its record continues from the phase it was in).
  void record_terminal_async(std::string const& execution_id, core::TerminalRecord const& record,
                             std::function<void(Result<>)> done) override;

  // Commits whatever is deferred now (the commit thread does the same).
  [[nodiscard]] Result<> flush();

  // Tells the sink whether the loop has at most one execution in flight (the daemon: the
  // manager's live count). While it says so, writes somebody waits for are committed on the
  // loop when the registry is free. Unset: always the commit thread. Set before the first
  // write; called on the loop.
  void set_solo_probe(std::function<bool()> probe) { solo_ = std::move(probe); }

 private:
  // `done` as a handler of the loop: a registry completion (called on whichever thread
  // committed) always answers through the loop, never from inside another write.
  [[nodiscard]] std::function<void(Result<>)> on_loop(std::function<void(Result<>)> done) const;
  // record_terminal's answer from the write's result and this execution's deferred refusals.
  [[nodiscard]] Result<> terminal_result(std::string const& execution_id, Result<> written);
  // Has a queued write committed. `now`: a write someone waits for (a completion hangs on
  // it): alone (the solo probe), on the loop at once; else by the commit thread, woken at the
  // end of this turn of the loop, with every write queued until then. `lazy`: a write nobody
  // waits for (phases after running, output accounting): committed with the next urgent
  // write, or after kLazyFlushBound at the latest.
  enum class Urgency { now, lazy };
  void schedule_flush(Urgency urgency);
  // Wakes the commit thread (starting it the first time) unless a flush is requested already.
  void wake_commit_thread(Urgency urgency);
  void flush_thread_main();

  registry::Registry* registry_;
  boost::asio::io_context* loop_;
  std::function<bool()> solo_;
  // The wake posted to the loop for this turn's urgent writes. Shared with that handler, which
  // may outlive the sink (the destructor clears `sink`); touched only on the loop thread.
  struct Turn {
    RegistrySink* sink;
    bool wake_posted = false;
  };
  std::shared_ptr<Turn> turn_ = std::make_shared<Turn>(Turn{this});
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
