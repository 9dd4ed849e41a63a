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

std::vector<ReapedOrphan> reap_orphans(std::function<bool(std::int32_t)> const& is_direct_child,
                                       std::size_t max_reaped) {
  std::vector<ReapedOrphan> out;
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
      scan_proc(is_direct_child, max_reaped, out);
      break;
    }
    if (auto r = reap_pid(info.si_pid)) {
      out.push_back(*r);
    } else {
      break;  // raced with another waiter; the next call starts over
    }
  }
  return out;
}

}  // namespace custos::sys
