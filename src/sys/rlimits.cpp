#include "custos/sys/rlimits.hpp"

#include <array>
#include <cerrno>
#include <string>
#include <sys/resource.h>
#include <utility>

namespace custos::sys {
namespace {

constexpr std::array<std::pair<std::string_view, int>, 9> kNames{{
    {"nofile", RLIMIT_NOFILE},
    {"nproc", RLIMIT_NPROC},
    {"cpu", RLIMIT_CPU},
    {"as", RLIMIT_AS},
    {"core", RLIMIT_CORE},
    {"fsize", RLIMIT_FSIZE},
    {"stack", RLIMIT_STACK},
    {"data", RLIMIT_DATA},
    {"memlock", RLIMIT_MEMLOCK},
}};

Result<Rlimit> prlimit_get(pid_t pid, int resource) {
  struct rlimit64 cur {};
  if (::prlimit64(pid, static_cast<__rlimit_resource>(resource), nullptr, &cur) != 0) {
    return Error(Errc::sys_error, "prlimit64 get resource " + std::to_string(resource), errno);
  }
  return Rlimit{resource, cur.rlim_cur, cur.rlim_max};
}

}  // namespace

Result<Rlimit> get_rlimit(int resource) {
  return prlimit_get(0, resource);
}

Result<Rlimit> get_rlimit(std::int32_t pid, int resource) {
  return prlimit_get(pid, resource);
}

Result<void> set_rlimit(Rlimit const& limit) {
  CUSTOS_TRYV(validate_rlimit(limit));
  struct rlimit64 want {};
  want.rlim_cur = limit.soft;
  want.rlim_max = limit.hard;
  if (::prlimit64(0, static_cast<__rlimit_resource>(limit.resource), &want, nullptr) != 0) {
    return Error(Errc::sys_error, "prlimit64 set resource " + std::to_string(limit.resource),
                 errno);
  }
  return ok();
}

Result<void> validate_rlimit(Rlimit const& limit) {
  if (limit.resource < 0 || limit.resource >= RLIMIT_NLIMITS) {
    return Error(Errc::plan_invalid_limit,
                 "unknown rlimit resource " + std::to_string(limit.resource), EINVAL);
  }
  if (limit.soft > limit.hard) {
    return Error(Errc::plan_invalid_limit, "rlimit soft value exceeds hard value", EINVAL);
  }
  return ok();
}

std::optional<int> rlimit_resource_from_name(std::string_view name) {
  for (auto const& [n, r] : kNames) {
    if (n == name) return r;
  }
  return std::nullopt;
}

}  // namespace custos::sys
