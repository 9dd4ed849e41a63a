// Startup recovery's driver: the registry's records, the native backend's identity rules and
// cleanup, and adoption by the manager (supervisor/recovery.hpp).
#include "custos/supervisor/recovery.hpp"

#include <chrono>

#include "custos/core/plan_canonical.hpp"
#include "custos/core/wire_names.hpp"
#include "custos/registry/recovery.hpp"
#include "custos/supervisor/manager.hpp"

namespace custos::supervisor {
namespace {

namespace rcv = backend::recovery;
using RP = core::RecoveryPath;

rcv::RecordedRoot recorded_root(registry::Ownership const& o) {
  return rcv::RecordedRoot{o.boot_id, o.pidfs_dev,        o.pidfs_ino,
                           o.pid,     o.start_time_ticks, o.pid_ns_ino};
}

rcv::RecordedBoundary recorded_boundary(registry::BoundaryInfo const& b) {
  return rcv::RecordedBoundary{b.kind, b.cgroup_path, b.marker_hex, b.marker_ns_ino};
}

// How long the root has run: from its start time when recorded (exact to a clock tick), else
// from the record's creation (the launch began right after it).
std::chrono::milliseconds age_of(registry::ExecutionRecord const& rec) {
  if (auto age = rcv::process_age(rec.ownership.start_time_ticks)) return *age;
  auto const now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  if (rec.created_ns <= 0 || now <= rec.created_ns) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::nanoseconds(now - rec.created_ns));
}

// What the manager needs to adopt the live execution of `rec` through `pidfd`.
Result<AdoptRequest> adoption_of(registry::ExecutionRecord const& rec, sys::Pidfd pidfd) {
  auto decoded = CUSTOS_TRY(core::decode_execution(rec.plan_canonical));
  AdoptRequest a;
  a.identity = std::move(decoded.identity);
  a.plan = std::move(decoded.plan);
  a.plan_digest = rec.plan_digest;
  a.phase = rec.phase;
  a.launch_committed = rec.ownership.state == registry::OwnershipState::committed;
  a.trigger = rec.trigger;
  a.out = rec.out.accounting;
  a.err = rec.err.accounting;
  a.age = age_of(rec);
  auto const& o = rec.ownership;
  a.root.execution_id = rec.execution_id;
  a.root.root = std::move(pidfd);
  a.root.identity =
      sys::PidfsIdentity{o.boot_id, o.pidfs_dev, o.pidfs_ino, o.pid, o.start_time_ticks};
  a.root.boundary = rec.boundary.kind.value_or(core::Boundary::marker);
  a.root.cgroup_path = rec.boundary.cgroup_path;
  a.root.marker_hex = rec.boundary.marker_hex;
  if (rec.boundary.marker_ns_ino != 0) a.root.pid_ns_inode = rec.boundary.marker_ns_ino;
  return a;
}

constexpr auto kRestartPolicyNames = core::wire_names<RestartPolicy>({
    {RestartPolicy::adopt, "adopt"},
    {RestartPolicy::cancel, "cancel"},
});
static_assert(kRestartPolicyNames.complete());

}  // namespace

std::string_view restart_policy_wire(RestartPolicy p) noexcept {
  return kRestartPolicyNames.wire(p);
}

std::optional<RestartPolicy> restart_policy_from_wire(std::string_view w) noexcept {
  return kRestartPolicyNames.from_wire(w);
}

std::size_t RecoveryReport::count(core::RecoveryPath p) const noexcept {
  std::size_t n = 0;
  for (auto const& e : executions) n += e.classification == p ? 1 : 0;
  return n;
}

namespace {

// What one record's stored evidence says, the pid looked up at most once (native_recovery.hpp).
// `same_boot`: whether the record's processes could be of this boot (the cleanup may act).
RecoveredExecution classify(registry::ExecutionRecord const& rec, rcv::HostIdentity const& host,
                            std::uint32_t& pidfd_opens, bool& same_boot) {
  RecoveredExecution out;
  out.execution_id = rec.execution_id;
  same_boot = false;
  switch (registry::stored_evidence(rec)) {
    case registry::StoredEvidence::nothing_staged:
      // No ownership was ever staged, so the barrier was never released: no program ran.
      out.classification = RP::absent_without_terminal;
      out.detail = "no process was ever staged";
      same_boot = true;
      break;
    case registry::StoredEvidence::legacy:
      out.classification = RP::indeterminate;
      out.detail = "legacy pid/start-time ownership is never acted on";
      break;
    case registry::StoredEvidence::modelled:
      // A reference execution's model lived in the previous daemon's memory: nothing of it
      // outlives that daemon, and there is no process, cgroup or marker to look for.
      out.classification = RP::absent_without_terminal;
      out.detail = "a modelled (reference) execution ends with its daemon";
      break;
    case registry::StoredEvidence::marker_only:
      // An ungated container exec: no identity to re-acquire, so a live one is never adopted;
      // its marker sweep (in the recorded namespace) ends whatever of it remains.
      out.classification = RP::absent_without_terminal;
      out.detail = "an ungated execution is known by its marker only: swept, never adopted";
      same_boot = true;
      break;
    case registry::StoredEvidence::pidfs_identity: {
      auto r = rcv::reacquire_root(recorded_root(rec.ownership), host);
      out.classification = r.path;
      out.detail = std::move(r.detail);
      out.pid_looked_up = r.pid_looked_up;
      pidfd_opens += r.pid_looked_up ? 1 : 0;
      same_boot = rec.ownership.boot_id == host.boot_id;
      if (r.path == RP::live_owned) {
        out.detail += std::string{" ("} +
                      std::string{registry::ownership_state_wire(rec.ownership.state)} + ")";
        auto a = adoption_of(rec, std::move(*r.pidfd));
        if (a) {
          out.adopt = std::move(*a);
        } else {
          // Ours and alive, but nothing can supervise it without its plan: nothing is
          // signalled (its pidfd is closed here).
          out.classification = RP::indeterminate;
          out.detail += "; its stored plan does not decode: " + a.error().message();
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace

Result<RecoveryReport> recover(registry::Registry& registry, RecoveryOptions const& options) {
  auto const host = CUSTOS_TRY(rcv::current_host(options.boot_id, options.pid_ns_ino));
  rcv::CleanupOptions cleanup_opts;
  cleanup_opts.kill_timeout = options.kill_timeout;
  cleanup_opts.marker_sweep = options.marker_sweep;
  cleanup_opts.proc_root = options.proc_root;
  cleanup_opts.execution_cgroup_parent = options.execution_cgroup_parent;
  cleanup_opts.pid_ns_ino = host.pid_ns_ino;

  auto work = CUSTOS_TRY(registry::read_recovery_work(registry));
  RecoveryReport report;
  report.boot_id = host.boot_id;
  report.already_terminal = work.already_terminal;
  report.orphan_claims = std::move(work.orphan_claims);
  report.quarantined = std::move(work.quarantined);

  for (registry::ExecutionRecord const& rec : work.records) {
    bool same_boot = false;
    RecoveredExecution out = classify(rec, host, report.pidfd_opens, same_boot);
    auto const evidence = registry::stored_evidence(rec);
    if (out.classification == RP::absent_without_terminal) {
      rcv::GoneExecution gone;
      gone.execution_id = rec.execution_id;
      gone.boundary = recorded_boundary(rec.boundary);
      gone.start_time_ticks = rec.ownership.start_time_ticks;
      gone.same_boot = same_boot;
      gone.never_staged = evidence == registry::StoredEvidence::nothing_staged;
      out.cleanup = rcv::clean_up_gone(gone, cleanup_opts, out.detail);
      CUSTOS_TRYV(registry::record_unobserved_end(registry, rec, out.classification, out.cleanup));
      out.terminal_written = true;
    } else if (out.classification == RP::indeterminate) {
      // Nothing is signalled. Report whether the execution's cgroup still holds processes.
      out.cleanup = core::Cleanup::unconfirmed;
      rcv::describe_unproven(recorded_boundary(rec.boundary), out.detail);
      CUSTOS_TRYV(registry::record_unobserved_end(registry, rec, out.classification, out.cleanup));
      out.terminal_written = true;
    }
    report.executions.push_back(std::move(out));
  }

  report.leftover_cgroups = rcv::remove_leftover_cgroups(cleanup_opts, [&](std::string const& id) {
    for (auto const& e : report.executions) {
      if (e.execution_id == id) return false;  // this recovery's own: handled above
    }
    auto rec = registry.get(id);  // unknown and quarantined ids are refused: left alone
    return rec && rec->phase == core::Phase::terminal;
  });
  return report;
}

std::vector<std::pair<std::string, Error>> adopt_recovered(ExecutionManager& manager,
                                                           RecoveryReport& report,
                                                           RestartPolicy policy) {
  std::vector<std::pair<std::string, Error>> failed;
  for (RecoveredExecution& e : report.executions) {
    if (!e.adopt) continue;
    AdoptRequest request = std::move(*e.adopt);
    e.adopt.reset();
    auto view = manager.adopt(std::move(request));
    if (!view) {
      failed.emplace_back(e.execution_id, view.error());
      continue;
    }
    e.adopted = true;
    if (policy == RestartPolicy::cancel && !view->terminal) {
      // Through the one teardown, like a daemon shutdown's cancel.
      (void)manager.cancel(e.execution_id, core::Trigger::supervisor_shutdown,
                           "restart-policy cancel: adopted, then cancelled");
    }
  }
  return failed;
}

}  // namespace custos::supervisor
