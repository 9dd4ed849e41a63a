// A plan's requirements against a grant's contract: every undeclared item, pointing into the
// request (compile.hpp, undeclared).
//
// Both sides are compared by what they mean (their policies), and each finding is traced back to
// the request item that asked for it. A plan's absent member means the strictest value, which
// every contract allows, so a finding always has an item of the request to point at — except
// the two that come from the contract's side: a default io mode the contract does not list, and
// a resource dimension the contract requires enforced; those point at the deepest member of the
// request that exists on the way to where the item would be.
#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "custos/core/json_pointer.hpp"
#include "custos/sandbox/compile.hpp"

namespace custos::sandbox {
namespace {

using core::pointer_append;

class Finder {
 public:
  Finder(SandboxRequirements const& req, std::string_view sandbox_ptr, std::string_view owner)
      : req_(req), base_(sandbox_ptr), owner_(owner) {}

  // `what` the request asks for, which the contract does not allow.
  void add(std::string pointer, std::string const& what) {
    add_message(std::move(pointer), what + " is not in " + owner_ + "'s sandbox contract");
  }
  void add_message(std::string pointer, std::string message) {
    out_.push_back(Diagnostic{Errc::sandbox_undeclared, std::move(pointer), std::move(message)});
  }
  [[nodiscard]] std::string at(std::initializer_list<std::string_view> tokens) const {
    std::string p = base_;
    for (auto t : tokens) p = pointer_append(p, t);
    return p;
  }
  [[nodiscard]] std::string at_index(std::initializer_list<std::string_view> tokens,
                                     std::size_t i) const {
    return pointer_append(at(tokens), i);
  }
  [[nodiscard]] SandboxRequirements const& req() const noexcept { return req_; }
  [[nodiscard]] std::string const& owner() const noexcept { return owner_; }
  std::vector<Diagnostic> take() && { return std::move(out_); }

 private:
  SandboxRequirements const& req_;
  std::string base_;
  std::string owner_;
  std::vector<Diagnostic> out_;
};

// Filesystem: the plan's rights at every path must be within the contract's there. Both are
// decided by the longest rule at or above a path, so they change only at a rule's path: checking
// at every path either side lists covers every path.
void filesystem_findings(Finder& f, SandboxPolicy const& plan, SandboxPolicy const& contract) {
  if (!f.req().filesystem) return;
  auto const& entries = *f.req().filesystem;
  std::set<std::string> points;
  for (auto const& r : plan.filesystem) points.insert(r.path);
  for (auto const& r : contract.filesystem) points.insert(r.path);
  // (entry, allow index) -> what it asks for; a map, so findings come out in request order.
  std::map<std::pair<std::size_t, std::size_t>, std::string> found;
  for (auto const& point : points) {
    PathRule const* rule = plan.governing(point);
    if (rule == nullptr) continue;
    RightSet const extra = rule->rights.minus(contract.rights_at(point));
    if (extra.empty()) continue;
    auto const e = std::find_if(entries.begin(), entries.end(),
                                [&](PathRequirement const& x) { return x.path == rule->path; });
    if (e == entries.end()) continue;  // cannot happen: every rule comes from an entry
    auto const i = static_cast<std::size_t>(e - entries.begin());
    RightSet told;  // a right listed twice is reported at its first place only
    for (std::size_t j = 0; j < e->allow.size(); ++j) {
      Right const right = e->allow[j];
      if (!extra.has(right) || told.has(right)) continue;
      told.add(right);
      std::string what = std::string{right_wire(right)} + " on " + e->path;
      // Reaching a path below the rule where the contract gives less (a carve-out of it).
      if (point != e->path) what += " (it reaches " + point + ")";
      found.emplace(std::pair{i, j}, std::move(what));  // the first point found is kept
    }
  }
  for (auto const& [at, what] : found) {
    f.add(pointer_append(pointer_append(f.at_index({"filesystem"}, at.first), "allow"), at.second),
          what);
  }
}

void process_findings(Finder& f, ProcessPolicy const& plan, ProcessPolicy const& contract) {
  auto const& p = f.req().process;
  if (!p) return;
  if (plan.descendants && !contract.descendants) {
    f.add(f.at({"process", "descendants"}), "descendants: true");
  } else if (plan.descendants && plan.max_processes > contract.max_processes) {
    f.add(f.at({"process", "max_processes"}), "max_processes " +
                                                  std::to_string(plan.max_processes) + " (above " +
                                                  std::to_string(contract.max_processes) + ")");
  }
  if (plan.run_as_root && !contract.run_as_root) {
    f.add(f.at({"process", "run_as_root"}), "run_as_root: true");
  }
}

void environment_findings(Finder& f, EnvironmentPolicy const& contract) {
  auto const& env = f.req().environment;
  if (!env || !env->allow) return;
  std::set<std::string> told;
  for (std::size_t j = 0; j < env->allow->size(); ++j) {
    auto const& name = (*env->allow)[j];
    if (std::binary_search(contract.allow.begin(), contract.allow.end(), name)) continue;
    if (!told.insert(name).second) continue;
    f.add(f.at_index({"environment", "allow"}, j), "environment name " + name);
  }
}

void network_findings(Finder& f, NetworkPolicy const& plan, NetworkPolicy const& contract) {
  auto const& net = f.req().network;
  if (!net || !net->outbound || contract.outbound == Outbound::any) return;
  if (plan.outbound == Outbound::any) {
    f.add(f.at({"network", "outbound"}), "outbound any");
    return;
  }
  if (plan.outbound != Outbound::tcp_connect) return;
  std::set<std::uint32_t> told;
  for (std::size_t j = 0; j < net->tcp_connect.size(); ++j) {
    auto const port = net->tcp_connect[j];
    if (std::binary_search(contract.tcp_ports.begin(), contract.tcp_ports.end(), port)) continue;
    if (!told.insert(port).second) continue;
    f.add(f.at_index({"network", "outbound", "tcp_connect"}, j),
          "TCP connect to port " + std::to_string(port));
  }
}

void secret_findings(Finder& f, std::vector<SecretDelivery> const& contract) {
  auto const& secrets = f.req().secrets;
  if (!secrets) return;
  for (std::size_t i = 0; i < secrets->size(); ++i) {
    auto const& s = (*secrets)[i];
    SecretDelivery const d{s.ref, s.channel, s.name, s.fd};
    if (std::binary_search(contract.begin(), contract.end(), d)) continue;
    std::string const target = s.channel == SecretChannel::fd
                                   ? "fd " + std::to_string(s.fd)
                                   : std::string{secret_channel_wire(s.channel)} + " " + s.name;
    f.add(f.at_index({"secrets"}, i), "secret " + s.ref + " delivered to " + target);
  }
}

// The deepest member of the request on the way to `domain`/`member`.
std::string deepest(Finder const& f, bool has_domain, bool has_member, std::string_view domain,
                    std::string_view member) {
  if (has_member) return f.at({domain, member});
  if (has_domain) return f.at({domain});
  return f.at({});
}

void terminal_findings(Finder& f, TerminalPolicy const& plan, TerminalPolicy const& contract) {
  auto const& t = f.req().terminal;
  bool const listed = t && t->modes;
  for (auto mode : plan.modes.minus(contract.modes).members()) {
    std::string const what = "io mode " + std::string{core::to_string(mode)};
    if (!listed) {
      f.add(deepest(f, t.has_value(), false, "terminal", "modes"), what + " (the default)");
      continue;
    }
    auto const& modes = *t->modes;
    auto const j =
        static_cast<std::size_t>(std::find(modes.begin(), modes.end(), mode) - modes.begin());
    f.add(f.at_index({"terminal", "modes"}, j), what);
  }
  if (plan.input && !contract.input) f.add(f.at({"terminal", "input"}), "input: true");
  if (plan.resize && !contract.resize) f.add(f.at({"terminal", "resize"}), "resize: true");
}

void resource_findings(Finder& f, ResourcesPolicy const& plan, ResourcesPolicy const& contract) {
  auto const& r = f.req().resources;
  std::string const ptr =
      deepest(f, r.has_value(), r.has_value() && r->enforce.has_value(), "resources", "enforce");
  for (auto dim : contract.enforce.minus(plan.enforce).members()) {
    f.add_message(ptr, f.owner() + "'s sandbox contract requires " +
                           std::string{core::resource_dim_wire(dim)} +
                           " in resources.enforce (enforced, not only sampled)");
  }
}

}  // namespace

std::vector<Diagnostic> undeclared(SandboxRequirements const& requirements,
                                   SandboxRequirements const& contract,
                                   std::string_view sandbox_ptr, std::string_view contract_of) {
  SandboxPolicy const plan = effective(requirements);
  SandboxPolicy const allowed = effective(contract);
  Finder f{requirements, sandbox_ptr, contract_of};
  filesystem_findings(f, plan, allowed);
  process_findings(f, plan.process, allowed.process);
  environment_findings(f, allowed.environment);
  network_findings(f, plan.network, allowed.network);
  secret_findings(f, allowed.secrets);
  resource_findings(f, plan.resources, allowed.resources);
  terminal_findings(f, plan.terminal, allowed.terminal);
  return std::move(f).take();
}

}  // namespace custos::sandbox
