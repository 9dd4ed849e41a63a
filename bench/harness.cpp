// Statistics, bounded loops and row arithmetic shared by the floors and the product rows.
#include <algorithm>
#include <cmath>
#include <fcntl.h>
#include <unistd.h>

#include "bench.hpp"

namespace custos::bench {

std::optional<double> Row::ratio() const {
  if (!value.has_value() || !floor_value.has_value() || *floor_value == 0.0) return std::nullopt;
  return *value / *floor_value;
}

bool Row::meets() const {
  auto const r = ratio();
  if (!r.has_value() || !target.has_value()) return false;
  return better == Better::lower ? *r <= *target : *r >= *target;
}

Row unmeasured(std::string name, std::string unit, std::string floor_name,
               std::optional<double> floor_value, double target, Better better, std::string why) {
  Row r;
  r.name = std::move(name);
  r.unit = std::move(unit);
  r.floor_name = std::move(floor_name);
  r.floor_value = floor_value;
  r.target = target;
  r.better = better;
  r.note = std::move(why);
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  std::size_t const mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2.0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void bounded_loop(std::size_t max_iterations, std::chrono::milliseconds budget,
                  std::function<bool()> const& body) {
  auto const stop_at = std::chrono::steady_clock::now() + budget;
  for (std::size_t i = 0; i < max_iterations && std::chrono::steady_clock::now() < stop_at; ++i) {
    if (!body()) return;
  }
}

void settle_page_cache(Env const& env) {
  // syncfs writes back the work dir's filesystem and waits for it; nothing is dropped from the
  // cache (that would be a machine-wide side effect), only made clean.
  int const fd = ::open(env.work_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::syncfs(fd);
  ::close(fd);
}

}  // namespace custos::bench
