// Requirements -> policy -> checked plan, and the rules against the plan and the caller
// (compile.hpp). The contract's comparison is contract.cpp's.
#include "custos/sandbox/compile.hpp"

#include <algorithm>
#include <set>

#include "custos/core/json_pointer.hpp"
#include "custos/sandbox/controls.hpp"

namespace custos::sandbox {
namespace {

using core::pointer_append;

// The environment name a plan's sandbox directory is announced under (docs/sandbox.md).
constexpr std::string_view kSecretsDirEnv = "CUSTOS_SECRETS_DIR";

template <class T>
void sort_unique(std::vector<T>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

std::vector<PathRule> effective_filesystem(std::vector<PathRequirement> const& entries) {
  std::vector<PathRule> rules;
  for (auto const& e : entries) {
    RightSet rights;
    for (Right r : e.allow) rights.add(r);
    rules.push_back(PathRule{e.path, rights});
  }
  std::sort(rules.begin(), rules.end(), [](PathRule const& a, PathRule const& b) {
    return a.path < b.path || (a.path == b.path && a.rights.bits() < b.rights.bits());
  });
  // A path listed twice has one set of rights (read_requirements refuses two different ones).
  rules.erase(std::unique(rules.begin(), rules.end(),
                          [](PathRule const& a, PathRule const& b) { return a.path == b.path; }),
              rules.end());
  return rules;
}

// ---- plan_rules, one function per domain

void env_rules(SandboxPolicy const& policy, core::ExecutionPlan const& plan,
               std::string const& plan_ptr, std::vector<Diagnostic>& out) {
  for (std::size_t i = 0; i < plan.env.size(); ++i) {
    if (!std::binary_search(policy.environment.allow.begin(), policy.environment.allow.end(),
                            plan.env[i].name)) {
      out.push_back({Errc::sandbox_invalid,
                     pointer_append(pointer_append(pointer_append(plan_ptr, "env"), i), "name"),
                     plan.env[i].name + " is not in sandbox.environment.allow"});
    }
  }
}

void terminal_rules(SandboxPolicy const& policy, core::ExecutionPlan const& plan,
                    std::string const& plan_ptr, std::vector<Diagnostic>& out) {
  std::string const io = pointer_append(plan_ptr, "io");
  if (!policy.terminal.modes.has(plan.io.mode)) {
    out.push_back({Errc::sandbox_invalid, pointer_append(io, "mode"),
                   "io mode " + std::string{core::to_string(plan.io.mode)} +
                       " is not in sandbox.terminal.modes"});
  }
  if (plan.io.resize && !policy.terminal.resize) {
    out.push_back({Errc::sandbox_invalid, pointer_append(io, "resize"),
                   "resize needs sandbox.terminal.resize: true"});
  }
}

void resource_rules(SandboxRequirements const& req, core::ExecutionPlan const& plan,
                    std::string const& sandbox_ptr, std::vector<Diagnostic>& out) {
  if (!req.resources || !req.resources->enforce) return;
  auto const& enforce = *req.resources->enforce;
  std::set<core::ResourceDim> reported;
  for (std::size_t i = 0; i < enforce.size(); ++i) {
    auto const limit = plan_limit_of(plan.limits, enforce[i]);
    if (limit && *limit) continue;  // a finite plan limit: enforceable
    if (!reported.insert(enforce[i]).second) continue;
    out.push_back(
        {Errc::sandbox_invalid,
         pointer_append(pointer_append(pointer_append(sandbox_ptr, "resources"), "enforce"), i),
         "limits." + std::string{plan_limit_name(enforce[i])} +
             " is unlimited: there is nothing to enforce"});
  }
}

void secret_rules(SandboxRequirements const& req, core::ExecutionPlan const& plan,
                  std::string const& plan_ptr, std::string const& sandbox_ptr,
                  std::vector<Diagnostic>& out) {
  if (!req.secrets) return;
  auto env_index = [&plan](std::string_view name) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < plan.env.size(); ++i) {
      if (plan.env[i].name == name) return i;
    }
    return std::nullopt;
  };
  bool files = false;
  for (std::size_t i = 0; i < req.secrets->size(); ++i) {
    auto const& s = (*req.secrets)[i];
    std::string const to = pointer_append(
        pointer_append(pointer_append(pointer_append(sandbox_ptr, "secrets"), i), "to"),
        secret_channel_wire(s.channel));
    if (s.channel == SecretChannel::env) {
      if (auto k = env_index(s.name)) {
        out.push_back({Errc::sandbox_invalid, to,
                       s.name + " is also an entry of plan.env (" +
                           pointer_append(pointer_append(plan_ptr, "env"), *k) + ")"});
      }
    } else if (s.channel == SecretChannel::file) {
      files = true;
    } else if (plan.limits.open_files && s.fd >= *plan.limits.open_files) {
      out.push_back({Errc::sandbox_invalid, to,
                     "fd " + std::to_string(s.fd) + " is not below limits.open_files " +
                         std::to_string(*plan.limits.open_files)});
    }
  }
  if (auto k = env_index(kSecretsDirEnv); files && k) {
    out.push_back(
        {Errc::sandbox_invalid,
         pointer_append(pointer_append(pointer_append(plan_ptr, "env"), *k), "name"),
         std::string{kSecretsDirEnv} + " names the secrets' directory; the daemon sets it"});
  }
}

// The first entry of the request that states the rule for `path`, and its index.
std::optional<std::size_t> entry_of(SandboxRequirements const& req, std::string_view path) {
  if (!req.filesystem) return std::nullopt;
  for (std::size_t i = 0; i < req.filesystem->size(); ++i) {
    if ((*req.filesystem)[i].path == path) return i;
  }
  return std::nullopt;
}

void workspace_rules(SandboxRequirements const& req, SandboxPolicy const& policy,
                     core::ExecutionPlan const& plan, std::string const& sandbox_ptr,
                     std::vector<Diagnostic>& out) {
  if (plan.workspace.access != core::WorkspaceAccess::read_only) return;
  std::string const& root = plan.workspace.root;
  constexpr RightSet kMutating{Right::create, Right::write, Right::remove};
  // The rules whose rights reach the workspace: the one governing its root, and every rule
  // below the root.
  std::vector<PathRule const*> reaching;
  if (auto const* g = policy.governing(root)) reaching.push_back(g);
  for (auto const& rule : policy.filesystem) {
    if (rule.path != root && path_at_or_below(rule.path, root)) reaching.push_back(&rule);
  }
  for (auto const* rule : reaching) {
    RightSet const bad = RightSet::from_bits(rule->rights.bits() & kMutating.bits()).value();
    if (bad.empty()) continue;
    auto const i = entry_of(req, rule->path);
    if (!i) continue;  // cannot happen: every rule comes from an entry
    auto const& entry = (*req.filesystem)[*i];
    std::string const aptr =
        pointer_append(pointer_append(pointer_append(sandbox_ptr, "filesystem"), *i), "allow");
    RightSet told;  // a right listed twice is reported once, at its first place
    for (std::size_t j = 0; j < entry.allow.size(); ++j) {
      if (!bad.has(entry.allow[j]) || told.has(entry.allow[j])) continue;
      told.add(entry.allow[j]);
      out.push_back({Errc::sandbox_invalid, pointer_append(aptr, j),
                     std::string{right_wire(entry.allow[j])} + " on " + entry.path +
                         " reaches the read_only workspace " + root +
                         " (a read_only workspace stays read-only in a sandbox)"});
    }
  }
}

}  // namespace

SandboxPolicy effective(SandboxRequirements const& req) {
  SandboxPolicy p;
  if (req.filesystem) p.filesystem = effective_filesystem(*req.filesystem);
  if (req.process) {
    p.process.descendants = req.process->descendants.value_or(false);
    p.process.max_processes = p.process.descendants ? req.process->max_processes.value_or(1) : 1;
    p.process.signal_scope = req.process->signal_scope.value_or(SignalScope::own_tree);
    p.process.run_as_root = req.process->run_as_root.value_or(false);
  }
  if (req.environment && req.environment->allow) {
    p.environment.allow = *req.environment->allow;
    sort_unique(p.environment.allow);
  }
  if (req.network && req.network->outbound) {
    p.network.outbound = *req.network->outbound;
    if (p.network.outbound == Outbound::tcp_connect) {
      p.network.tcp_ports = req.network->tcp_connect;
      sort_unique(p.network.tcp_ports);
    }
  }
  if (req.secrets) {
    for (auto const& s : *req.secrets) p.secrets.push_back({s.ref, s.channel, s.name, s.fd});
    sort_unique(p.secrets);
  }
  if (req.resources && req.resources->enforce) {
    for (auto dim : *req.resources->enforce) p.resources.enforce.add(dim);
  }
  if (req.terminal) {
    if (req.terminal->modes) {
      p.terminal.modes = ModeSet{};
      for (auto m : *req.terminal->modes) p.terminal.modes.add(m);
    }
    p.terminal.input = req.terminal->input.value_or(false);
    p.terminal.resize = req.terminal->resize.value_or(false);
  }
  return p;
}

std::vector<Diagnostic> plan_rules(SandboxRequirements const& req, SandboxPolicy const& policy,
                                   core::ExecutionPlan const& plan, std::string_view plan_ptr) {
  std::string const pptr{plan_ptr};
  std::string const sptr = pointer_append(pptr, "sandbox");
  std::vector<Diagnostic> out;
  env_rules(policy, plan, pptr, out);
  terminal_rules(policy, plan, pptr, out);
  resource_rules(req, plan, sptr, out);
  secret_rules(req, plan, pptr, sptr, out);
  workspace_rules(req, policy, plan, sptr, out);
  return out;
}

Result<CheckedSandboxPlan> compile_plan(SandboxRequirements const& req,
                                        core::ExecutionPlan const& plan,
                                        std::string_view plan_ptr) {
  CheckedSandboxPlan checked;
  checked.policy = effective(req);
  if (auto d = plan_rules(req, checked.policy, plan, plan_ptr); !d.empty()) {
    return sandbox_error(Errc::sandbox_invalid, std::move(d));
  }
  checked.controls = required_controls(checked.policy);
  return checked;
}

Result<std::optional<CheckedSandboxPlan>> compile(CompileInput const& in) {
  if (in.plan == nullptr) return Error{Errc::internal, "sandbox compile: no plan"};
  std::string const sandbox_ptr = pointer_append(in.plan_ptr, "sandbox");
  if (in.requirements == nullptr) {
    if (in.contract == nullptr) return std::optional<CheckedSandboxPlan>{};
    return sandbox_error(Errc::sandbox_required,
                         {{Errc::sandbox_required, sandbox_ptr,
                           in.contract_of + " has a sandbox contract: the plan needs a sandbox"}});
  }
  CheckedSandboxPlan checked;
  checked.policy = effective(*in.requirements);
  auto invalid = plan_rules(*in.requirements, checked.policy, *in.plan, in.plan_ptr);
  std::uint32_t const uid = in.plan->user ? in.plan->user->uid : in.caller_uid;
  if (uid == 0 && !checked.policy.process.run_as_root) {
    invalid.push_back({Errc::sandbox_invalid,
                       pointer_append(pointer_append(sandbox_ptr, "process"), "run_as_root"),
                       in.plan->user ? "plan.user is uid 0: the sandbox needs run_as_root: true"
                                     : "the caller is uid 0 and the plan names no user: the "
                                       "execution would run as root (run_as_root: true, or a "
                                       "non-root plan.user)"});
  }
  if (!invalid.empty()) return sandbox_error(Errc::sandbox_invalid, std::move(invalid));
  if (in.contract != nullptr) {
    auto d = undeclared(*in.requirements, *in.contract, sandbox_ptr, in.contract_of);
    if (!d.empty()) return sandbox_error(Errc::sandbox_undeclared, std::move(d));
  }
  std::vector<Diagnostic> unknown;
  if (in.requirements->secrets) {
    auto const& secrets = *in.requirements->secrets;
    for (std::size_t i = 0; i < secrets.size(); ++i) {
      if (in.secret_exists && in.secret_exists(secrets[i].ref)) continue;
      unknown.push_back(
          {Errc::sandbox_secret_unknown,
           pointer_append(pointer_append(pointer_append(sandbox_ptr, "secrets"), i), "ref"),
           "the secret store holds no secret " + secrets[i].ref});
    }
  }
  if (!unknown.empty()) return sandbox_error(Errc::sandbox_secret_unknown, std::move(unknown));
  checked.controls = required_controls(checked.policy);
  return std::optional<CheckedSandboxPlan>{std::move(checked)};
}

Error sandbox_error(Errc code, std::vector<Diagnostic> diagnostics) {
  Error e{code};
  if (diagnostics.size() == 1) {
    e.context = diagnostics.front().pointer + ": " + diagnostics.front().message;
  } else {
    e.context = std::to_string(diagnostics.size()) + " problems";
  }
  e.diagnostics = std::move(diagnostics);
  return e;
}

}  // namespace custos::sandbox
