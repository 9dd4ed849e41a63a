#include "custos/sys/subreaper.hpp"

#include <array>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <string>
#include <string_view>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace custos::sys {
namespace {

ExitStatus status_of(siginfo_t const& info) {
  if (info.si_code == CLD_EXITED) return ExitStatus::exited(info.si_status);
  return ExitStatus::signaled(info.si_status, info.si_code == CLD_DUMPED);
}

// Reaps `pid` if it is an exited child of ours. nullopt if it is still running or not ours.
std::optional<ReapedOrphan> reap_pid(pid_t pid) {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  for (;;) {
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG) == 0) break;
    if (errno != EINTR) return std::nullopt;
  }
  if (info.si_pid == 0) return std::nullopt;
  return ReapedOrphan{info.si_pid, status_of(info)};
}

// True if `pid` is a child of ours that has exited and waits to be reaped (nothing is reaped).
bool exited_child(pid_t pid) {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  for (;;) {
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0) break;
    if (errno != EINTR) return false;
  }
  return info.si_pid != 0;
}

// State (field 3) and ppid (field 4) of /proc/<name>/stat; false if unreadable.
bool read_state_ppid(char const* name, char& state, pid_t& ppid) {
  std::string path = "/proc/";
  path += name;
  path += "/stat";
  int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::array<char, 1024> buf{};
  ssize_t const n = ::read(fd, buf.data(), buf.size() - 1);
  ::close(fd);
  if (n <= 0) return false;
  std::string_view const line(buf.data(), static_cast<std::size_t>(n));
  auto const close = line.rfind(')');
  // ") S 1234 ..."
  if (close == std::string_view::npos || close + 4 >= line.size()) return false;
  state = line[close + 2];
  auto const* begin = line.data() + close + 4;
  auto const* end = line.data() + line.size();
  int parent = 0;
  auto const [ptr, ec] = std::from_chars(begin, end, parent);
  if (ec != std::errc() || ptr == begin) return false;
  ppid = parent;
  return true;
}

// Slow path: every zombie whose parent is us and that is not a direct child.
void scan_proc(std::function<bool(std::int32_t)> const& is_direct_child, std::size_t max_reaped,
               std::function<void(std::int32_t)> const& before_reap,
               std::vector<ReapedOrphan>& out) {
  pid_t const self = ::getpid();
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    if (out.size() >= max_reaped) break;
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    char state = 0;
    pid_t ppid = 0;
    if (!read_state_ppid(e->d_name, state, ppid)) continue;
    if (ppid != self || state != 'Z') continue;
    pid_t const pid = static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10));
    if (is_direct_child(pid)) continue;
    if (before_reap) before_reap(pid);
    if (auto r = reap_pid(pid)) out.push_back(*r);
  }
  ::closedir(dir);
}

}  // namespace

Result<void> become_child_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1UL, 0UL, 0UL, 0UL) != 0) {
    return Error(Errc::sys_error, "prctl(PR_SET_CHILD_SUBREAPER)", errno);
  }
  return ok();
}

Result<bool> is_child_subreaper() {
  int value = 0;
  if (::prctl(PR_GET_CHILD_SUBREAPER, &value, 0UL, 0UL, 0UL) != 0) {
    return Error(Errc::sys_error, "prctl(PR_GET_CHILD_SUBREAPER)", errno);
  }
  return value != 0;
}

Result<std::vector<std::int32_t>> list_own_children() {
  // One `children` file per thread: a child belongs to the thread that created it, and an
  // orphan reparents to some thread of the subreaper. Each file is produced from the thread's
  // child list under the tasklist lock; a zombie stays on that list until it is reaped.
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return Error(Errc::procfs_failed, "open /proc/self/task", errno);
  std::vector<std::int32_t> out;
  std::string text;
  std::array<char, 4096> buf{};
  int read_errno = 0;
  bool any = false;
  while (dirent* e = ::readdir(tasks)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::string name = e->d_name;
    name += "/children";
    int const fd = ::openat(::dirfd(tasks), name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      // A thread that exited since readdir has no children left to report.
      if (errno != ENOENT && errno != ESRCH) read_errno = errno;
      continue;
    }
    any = true;
    text.clear();
    for (;;) {
      ssize_t const n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) read_errno = errno;
      if (n <= 0) break;
      text.append(buf.data(), static_cast<std::size_t>(n));
    }
    ::close(fd);
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::int32_t pid = 0;
      auto const [ptr, ec] = std::from_chars(text.data() + pos, text.data() + text.size(), pid);
      if (ptr == text.data() + pos) {
        ++pos;  // a separator (space or newline)
        continue;
      }
      if (ec != std::errc()) {  // out of range: not a pid; skip the whole number
        pos = static_cast<std::size_t>(ptr - text.data());
        continue;
      }
      if (pid > 0) out.push_back(pid);
      pos = static_cast<std::size_t>(ptr - text.data());
    }
  }
  ::closedir(tasks);
  if (read_errno != 0)
    return Error(Errc::procfs_failed, "read /proc/self/task/*/children", read_errno);
  if (!any) return Error(Errc::procfs_failed, "no readable /proc/self/task/*/children");
  return out;
}

std::vector<ReapedOrphan> reap_orphans(std::function<bool(std::int32_t)> const& is_direct_child,
                                       std::size_t max_reaped,
                                       std::function<void(std::int32_t)> const& before_reap) {
  std::vector<ReapedOrphan> out;
  // The fast way: this process's own child list (our execution roots and the few orphans that
  // reparented to us), each looked at with one non-reaping waitid. No other process is read.
  if (auto children = list_own_children()) {
    for (std::int32_t const pid : *children) {
      if (out.size() >= max_reaped) break;
      if (is_direct_child(pid)) continue;
      if (!exited_child(pid)) continue;
      if (before_reap) before_reap(pid);
      if (auto r = reap_pid(pid)) out.push_back(*r);
    }
    return out;
  }
  // Without the child lists (a kernel without CONFIG_PROC_CHILDREN): peek at the first exited
  // child, and scan /proc when that is a direct child hiding the orphans behind it.
  while (out.size() < max_reaped) {
    siginfo_t info;
    std::memset(&info, 0, sizeof info);
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      break;  // ECHILD: no children at all
    }
    if (info.si_pid == 0) break;  // children exist, none has exited
    if (is_direct_child(info.si_pid)) {
      // The first zombie belongs to someone's pidfd; it would be reported again on every peek,
      // so look for the orphans behind it directly.
      scan_proc(is_direct_child, max_reaped, before_reap, out);
      break;
    }
    if (before_reap) before_reap(info.si_pid);
    if (auto r = reap_pid(info.si_pid)) {
      out.push_back(*r);
    } else {
      break;  // raced with another waiter; the next call starts over
    }
  }
  return out;
}

}  // namespace custos::sys
