// The native backend: a root created with clone3 at a barrier, into a per-execution cgroup v2
// where the daemon has a writable subtree (else the /proc marker boundary), held by pidfds,
// its stdio three pipes or one PTY. docs/process-model.md describes the mechanism.
//
// One NativeBackend per daemon holds what its executions share: the cgroup subtree, the one
// inotify instance for every tree-empty wait, the worker thread for blocking scans (the final
// marker sweep, workspace disk walks), the batched marker sweeper, the read buffer, and the
// indexes orphan reaping consults (live roots, cgroup -> execution).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Asio through one place: GCC 12 at -O2 reports a false positive inside Asio's executor
// comparison, silenced for Boost's headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/thread_pool.hpp>
#pragma GCC diagnostic pop

#include "custos/backend/backend.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::backend {

struct NativeConfig {
  // The daemon-owned cgroup v2 directory under which per-execution cgroups are created
  // (`<subtree>/<execution_id>`). Empty or not writable: every execution uses the marker.
  std::string cgroup_subtree;
  BoundaryPreference boundary = BoundaryPreference::automatic;
  // The cgroup2 mount has nsdelegate (then a root execution cannot leave its cgroup); detected
  // from the mount when `detect_nsdelegate`.
  bool detect_nsdelegate = true;
  bool nsdelegate = false;
  std::uint32_t marker_sweep_rounds = 64;
  std::uint64_t disk_walk_max_entries = 100000;
  // A secret's value from the daemon's store by ref, read at spawn to deliver it (a sandbox's
  // secrets); empty: no store (a plan naming a secret never gets this far: it is refused as
  // sandbox.secret_unknown when it is authorized).
  std::function<Result<std::string>(std::string_view ref)> read_secret;
  // Names this daemon's own per-execution cgroups outside cgroup v2 (the v1 pids hierarchy's
  // `custos/<instance>`): stable across its restarts, distinct from other daemons'. Empty: the
  // daemon's pid.
  std::string instance;
};

class NativeExecution;
struct SandboxHost;

class NativeBackend final : public Backend {
 public:
  NativeBackend(boost::asio::io_context& io, NativeConfig config);
  ~NativeBackend() override;
  NativeBackend(NativeBackend const&) = delete;
  NativeBackend& operator=(NativeBackend const&) = delete;

  [[nodiscard]] core::BackendKind kind() const noexcept override {
    return core::BackendKind::native;
  }
  [[nodiscard]] Descriptor descriptor() const override;
  // cgroup_unavailable is the one refusal: boundary=cgroup with no writable subtree.
  [[nodiscard]] Admission admit(core::ExecutionPlan const& plan) const override;
  [[nodiscard]] std::shared_ptr<BackendExecution> create(std::string execution_id) override;
  [[nodiscard]] bool is_root(std::int32_t pid) const override;
  [[nodiscard]] std::optional<std::string> owner_of(std::int32_t pid) const override;

  // The boundary a new execution gets.
  [[nodiscard]] core::Boundary boundary() const noexcept;
  [[nodiscard]] bool has_subtree() const noexcept { return subtree_.has_value(); }
  // The daemon's writable subtree (nullptr without one) and the cgroup2 mount point ("" without
  // one): the container backends create their per-exec cgroups from these.
  [[nodiscard]] sys::CgroupDir const* subtree() const noexcept {
    return subtree_ ? &*subtree_ : nullptr;
  }
  [[nodiscard]] std::string const& cgroup_mount() const noexcept { return cgroup_mount_; }
  [[nodiscard]] NativeConfig const& config() const noexcept { return config_; }
  // Final sweeps requested and the /proc sweeps that served them (fewer when shared).
  [[nodiscard]] sys::MarkerSweeper::Stats sweeper_stats() const { return sweeper_.stats(); }

 private:
  friend class NativeExecution;
  // The execution's root and cgroup are indexed while it lives (orphan reaping).
  void note_root(std::int32_t pid, NativeExecution* exec);
  void forget_root(std::int32_t pid, NativeExecution const* exec);
  void note_cgroup(std::string const& rel, std::string const& execution_id);
  void forget_cgroup(std::string const& rel);
  // One inotify instance for every execution's tree-empty wait (created on first use): closing
  // an inotify instance waits for an SRCU grace period (milliseconds), so one per execution
  // would cost more than the polling it replaces. -1 when unavailable.
  [[nodiscard]] int watch_events(std::string const& events_path, NativeExecution* exec);
  void unwatch_events(int wd);
  void arm_inotify();
  void on_inotify();

  boost::asio::io_context& io_;
  NativeConfig config_;
  std::optional<sys::CgroupDir> subtree_;
  std::string cgroup_mount_;
  std::unique_ptr<SandboxHost const> sandbox_host_;  // what this host can enforce
  std::vector<std::uint8_t> scratch_;                // shared read buffer (one loop thread)
  std::map<std::int32_t, NativeExecution*> roots_;
  std::map<std::string, std::string> cgroup_owner_;  // cgroup path below the mount -> execution
  std::optional<boost::asio::posix::stream_descriptor> inotify_;
  std::map<int, NativeExecution*> watches_;
  bool inotify_waiting_ = false;
  std::shared_ptr<bool> alive_;
  // Final marker sweeps of every execution, batched: requests queued while one sweep runs share
  // the next one's /proc passes. Used from the worker only. Declared before workers_ (joined
  // first).
  sys::MarkerSweeper sweeper_;
  // Blocking scans run here, never on the loop thread; completions are posted back to io_. One
  // thread: the loop keeps the other core of a small host. Declared last: joined first.
  boost::asio::thread_pool workers_{1};
};

}  // namespace custos::backend
