// The sandbox's wire names and path predicates (types.hpp).
#include "custos/sandbox/types.hpp"

#include <algorithm>

#include "custos/core/wire_names.hpp"

namespace custos::sandbox {
namespace {

constexpr auto kRightNames = core::wire_names<Right>({
    {Right::discover, "discover"},
    {Right::metadata, "metadata"},
    {Right::read, "read"},
    {Right::execute, "execute"},
    {Right::create, "create"},
    {Right::write, "write"},
    {Right::remove, "remove"},
});
static_assert(kRightNames.complete() && kRightNames.size() == kRightCount);

constexpr auto kSignalScopeNames = core::wire_names<SignalScope>({
    {SignalScope::own_tree, "own_tree"},
});
static_assert(kSignalScopeNames.complete(1));

constexpr auto kOutboundNames = core::wire_names<Outbound>({
    {Outbound::none, "none"},
    {Outbound::tcp_connect, "tcp_connect"},
    {Outbound::any, "any"},
});
static_assert(kOutboundNames.complete(1));

constexpr auto kChannelNames = core::wire_names<SecretChannel>({
    {SecretChannel::env, "env"},
    {SecretChannel::file, "file"},
    {SecretChannel::fd, "fd"},
});
static_assert(kChannelNames.complete(1));

bool is_name_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

bool is_alnum(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

std::string_view right_wire(Right r) noexcept {
  return kRightNames.wire(r);
}
std::optional<Right> right_from_wire(std::string_view w) noexcept {
  return kRightNames.from_wire(w);
}
std::string_view signal_scope_wire(SignalScope s) noexcept {
  return kSignalScopeNames.wire(s);
}
std::optional<SignalScope> signal_scope_from_wire(std::string_view w) noexcept {
  return kSignalScopeNames.from_wire(w);
}
std::string_view outbound_wire(Outbound o) noexcept {
  return kOutboundNames.wire(o);
}
std::string_view secret_channel_wire(SecretChannel c) noexcept {
  return kChannelNames.wire(c);
}
std::optional<SecretChannel> secret_channel_from_wire(std::string_view w) noexcept {
  return kChannelNames.from_wire(w);
}

PathRule const* SandboxPolicy::governing(std::string_view path) const noexcept {
  PathRule const* best = nullptr;
  for (auto const& rule : filesystem) {
    if (path_at_or_below(path, rule.path) &&
        (best == nullptr || rule.path.size() > best->path.size())) {
      best = &rule;
    }
  }
  return best;
}

RightSet SandboxPolicy::rights_at(std::string_view path) const noexcept {
  auto const* rule = governing(path);
  return rule != nullptr ? rule->rights : RightSet{};
}

std::optional<std::string> normalize_path(std::string_view path, std::string* why) {
  auto fail = [why](char const* reason) -> std::optional<std::string> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  if (path.empty() || path.front() != '/') return fail("must be an absolute path");
  std::string out;
  std::size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    std::size_t const start = i;
    while (i < path.size() && path[i] != '/') ++i;
    std::string_view const component = path.substr(start, i - start);
    if (component.empty() || component == ".") continue;
    if (component == "..") {
      return fail(
          "has a \"..\" component (refused: folding it is wrong where a component is a "
          "symlink)");
    }
    out += '/';
    out += component;
  }
  if (out.empty()) out = "/";
  return out;
}

bool path_at_or_below(std::string_view path, std::string_view ancestor) noexcept {
  if (ancestor == "/") return !path.empty() && path.front() == '/';
  if (!path.starts_with(ancestor)) return false;
  return path.size() == ancestor.size() || path[ancestor.size()] == '/';
}

bool is_valid_secret_ref(std::string_view ref) noexcept {
  return !ref.empty() && ref.size() <= kMaxSecretRefBytes && is_alnum(ref.front()) &&
         std::all_of(ref.begin(), ref.end(), is_name_char);
}

bool is_valid_secret_file(std::string_view name) noexcept {
  return !name.empty() && name.size() <= kMaxSecretFileBytes && name != "." && name != ".." &&
         std::all_of(name.begin(), name.end(), is_name_char);
}

std::optional<core::Limit> plan_limit_of(core::Limits const& limits,
                                         core::ResourceDim dim) noexcept {
  switch (dim) {
    case core::ResourceDim::wall:
      return limits.wall_ms;
    case core::ResourceDim::cpu:
      return limits.cpu_ms;
    case core::ResourceDim::memory:
      return limits.memory_bytes;
    case core::ResourceDim::disk:
      return limits.disk_bytes;
    case core::ResourceDim::output:
      return limits.output_bytes;
    case core::ResourceDim::descriptors:
      return limits.open_files;
    case core::ResourceDim::processes:
      return limits.processes;
    case core::ResourceDim::concurrency:
      break;
  }
  return std::nullopt;
}

std::string_view plan_limit_name(core::ResourceDim dim) noexcept {
  switch (dim) {
    case core::ResourceDim::wall:
      return "wall_ms";
    case core::ResourceDim::cpu:
      return "cpu_ms";
    case core::ResourceDim::memory:
      return "memory_bytes";
    case core::ResourceDim::disk:
      return "disk_bytes";
    case core::ResourceDim::output:
      return "output_bytes";
    case core::ResourceDim::descriptors:
      return "open_files";
    case core::ResourceDim::processes:
      return "processes";
    case core::ResourceDim::concurrency:
      break;
  }
  return {};
}

}  // namespace custos::sandbox
