// Resource watching of one execution: the wall-clock deadline, the periodic sampler and the
// disk measurement, the peaks they saw, and the limits they enforce (a limit crossed offers the
// resource_limit trigger). Also builds the terminal record's resource report.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/steady_timer.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/backend.hpp"
#include "custos/core/resources.hpp"
#include "custos/supervisor/types.hpp"

namespace custos::supervisor {

class Supervisor;

class ResourceWatch {
 public:
  ResourceWatch(Supervisor& owner, boost::asio::io_context& io);

  // The launch began (wall time counts from here); `concurrency` includes this execution.
  void launch_began(std::size_t concurrency);
  // An adopted execution's root started `age` ago: wall time and the deadline count from then.
  void adopted(std::chrono::milliseconds age);
  // A handover: the peaks so far go to the next image (Carried::peaks), and come back there.
  void carry(Carried::Peaks& out) const;
  void resume(Carried::Peaks const& in);
  // The root exists with these kernel-enforced limits.
  void acquired(bool memory_hard, bool pids_hard, bool descriptors_hard);
  // The target runs: the deadline and the sampler are armed.
  void start();
  void root_exited();
  // What the backend knew of the tree's usage at the end (its peaks are kept).
  void final_usage(backend::Usage const& usage);
  // Sample now (the backend saw the usage change), and act on the limits as the sampler does.
  void sample_now();
  void cancel_timers();
  [[nodiscard]] core::ResourceReport report(bool ran, std::uint64_t output_observed) const;
  [[nodiscard]] std::size_t concurrency() const noexcept { return concurrency_; }
  [[nodiscard]] std::chrono::system_clock::time_point started_wall() const noexcept {
    return started_wall_;
  }
  // The latest sample of the live tree (none before the first, or once the tree is done).
  [[nodiscard]] std::optional<backend::Usage> const& last_sample() const noexcept { return last_; }

 private:
  void arm_deadline();
  void arm_sampler();
  void sample();
  void on_disk(std::optional<std::uint64_t> growth);
  void over_limit(std::string const& dim, std::uint64_t value);

  Supervisor* owner_;
  boost::asio::steady_timer deadline_;
  boost::asio::steady_timer sampler_;
  std::chrono::steady_clock::time_point started_{};
  std::chrono::system_clock::time_point started_wall_{};
  std::optional<std::chrono::steady_clock::time_point> exited_at_;
  std::chrono::steady_clock::time_point last_disk_sample_{};
  std::size_t concurrency_ = 0;
  std::chrono::milliseconds before_start_{0};  // of limits.wall_ms, spent before start() (adopted)
  bool memory_hard_ = false;
  bool pids_hard_ = false;
  bool descriptors_hard_ = true;
  bool stopped_ = false;
  std::optional<backend::Usage> last_;
  // Peaks.
  std::optional<std::uint64_t> cpu_ms_;
  std::optional<std::uint64_t> rss_peak_;
  std::optional<std::uint64_t> procs_peak_;
  std::optional<std::uint64_t> fds_peak_;
  std::optional<std::uint64_t> disk_growth_peak_;
};

}  // namespace custos::supervisor
