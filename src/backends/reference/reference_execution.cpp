#include "reference_execution.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <csignal>
#include <variant>

#include "custos/sandbox/controls.hpp"

namespace custos::backend {
namespace {

// Bytes a model's stdin holds that no read_stdin asked for yet: the model is a reader like any
// other, and a pipe holds at most this much before its writer would block. Beyond it the model
// takes nothing more (would_block), exactly like a full pipe.
constexpr std::uint64_t kModelPipeBytes = std::uint64_t{64} * 1024;

}  // namespace

ReferenceExecution::ReferenceExecution(boost::asio::io_context& io, std::string execution_id)
    : io_(io), id_(std::move(execution_id)), sleep_(io) {}

ReferenceExecution::~ReferenceExecution() {
  detach();
}

void ReferenceExecution::acquire(LaunchContext const& ctx,
                                 std::function<void(Step<Acquired>)> done) {
  if (ctx.plan == nullptr || !ctx.plan->backend.script) {
    return done(core::SpawnFailure{"script", 0, "a reference plan carries its script"});
  }
  script_ = *ctx.plan->backend.script;
  if (ctx.sandbox != nullptr) sandbox_ = ctx.sandbox->policy;
  chunk_bytes_ = static_cast<std::size_t>(std::max<std::uint64_t>(ctx.view->chunk_bytes, 1));
  pty_mode_ = ctx.view->pty;
  Acquired a;
  a.boundary = core::Boundary::reference;
  // Nothing of a model can leave it, but no kernel holds it either: it claims no containment.
  a.kernel_enforced = false;
  done(a);
}

void ReferenceExecution::release(std::function<void(Step<std::monostate>)> done) {
  done(std::monostate{});
}

void ReferenceExecution::abort() {
  root_alive_ = false;
  root_reported_ = true;
  descendants_ = 0;
  streams_open_ = false;
}

void ReferenceExecution::start(ExecutionPort& port) {
  port_ = &port;
  resume_later();  // the script runs as handlers of the loop, after the start is told
}

void ReferenceExecution::post_task(std::function<void()> fn) {
  if (!live()) return;
  port_->task_begun();
  boost::asio::post(io_, [self = shared_from_this(), fn = std::move(fn)] {
    if (!self->live()) return;
    fn();
    self->port_->task_ended();
  });
}

void ReferenceExecution::resume_later() {
  post_task([this] { run(); });
}

// ------------------------------------------------------------------------------ the script

void ReferenceExecution::run() {
  while (live() && root_alive_ && !sleeping_ && !waiting_for_stdin_) {
    if (next_ >= script_.steps.size()) {
      auto const end = core::script_end(script_);
      if (auto const* e = std::get_if<core::script::Exit>(&end)) {
        end_root(core::ExitStatus::exited(e->code));
      } else {
        end_root(core::ExitStatus::signaled(
            static_cast<std::int32_t>(std::get<core::script::Signal>(end).signal)));
      }
      return;
    }
    auto const& step = script_.steps[next_++];
    ++steps_run_;
    if (auto const* w = std::get_if<core::script::Write>(&step)) {
      write(*w);
    } else if (auto const* s = std::get_if<core::script::Sleep>(&step)) {
      sleeping_ = true;
      port_->task_begun();
      sleep_.expires_after(std::chrono::milliseconds(s->ms));
      sleep_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        self->sleeping_ = false;
        if (!self->live()) return;
        if (!ec) self->run();
        self->port_->task_ended();
      });
    } else if (auto const* sp = std::get_if<core::script::Spawn>(&step)) {
      if (spawn_denied(sp->count)) return;
      descendants_ += sp->count;
      usage_.processes = 1 + descendants_;
      port_->on_usage_changed();
    } else if (auto const* ig = std::get_if<core::script::Ignore>(&step)) {
      ignored_.insert(ig->signal);
    } else if (auto const* u = std::get_if<core::script::Use>(&step)) {
      if (u->cpu_ms) usage_.cpu_ms = std::max(usage_.cpu_ms.value_or(0), *u->cpu_ms);
      if (u->memory_bytes)
        usage_.rss_bytes = std::max(usage_.rss_bytes.value_or(0), *u->memory_bytes);
      if (u->descriptors) usage_.open_fds = std::max(usage_.open_fds.value_or(0), *u->descriptors);
      if (u->disk_bytes)
        usage_.disk_bytes = std::max(usage_.disk_bytes.value_or(0), *u->disk_bytes);
      port_->on_usage_changed();
    } else if (auto const* r = std::get_if<core::script::ReadStdin>(&step)) {
      waiting_for_stdin_ = r->bytes;
      // Consumed at once from what already arrived, else when more arrives (write_input).
      std::uint64_t const take = std::min(*waiting_for_stdin_, stdin_available_);
      stdin_available_ -= take;
      stdin_read_ += take;
      *waiting_for_stdin_ -= take;
      if (*waiting_for_stdin_ == 0 || stdin_ended_) waiting_for_stdin_.reset();
      if (take > 0) port_->on_input_writable();  // room again for the supervisor's queue
    } else if (auto const* e = std::get_if<core::script::Exit>(&step)) {
      return end_root(core::ExitStatus::exited(e->code));
    } else if (auto const* sg = std::get_if<core::script::Signal>(&step)) {
      return end_root(core::ExitStatus::signaled(static_cast<std::int32_t>(sg->signal)));
    }
  }
}

bool ReferenceExecution::spawn_denied(std::uint64_t count) {
  if (!sandbox_) return false;
  auto const& process = sandbox_->process;
  if (!process.descendants) {
    deny(sandbox::control::process_no_descendants,
         "spawn " + std::to_string(count) + " with descendants: false");
    return true;
  }
  std::uint64_t const tree = 1 + descendants_ + count;
  if (tree > process.max_processes) {
    deny(sandbox::control::process_max_processes,
         "spawn " + std::to_string(count) + ": the tree would hold " + std::to_string(tree) +
             " processes, max_processes is " + std::to_string(process.max_processes));
    return true;
  }
  return false;
}

void ReferenceExecution::deny(std::string_view control, std::string detail) {
  denied_ = std::string{control};
  port_->on_sandbox_denied(std::string{control}, std::move(detail));
  end_root(core::ExitStatus::signaled(SIGSYS));
}

void ReferenceExecution::write(core::script::Write const& w) {
  if (!streams_open_) return;  // the root writes into a closed stream: nothing arrives
  core::Stream const stream = pty_mode_ ? core::Stream::pty
                              : w.stream == core::ScriptStream::stderr_stream
                                  ? core::Stream::stderr_stream
                                  : core::Stream::stdout_stream;
  std::span<std::uint8_t const> rest(w.data);
  while (!rest.empty() && live()) {
    auto const n = std::min(rest.size(), chunk_bytes_);
    port_->on_output(stream, rest.first(n));
    rest = rest.subspan(n);
  }
}

void ReferenceExecution::end_root(core::ExitStatus status) {
  if (!root_alive_) return;
  root_alive_ = false;
  sleep_.cancel();
  waiting_for_stdin_.reset();
  // The streams end first when nothing else of the tree holds them (the order a native root's
  // EOF and exit have when it is the last writer), then the exit is reported.
  maybe_end_streams();
  post_task([this, status] {
    root_reported_ = true;
    port_->on_root_exit(status);
    if (watched_ && tree_state() == TreeState::empty) port_->on_tree_change();
  });
}

void ReferenceExecution::end_tree(int sig) {
  descendants_ = 0;
  end_root(core::ExitStatus::signaled(sig));
  maybe_end_streams();
}

void ReferenceExecution::maybe_end_streams() {
  if (!streams_open_ || root_alive_ || descendants_ > 0 || !live()) return;
  streams_open_ = false;
  if (pty_mode_) {
    port_->on_stream_end(core::Stream::pty, true);
  } else {
    port_->on_stream_end(core::Stream::stdout_stream, true);
    port_->on_stream_end(core::Stream::stderr_stream, true);
  }
  if (watched_ && root_reported_) port_->on_tree_change();
}

// ------------------------------------------------------------------------------ input

InputWrite ReferenceExecution::write_input(std::span<std::uint8_t const> bytes) {
  InputWrite w;
  if (!root_alive_ && descendants_ == 0) {
    w.closed = true;  // nothing reads: a closed pipe
    return w;
  }
  std::uint64_t n = bytes.size();
  if (waiting_for_stdin_) {
    std::uint64_t const take = std::min(n, *waiting_for_stdin_);
    *waiting_for_stdin_ -= take;
    stdin_read_ += take;
    w.written += take;
    n -= take;
    if (*waiting_for_stdin_ == 0) {
      waiting_for_stdin_.reset();
      resume_later();
    }
  }
  std::uint64_t const room =
      kModelPipeBytes > stdin_available_ ? kModelPipeBytes - stdin_available_ : 0;
  std::uint64_t const buffered = std::min(n, room);
  stdin_available_ += buffered;
  w.written += buffered;
  w.would_block = buffered < n;
  return w;
}

void ReferenceExecution::close_input(bool eof) {
  (void)eof;
  stdin_ended_ = true;
  if (waiting_for_stdin_) {
    waiting_for_stdin_.reset();  // the read returns short, at end of file
    resume_later();
  }
}

Result<> ReferenceExecution::resize(std::uint16_t rows, std::uint16_t cols) {
  if (!pty_mode_) return Error(Errc::exec_not_pty, id_);
  if (rows == 0 || cols == 0) return Error(Errc::plan_invalid_value, "rows and cols are >= 1");
  return ok();
}

// ------------------------------------------------------------------------------ teardown

std::uint32_t ReferenceExecution::signal_tree(int sig) {
  std::uint32_t const targets = static_cast<std::uint32_t>((root_alive_ ? 1U : 0U) + descendants_);
  if (targets == 0) return 0;
  if (sig != SIGKILL && ignored_.contains(static_cast<std::uint32_t>(sig))) {
    ++ignored_deliveries_;
    return targets;  // delivered, and ignored by every process of the model
  }
  // The signal arrives after this call returns, as a real one does after kill(2).
  post_task([this, sig] { end_tree(sig); });
  return targets;
}

std::uint32_t ReferenceExecution::kill_tree() {
  std::uint32_t const targets = static_cast<std::uint32_t>((root_alive_ ? 1U : 0U) + descendants_);
  if (targets > 0) post_task([this] { end_tree(SIGKILL); });
  return targets;
}

TreeState ReferenceExecution::tree_state() const {
  return root_reported_ && !root_alive_ && descendants_ == 0 ? TreeState::empty
                                                             : TreeState::populated;
}

bool ReferenceExecution::watch_tree() {
  watched_ = live();
  return watched_;
}

void ReferenceExecution::final_scan(std::function<void(FinalScan)> done) {
  post_task([this, done = std::move(done)] {
    FinalScan scan;
    if (tree_state() != TreeState::empty)
      scan.unconfirmed.push_back("the model's tree did not end");  // cannot happen after a kill
    scan.usage = usage_;
    done(std::move(scan));
  });
}

// ------------------------------------------------------------------------------ resources

Usage ReferenceExecution::sample() {
  Usage u = usage_;
  u.processes = (root_alive_ ? 1U : 0U) + descendants_;
  if (usage_.processes) u.processes = std::max(*u.processes, *usage_.processes);
  return u;
}

bool ReferenceExecution::measure_disk(std::function<void(std::optional<std::uint64_t>)> done) {
  (void)done;
  return false;  // the model reports disk use with its other usage
}

// ------------------------------------------------------------------------------ close

std::vector<core::Stream> ReferenceExecution::close_streams() {
  if (!streams_open_) return {};
  streams_open_ = false;
  if (pty_mode_) return {core::Stream::pty};
  return {core::Stream::stdout_stream, core::Stream::stderr_stream};
}

void ReferenceExecution::close() {
  sleep_.cancel();
}

void ReferenceExecution::detach() {
  if (detached_) return;
  detached_ = true;
  port_ = nullptr;
  sleep_.cancel();
}

core::Observations ReferenceExecution::observations() const {
  core::Observations o;
  o["model"] = "reference";
  o["steps_run"] = std::to_string(steps_run_);
  if (stdin_read_ > 0) o["stdin_read"] = std::to_string(stdin_read_);
  if (ignored_deliveries_ > 0) o["signals_ignored"] = std::to_string(ignored_deliveries_);
  if (sandbox_) o["sandbox"] = denied_ ? "denied" : "enforced";
  return o;
}

// ------------------------------------------------------------------------------ the backend

Descriptor ReferenceBackend::descriptor() const {
  Descriptor d;
  d.kind = core::BackendKind::reference;
  d.available = true;
  for (std::string name : {"boundary.reference", "io.pipes", "io.pty"}) {
    d.add(std::move(name), ControlFidelity::hard, "the model");
  }
  // Every control a checked sandbox plan can need (the resource dimensions included): the
  // model enforces each exactly as its plan says.
  for (auto& name : sandbox::all_controls()) {
    d.add(std::move(name), ControlFidelity::hard, "the model");
  }
  return d;
}

Admission ReferenceBackend::admit(core::ExecutionPlan const& plan) const {
  Admission a;
  if (plan.backend.kind != core::BackendKind::reference || !plan.backend.script) {
    a.admitted = false;
    a.missing.emplace_back("backend.script");
    a.detail = "the reference backend runs reference plans with a script";
  }
  return a;
}

std::shared_ptr<BackendExecution> ReferenceBackend::create(std::string execution_id) {
  return std::make_shared<ReferenceExecution>(io_, std::move(execution_id));
}

}  // namespace custos::backend
