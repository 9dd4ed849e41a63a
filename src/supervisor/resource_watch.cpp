#include "resource_watch.hpp"

#include <algorithm>

#include "supervisor.hpp"

namespace custos::supervisor {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

void peak(std::optional<std::uint64_t>& slot, std::optional<std::uint64_t> v) {
  if (!v) return;
  slot = slot ? std::max(*slot, *v) : *v;
}

}  // namespace

ResourceWatch::ResourceWatch(Supervisor& owner, boost::asio::io_context& io)
    : owner_(&owner), deadline_(io), sampler_(io) {}

void ResourceWatch::launch_began(std::size_t concurrency) {
  started_ = Clock::now();
  started_wall_ = std::chrono::system_clock::now();
  last_disk_sample_ = started_;
  concurrency_ = concurrency;
}

void ResourceWatch::adopted(milliseconds age) {
  started_ -= age;
  started_wall_ -= age;
  last_disk_sample_ = Clock::now();
  before_start_ = age;
}

void ResourceWatch::carry(Carried::Peaks& out) const {
  out = Carried::Peaks{cpu_ms_, rss_peak_, procs_peak_, fds_peak_, disk_growth_peak_};
}

void ResourceWatch::resume(Carried::Peaks const& in) {
  cpu_ms_ = in.cpu_ms;
  rss_peak_ = in.rss_bytes;
  procs_peak_ = in.processes;
  fds_peak_ = in.open_fds;
  disk_growth_peak_ = in.disk_growth;
}

void ResourceWatch::acquired(bool memory_hard, bool pids_hard, bool descriptors_hard) {
  memory_hard_ = memory_hard;
  pids_hard_ = pids_hard;
  descriptors_hard_ = descriptors_hard;
}

void ResourceWatch::start() {
  arm_deadline();
  arm_sampler();
}

void ResourceWatch::root_exited() {
  exited_at_ = Clock::now();
}

void ResourceWatch::final_usage(backend::Usage const& usage) {
  peak(cpu_ms_, usage.cpu_ms);
  peak(rss_peak_, usage.rss_bytes);
  peak(procs_peak_, usage.processes);
  peak(fds_peak_, usage.open_fds);
  peak(disk_growth_peak_, usage.disk_bytes);
}

void ResourceWatch::sample_now() {
  if (stopped_ || owner_->teardown_.tree_done()) return;
  sample();
}

void ResourceWatch::cancel_timers() {
  stopped_ = true;
  deadline_.cancel();
  sampler_.cancel();
}

void ResourceWatch::arm_deadline() {
  auto const& wall = owner_->plan_.wall_ms;
  if (!wall) return;
  // An adopted root may be past its deadline already: then it fires at once.
  auto const left = std::max(milliseconds(0), milliseconds(*wall) - before_start_);
  owner_->arm(deadline_, left, [this, wall = *wall] {
    (void)owner_->offer(core::Trigger::deadline,
                        "limits.wall_ms=" + std::to_string(wall) + " reached");
  });
}

void ResourceWatch::arm_sampler() {
  if (stopped_ || owner_->teardown_.tree_done()) return;
  owner_->arm(sampler_, owner_->config().sample_interval, [this] {
    if (stopped_ || owner_->teardown_.tree_done()) return;
    sample();
    arm_sampler();
  });
}

void ResourceWatch::sample() {
  Supervisor& s = *owner_;
  auto const u = s.backend_->sample();
  last_ = u;
  peak(cpu_ms_, u.cpu_ms);
  peak(rss_peak_, u.rss_bytes);
  peak(procs_peak_, u.processes);
  peak(fds_peak_, u.open_fds);
  peak(disk_growth_peak_, u.disk_bytes);
  auto const now = Clock::now();
  if (s.plan_.disk_bytes && now - last_disk_sample_ >= s.config().disk_sample_interval) {
    last_disk_sample_ = now;
    (void)s.backend_->measure_disk(
        [this](std::optional<std::uint64_t> growth) { on_disk(growth); });
  }
  if (s.life_.phase != core::Phase::running) return;
  auto over = [](std::optional<std::uint64_t> const& v, std::optional<std::uint64_t> const& lim) {
    return v && lim && *v > *lim;
  };
  auto const& plan = s.plan_;
  if (over(cpu_ms_, plan.cpu_ms)) return over_limit("cpu_ms", *cpu_ms_);
  if (over(rss_peak_, plan.memory_bytes)) return over_limit("memory_bytes", *rss_peak_);
  if (over(procs_peak_, plan.processes)) return over_limit("processes", *procs_peak_);
  if (over(disk_growth_peak_, plan.disk_bytes)) return over_limit("disk_bytes", *disk_growth_peak_);
}

void ResourceWatch::on_disk(std::optional<std::uint64_t> growth) {
  if (!growth) return;
  peak(disk_growth_peak_, growth);
  // The sampler checks limits right after sampling; a walk finishes later, so it checks the
  // disk limit itself.
  auto const& plan = owner_->plan_;
  if (owner_->life_.phase == core::Phase::running && plan.disk_bytes && *growth > *plan.disk_bytes)
    over_limit("disk_bytes", *growth);
}

void ResourceWatch::over_limit(std::string const& dim, std::uint64_t value) {
  boost::json::object f;
  f["limit"] = dim;
  f["action"] = "cancel";
  owner_->emit("limit", std::move(f));
  (void)owner_->offer(core::Trigger::resource_limit,
                      dim + " " + std::to_string(value) + " over the plan's limit");
}

core::ResourceReport ResourceWatch::report(bool ran, std::uint64_t output_observed) const {
  auto const& plan = owner_->plan_;
  core::ResourceReport rep;
  auto set = [&](core::ResourceDim d, std::optional<std::uint64_t> v,
                 std::optional<std::uint64_t> lim, core::Fidelity fid) {
    auto& o = rep.at(d);
    o.value = v;
    o.limit = lim;
    o.fidelity = v ? fid : core::Fidelity::unavailable;
  };
  std::optional<std::uint64_t> wall;
  if (ran) {
    auto const end = exited_at_ ? *exited_at_ : Clock::now();
    wall = static_cast<std::uint64_t>(
        std::chrono::duration_cast<milliseconds>(end - started_).count());
  }
  // Wall time is measured exactly and the deadline timer enforces it without a sampling gap.
  set(core::ResourceDim::wall, wall, plan.wall_ms, core::Fidelity::hard);
  set(core::ResourceDim::cpu, cpu_ms_, plan.cpu_ms, core::Fidelity::sampled);
  set(core::ResourceDim::memory, rss_peak_, plan.memory_bytes,
      memory_hard_ ? core::Fidelity::hard : core::Fidelity::sampled);
  set(core::ResourceDim::disk, disk_growth_peak_, plan.disk_bytes, core::Fidelity::sampled);
  // Every output byte is counted as it is read: exact, and the limit applies byte-exactly.
  set(core::ResourceDim::output, ran ? std::optional<std::uint64_t>(output_observed) : std::nullopt,
      plan.output_bytes, core::Fidelity::hard);
  // limits.open_files is RLIMIT_NOFILE of every process (kernel-enforced per process, hence
  // hard) unless the backend could not set it; the value is the sampled peak of descriptors
  // open over the whole tree.
  set(core::ResourceDim::descriptors, fds_peak_, plan.open_files,
      plan.open_files && descriptors_hard_ ? core::Fidelity::hard : core::Fidelity::sampled);
  set(core::ResourceDim::processes, procs_peak_, plan.processes,
      pids_hard_ ? core::Fidelity::hard : core::Fidelity::sampled);
  set(core::ResourceDim::concurrency, concurrency_, std::nullopt, core::Fidelity::sampled);
  return rep;
}

}  // namespace custos::supervisor
