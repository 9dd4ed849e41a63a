// Resource limits (setrlimit) for a child. The values are plain data so that SpawnSpec can carry
// them across clone3; the child applies them with prlimit64 on itself (async-signal-safe).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <sys/resource.h>

#include "custos/core/result.hpp"

namespace custos::sys {

// RLIM_INFINITY is kRlimInfinity; soft must not exceed hard.
inline constexpr std::uint64_t kRlimInfinity = ~std::uint64_t{0};

struct Rlimit {
  int resource = 0;  // RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_CPU, RLIMIT_AS, RLIMIT_CORE, ...
  std::uint64_t soft = 0;
  std::uint64_t hard = 0;

  friend bool operator==(Rlimit const&, Rlimit const&) = default;
};

// The limit of the calling process. Errors: sys.error (EINVAL for an unknown resource).
[[nodiscard]] Result<Rlimit> get_rlimit(int resource);

// The limit of another process (prlimit64 on pid, read only). Errors: sys.error (ESRCH, EPERM).
[[nodiscard]] Result<Rlimit> get_rlimit(std::int32_t pid, int resource);

// Sets a limit on the calling process. Errors: sys.error (EINVAL soft > hard, EPERM raising hard).
[[nodiscard]] Result<void> set_rlimit(Rlimit const& limit);

// Checks a limit before it is put in a SpawnSpec: known resource, soft <= hard.
// Errors: plan.invalid_limit.
[[nodiscard]] Result<void> validate_rlimit(Rlimit const& limit);

// "nofile" -> RLIMIT_NOFILE, "nproc", "cpu", "as", "core", "fsize", "stack", "data", "memlock";
// nullopt for an unknown name.
[[nodiscard]] std::optional<int> rlimit_resource_from_name(std::string_view name);

}  // namespace custos::sys
