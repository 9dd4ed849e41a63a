// One container execution (private to the container backends): the gated exec from its creation
// to its last handle. The engine half (create, start, the hijacked stream, resize) is here; the
// tree half — signal, kill, tree state, final scan, sampling — is a native execution that took
// the gate's pidfd over (NativeExecution::adopt with after_restart false), so both backends end
// a tree with the same code.
//
// Concurrency: everything runs on the daemon's single loop thread. Every asynchronous operation
// started once the port is known (the stream, a resize, the container check at the root's exit)
// is counted with ExecutionPort::task_begun/task_ended.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/steady_timer.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/container.hpp"
#include "custos/engine/client.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::backend {

class ContainerExecution final : public BackendExecution,
                                 public ExecutionPort,
                                 public std::enable_shared_from_this<ContainerExecution> {
 public:
  ContainerExecution(ContainerBackend& host, std::string execution_id);
  ~ContainerExecution() override;
  ContainerExecution(ContainerExecution const&) = delete;
  ContainerExecution& operator=(ContainerExecution const&) = delete;

  // BackendExecution
  void acquire(LaunchContext const& ctx, std::function<void(Step<Acquired>)> done) override;
  void release(std::function<void(Step<std::monostate>)> done) override;
  void abort() override;
  [[nodiscard]] core::Cleanup abort_cleanup() const override {
    return discard_unconfirmed_.empty() ? core::Cleanup::confirmed : core::Cleanup::unconfirmed;
  }
  void start(ExecutionPort& port) override;
  // After a daemon restart the tree is taken over as a native one. After a crash the engine's
  // stream died with the previous daemon (no output kept); after a handover ctx.stdio carries
  // the stream's connection and state, and output and input go on (container_handover.cpp).
  [[nodiscard]] Result<Acquired> adopt(AdoptContext ctx) override;
  // A handover: the engine connection, released with where its stream stands, and what the next
  // image needs to go on (the exec, the container and its init's identity).
  [[nodiscard]] std::optional<CarriedStdio> hand_over_stdio() override;

  [[nodiscard]] bool has_input() const noexcept override;
  [[nodiscard]] InputWrite write_input(std::span<std::uint8_t const> bytes) override;
  void await_input_writable() override;
  void close_input(bool eof) override;
  [[nodiscard]] Result<> resize(std::uint16_t rows, std::uint16_t cols) override;

  [[nodiscard]] std::uint32_t signal_tree(int sig) override { return tree_->signal_tree(sig); }
  [[nodiscard]] std::uint32_t kill_tree() override { return tree_->kill_tree(); }
  [[nodiscard]] TreeState tree_state() const override { return tree_->tree_state(); }
  [[nodiscard]] bool root_gone() const noexcept override { return tree_->root_gone(); }
  bool watch_tree() override { return tree_->watch_tree(); }
  void unwatch_tree() override { tree_->unwatch_tree(); }
  void final_scan(std::function<void(FinalScan)> done) override;
  [[nodiscard]] Usage sample() override { return tree_->sample(); }
  // The workspace is the container's: no disk measurement (admission refuses a disk limit).
  bool measure_disk(std::function<void(std::optional<std::uint64_t>)> done) override {
    (void)done;
    return false;
  }
  [[nodiscard]] std::vector<core::Stream> close_streams() override;
  void close() override;
  void detach() override;
  [[nodiscard]] core::Observations observations() const override;

  // ExecutionPort, as the tree half's port: everything goes to the supervisor's, except the
  // root's exit, which first asks whether the container itself went away.
  void on_output(core::Stream stream, std::span<std::uint8_t const> bytes) override;
  void on_stream_end(core::Stream stream, bool complete) override;
  void on_root_exit(std::optional<core::ExitStatus> status) override;
  void on_tree_change() override { port_->on_tree_change(); }
  void on_input_writable() override { port_->on_input_writable(); }
  void on_backend_failure(std::string reason) override {
    port_->on_backend_failure(std::move(reason));
  }
  void on_usage_changed() override { port_->on_usage_changed(); }
  void on_sandbox_denied(std::string control, std::string detail) override {
    port_->on_sandbox_denied(std::move(control), std::move(detail));
  }
  void task_begun() override { port_->task_begun(); }
  void task_ended() override { port_->task_ended(); }

 private:
  // The launch between acquire's first call and its answer.
  struct Launching {
    LaunchContext ctx;
    std::function<void(Step<Acquired>)> done;
    std::string container_id;
    engine::ContainerProcess init;  // the container's init, as the host sees it
    std::chrono::steady_clock::time_point gate_deadline;
    bool unreadable = false;  // the candidate's environ was refused to the daemon (EACCES)
    // Ungated: the release's answer, and when the exec was started (clock ticks since boot).
    std::function<void(Step<std::monostate>)> release_done;
    std::uint64_t start_ticks = 0;
    boost::asio::steady_timer timer;
    explicit Launching(boost::asio::io_context& io) : timer(io) {}
  };

  void on_inspected(Result<engine::ContainerInfo> info);
  void on_created(Result<std::string> exec_id);
  void on_started(Result<std::shared_ptr<engine::ExecStream>> stream);
  void poll_gate();
  void on_exec_inspected(Result<engine::ExecInspect> inspect);
  // One look at the process the engine named: the gate (enter the boundary and answer), not yet
  // (look again, up to the deadline), or never (fail).
  void gate_step(std::int32_t pid);
  // The pid the engine named is the gate: pidfd, marker, PID namespace, stopped. nullopt: not
  // yet (look again); an error: never.
  [[nodiscard]] Result<bool> check_gate(std::int32_t pid);
  [[nodiscard]] Step<Acquired> enter_boundary();
  [[nodiscard]] Result<std::optional<sys::CgroupDir>> make_cgroup(std::string& placement);
  void start_exec();
  // Ungated (plan gate optional, no gate in the container): container_execution.cpp explains.
  void answer_ungated_acquire();
  void release_ungated(std::function<void(Step<std::monostate>)> done);
  void on_ungated_inspected(Result<engine::ExecInspect> inspect);
  void enter_ungated(std::optional<sys::Pidfd> root);
  void fail(std::string step, Error const& e);
  // Drops whatever of the exec exists (the gate through its pidfd, a marker sweep of the
  // container's namespace, the stream, the cgroup).
  void discard();
  void deliver(engine::StdStream stream, std::span<std::uint8_t const> bytes);
  // adopt() with what a handover carried: the exec's facts, and its stream resumed.
  void take_carried(CarriedStdio carried, core::ExecutionPlan const& plan, PlanView const& view);
  [[nodiscard]] bool container_went_away() const;

  ContainerBackend* host_;
  boost::asio::io_context& io_;
  std::string id_;
  engine::EngineKind engine_;
  ExecutionPort* port_ = nullptr;
  bool detached_ = false;

  std::shared_ptr<engine::Client> client_;
  std::unique_ptr<Launching> launching_;
  std::optional<sys::Marker> marker_;
  std::string exec_id_;
  std::string container_id_;
  // The engine's hijacked stream: the exec's output and input.
  struct Io {
    std::shared_ptr<engine::ExecStream> stream;
    bool tty = false;
    std::size_t chunk_bytes = 65536;
    bool open = false;           // output still reported (not ended, not closed at its bound)
    bool input_waiting = false;  // one await_writable at a time
  };
  Io io_state_;
  std::optional<sys::Pidfd> candidate_;  // the process the engine named, not yet verified
  std::optional<sys::Pidfd> gate_;       // the verified gate, kept for its release (SIGCONT)
  std::optional<sys::Pidfd> init_;       // the container's init: its end is the container's
  std::uint64_t pid_ns_ = 0;
  std::optional<sys::CgroupDir> cgroup_;  // made here, handed to the tree half by path
  std::string placement_;                 // "container", "daemon" or "" (marker)
  std::shared_ptr<BackendExecution> tree_;
  bool released_ = false;
  bool ungated_ = false;       // started without the gate (see answer_ungated_acquire)
  bool exec_started_ = false;  // the engine was asked to start the exec
  bool root_unseen_ = false;   // ungated: the program ended before it was identified
  bool backend_failed_ = false;
  bool observed_engine_exit_ = false;  // the exit code is the engine's (no PIDFD_INFO_EXIT)
  std::string discard_unconfirmed_;    // why an aborted launch's cleanup cannot be confirmed
  // Carried across a handover: the container's init did not re-identify (it ended meanwhile);
  // why the carried stream could not go on (its streams then end incomplete).
  bool carried_ = false;  // adopted with what a handover carried (take_carried)
  bool init_gone_ = false;
  std::string handover_lost_;
};

}  // namespace custos::backend
