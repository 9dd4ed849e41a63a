// One reference execution: the scripted model of a process tree (private to the reference
// backend; the model's rules are in custos/backend/reference.hpp).
//
// Concurrency: everything runs on the daemon's loop. Every step that waits (a sleep, a stdin
// read) and every delivery the model schedules (a signal's effect, the final scan's answer) is
// a counted task of the ExecutionPort, so the supervisor closes only once each completed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/reference.hpp"
#include "custos/core/plan.hpp"

namespace custos::backend {

class ReferenceExecution final : public BackendExecution,
                                 public std::enable_shared_from_this<ReferenceExecution> {
 public:
  ReferenceExecution(boost::asio::io_context& io, std::string execution_id);
  ~ReferenceExecution() override;
  ReferenceExecution(ReferenceExecution const&) = delete;
  ReferenceExecution& operator=(ReferenceExecution const&) = delete;

  void acquire(LaunchContext const& ctx, std::function<void(Step<Acquired>)> done) override;
  void release(std::function<void(Step<std::monostate>)> done) override;
  void abort() override;
  void start(ExecutionPort& port) override;

  [[nodiscard]] bool has_input() const noexcept override { return true; }
  [[nodiscard]] InputWrite write_input(std::span<std::uint8_t const> bytes) override;
  void await_input_writable() override {}  // the model never blocks its writer
  void close_input(bool eof) override;
  [[nodiscard]] Result<> resize(std::uint16_t rows, std::uint16_t cols) override;

  [[nodiscard]] std::uint32_t signal_tree(int sig) override;
  [[nodiscard]] std::uint32_t kill_tree() override;
  [[nodiscard]] TreeState tree_state() const override;
  [[nodiscard]] bool root_gone() const noexcept override { return root_reported_; }
  bool watch_tree() override;
  void unwatch_tree() override { watched_ = false; }
  void final_scan(std::function<void(FinalScan)> done) override;

  [[nodiscard]] Usage sample() override;
  bool measure_disk(std::function<void(std::optional<std::uint64_t>)> done) override;

  [[nodiscard]] std::vector<core::Stream> close_streams() override;
  void close() override;
  void detach() override;
  [[nodiscard]] core::Observations observations() const override;

 private:
  // Runs steps from `next_` until one waits or the script ends.
  void run();
  // Schedules run() as a counted handler of the loop (after a wait, or to yield).
  void resume_later();
  void write(core::script::Write const& w);
  // Whether the checked sandbox plan denies spawning `count` more; if so the denial is reported
  // and the root ended (true).
  bool spawn_denied(std::uint64_t count);
  void deny(std::string_view control, std::string detail);
  // The root ends: with the script's end, or by a signal. Reported to the port as a handler.
  void end_root(core::ExitStatus status);
  // Every process of the tree ends (a signal not ignored, or SIGKILL).
  void end_tree(int sig);
  // The streams end once nothing of the tree holds them.
  void maybe_end_streams();
  [[nodiscard]] bool live() const noexcept { return port_ != nullptr && !detached_; }
  // Posts `fn` as a counted task of the port.
  void post_task(std::function<void()> fn);

  boost::asio::io_context& io_;
  std::string id_;
  ExecutionPort* port_ = nullptr;
  bool detached_ = false;
  core::ReferenceScript script_;
  std::optional<sandbox::SandboxPolicy> sandbox_;  // the checked plan's policy; none: unsandboxed
  std::optional<std::string> denied_;              // the control that denied, once one did
  std::size_t chunk_bytes_ = 65536;
  bool pty_mode_ = false;
  std::size_t next_ = 0;  // the next step to run
  std::uint64_t steps_run_ = 0;
  bool root_alive_ = true;      // the modelled root has not ended
  bool root_reported_ = false;  // its end was reported to the port
  std::uint64_t descendants_ = 0;
  bool streams_open_ = true;
  std::set<std::uint32_t> ignored_;
  std::uint32_t ignored_deliveries_ = 0;  // signals the model ignored
  std::uint64_t stdin_available_ = 0;     // arrived and not yet read
  std::uint64_t stdin_read_ = 0;
  bool stdin_ended_ = false;
  std::optional<std::uint64_t> waiting_for_stdin_;  // bytes the current read_stdin still needs
  boost::asio::steady_timer sleep_;
  bool sleeping_ = false;
  bool watched_ = false;
  Usage usage_;
  std::optional<std::uint64_t> disk_bytes_;
};

}  // namespace custos::backend
