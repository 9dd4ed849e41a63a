// Startup recovery: PidfsRecoveryMatch per record, terminal records, restart policy.
#include "custos/registry/recovery.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <poll.h>
#include <sys/stat.h>
#include <thread>

#include "custos/core/ids.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::registry {

std::string_view restart_policy_wire(RestartPolicy p) noexcept {
  switch (p) {
    case RestartPolicy::cancel_and_reap:
      return "cancel_and_reap";
    case RestartPolicy::keep_running:
      return "keep_running";
  }
  return "cancel_and_reap";
}

std::optional<RestartPolicy> restart_policy_from_wire(std::string_view w) noexcept {
  for (auto p : {RestartPolicy::cancel_and_reap, RestartPolicy::keep_running}) {
    if (restart_policy_wire(p) == w) return p;
  }
  return std::nullopt;
}

std::size_t RecoveryReport::count(core::RecoveryPath p) const noexcept {
  std::size_t n = 0;
  for (auto const& e : executions) n += e.classification == p ? 1 : 0;
  return n;
}

namespace {

// Waits until the process behind `pidfd` has exited (pidfd readable), up to `timeout`.
bool wait_exited(sys::Pidfd const& pidfd, std::chrono::milliseconds timeout) {
  pollfd p{pidfd.fd().get(), POLLIN, 0};
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int const r = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Kills and removes the execution's own cgroup. Everything inside it belongs to the execution:
// only the daemon creates processes there (CLONE_INTO_CGROUP) and nobody else writes to its
// cgroup.procs, so cgroup.kill here cannot reach a stranger.
core::Cleanup kill_cgroup(std::string const& path, std::chrono::milliseconds timeout,
                          std::string& detail, bool* killed = nullptr) {
  auto dir = sys::CgroupDir::open(path);
  if (!dir) {
    if (dir.error().sys_errno == ENOENT) return core::Cleanup::confirmed;  // already gone
    detail += "; cgroup: " + dir.error().message();
    return core::Cleanup::unconfirmed;
  }
  auto populated = dir->populated();
  if (populated && *populated) {
    if (killed != nullptr) *killed = true;
    if (auto k = dir->kill(); !k) {
      detail += "; cgroup.kill: " + k.error().message();
      return core::Cleanup::unconfirmed;
    }
    if (auto w = dir->wait_empty(timeout); !w) {
      detail += "; cgroup not empty: " + w.error().message();
      return core::Cleanup::unconfirmed;
    }
    detail += "; cgroup was populated, killed";
  }
  if (auto r = dir->remove(); !r) {
    detail += "; rmdir: " + r.error().message();
    return core::Cleanup::unconfirmed;
  }
  return core::Cleanup::confirmed;
}

// After a reboot a cgroup path from the old boot can only exist if someone re-created it, and
// then it is not ours: remove it only when it is empty, never kill inside it.
core::Cleanup remove_stale_cgroup(std::string const& path, std::string& detail) {
  auto dir = sys::CgroupDir::open(path);
  if (!dir) {
    if (dir.error().sys_errno == ENOENT) return core::Cleanup::confirmed;
    detail += "; cgroup: " + dir.error().message();
    return core::Cleanup::unconfirmed;
  }
  auto populated = dir->populated();
  if (!populated || *populated) {
    detail += "; a populated cgroup exists at the old path; left untouched";
    return core::Cleanup::unconfirmed;
  }
  if (auto r = dir->remove(); !r) {
    detail += "; rmdir: " + r.error().message();
    return core::Cleanup::unconfirmed;
  }
  return core::Cleanup::confirmed;
}

// The cgroup a launch creates (named by the execution id, under the daemon's subtree) before its
// staged write records it: a crash in between leaves it, holding at most the child at its
// barrier (no program ran; it exits when the barrier closes). It is this execution's alone: the
// daemon creates it for this id, and cgroups do not outlive a reboot. Killed and removed.
core::Cleanup remove_unrecorded_cgroup(std::string const& execution_id,
                                       RecoveryOptions const& options, std::string& detail) {
  if (options.execution_cgroup_parent.empty()) return core::Cleanup::confirmed;
  // Not a name the daemon would have given a cgroup (and no path component: no '/', no "..").
  if (!core::is_valid_id(execution_id)) return core::Cleanup::confirmed;
  std::string const path = options.execution_cgroup_parent + "/" + execution_id;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return core::Cleanup::confirmed;  // never created
    detail +=
        "; cannot tell whether its launch left a cgroup at " + path + ": " + std::strerror(errno);
    return core::Cleanup::unconfirmed;
  }
  std::string why;
  core::Cleanup const c = kill_cgroup(path, options.kill_timeout, why);
  detail += "; the cgroup its launch created before the staged write was " +
            std::string{c == core::Cleanup::confirmed ? "removed" : "not removed"} + why;
  return c;
}

// "ex-" and 16 lowercase hex digits: the ids the daemon gives executions (and their cgroups).
bool is_execution_cgroup_name(std::string_view name) {
  if (name.size() != 19 || name.substr(0, 3) != "ex-") return false;
  return std::all_of(name.begin() + 3, name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The cgroups under the subtree whose execution was terminal before this recovery. Its teardown
// wrote the terminal record after a failed rmdir (cleanup unconfirmed: the tree did not empty in
// time); everything inside still belongs to that execution and nobody else acts on it, so it is
// killed and removed now. Quarantined or unknown ids are left alone (an untrusted or absent
// record authorizes nothing), and so are the records this recovery handled itself.
void remove_leftover_cgroups(Registry& registry, RecoveryOptions const& options,
                             RecoveryReport& report) {
  if (options.execution_cgroup_parent.empty()) return;
  std::error_code ec;
  std::filesystem::directory_iterator it(options.execution_cgroup_parent, ec);
  if (ec) return;  // no subtree yet: nothing was ever created under it
  std::vector<std::string> names;
  for (auto const& entry : it) {
    std::error_code dec;
    if (!entry.is_directory(dec)) continue;
    std::string name = entry.path().filename().string();
    if (is_execution_cgroup_name(name)) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  for (std::string const& name : names) {
    bool const handled =
        std::any_of(report.executions.begin(), report.executions.end(),
                    [&](RecoveredExecution const& e) { return e.execution_id == name; });
    if (handled) continue;
    auto rec = registry.get(name);
    if (!rec || rec->phase != core::Phase::terminal) continue;
    LeftoverCgroup left{name, core::Cleanup::unconfirmed, {}};
    left.cleanup = kill_cgroup(options.execution_cgroup_parent + "/" + name, options.kill_timeout,
                               left.detail);
    if (left.detail.starts_with("; ")) left.detail.erase(0, 2);
    report.leftover_cgroups.push_back(std::move(left));
  }
}

// Final marker sweep: SIGKILL to every process carrying the execution's marker, each re-checked
// through its own pidfd before the signal. Returns whether the sweep confirmed none remain.
//
// not_before_ticks is the root's start time: the marker is random per execution and first given
// to the root, so no process that started earlier can carry it. Skipping those keeps processes
// this daemon may never read (PID 1's environ is unreadable even to root on some hosts) from
// making every sweep unconfirmed.
bool sweep_marker(std::string const& marker_hex, RecoveryOptions const& options,
                  std::uint64_t pid_ns, std::uint64_t not_before_ticks, std::string& detail) {
  auto marker = sys::Marker::from_hex(marker_hex);
  if (!marker) {
    detail += "; marker unreadable: " + marker.error().message();
    return false;
  }
  sys::MarkerSweepOptions so;
  so.signal = SIGKILL;
  so.pid_ns_inode = pid_ns;
  so.proc_root = options.proc_root;
  if (not_before_ticks != 0) so.not_before_ticks = not_before_ticks;
  auto r = sys::marker_sweep(*marker, so);
  if (!r) {
    detail += "; marker sweep: " + r.error().message();
    return false;
  }
  if (r->signalled > 0) detail += "; marker sweep killed " + std::to_string(r->signalled);
  if (!r->confirmed) {
    detail += "; marker sweep unconfirmed (" + std::to_string(r->unreadable) + " unreadable, " +
              std::to_string(r->remaining) + " remaining)";
  }
  return r->confirmed;
}

core::TerminalRecord base_terminal(ExecutionRecord const& rec, core::RecoveryPath via,
                                   core::Cleanup cleanup) {
  core::TerminalRecord t;
  t.recovery = via;
  t.trigger = rec.trigger;
  // Whatever was in flight when the daemon died was never read: neither stream is complete.
  auto incomplete = [](core::StreamAccounting const& a) {
    auto m = core::account_mark_incomplete(a);
    return m ? *m : core::StreamAccounting{a.observed, a.retained, a.dropped, false};
  };
  t.output[core::Stream::stdout_stream] = incomplete(rec.out.accounting);
  t.output[core::Stream::stderr_stream] = incomplete(rec.err.accounting);
  t.tree.boundary = rec.boundary.kind.value_or(core::Boundary::marker);
  t.tree.cleanup = cleanup;
  // After a restart nothing is known about nsdelegate/uid at launch time: claim the weaker one.
  t.tree.containment = core::Containment::escapable;
  for (auto& d : t.resources.dims) d.fidelity = core::Fidelity::unavailable;
  return t;
}

// Writes the recovery_indeterminate terminal record of an absent/indeterminate execution.
Result<void> finish_unobserved(Registry& reg, ExecutionRecord const& rec, RecoveredExecution& out) {
  core::TerminalRecord t = base_terminal(rec, out.classification, out.cleanup);
  t.classification = core::Classification::recovery_indeterminate;
  TerminalBlob blob = CUSTOS_TRY(terminal_blob(t));
  CUSTOS_TRYV(reg.record_recovered(rec.execution_id, {}, blob, out.classification));
  out.terminal_written = true;
  return ok();
}

// PidfsRecoveryMatch for one record with a pidfs identity (steps 1-4 of the header).
void match(ExecutionRecord const& rec, std::string const& boot, std::uint64_t pid_ns,
           RecoveryReport& report, RecoveredExecution& out) {
  auto const& o = rec.ownership;
  using RP = core::RecoveryPath;
  if (o.boot_id != boot) {
    out.classification = RP::absent_without_terminal;
    out.detail = "boot id changed (" + o.boot_id + " -> " + boot + "): no pid lookup";
    return;
  }
  if (o.pid_ns_ino != 0 && o.pid_ns_ino != pid_ns) {
    out.classification = RP::indeterminate;
    out.detail = "pid " + std::to_string(o.pid) + " was recorded in another pid namespace";
    return;
  }
  out.pid_looked_up = true;
  ++report.pidfd_opens;
  auto pidfd = sys::Pidfd::open(o.pid);  // exactly once
  if (!pidfd) {
    if (pidfd.error().sys_errno == ESRCH) {
      out.classification = RP::absent_without_terminal;
      out.detail = "no process with pid " + std::to_string(o.pid);
    } else {
      out.classification = RP::indeterminate;
      out.detail = "pidfd_open(" + std::to_string(o.pid) + "): " + pidfd.error().message();
    }
    return;
  }
  struct stat st {};
  if (::fstat(pidfd->fd().get(), &st) != 0) {
    out.classification = RP::indeterminate;
    out.detail = "fstat of the pidfd failed (errno " + std::to_string(errno) + ")";
    return;
  }
  if (static_cast<std::uint64_t>(st.st_dev) != o.pidfs_dev ||
      static_cast<std::uint64_t>(st.st_ino) != o.pidfs_ino) {
    // The pid now names another process: ours ended (a live or unreaped process keeps its pid).
    // The stranger's pidfd is closed here without any action.
    out.classification = RP::absent_without_terminal;
    out.detail = "pid " + std::to_string(o.pid) + " now belongs to another process (pidfs inode " +
                 std::to_string(st.st_ino) + ", recorded " + std::to_string(o.pidfs_ino) + ")";
    return;
  }
  // Negative evidence only: it can refuse the match, never make it.
  if (o.start_time_ticks != 0) {
    auto start = sys::read_start_time(o.pid);
    if (start && *start != o.start_time_ticks && pidfd->alive()) {
      out.classification = RP::indeterminate;
      out.detail = "pidfs identity matches but the start time disagrees (" +
                   std::to_string(*start) + " vs " + std::to_string(o.start_time_ticks) + ")";
      return;
    }
  }
  if (!pidfd->alive()) {
    out.classification = RP::absent_without_terminal;
    out.detail = "the owned process has exited; its end was not observed";
    return;
  }
  out.classification = RP::live_owned;
  out.detail = std::string{"re-acquired by pidfs identity ("} +
               std::string{ownership_state_wire(o.state)} + ")";
  out.pidfd = std::move(*pidfd);
}

}  // namespace

Result<RecoveryReport> recover(Registry& registry, RecoveryOptions const& options) {
  RecoveryReport report;
  report.boot_id = options.boot_id;
  if (report.boot_id.empty()) report.boot_id = CUSTOS_TRY(sys::read_boot_id());
  std::uint64_t const pid_ns = options.pid_ns_ino != 0 ? options.pid_ns_ino : current_pid_ns_ino();

  report.quarantined = CUSTOS_TRY(registry.quarantined());
  report.orphan_claims = CUSTOS_TRY(registry.orphan_claims());
  auto const records = CUSTOS_TRY(registry.non_terminal());
  report.already_terminal = CUSTOS_TRY(registry.count_terminal());

  for (ExecutionRecord const& rec : records) {
    RecoveredExecution out;
    out.execution_id = rec.execution_id;
    auto const& o = rec.ownership;
    bool same_boot = false;
    switch (o.state) {
      case OwnershipState::unassigned:
        // No ownership was ever staged, so the barrier was never released: no program ran.
        out.classification = core::RecoveryPath::absent_without_terminal;
        out.detail = "no process was ever staged";
        same_boot = true;
        break;
      case OwnershipState::legacy_unverified:
        out.classification = core::RecoveryPath::indeterminate;
        out.detail = "legacy pid/start-time ownership is never acted on";
        break;
      case OwnershipState::modelled:
        // A reference execution's model lived in the previous daemon's memory: nothing of it
        // can outlive that daemon, and there is no process to look for.
        out.classification = core::RecoveryPath::absent_without_terminal;
        out.detail = "a modelled (reference) execution ends with its daemon";
        break;
      case OwnershipState::staged:
      case OwnershipState::committed:
        match(rec, report.boot_id, pid_ns, report, out);
        same_boot = o.boot_id == report.boot_id;
        break;
    }

    if (out.classification == core::RecoveryPath::absent_without_terminal) {
      // The process is gone; what may remain is its tree. Clean it with exact ownership only:
      // the execution's own cgroup, and (same boot) its marker.
      out.cleanup = core::Cleanup::confirmed;
      if (rec.boundary.kind == core::Boundary::cgroup && !rec.boundary.cgroup_path.empty()) {
        out.cleanup = same_boot
                          ? kill_cgroup(rec.boundary.cgroup_path, options.kill_timeout, out.detail)
                          : remove_stale_cgroup(rec.boundary.cgroup_path, out.detail);
      } else if (o.state == OwnershipState::unassigned) {
        out.cleanup = remove_unrecorded_cgroup(rec.execution_id, options, out.detail);
      }
      if (same_boot && options.marker_sweep && !rec.boundary.marker_hex.empty()) {
        if (!sweep_marker(rec.boundary.marker_hex, options, pid_ns, rec.ownership.start_time_ticks,
                          out.detail)) {
          out.cleanup = core::Cleanup::unconfirmed;
        }
      }
      CUSTOS_TRYV(finish_unobserved(registry, rec, out));
    } else if (out.classification == core::RecoveryPath::indeterminate) {
      // Nothing is signalled. Report whether the execution's cgroup still holds processes.
      out.cleanup = core::Cleanup::unconfirmed;
      if (rec.boundary.kind == core::Boundary::cgroup) {
        if (auto dir = sys::CgroupDir::open(rec.boundary.cgroup_path); dir) {
          auto pop = dir->populated();
          out.detail += pop ? (*pop ? "; its cgroup is populated" : "; its cgroup is empty") : "";
        }
      }
      CUSTOS_TRYV(finish_unobserved(registry, rec, out));
    }
    report.executions.push_back(std::move(out));
  }
  remove_leftover_cgroups(registry, options, report);
  return report;
}

namespace {

// How a process that is not our child ended, as far as can be read now: from waitid without
// reaping it when it is ours after all (a subreaper that inherited it: the reaping stays with
// our reaper), otherwise from PIDFD_GET_INFO once its own parent reaped it. Never waits: the
// owner that wants the status polls KeptExecutions::exit_observable first.
std::optional<core::ExitStatus> observed_exit(sys::Pidfd const& pidfd) {
  auto to_core = [](sys::ExitStatus const& s) -> std::optional<core::ExitStatus> {
    if (s.code) return core::ExitStatus::exited(*s.code);
    if (s.signal) return core::ExitStatus::signaled(*s.signal);
    return std::nullopt;
  };
  if (auto own = pidfd.peek_exit(); own && *own) return to_core(**own);
  if (auto info = pidfd.get_exit_info(); info && *info) return to_core(**info);
  return std::nullopt;
}

// Ends one live_owned execution and writes its one terminal record (recovery live_owned).
// With a `trigger` (the default restart policy, KeptExecutions::cancel): kills its tree — the
// cgroup when it has one, then the root through the recovered pidfd, then the marker sweep —
// and records `trigger` unless the record already holds the first accepted one. Without one
// (KeptExecutions::finish_exited: the root ended on its own) the root is not signalled; what
// is left of its tree is killed as the supervisor kills a tree whose root exited, and the
// record says how the root ended.
Result<void> finish_live(Registry& registry, RecoveredExecution& e, RecoveryOptions const& options,
                         std::optional<core::Trigger> trigger) {
  std::uint64_t const pid_ns = options.pid_ns_ino != 0 ? options.pid_ns_ino : current_pid_ns_ino();
  ExecutionRecord const rec = CUSTOS_TRY(registry.get(e.execution_id));
  sys::Pidfd const& pidfd = *e.pidfd;

  // Cancel and reap: the whole tree at once where a cgroup boundary exists, then the root
  // through the recovered pidfd (it may have left the cgroup), then the marker sweep.
  bool confirmed = true;
  bool killed_tree = false;
  if (rec.boundary.kind == core::Boundary::cgroup && !rec.boundary.cgroup_path.empty()) {
    if (kill_cgroup(rec.boundary.cgroup_path, options.kill_timeout, e.detail, &killed_tree) !=
        core::Cleanup::confirmed) {
      confirmed = false;
    }
  }
  Result<bool> sent = false;
  if (trigger) {
    sent = pidfd.send_signal(SIGKILL);
    if (!sent) {
      e.detail += "; SIGKILL through the pidfd: " + sent.error().message();
      confirmed = false;
    }
  }
  if (!wait_exited(pidfd, options.kill_timeout)) {
    e.detail += "; the root process did not exit in time";
    confirmed = false;
  }
  if (options.marker_sweep && !rec.boundary.marker_hex.empty()) {
    if (!sweep_marker(rec.boundary.marker_hex, options, pid_ns, rec.ownership.start_time_ticks,
                      e.detail))
      confirmed = false;
  }
  e.cleanup = confirmed ? core::Cleanup::confirmed : core::Cleanup::unconfirmed;

  // The raw exit: from PIDFD_GET_INFO once whoever inherited the process has reaped it;
  // otherwise the SIGKILL this recovery delivered (the pidfd proves it reached our process).
  std::optional<core::ExitStatus> exit = observed_exit(pidfd);
  if (!exit && sent && *sent) exit = core::ExitStatus::signaled(SIGKILL);

  core::TerminalRecord t = base_terminal(rec, core::RecoveryPath::live_owned, e.cleanup);
  t.trigger = rec.trigger ? rec.trigger : trigger;
  t.escalation.forced = trigger.has_value() || killed_tree;
  std::vector<core::Phase> steps;
  if (rec.ownership.state == OwnershipState::staged) {
    // The last durable write is the staged slot: the daemon died at the barrier, or after
    // releasing it but before `committed` reached the WAL (the same loop step). Either way no
    // exit of the program was observed; recovery killed what it found.
    t.spawn_error = core::SpawnFailure{
        "barrier", 0,
        "the daemon restarted before the commit of the launch was recorded; killed by recovery"};
  } else {
    if (!exit) {
      // Neither observed nor delivered: nobody can say how it ended.
      e.detail += "; exit not observable";
      t = base_terminal(rec, core::RecoveryPath::indeterminate, e.cleanup);
      t.classification = core::Classification::recovery_indeterminate;
      e.classification = core::RecoveryPath::indeterminate;
      TerminalBlob blob = CUSTOS_TRY(terminal_blob(t));
      CUSTOS_TRYV(registry.record_recovered(rec.execution_id, {}, blob, e.classification));
      e.terminal_written = true;
      return ok();
    }
    t.exit = *exit;
    e.exit = exit;
    switch (rec.phase) {
      case core::Phase::starting:
        steps = {core::Phase::running, core::Phase::exited, core::Phase::closed};
        break;
      case core::Phase::running:
        steps = {core::Phase::stopping, core::Phase::exited, core::Phase::closed};
        break;
      case core::Phase::stopping:
        steps = {core::Phase::exited, core::Phase::closed};
        break;
      case core::Phase::exited:
        steps = {core::Phase::closed};
        break;
      default:
        break;
    }
  }
  auto verdict = core::make_terminal_record(
      core::ClassifyInput{t.exit, t.spawn_error.has_value(), t.trigger, t.tree.cleanup, false,
                          core::RecoveryPath::live_owned},
      t.spawn_error);
  if (!verdict) return verdict.error();
  t.classification = verdict->classification;
  TerminalBlob blob = CUSTOS_TRY(terminal_blob(t));
  CUSTOS_TRYV(
      registry.record_recovered(rec.execution_id, steps, blob, core::RecoveryPath::live_owned));
  e.terminal_written = true;
  return ok();
}

Error not_kept(std::string_view execution_id) {
  return Error{Errc::exec_not_found,
               std::string{execution_id} + " is not a recovered execution kept running"};
}

}  // namespace

Result<void> apply_restart_policy(Registry& registry, RecoveryReport& report,
                                  RecoveryOptions const& options) {
  if (options.policy == RestartPolicy::keep_running) return ok();
  for (RecoveredExecution& e : report.executions) {
    if (e.classification != core::RecoveryPath::live_owned || e.terminal_written || !e.pidfd) {
      continue;
    }
    CUSTOS_TRYV(finish_live(registry, e, options, core::Trigger::supervisor_shutdown));
  }
  return ok();
}

KeptExecutions::KeptExecutions(Registry& registry, RecoveryReport& report, RecoveryOptions options)
    : registry_(&registry), options_(std::move(options)) {
  for (RecoveredExecution& e : report.executions) {
    if (e.classification != core::RecoveryPath::live_owned || e.terminal_written || !e.pidfd) {
      continue;
    }
    RecoveredExecution kept;
    kept.execution_id = e.execution_id;
    kept.classification = e.classification;
    kept.detail = e.detail;
    kept.pid_looked_up = e.pid_looked_up;
    kept.pidfd = std::move(e.pidfd);
    e.pidfd.reset();
    kept_.emplace(kept.execution_id, std::move(kept));
  }
}

bool KeptExecutions::contains(std::string_view execution_id) const {
  return kept_.find(execution_id) != kept_.end();
}

std::vector<std::string> KeptExecutions::ids() const {
  std::vector<std::string> out;
  out.reserve(kept_.size());
  for (auto const& [id, e] : kept_) out.push_back(id);
  return out;
}

Result<KeptExecutions::Cancelled> KeptExecutions::cancel(std::string_view execution_id,
                                                         core::Trigger trigger) {
  auto it = kept_.find(execution_id);
  if (it == kept_.end()) {
    return not_kept(execution_id);
  }
  auto const before = CUSTOS_TRY(registry_->get(execution_id));
  Cancelled out;
  if (!it->second.pidfd->alive()) {
    // The root ended on its own first: its exit decided the outcome (as the supervisor rejects a
    // trigger after the exit). Nothing is recorded or signalled here; finish_exited ends what
    // is left of the tree and records how the root ended.
    out.accepted = false;
    out.trigger = before.trigger;
    out.detail = "the root process already exited; its end is being recorded";
    return out;
  }
  // The trigger first, as the supervisor does: the first accepted one stays (a trigger the
  // previous daemon recorded wins; a different one is then refused and reported as not
  // accepted).
  out.accepted = !before.trigger.has_value();
  if (out.accepted) CUSTOS_TRYV(registry_->record_trigger(execution_id, trigger));
  out.trigger = before.trigger ? *before.trigger : trigger;
  Finished f = CUSTOS_TRY(end_kept(it, trigger));
  out.terminal = std::move(f.terminal);
  out.cleanup = f.cleanup;
  out.detail = std::move(f.detail);
  return out;
}

Result<KeptExecutions::Finished> KeptExecutions::end_kept(Kept::iterator it,
                                                          std::optional<core::Trigger> trigger) {
  RecoveredExecution e = std::move(it->second);
  kept_.erase(it);
  if (auto r = finish_live(*registry_, e, options_, trigger); !r) {
    // Still ours and still without a terminal record: it stays kept (cancellable again, and
    // ended at the next start otherwise).
    std::string id = e.execution_id;
    kept_.emplace(std::move(id), std::move(e));
    return r.error();
  }
  auto const after = CUSTOS_TRY(registry_->get(e.execution_id));
  if (!after.terminal) {
    return Error{Errc::internal, e.execution_id + ": no terminal record after it ended"};
  }
  Finished out;
  out.terminal = CUSTOS_TRY(decode_terminal(*after.terminal));
  out.cleanup = e.cleanup;
  out.detail = std::move(e.detail);
  return out;
}

Result<sys::UniqueFd> KeptExecutions::watch_fd(std::string_view execution_id) const {
  auto it = kept_.find(execution_id);
  if (it == kept_.end()) {
    return not_kept(execution_id);
  }
  return it->second.pidfd->fd().dup();
}

bool KeptExecutions::exit_observable(std::string_view execution_id) {
  auto it = kept_.find(execution_id);
  if (it == kept_.end()) return true;
  sys::Pidfd const& pidfd = *it->second.pidfd;
  if (pidfd.alive()) return false;
  if (auto own = pidfd.peek_exit(); own && *own) return true;
  // Without PIDFD_INFO_EXIT (kernels before 6.15) the status can never be read: nothing to
  // wait for.
  if (!sys::Pidfd::exit_info_supported()) return true;
  auto info = pidfd.get_exit_info();
  return !info || info->has_value();
}

Result<KeptExecutions::Finished> KeptExecutions::finish_exited(std::string_view execution_id) {
  auto it = kept_.find(execution_id);
  if (it == kept_.end()) {
    return not_kept(execution_id);
  }
  if (it->second.pidfd->alive()) {
    return Error{Errc::exec_not_running,
                 std::string{execution_id} + ": its root process has not exited"};
  }
  return end_kept(it, std::nullopt);
}

}  // namespace custos::registry
