// Native recovery: re-acquisition by exact pidfs identity and the cleanup of gone executions
// (the numbered algorithm is in native_recovery.hpp).
#include "custos/backend/native_recovery.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/core/ids.hpp"
#include "custos/sys/cgroup.hpp"
#include "custos/sys/identity.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::backend::recovery {
namespace {

using RP = core::RecoveryPath;

std::uint64_t own_pid_ns_ino() noexcept {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

// Kills and removes the execution's own cgroup. Everything inside it belongs to the execution:
// only the daemon creates processes there (CLONE_INTO_CGROUP) and nobody else writes to its
// cgroup.procs, so cgroup.kill here cannot reach a stranger.
core::Cleanup kill_cgroup(std::string const& path, std::chrono::milliseconds timeout,
                          std::string& detail) {
  auto dir = sys::CgroupDir::open(path);
  if (!dir) {
    if (dir.error().sys_errno == ENOENT) return core::Cleanup::confirmed;  // already gone
    detail += "; cgroup: " + dir.error().message();
    return core::Cleanup::unconfirmed;
  }
  auto populated = dir->populated();
  if (populated && *populated) {
    if (auto k = dir->kill(); !k) {
      detail += "; cgroup.kill: " + k.error().message();
      return core::Cleanup::unconfirmed;
    }
    if (auto w = dir->wait_empty(timeout); !w) {
      detail += "; cgroup not empty: " + w.error().message();
      return core::Cleanup::unconfirmed;
    }
    detail += "; cgroup was populated, killed";
  }
  if (auto r = dir->remove(); !r) {
    detail += "; rmdir: " + r.error().message();
    return core::Cleanup::unconfirmed;
  }
  return core::Cleanup::confirmed;
}

// After a reboot a cgroup path from the old boot can only exist if someone re-created it, and
// then it is not ours: remove it only when it is empty, never kill inside it.
core::Cleanup remove_stale_cgroup(std::string const& path, std::string& detail) {
  auto dir = sys::CgroupDir::open(path);
  if (!dir) {
    if (dir.error().sys_errno == ENOENT) return core::Cleanup::confirmed;
    detail += "; cgroup: " + dir.error().message();
    return core::Cleanup::unconfirmed;
  }
  auto populated = dir->populated();
  if (!populated || *populated) {
    detail += "; a populated cgroup exists at the old path; left untouched";
    return core::Cleanup::unconfirmed;
  }
  if (auto r = dir->remove(); !r) {
    detail += "; rmdir: " + r.error().message();
    return core::Cleanup::unconfirmed;
  }
  return core::Cleanup::confirmed;
}

// The cgroup a launch creates (named by the execution id, under the daemon's subtree) before its
// staged write records it: a crash in between leaves it, holding at most the child at its
// barrier (no program ran; it exits when the barrier closes). It is this execution's alone: the
// daemon creates it for this id, and cgroups do not outlive a reboot. Killed and removed.
core::Cleanup remove_unrecorded_cgroup(std::string const& execution_id,
                                       CleanupOptions const& options, std::string& detail) {
  if (options.execution_cgroup_parent.empty()) return core::Cleanup::confirmed;
  // Not a name the daemon would have given a cgroup (and no path component: no '/', no "..").
  if (!core::is_valid_id(execution_id)) return core::Cleanup::confirmed;
  std::string const path = options.execution_cgroup_parent + "/" + execution_id;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return core::Cleanup::confirmed;  // never created
    detail +=
        "; cannot tell whether its launch left a cgroup at " + path + ": " + std::strerror(errno);
    return core::Cleanup::unconfirmed;
  }
  std::string why;
  core::Cleanup const c = kill_cgroup(path, options.kill_timeout, why);
  detail += "; the cgroup its launch created before the staged write was " +
            std::string{c == core::Cleanup::confirmed ? "removed" : "not removed"} + why;
  return c;
}

// Final marker sweep: SIGKILL to every process carrying the execution's marker, each re-checked
// through its own pidfd before the signal. Returns whether the sweep confirmed none remain.
//
// not_before_ticks is the root's start time: the marker is random per execution and first given
// to the root, so no process that started earlier can carry it. Skipping those keeps processes
// this daemon may never read (PID 1's environ is unreadable even to root on some hosts) from
// making every sweep unconfirmed.
bool sweep_marker(RecordedBoundary const& boundary, CleanupOptions const& options,
                  std::uint64_t not_before_ticks, std::string& detail) {
  auto const& marker_hex = boundary.marker_hex;
  auto marker = sys::Marker::from_hex(marker_hex);
  if (!marker) {
    detail += "; marker unreadable: " + marker.error().message();
    return false;
  }
  sys::MarkerSweepOptions so;
  so.signal = SIGKILL;
  // A container execution's processes are in the container's namespace, as recorded.
  so.pid_ns_inode = boundary.marker_ns_ino != 0 ? boundary.marker_ns_ino
                    : options.pid_ns_ino != 0   ? options.pid_ns_ino
                                                : own_pid_ns_ino();
  so.proc_root = options.proc_root;
  if (not_before_ticks != 0) so.not_before_ticks = not_before_ticks;
  auto r = sys::marker_sweep(*marker, so);
  if (!r) {
    detail += "; marker sweep: " + r.error().message();
    return false;
  }
  if (r->signalled > 0) detail += "; marker sweep killed " + std::to_string(r->signalled);
  if (!r->confirmed) {
    detail += "; marker sweep unconfirmed (" + std::to_string(r->unreadable) + " unreadable, " +
              std::to_string(r->remaining) + " remaining)";
  }
  return r->confirmed;
}

}  // namespace

Result<HostIdentity> current_host(std::string boot_id, std::uint64_t pid_ns_ino) {
  HostIdentity h;
  h.boot_id = boot_id.empty() ? CUSTOS_TRY(sys::read_boot_id()) : std::move(boot_id);
  h.pid_ns_ino = pid_ns_ino != 0 ? pid_ns_ino : own_pid_ns_ino();
  return h;
}

Reacquired reacquire_root(RecordedRoot const& o, HostIdentity const& host) {
  Reacquired out;
  // 1. The boot fence comes before any lookup: a pid of another boot names nothing of ours.
  if (o.boot_id != host.boot_id) {
    out.path = RP::absent_without_terminal;
    out.detail = "boot id changed (" + o.boot_id + " -> " + host.boot_id + "): no pid lookup";
    return out;
  }
  if (o.pid_ns_ino != 0 && o.pid_ns_ino != host.pid_ns_ino) {
    out.path = RP::indeterminate;
    out.detail = "pid " + std::to_string(o.pid) + " was recorded in another pid namespace";
    return out;
  }
  // 2. Exactly one pidfd_open; from here on only that pidfd names the process.
  out.pid_looked_up = true;
  auto pidfd = sys::Pidfd::open(o.pid);
  if (!pidfd) {
    if (pidfd.error().sys_errno == ESRCH) {
      out.path = RP::absent_without_terminal;
      out.detail = "no process with pid " + std::to_string(o.pid);
    } else {
      out.path = RP::indeterminate;
      out.detail = "pidfd_open(" + std::to_string(o.pid) + "): " + pidfd.error().message();
    }
    return out;
  }
  struct stat st {};
  if (::fstat(pidfd->fd().get(), &st) != 0) {
    out.path = RP::indeterminate;
    out.detail = "fstat of the pidfd failed (errno " + std::to_string(errno) + ")";
    return out;
  }
  if (static_cast<std::uint64_t>(st.st_dev) != o.pidfs_dev ||
      static_cast<std::uint64_t>(st.st_ino) != o.pidfs_ino) {
    // The pid now names another process: ours ended (a live or unreaped process keeps its pid).
    // The stranger's pidfd is closed here without any action.
    out.path = RP::absent_without_terminal;
    out.detail = "pid " + std::to_string(o.pid) + " now belongs to another process (pidfs inode " +
                 std::to_string(st.st_ino) + ", recorded " + std::to_string(o.pidfs_ino) + ")";
    return out;
  }
  // 3. Negative evidence only: it can refuse the match, never make it.
  if (o.start_time_ticks != 0) {
    auto start = sys::read_start_time(o.pid);
    if (start && *start != o.start_time_ticks && pidfd->alive()) {
      out.path = RP::indeterminate;
      out.detail = "pidfs identity matches but the start time disagrees (" +
                   std::to_string(*start) + " vs " + std::to_string(o.start_time_ticks) + ")";
      return out;
    }
  }
  if (!pidfd->alive()) {
    // Exited. Only if it is this process's own unreaped child (a handover: the same process,
    // whose root ended while no image supervised it) is its end still observable, exactly, by
    // whoever adopts it; otherwise nobody can read it any more.
    auto unreaped = pidfd->peek_exit();
    if (!unreaped || !*unreaped) {
      out.path = RP::absent_without_terminal;
      out.detail = "the owned process has exited; its end was not observed";
      return out;
    }
    out.path = RP::live_owned;
    out.detail = "re-acquired by pidfs identity, exited and not yet reaped (its status is read)";
    out.pidfd = std::move(*pidfd);
    return out;
  }
  // 4. Ours, alive: the same pidfd goes on to adoption.
  out.path = RP::live_owned;
  out.detail = "re-acquired by pidfs identity";
  out.pidfd = std::move(*pidfd);
  return out;
}

core::Cleanup clean_up_gone(GoneExecution const& gone, CleanupOptions const& options,
                            std::string& detail) {
  // The process is gone; what may remain is its tree. Clean it with exact ownership only: the
  // execution's own cgroup, and (same boot) its marker.
  core::Cleanup cleanup = core::Cleanup::confirmed;
  auto const& b = gone.boundary;
  if (b.kind == core::Boundary::cgroup && !b.cgroup_path.empty()) {
    cleanup = gone.same_boot ? kill_cgroup(b.cgroup_path, options.kill_timeout, detail)
                             : remove_stale_cgroup(b.cgroup_path, detail);
  } else if (gone.never_staged) {
    cleanup = remove_unrecorded_cgroup(gone.execution_id, options, detail);
  }
  // Not across a reboot: no process can have survived it, and the sweep would read every /proc
  // entry for nothing.
  if (gone.same_boot && options.marker_sweep && !b.marker_hex.empty()) {
    if (!sweep_marker(b, options, gone.start_time_ticks, detail)) {
      cleanup = core::Cleanup::unconfirmed;
    }
  }
  return cleanup;
}

void describe_unproven(RecordedBoundary const& boundary, std::string& detail) {
  if (boundary.kind != core::Boundary::cgroup || boundary.cgroup_path.empty()) return;
  auto dir = sys::CgroupDir::open(boundary.cgroup_path);
  if (!dir) return;
  auto pop = dir->populated();
  if (pop) detail += *pop ? "; its cgroup is populated" : "; its cgroup is empty";
}

bool is_execution_cgroup_name(std::string_view name) noexcept {
  if (name.size() != 19 || name.substr(0, 3) != "ex-") return false;
  return std::all_of(name.begin() + 3, name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::vector<LeftoverCgroup> remove_leftover_cgroups(
    CleanupOptions const& options, std::function<bool(std::string const&)> const& was_terminal) {
  std::vector<LeftoverCgroup> out;
  if (options.execution_cgroup_parent.empty()) return out;
  std::error_code ec;
  std::filesystem::directory_iterator it(options.execution_cgroup_parent, ec);
  if (ec) return out;  // no subtree yet: nothing was ever created under it
  std::vector<std::string> names;
  for (auto const& entry : it) {
    std::error_code dec;
    if (!entry.is_directory(dec)) continue;
    std::string name = entry.path().filename().string();
    if (is_execution_cgroup_name(name)) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  for (std::string const& name : names) {
    // Everything inside still belongs to that terminal execution and nobody else acts on it.
    if (!was_terminal(name)) continue;
    LeftoverCgroup left{name, core::Cleanup::unconfirmed, {}};
    left.cleanup = kill_cgroup(options.execution_cgroup_parent + "/" + name, options.kill_timeout,
                               left.detail);
    if (left.detail.starts_with("; ")) left.detail.erase(0, 2);
    out.push_back(std::move(left));
  }
  return out;
}

std::optional<std::chrono::milliseconds> process_age(std::uint64_t start_time_ticks) {
  if (start_time_ticks == 0) return std::nullopt;
  long const hz = ::sysconf(_SC_CLK_TCK);
  timespec now{};
  // /proc/PID/stat's start time counts from boot in the boot-time clock (suspend included).
  if (hz <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return std::nullopt;
  auto const now_ms = static_cast<std::int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
  auto const start_ms =
      static_cast<std::int64_t>(start_time_ticks * 1000 / static_cast<std::uint64_t>(hz));
  return std::chrono::milliseconds(std::max<std::int64_t>(0, now_ms - start_ms));
}

}  // namespace custos::backend::recovery
