// Canonical bytes of the checked sandbox plan (canonical.hpp has the layout).
#include "custos/sandbox/canonical.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include "custos/sandbox/controls.hpp"

namespace custos::sandbox {
namespace {

using core::CanonicalReader;
using core::CanonicalWriter;
using core::FieldType;

Error malformed(std::string what) {
  return Error{Errc::canonical_malformed, "checked sandbox plan: " + std::move(what)};
}

template <class T, class Less = std::less<>>
bool strictly_ascending(std::vector<T> const& v, Less less = {}) {
  return std::adjacent_find(v.begin(), v.end(),
                            [&](T const& a, T const& b) { return !less(a, b); }) == v.end();
}

void filesystem_problems(SandboxPolicy const& p, std::vector<std::string>& out) {
  if (p.filesystem.size() > kMaxFilesystemEntries) out.emplace_back("too many path rules");
  for (auto const& r : p.filesystem) {
    auto norm = normalize_path(r.path, nullptr);
    if (!norm || *norm != r.path || r.path.size() > kMaxPathBytes) {
      out.push_back("path " + r.path + " is not absolute and normalized");
    }
    if (!r.rights.empty() && !r.rights.has(Right::metadata)) {
      out.push_back("path " + r.path + " has rights without metadata");
    }
  }
  if (!strictly_ascending(p.filesystem,
                          [](PathRule const& a, PathRule const& b) { return a.path < b.path; })) {
    out.emplace_back("path rules are not strictly ascending by path");
  }
}

void secret_problems(SandboxPolicy const& p, std::vector<std::string>& out) {
  if (p.secrets.size() > kMaxSecrets) out.emplace_back("too many secrets");
  std::set<std::tuple<SecretChannel, std::string, std::uint32_t>> targets;
  for (auto const& s : p.secrets) {
    bool valid = is_valid_secret_ref(s.ref);
    switch (s.channel) {
      case SecretChannel::env:
        valid = valid && core::is_valid_env_name(s.name) && s.fd == 0;
        break;
      case SecretChannel::file:
        valid = valid && is_valid_secret_file(s.name) && s.fd == 0;
        break;
      case SecretChannel::fd:
        valid = valid && s.name.empty() && s.fd >= kMinSecretFd && s.fd <= kMaxSecretFd;
        break;
    }
    if (!valid) out.push_back("secret " + s.ref + " has an invalid delivery");
    if (!targets.insert({s.channel, s.name, s.fd}).second) {
      out.push_back("two secrets are delivered to the same place");
    }
  }
  if (!strictly_ascending(p.secrets)) out.emplace_back("secrets are not strictly ascending");
}

}  // namespace

std::vector<std::string> policy_problems(SandboxPolicy const& p) {
  std::vector<std::string> out;
  filesystem_problems(p, out);
  auto const& proc = p.process;
  if (proc.max_processes < 1 || proc.max_processes > core::kMaxPlanNumber ||
      (!proc.descendants && proc.max_processes != 1)) {
    out.emplace_back("max_processes out of its range");
  }
  auto const& env = p.environment.allow;
  if (env.size() > kMaxEnvAllow || !strictly_ascending(env) ||
      !std::all_of(env.begin(), env.end(),
                   [](std::string const& n) { return core::is_valid_env_name(n); })) {
    out.emplace_back("environment.allow is not a set of valid names");
  }
  auto const& ports = p.network.tcp_ports;
  if ((p.network.outbound == Outbound::tcp_connect) == ports.empty() ||
      ports.size() > kMaxTcpPorts || !strictly_ascending(ports) ||
      std::any_of(ports.begin(), ports.end(), [](auto x) { return x < 1 || x > 65535; })) {
    out.emplace_back("tcp ports do not match outbound");
  }
  secret_problems(p, out);
  if (p.resources.enforce.has(core::ResourceDim::concurrency)) {
    out.emplace_back("concurrency cannot be enforced");
  }
  if (p.terminal.modes.empty()) out.emplace_back("no io mode");
  return out;
}

// ------------------------------------------------------------------------------ writing

namespace {

void write_policy(CanonicalWriter& w, SandboxPolicy const& p) {
  w.begin_list(1, FieldType::record);
  for (auto const& r : p.filesystem) {
    w.begin_element_record(kind::fs_rule)
        .string(1, r.path)
        .u8(2, static_cast<std::uint8_t>(r.rights.bits()))
        .end_element_record();
  }
  w.end_list();
  w.begin_record(2, kind::process)
      .boolean(1, p.process.descendants)
      .u64(2, p.process.max_processes)
      .u8(3, static_cast<std::uint8_t>(p.process.signal_scope))
      .boolean(4, p.process.run_as_root)
      .end_record();
  w.begin_record(3, kind::environment).string_list(1, p.environment.allow).end_record();
  w.begin_record(4, kind::network)
      .u8(1, static_cast<std::uint8_t>(p.network.outbound))
      .u32_list(2, p.network.tcp_ports)
      .end_record();
  w.begin_list(5, FieldType::record);
  for (auto const& s : p.secrets) {
    switch (s.channel) {
      case SecretChannel::env:
        w.begin_element_record(kind::secret_env).string(1, s.ref).string(2, s.name);
        break;
      case SecretChannel::file:
        w.begin_element_record(kind::secret_file).string(1, s.ref).string(2, s.name);
        break;
      case SecretChannel::fd:
        w.begin_element_record(kind::secret_fd).string(1, s.ref).u32(2, s.fd);
        break;
    }
    w.end_element_record();
  }
  w.end_list();
  w.begin_record(6, kind::resources)
      .u8(1, static_cast<std::uint8_t>(p.resources.enforce.bits()))
      .end_record();
  w.begin_record(7, kind::terminal)
      .u8(1, static_cast<std::uint8_t>(p.terminal.modes.bits()))
      .boolean(2, p.terminal.input)
      .boolean(3, p.terminal.resize)
      .end_record();
}

Result<std::vector<SecretDelivery>> read_secrets(CanonicalReader& r) {
  auto l = CUSTOS_TRY(r.list(5, FieldType::record));
  if (l.size() > kMaxSecrets) return malformed("too many secrets");
  std::vector<SecretDelivery> out;
  while (!l.done()) {
    auto e = CUSTOS_TRY(l.next_record());
    SecretDelivery s;
    s.ref = CUSTOS_TRY(e.string(1));
    if (e.kind() == kind::secret_env || e.kind() == kind::secret_file) {
      s.channel = e.kind() == kind::secret_env ? SecretChannel::env : SecretChannel::file;
      s.name = CUSTOS_TRY(e.string(2));
    } else if (e.kind() == kind::secret_fd) {
      s.channel = SecretChannel::fd;
      s.fd = CUSTOS_TRY(e.u32(2));
    } else {
      return malformed("secret of record kind " + std::to_string(e.kind()));
    }
    CUSTOS_TRYV(e.finish());
    out.push_back(std::move(s));
  }
  CUSTOS_TRYV(l.finish());
  return out;
}

template <class Set>
Result<Set> read_set(CanonicalReader& r, core::Tag tag, char const* what) {
  std::uint8_t const bits = CUSTOS_TRY(r.u8(tag));
  auto s = Set::from_bits(bits);
  if (!s) return malformed(std::string{what} + " bits " + std::to_string(bits));
  return *s;
}

Result<std::vector<PathRule>> read_filesystem(CanonicalReader& r) {
  auto l = CUSTOS_TRY(r.list(1, FieldType::record));
  if (l.size() > kMaxFilesystemEntries) return malformed("too many path rules");
  std::vector<PathRule> out;
  while (!l.done()) {
    auto e = CUSTOS_TRY(l.next_record());
    if (e.kind() != kind::fs_rule)
      return malformed("path rule of kind " + std::to_string(e.kind()));
    PathRule rule;
    rule.path = CUSTOS_TRY(e.string(1));
    rule.rights = CUSTOS_TRY(read_set<RightSet>(e, 2, "rights"));
    CUSTOS_TRYV(e.finish());
    out.push_back(std::move(rule));
  }
  CUSTOS_TRYV(l.finish());
  return out;
}

Result<SandboxPolicy> read_policy(CanonicalReader& r) {
  SandboxPolicy p;
  p.filesystem = CUSTOS_TRY(read_filesystem(r));
  {
    auto pr = CUSTOS_TRY(r.record(2, kind::process));
    p.process.descendants = CUSTOS_TRY(pr.boolean(1));
    p.process.max_processes = CUSTOS_TRY(pr.u64(2));
    std::uint8_t const scope = CUSTOS_TRY(pr.u8(3));
    if (scope != static_cast<std::uint8_t>(SignalScope::own_tree)) {
      return malformed("signal scope " + std::to_string(scope));
    }
    p.process.run_as_root = CUSTOS_TRY(pr.boolean(4));
    CUSTOS_TRYV(pr.finish());
  }
  {
    auto env = CUSTOS_TRY(r.record(3, kind::environment));
    p.environment.allow = CUSTOS_TRY(env.string_list(1));
    CUSTOS_TRYV(env.finish());
  }
  {
    auto net = CUSTOS_TRY(r.record(4, kind::network));
    std::uint8_t const outbound = CUSTOS_TRY(net.u8(1));
    if (outbound < 1 || outbound > 3) return malformed("outbound " + std::to_string(outbound));
    p.network.outbound = static_cast<Outbound>(outbound);
    p.network.tcp_ports = CUSTOS_TRY(net.u32_list(2));
    CUSTOS_TRYV(net.finish());
  }
  p.secrets = CUSTOS_TRY(read_secrets(r));
  {
    auto res = CUSTOS_TRY(r.record(6, kind::resources));
    p.resources.enforce = CUSTOS_TRY(read_set<DimSet>(res, 1, "enforce"));
    CUSTOS_TRYV(res.finish());
  }
  {
    auto t = CUSTOS_TRY(r.record(7, kind::terminal));
    p.terminal.modes = CUSTOS_TRY(read_set<ModeSet>(t, 1, "modes"));
    p.terminal.input = CUSTOS_TRY(t.boolean(2));
    p.terminal.resize = CUSTOS_TRY(t.boolean(3));
    CUSTOS_TRYV(t.finish());
  }
  return p;
}

}  // namespace

Result<std::vector<std::uint8_t>> encode(CheckedSandboxPlan const& checked) {
  if (auto problems = policy_problems(checked.policy); !problems.empty()) {
    return Error{Errc::sandbox_invalid, "checked sandbox plan: " + problems.front()};
  }
  if (checked.controls != required_controls(checked.policy)) {
    return Error{Errc::sandbox_invalid, "checked sandbox plan: controls are not the policy's"};
  }
  CanonicalWriter w{kind::checked_sandbox};
  write_policy(w, checked.policy);
  w.string_list(8, checked.controls);
  return std::move(w).finish();
}

Result<CheckedSandboxPlan> decode(std::span<std::uint8_t const> doc) {
  auto r = CUSTOS_TRY(CanonicalReader::open(doc, kind::checked_sandbox));
  CheckedSandboxPlan out;
  out.policy = CUSTOS_TRY(read_policy(r));
  out.controls = CUSTOS_TRY(r.string_list(8));
  CUSTOS_TRYV(r.finish());
  if (auto problems = policy_problems(out.policy); !problems.empty()) {
    return malformed(problems.front());
  }
  if (out.controls != required_controls(out.policy)) {
    return malformed("controls are not the ones its policy needs");
  }
  return out;
}

Result<core::Digest> digest(CheckedSandboxPlan const& checked) {
  auto bytes = CUSTOS_TRY(encode(checked));
  return core::sha256(bytes);
}

}  // namespace custos::sandbox
