// The daemon as child subreaper: descendants orphaned by an execution's root reparent to the
// daemon instead of init, stay visible, and are reaped here so that no zombie accumulates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/pidfd.hpp"

namespace custos::sys {

// prctl(PR_SET_CHILD_SUBREAPER, 1). Process-wide and inherited by nothing (children do not get
// it). Errors: sys.error.
[[nodiscard]] Result<void> become_child_subreaper();

// prctl(PR_GET_CHILD_SUBREAPER). Errors: sys.error.
[[nodiscard]] Result<bool> is_child_subreaper();

struct ReapedOrphan {
  std::int32_t pid = 0;
  ExitStatus status;
};

// Every child of this process (of all its threads), zombies included, read from
// /proc/self/task/<tid>/children. Errors: procfs.failed (a kernel without CONFIG_PROC_CHILDREN
// has no such files).
[[nodiscard]] Result<std::vector<std::int32_t>> list_own_children();

// Reaps exited children that are not the caller's own direct children (those are waited through
// their pidfd by whoever owns them; `is_direct_child(pid)` says which). The candidates are this
// process's own children (list_own_children): each one that is not direct is checked with
// waitid(P_PID, WEXITED|WNOHANG|WNOWAIT) and, if it exited, reaped by pid — safe, because a
// zombie child's pid cannot be recycled until we reap it. No other process is read, so the cost
// does not grow with the host's process count. Without the child lists, it peeks with
// waitid(P_ALL, WNOWAIT) and, when the peek shows a direct child (which must be left alone and
// would hide the zombies behind it), scans /proc for zombies whose parent is this process.
// `before_reap(pid)`, when given, runs for each orphan while it is still an unreaped zombie
// (its /proc/<pid>/cgroup still names its cgroup). At most `max_reaped` per call (bounded work
// per tick). Never fails: a child that vanished in between is simply not reported.
// Call it from one thread only (the one that handles SIGCHLD), never concurrently with itself.
[[nodiscard]] std::vector<ReapedOrphan> reap_orphans(
    std::function<bool(std::int32_t)> const& is_direct_child, std::size_t max_reaped = 1024,
    std::function<void(std::int32_t)> const& before_reap = {});

}  // namespace custos::sys
