// cgroup v2: mount discovery, and CgroupDir, a cgroup held by a directory fd.
//
// Nothing here assumes /sys/fs/cgroup: the v2 mount comes from /proc/self/mountinfo and the
// daemon's own cgroup from the `0::` line of /proc/self/cgroup. Every interface file is reached
// with openat() relative to the cgroup's directory fd, so a cgroup renamed or re-mounted under
// us cannot redirect a write to another cgroup's file. Parsers take text so tests can feed them
// fake mount tables, and CgroupDir::open takes any directory so the file logic can run on a temp
// tree.
//
// Limits (memory.max, pids.max, cpu.max) are set only where the controller is listed in this
// cgroup's cgroup.controllers, i.e. enabled in the parent's cgroup.subtree_control; otherwise the
// setter returns sys.unsupported and the caller records that dimension as sampled/unavailable.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

struct CgroupMount {
  std::string path;         // mount point of the cgroup2 hierarchy
  bool nsdelegate = false;  // cgroup namespaces are delegation boundaries (see boundaries.md)
};

// The first cgroup2 entry of a mountinfo table (proc_pid_mountinfo(5) format).
// Errors: cgroup.unavailable when the table has no cgroup2 mount; cgroup.failed on a malformed
// cgroup2 line.
[[nodiscard]] Result<CgroupMount> parse_cgroup2_mount(std::string_view mountinfo);
// Reads `mountinfo_path` (default /proc/self/mountinfo) and parses it.
[[nodiscard]] Result<CgroupMount> find_cgroup2_mount(
    std::string const& mountinfo_path = "/proc/self/mountinfo");

// The path of the `0::` line of a /proc/<pid>/cgroup file ("/" or "/system.slice/x.service").
// Errors: cgroup.unavailable when there is no `0::` line (no v2 hierarchy).
[[nodiscard]] Result<std::string> parse_own_cgroup(std::string_view proc_cgroup);
[[nodiscard]] Result<std::string> own_cgroup(
    std::string const& proc_cgroup_path = "/proc/self/cgroup");

// Values read from the interface files; each is nullopt when its file is absent (controller not
// enabled) or unreadable, never a made-up zero.
struct CgroupStats {
  std::optional<std::uint64_t>
      cpu_usage_usec;  // cpu.stat usage_usec (present without the cpu controller on v2)
  std::optional<std::uint64_t> memory_current;  // memory.current (memory controller)
  std::optional<std::uint64_t> memory_peak;     // memory.peak (memory controller, kernel >= 5.19)
  std::optional<std::uint64_t> memory_max;      // memory.max, nullopt when "max" or absent
  std::optional<std::uint64_t> pids_current;    // pids.current (pids controller)
  std::optional<std::uint64_t> pids_max;        // pids.max, nullopt when "max" or absent
  std::optional<bool> populated;                // cgroup.events
};

class CgroupDir {
 public:
  CgroupDir() = default;

  // Opens an existing cgroup directory by absolute path.
  // Errors: cgroup.failed with the open errno (ENOENT, EACCES).
  [[nodiscard]] static Result<CgroupDir> open(std::string path);
  // mkdir `name` beneath `parent` (mkdirat on the parent fd, mode 0755) and opens it.
  // `name` must be a single path component. Errors: cgroup.failed (EEXIST, EACCES, ENOSPC when
  // cgroup.max.descendants is hit, EINVAL for a bad name).
  [[nodiscard]] static Result<CgroupDir> create(CgroupDir const& parent, std::string const& name);
  // Opens the existing child `name` of `parent`. Errors: cgroup.failed (ENOENT, ...).
  [[nodiscard]] static Result<CgroupDir> open_child(CgroupDir const& parent,
                                                    std::string const& name);

  [[nodiscard]] UniqueFd const& fd() const noexcept { return fd_; }
  [[nodiscard]] std::string const& path() const noexcept { return path_; }
  [[nodiscard]] bool valid() const noexcept { return fd_.valid(); }

  // Writes "1" to cgroup.kill: SIGKILL to every process of the subtree, atomically with respect
  // to forks. Errors: sys.unsupported when the kernel has no cgroup.kill (< 5.14);
  // cgroup.failed otherwise.
  [[nodiscard]] Result<void> kill() const;
  // cgroup.events `populated`. Errors: cgroup.failed.
  [[nodiscard]] Result<bool> populated() const;
  // Waits until `populated 0`, watching cgroup.events with inotify (the kernel emits a modify
  // event when it changes); if inotify is unavailable, re-reads it every 10 ms.
  // Errors: cleanup.unconfirmed (ETIMEDOUT) when still populated at the deadline; cgroup.failed.
  [[nodiscard]] Result<void> wait_empty(std::chrono::milliseconds timeout) const;
  // The pids of cgroup.procs (this cgroup only, not its children). Errors: cgroup.failed.
  [[nodiscard]] Result<std::vector<std::int32_t>> procs() const;
  // The pids of this cgroup and of every cgroup below it (an execution with delegation may
  // create its own children), at most `max_pids` and 16 levels deep. Child cgroups that vanish
  // during the walk are skipped. Errors: cgroup.failed when this cgroup's own list is unreadable.
  [[nodiscard]] Result<std::vector<std::int32_t>> tree_procs(std::size_t max_pids = 65536) const;
  // Moves `pid` into this cgroup (writes it to cgroup.procs). The caller needs write access to
  // this cgroup.procs and to the common ancestor's. Errors: cgroup.failed (ESRCH, EACCES, EBUSY).
  [[nodiscard]] Result<void> attach(pid_t pid) const;
  // rmdir of the directory. EBUSY is retried for up to ~1 s, because a just-killed subtree stays
  // populated until the kernel has finished its exits; ENOENT counts as already removed.
  // Errors: cgroup.failed (EBUSY after the retries: a process is still inside or a child
  // cgroup exists; ESTALE when the path now names another directory, which is left alone).
  [[nodiscard]] Result<void> remove() const;

  // cgroup.controllers: the controllers available to this cgroup.
  [[nodiscard]] Result<std::set<std::string>> controllers() const;
  // cgroup.subtree_control: the controllers enabled for this cgroup's children.
  [[nodiscard]] Result<std::set<std::string>> subtree_control() const;
  // Writes "+c1 +c2" to cgroup.subtree_control. Errors: sys.unsupported when a controller is
  // not in cgroup.controllers; cgroup.failed (EBUSY: the cgroup holds processes itself).
  [[nodiscard]] Result<void> enable_controllers(std::set<std::string> const& wanted) const;

  // memory.max / pids.max / cpu.max ("quota period" in microseconds).
  // Errors: sys.unsupported when the controller is not enabled for this cgroup; cgroup.failed.
  [[nodiscard]] Result<void> set_memory_max(std::uint64_t bytes) const;
  [[nodiscard]] Result<void> set_pids_max(std::uint64_t count) const;
  [[nodiscard]] Result<void> set_cpu_max(std::uint64_t quota_usec, std::uint64_t period_usec) const;

  // Reads every statistic it can; absent files stay nullopt. Errors: cgroup.failed only when
  // the directory itself is gone (cgroup.events unreadable).
  [[nodiscard]] Result<CgroupStats> stats() const;

 private:
  CgroupDir(UniqueFd fd, std::string path) noexcept : fd_(std::move(fd)), path_(std::move(path)) {}

  UniqueFd fd_;
  std::string path_;
};

// Creates (or opens, when it exists) `name` beneath `parent` and enables in its
// subtree_control every controller of `wanted` that it has available; controllers that cannot
// be enabled are left out silently — per-execution cgroups report what they really got through
// controllers(). This is the daemon-owned subtree that execution cgroups are created in.
// Errors: as create/open_child.
[[nodiscard]] Result<CgroupDir> ensure_subtree(CgroupDir const& parent, std::string const& name,
                                               std::set<std::string> const& wanted = {});

// Where execution cgroups go, and what the kernel will enforce in them.
struct ExecutionRoot {
  CgroupDir dir;                      // the subtree execution cgroups are created in
  std::set<std::string> controllers;  // controllers available to each execution cgroup
  bool moved_self = false;            // the daemon moved itself into the leaf cgroup
};

// Prepares the daemon-owned subtree below `daemon_cgroup_dir` (the absolute directory of the
// daemon's own cgroup: mount path + own_cgroup()). cgroup v2 forbids enabling controllers for
// children of a cgroup that holds processes itself (the "no internal processes" rule, the v2
// root excepted). So when controllers of `wanted` are available and the daemon's cgroup is not
// the hierarchy root, the daemon first moves itself (all its threads: its pid goes to
// cgroup.procs) into the leaf `<dir>/<leaf>`, then enables the controllers it can, then creates
// or opens `<dir>/<subtree>` with the same controllers enabled for its children. A controller
// that cannot be enabled (another process still in the daemon's cgroup, or not delegated) is
// left out: `controllers` reports what executions really get, so limits are recorded honestly.
// Errors: cgroup.failed (open/mkdir/attach), cgroup.unavailable when the directory is missing.
[[nodiscard]] Result<ExecutionRoot> prepare_execution_root(
    std::string const& daemon_cgroup_dir,
    std::set<std::string> const& wanted = {"cpu", "memory", "pids"},
    std::string const& leaf = "daemon", std::string const& subtree = "executions");

}  // namespace custos::sys
