// The sandbox's values (docs/sandbox.md): the requirements a request states (`plan.sandbox`), the
// contract a grant states (`sandbox` of a grant: the same shape), the effective policy either one
// means once every default is filled in, and the checked sandbox plan a plan's requirements
// compile to. Plain data and pure helpers; no I/O.
//
// Three forms, on purpose:
//   SandboxRequirements  what the JSON said, member by member, lists in request order, every
//                        absent domain and field absent. Kept for two things only: diagnostics
//                        point into the request by its indices
//                        (/plan/sandbox/filesystem/1/allow/4), and to_json prints exactly what was
//                        given (a grant's stored contract).
//   SandboxPolicy        the meaning: every domain present, every default (the strictest value)
//                        filled in, every list a set (sorted, duplicates dropped). Two
//                        requirements that mean the same have equal policies.
//   CheckedSandboxPlan   a plan's policy plus the complete list of controls it needs: inert data,
//                        the input of admission and of enforcement, digested (canonical.hpp).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/core/resources.hpp"

namespace custos::sandbox {

// ------------------------------------------------------------------------------ bounds
// Every size a caller controls is bounded; exceeding one is plan.too_large (like the plan's).

inline constexpr std::size_t kMaxFilesystemEntries = 256;
// A path: Linux PATH_MAX (4096) including the terminator, as the plan's paths.
inline constexpr std::size_t kMaxPathBytes = core::kMaxPathBytes;
// A list naming members of a small closed set (rights, io modes, resource dimensions):
// duplicates are allowed and dropped, but the list itself is bounded.
inline constexpr std::size_t kMaxSetListItems = 64;
// environment.allow: as many names as a plan may have entries.
inline constexpr std::size_t kMaxEnvAllow = core::kMaxEnvCount;
inline constexpr std::size_t kMaxTcpPorts = 256;
inline constexpr std::size_t kMaxSecrets = 64;
// A secret ref: [A-Za-z0-9_.-], first alphanumeric. It names a file of the secret store and of
// $CREDENTIALS_DIRECTORY, so it can never be a path.
inline constexpr std::size_t kMaxSecretRefBytes = 128;
// A secret file's name in $CUSTOS_SECRETS_DIR: one path component (NAME_MAX), same alphabet.
inline constexpr std::size_t kMaxSecretFileBytes = 255;
// A secret fd: above stdio, below the default RLIMIT_NOFILE soft limit.
inline constexpr std::uint32_t kMinSecretFd = 3;
inline constexpr std::uint32_t kMaxSecretFd = 1023;

// ------------------------------------------------------------------------------ enums

// Filesystem rights, each for a path and everything below it (API.md): list directories, stat,
// read, execute, create entries, write (modify) files, remove entries.
enum class Right : std::uint8_t { discover, metadata, read, execute, create, write, remove };
inline constexpr std::size_t kRightCount = 7;

// Who the execution may signal (and see): only its own tree. The one value API.md defines; the
// member exists so that a contract can state it and a later version can add wider scopes.
enum class SignalScope : std::uint8_t { own_tree = 1 };

// Outbound network: nothing but a private loopback, TCP connect to listed ports, or anything.
// Ordered from strictest to widest.
enum class Outbound : std::uint8_t { none = 1, tcp_connect = 2, any = 3 };

// Where a secret's value is delivered: an environment variable, a file in the private directory
// named by $CUSTOS_SECRETS_DIR, or an inherited descriptor.
enum class SecretChannel : std::uint8_t { env = 1, file = 2, fd = 3 };

[[nodiscard]] std::string_view right_wire(Right r) noexcept;
[[nodiscard]] std::optional<Right> right_from_wire(std::string_view w) noexcept;
[[nodiscard]] std::string_view signal_scope_wire(SignalScope s) noexcept;
[[nodiscard]] std::optional<SignalScope> signal_scope_from_wire(std::string_view w) noexcept;
[[nodiscard]] std::string_view outbound_wire(Outbound o) noexcept;  // "none", "tcp_connect", "any"
[[nodiscard]] std::string_view secret_channel_wire(SecretChannel c) noexcept;
[[nodiscard]] std::optional<SecretChannel> secret_channel_from_wire(std::string_view w) noexcept;

// A set of enumerators of E, whose values are First..First+N-1, as a bit mask (bit i is the
// enumerator First+i). The mask is also the set's canonical encoding (canonical.hpp).
template <class E, std::size_t N, std::size_t First = 0>
class EnumSet {
  static_assert(N <= 32);

 public:
  static constexpr std::uint32_t kAll = N == 32 ? 0xFFFFFFFFU : (1U << N) - 1U;

  constexpr EnumSet() noexcept = default;
  constexpr EnumSet(std::initializer_list<E> members) noexcept {
    for (E e : members) add(e);
  }
  // nullopt when `bits` names a value outside the enum.
  [[nodiscard]] static constexpr std::optional<EnumSet> from_bits(std::uint32_t bits) noexcept {
    if ((bits & ~kAll) != 0) return std::nullopt;
    EnumSet s;
    s.bits_ = bits;
    return s;
  }

  constexpr void add(E e) noexcept { bits_ |= bit(e); }
  [[nodiscard]] constexpr bool has(E e) const noexcept { return (bits_ & bit(e)) != 0; }
  [[nodiscard]] constexpr bool empty() const noexcept { return bits_ == 0; }
  [[nodiscard]] constexpr std::uint32_t bits() const noexcept { return bits_; }
  [[nodiscard]] constexpr bool subset_of(EnumSet other) const noexcept {
    return (bits_ & ~other.bits_) == 0;
  }
  [[nodiscard]] constexpr EnumSet minus(EnumSet other) const noexcept {
    EnumSet s;
    s.bits_ = bits_ & ~other.bits_;
    return s;
  }
  // The members in enum order.
  [[nodiscard]] std::vector<E> members() const {
    std::vector<E> out;
    for (std::size_t i = 0; i < N; ++i) {
      if ((bits_ & (1U << i)) != 0) out.push_back(static_cast<E>(i + First));
    }
    return out;
  }

  friend constexpr bool operator==(EnumSet, EnumSet) = default;

 private:
  [[nodiscard]] static constexpr std::uint32_t bit(E e) noexcept {
    return 1U << (static_cast<std::size_t>(e) - First);
  }
  std::uint32_t bits_ = 0;
};

using RightSet = EnumSet<Right, kRightCount>;
using ModeSet = EnumSet<core::IoMode, 2, 1>;  // IoMode::pipes = 1, pty = 2
using DimSet = EnumSet<core::ResourceDim, core::kResourceDimCount>;

// ------------------------------------------------------------------------------ requirements
// What the JSON said (see the file comment). Paths are already normalized; nothing else is
// changed. A member left out of the JSON is empty here.

struct PathRequirement {
  std::string path;          // absolute and normalized (no empty, "." or ".." component)
  std::vector<Right> allow;  // as listed (a right may repeat); its set is what counts
  friend bool operator==(PathRequirement const&, PathRequirement const&) = default;
};

struct ProcessRequirement {
  std::optional<bool> descendants;
  std::optional<std::uint64_t> max_processes;  // 1..kMaxPlanNumber
  std::optional<SignalScope> signal_scope;
  std::optional<bool> run_as_root;
  friend bool operator==(ProcessRequirement const&, ProcessRequirement const&) = default;
};

struct EnvironmentRequirement {
  std::optional<std::vector<std::string>> allow;  // valid env names, as listed
  friend bool operator==(EnvironmentRequirement const&, EnvironmentRequirement const&) = default;
};

struct NetworkRequirement {
  std::optional<Outbound> outbound;
  std::vector<std::uint32_t> tcp_connect;  // tcp_connect only: the ports (1..65535), as listed
  friend bool operator==(NetworkRequirement const&, NetworkRequirement const&) = default;
};

struct SecretRequirement {
  std::string ref;
  SecretChannel channel = SecretChannel::env;
  std::string name;      // env: the variable's name; file: the file's name; fd: empty
  std::uint32_t fd = 0;  // fd: the descriptor number; else 0
  friend bool operator==(SecretRequirement const&, SecretRequirement const&) = default;
};

struct ResourcesRequirement {
  std::optional<std::vector<core::ResourceDim>> enforce;  // as listed
  friend bool operator==(ResourcesRequirement const&, ResourcesRequirement const&) = default;
};

struct TerminalRequirement {
  std::optional<std::vector<core::IoMode>> modes;  // as listed
  std::optional<bool> input;
  std::optional<bool> resize;
  friend bool operator==(TerminalRequirement const&, TerminalRequirement const&) = default;
};

struct SandboxRequirements {
  std::optional<std::vector<PathRequirement>> filesystem;
  std::optional<ProcessRequirement> process;
  std::optional<EnvironmentRequirement> environment;
  std::optional<NetworkRequirement> network;
  std::optional<std::vector<SecretRequirement>> secrets;
  std::optional<ResourcesRequirement> resources;
  std::optional<TerminalRequirement> terminal;
  friend bool operator==(SandboxRequirements const&, SandboxRequirements const&) = default;
};

// ------------------------------------------------------------------------------ the policy
// What requirements mean: every domain, every default, every list a set. The defaults are the
// default denial of API.md ("denied at its strictest").

// The rights a path has, for it and everything below it. Among the rules whose path is the
// path itself or one of its ancestors, the longest decides: a rule for /srv/w/.git narrows (or
// widens) what /srv/w gives. A path under no rule does not exist for the execution.
struct PathRule {
  std::string path;
  RightSet rights;
  friend bool operator==(PathRule const&, PathRule const&) = default;
};

struct ProcessPolicy {
  bool descendants = false;
  std::uint64_t max_processes = 1;  // the whole tree, the root included; 1 when !descendants
  SignalScope signal_scope = SignalScope::own_tree;
  bool run_as_root = false;
  friend bool operator==(ProcessPolicy const&, ProcessPolicy const&) = default;
};

struct EnvironmentPolicy {
  std::vector<std::string> allow;  // sorted, unique
  friend bool operator==(EnvironmentPolicy const&, EnvironmentPolicy const&) = default;
};

struct NetworkPolicy {
  Outbound outbound = Outbound::none;
  std::vector<std::uint32_t> tcp_ports;  // sorted, unique; non-empty exactly for tcp_connect
  friend bool operator==(NetworkPolicy const&, NetworkPolicy const&) = default;
};

struct SecretDelivery {
  std::string ref;
  SecretChannel channel = SecretChannel::env;
  std::string name;
  std::uint32_t fd = 0;
  friend bool operator==(SecretDelivery const&, SecretDelivery const&) = default;
  friend auto operator<=>(SecretDelivery const&, SecretDelivery const&) = default;
};

struct ResourcesPolicy {
  DimSet enforce;  // dimensions that must be kernel- or supervisor-enforced (fidelity hard)
  friend bool operator==(ResourcesPolicy const&, ResourcesPolicy const&) = default;
};

struct TerminalPolicy {
  ModeSet modes{core::IoMode::pipes};
  bool input = false;
  bool resize = false;
  friend bool operator==(TerminalPolicy const&, TerminalPolicy const&) = default;
};

struct SandboxPolicy {
  std::vector<PathRule> filesystem;  // sorted by path, one rule per path
  ProcessPolicy process;
  EnvironmentPolicy environment;
  NetworkPolicy network;
  std::vector<SecretDelivery> secrets;  // sorted (ref, channel, name, fd), unique
  ResourcesPolicy resources;
  TerminalPolicy terminal;

  // The rule that decides for `path` (absolute, normalized): the longest rule at or above it;
  // nullptr when none does (the path does not exist for the execution).
  [[nodiscard]] PathRule const* governing(std::string_view path) const noexcept;
  // The rights `path` has (empty when no rule governs it).
  [[nodiscard]] RightSet rights_at(std::string_view path) const noexcept;

  friend bool operator==(SandboxPolicy const&, SandboxPolicy const&) = default;
};

// A plan's compiled sandbox (compile.hpp): its policy and every control enforcing it needs,
// sorted (controls.hpp names them). Its digest (canonical.hpp) is the plan's sandbox_digest.
struct CheckedSandboxPlan {
  SandboxPolicy policy;
  std::vector<std::string> controls;
  friend bool operator==(CheckedSandboxPlan const&, CheckedSandboxPlan const&) = default;
};

// ------------------------------------------------------------------------------ predicates

// Normalizes an absolute path lexically: empty and "." components are dropped and a trailing
// '/' removed ("/usr//lib/./" -> "/usr/lib"; "/" stays "/"). nullopt, with the reason in
// `why`, when it is relative or has a ".." component (folding ".." is wrong where a component
// is a symlink, so it is refused, as in a plan's cwd).
[[nodiscard]] std::optional<std::string> normalize_path(std::string_view path, std::string* why);
// True when `ancestor` is `path` itself or a directory above it (whole components: /usr is above
// /usr/lib, not above /usrx). Both normalized.
[[nodiscard]] bool path_at_or_below(std::string_view path, std::string_view ancestor) noexcept;
[[nodiscard]] bool is_valid_secret_ref(std::string_view ref) noexcept;
[[nodiscard]] bool is_valid_secret_file(std::string_view name) noexcept;

// The plan limit a resource dimension enforces; nullopt for concurrency (no plan limit bounds
// it). descriptors is limits.open_files.
[[nodiscard]] std::optional<core::Limit> plan_limit_of(core::Limits const& limits,
                                                       core::ResourceDim dim) noexcept;
// The JSON name of that limit ("open_files" for descriptors); empty for concurrency.
[[nodiscard]] std::string_view plan_limit_name(core::ResourceDim dim) noexcept;

}  // namespace custos::sandbox
