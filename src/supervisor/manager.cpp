#include "custos/supervisor/manager.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <signal.h>
#include <string_view>
#include <system_error>
#include <unistd.h>

#include "custos/backend/container.hpp"
#include "custos/backend/plan_view.hpp"
#include "custos/backend/reference.hpp"
#include "custos/sys/openat2.hpp"
#include "custos/sys/procfs.hpp"
#include "custos/sys/subreaper.hpp"

#include "supervisor.hpp"

namespace custos::supervisor {
namespace {

constexpr std::chrono::milliseconds kShutdownPoll{10};

}  // namespace

Result<std::string> new_execution_id() {
  // 64 random bits, from the same getrandom source as markers: ids must not be guessable
  // sequence numbers (they name executions across restarts).
  auto m = sys::Marker::generate();
  if (!m) return m.error();
  return "ex-" + m->env_value().substr(0, 16);
}

std::map<std::string, std::string> environment_snapshot() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view const entry{*e};
    auto const eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out.emplace(std::string{entry.substr(0, eq)}, std::string{entry.substr(eq + 1)});
  }
  return out;
}

ExecutionManager::ExecutionManager(boost::asio::io_context& io, ManagerConfig config)
    : io_(io),
      config_(std::move(config)),
      reap_timer_(io),
      shutdown_timer_(io),
      alive_(std::make_shared<bool>(true)) {
  // A child that closed its stdin must turn our next write into EPIPE, not kill the daemon.
  // Children do not inherit this: sys/spawn resets every disposition before execve.
  (void)::signal(SIGPIPE, SIG_IGN);
  if (config_.become_subreaper) (void)sys::become_child_subreaper();
  guard_state_dir_ = !config_.state_dir.empty();
  if (config_.state_dir.empty()) {
    std::error_code ec;
    config_.state_dir = std::filesystem::temp_directory_path(ec) /
                        ("custos-supervisor-" + std::to_string(::getpid()));
  }
  if (!config_.inherit_source) config_.inherit_source = environment_snapshot();
  backend::NativeConfig native;
  native.cgroup_subtree = config_.cgroup_subtree;
  native.boundary = config_.boundary;
  native.detect_nsdelegate = config_.detect_nsdelegate;
  native.nsdelegate = config_.nsdelegate;
  native.marker_sweep_rounds = config_.marker_sweep_rounds;
  native.disk_walk_max_entries = config_.disk_walk_max_entries;
  native.read_secret = config_.read_secret;
  if (guard_state_dir_) {
    // This daemon's instance: its state directory (locked, so one daemon at a time), hashed.
    native.instance =
        "d" +
        std::to_string(std::hash<std::string>{}(config_.state_dir.lexically_normal().native()));
  }
  auto n = std::make_unique<backend::NativeBackend>(io_, std::move(native));
  native_ = n.get();
  config_.nsdelegate = native_->config().nsdelegate;
  backends_.push_back(std::move(n));
  backends_.push_back(std::make_unique<backend::ReferenceBackend>(io_));
  for (auto const& [kind, socket] :
       {std::pair{engine::EngineKind::docker, config_.docker_socket},
        std::pair{engine::EngineKind::podman, config_.podman_socket}}) {
    backend::ContainerConfig c;
    c.engine = kind;
    c.socket = socket;
    c.boundary = config_.boundary;
    c.call_timeout = config_.engine_timeout;
    backends_.push_back(std::make_unique<backend::ContainerBackend>(io_, std::move(c), *native_));
  }
  schedule_reap();
}

ExecutionManager::~ExecutionManager() {
  *alive_ = false;
  reap_timer_.cancel();
  shutdown_timer_.cancel();
  for (auto& [id, sup] : executions_) sup->detach();
  answer_all_waits(Error(Errc::daemon_shutting_down, "supervision detached"));
  // The backends join their workers when destroyed, after the executions (declaration order).
}

ManagerStats const& ExecutionManager::stats() const {
  auto const sweeper = native_->sweeper_stats();
  stats_.final_sweep_requests = sweeper.requests;
  stats_.final_sweeps = sweeper.sweeps;
  return stats_;
}

backend::Backend* ExecutionManager::backend_for(core::BackendKind kind) const noexcept {
  for (auto const& b : backends_) {
    if (b->kind() == kind) return b.get();
  }
  return nullptr;
}

std::vector<backend::Descriptor> ExecutionManager::backends() const {
  std::vector<backend::Descriptor> out;
  out.reserve(backends_.size());
  for (auto const& b : backends_) out.push_back(b->descriptor());
  return out;
}

std::size_t ExecutionManager::live_count() const noexcept {
  // Counted, not scanned: start() asks for it on every launch, and the map also holds up to
  // terminal_history terminal executions.
  return executions_.size() - terminal_in_map_;
}

std::array<std::size_t, core::kPhaseCount> ExecutionManager::live_by_phase() const {
  std::array<std::size_t, core::kPhaseCount> out{};
  for (auto const& [id, sup] : executions_) {
    if (!sup->terminal() && sup->phase() != core::Phase::terminal) {
      ++out[static_cast<std::size_t>(sup->phase())];
    }
  }
  return out;
}

std::shared_ptr<Supervisor> ExecutionManager::find(std::string const& execution_id) const {
  auto it = executions_.find(execution_id);
  return it == executions_.end() ? nullptr : it->second;
}

bool ExecutionManager::is_direct_child(std::int32_t pid) const {
  if (spared_.contains(pid)) return true;
  for (auto const& b : backends_) {
    if (b->is_root(pid)) return true;
  }
  return false;
}

std::optional<std::string> ExecutionManager::owner_of(std::int32_t pid) const {
  for (auto const& b : backends_) {
    if (auto owner = b->owner_of(pid)) return owner;
  }
  return std::nullopt;
}

backend::Admission ExecutionManager::admission(core::ExecutionPlan const& plan,
                                               sandbox::CheckedSandboxPlan const* sandbox) const {
  auto const* b = backend_for(plan.backend.kind);
  backend::Admission a;
  if (b == nullptr) {
    a.admitted = false;
    a.missing.push_back("backend." + std::string{core::to_string(plan.backend.kind)});
    a.detail = "backend " + std::string{core::to_string(plan.backend.kind)} +
               " is not served by this daemon";
    return a;
  }
  a = b->admit(plan);
  if (sandbox == nullptr) return a;
  // Every control the checked plan needs, at fidelity hard on this host: the complete list of
  // what is missing, never a partial enforcement.
  auto sandbox_missing = sandbox::missing_controls(*sandbox, b->descriptor());
  if (sandbox_missing.empty()) return a;
  a.admitted = false;
  a.missing.insert(a.missing.end(), sandbox_missing.begin(), sandbox_missing.end());
  std::sort(a.missing.begin(), a.missing.end());
  a.missing.erase(std::unique(a.missing.begin(), a.missing.end()), a.missing.end());
  if (a.detail.empty()) a.detail = "the sandbox needs controls this backend lacks here";
  return a;
}

Result<> ExecutionManager::admit(LaunchRequest const& request) const {
  if (shutting_down_) return Error(Errc::daemon_shutting_down, "the manager is shutting down");
  auto const kind = request.plan.backend.kind;
  if (backend_for(kind) == nullptr) {
    return Error(Errc::sys_unsupported, std::string{"backend "} +
                                            std::string{core::to_string(kind)} +
                                            " is not served by this daemon");
  }
  CUSTOS_TRYV(sandbox::check_binding(request.plan, request.sandbox.get()));
  CUSTOS_TRYV(check_workspace(request.plan));
  auto const a = admission(request.plan, request.sandbox ? &request.sandbox->checked : nullptr);
  if (a.admitted) return ok();
  if (std::find(a.missing.begin(), a.missing.end(), "boundary.cgroup") != a.missing.end())
    return Error(Errc::cgroup_unavailable, a.detail);
  Error e = sandbox::unsupported(kind, a.missing);
  if (!a.detail.empty()) e.context += "; " + a.detail;
  return e;
}

namespace {

Error path_refusal(Errc code, std::string const& pointer, std::string message, int err = 0) {
  Error e(code, pointer + ": " + message, err);
  e.diagnostics.push_back(Diagnostic{code, pointer, std::move(message)});
  return e;
}

}  // namespace

Result<> ExecutionManager::check_workspace(core::ExecutionPlan const& plan) const {
  auto const kind = plan.backend.kind;
  if (kind == core::BackendKind::docker || kind == core::BackendKind::podman) return ok();
  auto ws = sys::open_directory(plan.workspace.root);
  if (!ws) return ok();  // the launch reports it, at its workspace step
  if (guard_state_dir_) {
    if (state_chain_.ids.empty()) {
      state_chain_ = CUSTOS_TRY(sys::dir_chain(config_.state_dir.native()));
    }
    if (CUSTOS_TRY(sys::at_or_above(ws->get(), state_chain_))) {
      return path_refusal(
          Errc::workspace_state_dir, "/plan/workspace/root",
          "'" + plan.workspace.root + "' is or contains the daemon's state directory");
    }
  }
  if (plan.cwd != ".") {
    auto cwd = sys::open_beneath(*ws, plan.cwd, true);
    if (!cwd && cwd.error().code == Errc::workspace_escape) {
      return path_refusal(Errc::workspace_escape, "/plan/cwd",
                          "'" + plan.cwd + "' resolves outside the workspace",
                          cwd.error().sys_errno);
    }
  }
  return ok();
}

bool ExecutionManager::asks_before_claim(core::ExecutionPlan const& plan) const noexcept {
  auto const* b = backend_for(plan.backend.kind);
  return b != nullptr && b->asks_before_claim();
}

void ExecutionManager::preflight(core::ExecutionPlan const& plan,
                                 std::function<void(Result<>)> done) {
  auto* b = backend_for(plan.backend.kind);
  if (b == nullptr) {
    return done(Error(Errc::sys_unsupported, std::string{"backend "} +
                                                 std::string{core::to_string(plan.backend.kind)} +
                                                 " is not served by this daemon"));
  }
  b->preflight(plan, std::move(done));
}

Result<std::shared_ptr<Supervisor>> ExecutionManager::prepare_start(LaunchRequest request,
                                                                    LaunchPermit permit) {
  CUSTOS_TRYV(admit(request));
  if (!permit.valid()) return Error(Errc::auth_denied, "launch permit is empty (already spent)");
  auto const& plan = request.plan;
  // The rule for callers whose authority nobody checked: a non-root caller runs only as itself.
  // The gateway checks `user` against the grant's run_as_uids before it mints the permit.
  if (!permit.user_checked() && plan.user && request.caller.uid != 0 &&
      (plan.user->uid != request.caller.uid || plan.user->gid != request.caller.gid)) {
    return Error(Errc::auth_user, "a non-root caller may only run as itself");
  }
  auto digest = backend::compute_plan_digest(request.identity, request.plan);
  if (!digest) return digest.error();
  // The permit authorizes one claim and one plan: anything else is not what was consumed.
  if (*digest != permit.plan_digest()) {
    return Error(Errc::auth_digest_mismatch, "the launch permit was minted for another plan");
  }
  if (permit.action_id() != request.identity.action_id ||
      permit.process_id() != request.identity.process_id) {
    return Error(Errc::auth_denied, "the launch permit was minted for another (action, process)");
  }
  if (permit.execution_id().empty() || executions_.contains(permit.execution_id())) {
    return Error(Errc::auth_denied, "the launch permit's execution id is empty or already used");
  }
  // Spent here: the permit is a local by value, and its id moves into the execution.
  LaunchPermit const spent = std::move(permit);
  std::string const& id = spent.execution_id();

  auto* b = backend_for(request.plan.backend.kind);
  PlanView view = backend::view_plan(request.plan);
  auto sup = std::make_shared<Supervisor>(*this, id, std::move(request), std::move(view),
                                          std::move(*digest), b->create(id));
  executions_.emplace(id, sup);
  return sup;
}

void ExecutionManager::start_async(LaunchRequest request, LaunchPermit permit, StartDone done) {
  auto p = prepare_start(std::move(request), std::move(permit));
  if (!p) return done(p.error());
  std::shared_ptr<Supervisor> const sup = *p;
  std::size_t const live = live_count() - 1;  // before this one
  sup->launch(live, [this, weak = std::weak_ptr<bool>(alive_), sup,
                     done = std::move(done)](Result<StartResult> res) {
    auto a = weak.lock();
    if (!a || !*a) return;  // the manager is gone
    if (!res) {
      // Refused before anything ran (its claim, with a sink that writes it
      // off the loop): a wait registered meanwhile learns why, as its caller.
      executions_.erase(sup->id());
      answer_waits(sup->id(), res.error());
      return done(res.error());
    }
    ++stats_.started;
    if (sup->terminal() && res->pid == 0) ++stats_.spawn_failed;
    done(std::move(res));
  });
}

Result<ExecutionView> ExecutionManager::adopt(AdoptRequest request) {
  if (shutting_down_) return Error(Errc::daemon_shutting_down, "the manager is shutting down");
  std::string const id = request.root.execution_id;
  if (id.empty() || executions_.contains(id)) {
    return Error(Errc::auth_denied, "adopt: the execution id is empty or already used");
  }
  auto const kind = request.plan.backend.kind;
  auto* b = backend_for(kind);
  if (b == nullptr) {
    return Error(Errc::sys_unsupported, std::string{"backend "} +
                                            std::string{core::to_string(kind)} +
                                            " is not served by this daemon");
  }
  LaunchRequest launch;  // the caller is unknown after a restart; nothing launches again
  launch.identity = request.identity;
  launch.plan = request.plan;
  PlanView view = backend::view_plan(launch.plan);
  std::string digest = request.plan_digest;
  auto sup = std::make_shared<Supervisor>(*this, id, std::move(launch), std::move(view),
                                          std::move(digest), b->create(id));
  std::size_t const live = live_count();  // before this one
  executions_.emplace(id, sup);
  if (auto r = sup->adopt(std::move(request), live); !r) {
    executions_.erase(id);
    sup->detach();
    return r.error();
  }
  ++stats_.adopted;
  return sup->view();
}

Result<ExecutionView> ExecutionManager::get(std::string const& execution_id) const {
  auto sup = find(execution_id);
  if (!sup) return Error(Errc::exec_not_found, execution_id);
  return sup->view();
}

std::vector<ExecutionView> ExecutionManager::list(ListFilter const& filter) const {
  std::vector<std::shared_ptr<Supervisor>> picked;
  for (auto const& [id, sup] : executions_) {
    if (filter.phase && sup->phase() != *filter.phase) continue;
    if (filter.session_id && sup->session_id() != *filter.session_id) continue;
    picked.push_back(sup);
  }
  std::sort(picked.begin(), picked.end(), [](auto const& a, auto const& b) {
    if (a->started_at() != b->started_at()) return a->started_at() > b->started_at();
    return a->id() < b->id();
  });
  std::vector<ExecutionView> out;
  for (auto const& sup : picked) {
    if (out.size() >= filter.limit) break;
    out.push_back(sup->view());
  }
  return out;
}

WaitHandle ExecutionManager::wait(std::string const& execution_id,
                                  std::optional<std::chrono::milliseconds> timeout,
                                  std::function<void(Result<core::TerminalRecord>)> done) {
  auto sup = find(execution_id);
  if (!sup) {
    boost::asio::post(io_, [done = std::move(done), execution_id]() {
      done(Error(Errc::exec_not_found, execution_id));
    });
    return {};
  }
  if (sup->terminal()) {
    auto v = sup->view();
    Result<core::TerminalRecord> answer =
        v.terminal ? Result<core::TerminalRecord>{*v.terminal}
                   : Result<core::TerminalRecord>{Error(Errc::internal, "terminal without record")};
    boost::asio::post(io_,
                      [done = std::move(done), answer = std::move(answer)]() { done(answer); });
    return {};
  }
  std::uint64_t const wid = ++next_wait_id_;
  PendingWait w{execution_id, std::move(done), nullptr};
  if (timeout) {
    w.timer = std::make_unique<boost::asio::steady_timer>(io_);
    w.timer->expires_after(*timeout);
    w.timer->async_wait([weak = std::weak_ptr<bool>(alive_), this, wid,
                         execution_id](boost::system::error_code ec) {
      auto a = weak.lock();
      if (ec || !a || !*a) return;
      auto it = waits_.find(wid);
      if (it == waits_.end()) return;
      auto fn = std::move(it->second.done);
      unwait(WaitHandle{execution_id, wid});
      fn(Error(Errc::exec_wait_timeout, execution_id));
    });
  }
  waits_.emplace(wid, std::move(w));
  waits_by_execution_.emplace(execution_id, wid);
  stats_.pending_waits = waits_.size();
  return WaitHandle{execution_id, wid};
}

void ExecutionManager::unwait(WaitHandle const& handle) {
  auto it = waits_.find(handle.id);
  if (it == waits_.end()) return;
  auto [lo, hi] = waits_by_execution_.equal_range(it->second.execution_id);
  for (auto e = lo; e != hi; ++e) {
    if (e->second == handle.id) {
      waits_by_execution_.erase(e);
      break;
    }
  }
  // Erased before the timer is destroyed: its cancelled handler finds nothing to answer.
  waits_.erase(it);
  stats_.pending_waits = waits_.size();
}

void ExecutionManager::answer_waits(std::string const& execution_id,
                                    Result<core::TerminalRecord> const& answer) {
  auto [lo, hi] = waits_by_execution_.equal_range(execution_id);
  for (auto e = lo; e != hi; ++e) {
    auto node = waits_.extract(e->second);
    if (node.empty()) continue;
    // Posted, not called: a waiter may call back into the manager.
    boost::asio::post(io_, [done = std::move(node.mapped().done), answer]() { done(answer); });
  }
  waits_by_execution_.erase(lo, hi);
  stats_.pending_waits = waits_.size();
}

void ExecutionManager::answer_all_waits(Error const& error) {
  for (auto& [wid, w] : waits_) {
    boost::asio::post(io_, [done = std::move(w.done), error]() { done(error); });
  }
  waits_.clear();
  waits_by_execution_.clear();
  stats_.pending_waits = 0;
}

Result<CancelResult> ExecutionManager::cancel(std::string const& execution_id,
                                              core::Trigger trigger, std::string reason,
                                              bool force) {
  auto sup = find(execution_id);
  if (!sup) return Error(Errc::exec_not_found, execution_id);
  return sup->cancel(trigger, std::move(reason), force);
}

Result<std::uint64_t> ExecutionManager::input(std::string const& execution_id,
                                              std::span<std::uint8_t const> data, bool eof) {
  auto sup = find(execution_id);
  if (!sup) return Error(Errc::exec_not_found, execution_id);
  return sup->input(data, eof);
}

Result<> ExecutionManager::resize(std::string const& execution_id, std::uint16_t rows,
                                  std::uint16_t cols) {
  auto sup = find(execution_id);
  if (!sup) return Error(Errc::exec_not_found, execution_id);
  return sup->resize(rows, cols);
}

Result<SubscriptionHandle> ExecutionManager::subscribe(std::string const& execution_id,
                                                       std::optional<std::uint64_t> from_seq,
                                                       std::function<bool(Event const&)> sink) {
  auto sup = find(execution_id);
  if (!sup) return Error(Errc::exec_not_found, execution_id);
  return sup->subscribe(from_seq, std::move(sink));
}

void ExecutionManager::unsubscribe(SubscriptionHandle const& handle) {
  if (auto sup = find(handle.execution_id)) sup->unsubscribe(handle.id);
}

Result<OutputSlice> ExecutionManager::output(std::string const& execution_id, StreamId stream,
                                             std::uint64_t offset, std::uint64_t max_bytes) const {
  auto sup = find(execution_id);
  if (!sup) return Error(Errc::exec_not_found, execution_id);
  return sup->output(stream, offset, max_bytes);
}

void ExecutionManager::on_terminal(std::string const& execution_id,
                                   core::TerminalRecord const& record) {
  ++stats_.terminal;
  ++stats_.terminal_by_classification[static_cast<std::size_t>(record.classification)];
  if (record.tree.cleanup == core::Cleanup::unconfirmed) ++stats_.cleanup_unconfirmed;
  ++terminal_in_map_;  // every supervisor reports terminal once, while it is in executions_
  if (waits_by_execution_.contains(execution_id)) {
    auto sup = find(execution_id);
    auto v = sup ? std::optional<ExecutionView>{sup->view()} : std::nullopt;
    if (v && v->terminal) {
      answer_waits(execution_id, *v->terminal);
    } else {
      answer_waits(execution_id, Error(Errc::internal, execution_id + ": terminal without record"));
    }
  }
  terminal_order_.push_back(execution_id);
  // Keep a bounded history of terminal executions in memory for get/wait/output; the oldest
  // go first. Their spools stay (the registry keeps the durable record and the publisher the
  // output: exec.output serves them from there); retention removes them.
  while (terminal_order_.size() > config_.terminal_history) {
    std::string const old = terminal_order_.front();
    terminal_order_.erase(terminal_order_.begin());
    if (executions_.count(old) > 0) {
      // Erase later: the supervisor being closed may be the one evicted, still on the stack.
      boost::asio::post(io_, [weak = std::weak_ptr<bool>(alive_), this, old]() {
        if (auto a = weak.lock(); a && *a && executions_.erase(old) > 0) --terminal_in_map_;
      });
    }
  }
}

void ExecutionManager::schedule_reap() {
  if (shutting_down_ || handing_over_) return;
  reap_timer_.expires_after(config_.reap_interval);
  reap_timer_.async_wait([weak = std::weak_ptr<bool>(alive_), this](boost::system::error_code ec) {
    auto a = weak.lock();
    if (ec || !a || !*a) return;
    reap_orphans_now();
    schedule_reap();
  });
}

void ExecutionManager::reap_orphans_now() {
  if (handing_over_) return;
  // Our own roots are waited through their pidfds (with their exit status); everything else
  // that reparented to us is collected here so no zombie accumulates. A zombie keeps its cgroup
  // membership until it is reaped, so /proc/<pid>/cgroup still names the execution's cgroup
  // just before (the marker is gone with the zombie's memory: marker-boundary orphans stay
  // unattributed).
  std::map<std::int32_t, std::string> owners;
  auto reaped = sys::reap_orphans([this](std::int32_t pid) { return is_direct_child(pid); }, 1024,
                                  [this, &owners](std::int32_t pid) {
                                    if (auto owner = owner_of(pid)) owners[pid] = *owner;
                                  });
  stats_.orphans_reaped += reaped.size();
  for (auto const& r : reaped) {
    auto owner = owners.find(r.pid);
    if (owner == owners.end()) continue;
    ++stats_.orphans_attributed;
    if (auto sup = find(owner->second)) sup->count_orphan();
  }
}

std::size_t ExecutionManager::closing_count() const {
  std::size_t n = 0;
  for (auto const& [id, sup] : executions_) {
    if (sup->closing()) ++n;
  }
  return n;
}

void ExecutionManager::hold_exits() {
  // A root handed over is no longer anyone's root here: the orphan reaper would take its
  // zombie, and the next image would find it gone without a status.
  handing_over_ = true;
  reap_timer_.cancel();
  for (auto& [id, sup] : executions_) (void)sup->hold_exit();
}

void ExecutionManager::prepare_handover(std::chrono::milliseconds bound,
                                        std::function<void()> done) {
  hold_exits();
  poll_until([this] { return closing_count() == 0; }, std::chrono::steady_clock::now() + bound,
             std::move(done));
}

std::vector<Carried> ExecutionManager::give_back() {
  hold_exits();
  return hand_over();
}

std::vector<Carried> ExecutionManager::hand_over() {
  std::vector<Carried> out;
  for (auto& [id, sup] : executions_) {
    if (sup->terminal()) continue;
    if (auto c = sup->hand_over()) out.push_back(std::move(*c));
  }
  return out;
}

void ExecutionManager::shutdown(ShutdownPolicy policy, std::chrono::milliseconds bound,
                                std::function<void()> done) {
  shutting_down_ = true;
  reap_timer_.cancel();
  if (policy == ShutdownPolicy::detach) {
    for (auto& [id, sup] : executions_) {
      if (!sup->terminal()) sup->detach();
    }
    answer_all_waits(Error(Errc::daemon_shutting_down, "supervision detached"));
    boost::asio::post(io_, std::move(done));
    return;
  }
  for (auto& [id, sup] : executions_) {
    if (!sup->terminal()) (void)sup->cancel(core::Trigger::supervisor_shutdown, "daemon shutdown");
  }
  poll_until([this] { return live_count() == 0; }, std::chrono::steady_clock::now() + bound,
             [this, done = std::move(done)]() mutable {
               // Past the bound, whatever is still live is left to recovery at the next start.
               for (auto& [id, sup] : executions_) {
                 if (!sup->terminal()) sup->detach();
               }
               answer_all_waits(Error(Errc::daemon_shutting_down, "supervision detached"));
               reap_orphans_now();
               done();
             });
}

void ExecutionManager::poll_until(std::function<bool()> settled,
                                  std::chrono::steady_clock::time_point deadline,
                                  std::function<void()> done) {
  if (settled() || std::chrono::steady_clock::now() >= deadline) {
    boost::asio::post(io_, std::move(done));
    return;
  }
  shutdown_timer_.expires_after(kShutdownPoll);
  shutdown_timer_.async_wait([weak = std::weak_ptr<bool>(alive_), this, deadline,
                              settled = std::move(settled),
                              done = std::move(done)](boost::system::error_code ec) mutable {
    auto a = weak.lock();
    if (ec || !a || !*a) return;
    poll_until(std::move(settled), deadline, std::move(done));
  });
}

}  // namespace custos::supervisor
