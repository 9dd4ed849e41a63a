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

// Reaps exited children that are not the caller's own direct children (those are waited through
// their pidfd by whoever owns them; `is_direct_child(pid)` says which). Peeks with
// waitid(P_ALL, WEXITED|WNOHANG|WNOWAIT) and reaps each orphan by pid — safe, because a zombie
// child's pid cannot be recycled until we reap it. When the peek shows a direct child (which
// must be left alone and would hide the zombies behind it), the orphans are found by scanning
// /proc for zombies whose parent is this process. At most `max_reaped` per call (bounded work
// per tick). Never fails: a child that vanished in between is simply not reported.
// Call it from one thread only (the one that handles SIGCHLD), never concurrently with itself.
[[nodiscard]] std::vector<ReapedOrphan> reap_orphans(
    std::function<bool(std::int32_t)> const& is_direct_child, std::size_t max_reaped = 1024);

}  // namespace custos::sys
