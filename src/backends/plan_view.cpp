#include "custos/backend/plan_view.hpp"

#include <boost/json/value.hpp>

#include "custos/core/digest.hpp"
#include "custos/core/plan_canonical.hpp"
#include "custos/core/plan_json.hpp"

namespace custos::backend {

PlanView view_plan(core::ExecutionPlan const& plan) {
  PlanView v;
  v.executable = plan.command.executable;
  v.argv = plan.command.argv;
  v.env.reserve(plan.env.size());
  for (auto const& e : plan.env) v.env.push_back(EnvEntryView{e.name, e.value});
  v.workspace_root = plan.workspace.root;
  // Core normalizes the root itself to "."; sys resolves "" as the root.
  v.cwd = plan.cwd == "." ? std::string{} : plan.cwd;

  v.pty = plan.io.mode == core::IoMode::pty;
  if (v.pty) {
    v.rows = static_cast<std::uint16_t>(plan.io.rows == 0 ? core::kDefaultPtyRows : plan.io.rows);
    v.cols = static_cast<std::uint16_t>(plan.io.cols == 0 ? core::kDefaultPtyCols : plan.io.cols);
    v.resize = plan.io.resize;
  }

  v.wall_ms = plan.limits.wall_ms;
  v.cpu_ms = plan.limits.cpu_ms;
  v.memory_bytes = plan.limits.memory_bytes;
  v.processes = plan.limits.processes;
  v.open_files = plan.limits.open_files;
  v.disk_bytes = plan.limits.disk_bytes;
  v.output_bytes = plan.limits.output_bytes;
  v.stdin_bytes = plan.limits.stdin_bytes;

  v.chunk_bytes = plan.output.chunk_bytes == 0 ? 1 : plan.output.chunk_bytes;
  v.retained_bytes = plan.output.retained_bytes;
  v.spool_bytes = plan.output.spool_bytes;
  v.max_events = plan.output.max_events;
  v.cancel_on_limit = plan.output.on_limit == core::OnLimit::cancel;

  v.graceful_signal = static_cast<int>(plan.escalation.signal);
  v.grace_ms = plan.escalation.grace_ms;
  v.kill_after_ms = plan.escalation.kill_after_ms;

  if (plan.user) v.user = PlanView::User{plan.user->uid, plan.user->gid, plan.user->groups};
  return v;
}

std::string const& session_of(core::ExecutionIdentity const& identity) {
  return identity.session_id;
}

boost::json::value identity_json(core::ExecutionIdentity const& identity) {
  return core::to_json(identity);
}

Result<std::string> compute_plan_digest(core::ExecutionIdentity const& identity,
                                        core::ExecutionPlan const& plan) {
  auto d = core::plan_digest(identity, plan);
  if (!d) return d.error();
  return d->to_string();
}

}  // namespace custos::backend
