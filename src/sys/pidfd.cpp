#include "custos/sys/pidfd.hpp"

#include <cerrno>
#include <cstring>
#include <poll.h>
#include <signal.h>
#include <string>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace custos::sys {
namespace {

// PIDFD_GET_INFO (Linux 6.13+). Debian 12's kernel headers predate it, so the ABI is spelled out
// here: the first (VER0, 64 byte) layout of struct pidfd_info. The kernel accepts any size
// >= VER0 and fills what it knows, so the smaller struct stays valid on newer kernels.
struct PidfdInfoV0 {
  std::uint64_t mask;
  std::uint64_t cgroupid;
  std::uint32_t pid;
  std::uint32_t tgid;
  std::uint32_t ppid;
  std::uint32_t ruid;
  std::uint32_t rgid;
  std::uint32_t euid;
  std::uint32_t egid;
  std::uint32_t suid;
  std::uint32_t sgid;
  std::uint32_t fsuid;
  std::uint32_t fsgid;
  std::int32_t exit_code;
};
static_assert(sizeof(PidfdInfoV0) == 64);

constexpr std::uint64_t kPidfdInfoExit = 1U << 3;
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfoV0);

ExitStatus from_siginfo(siginfo_t const& info) {
  switch (info.si_code) {
    case CLD_EXITED:
      return ExitStatus::exited(info.si_status);
    case CLD_DUMPED:
      return ExitStatus::signaled(info.si_status, true);
    default:  // CLD_KILLED; WEXITED alone never reports stopped/continued
      return ExitStatus::signaled(info.si_status, false);
  }
}

Error pidfd_error(char const* what, std::int32_t pid, int err) {
  return Error(err == ENOSYS ? Errc::sys_unsupported : Errc::pidfd_failed,
               std::string(what) + " (pid " + std::to_string(pid) + ")", err);
}

}  // namespace

ExitStatus exit_status_from_wait(int status) noexcept {
  if (WIFEXITED(status)) return ExitStatus::exited(WEXITSTATUS(status));
  return ExitStatus::signaled(WTERMSIG(status), WCOREDUMP(status));
}

Result<Pidfd> Pidfd::open(std::int32_t pid) {
  if (pid <= 0) return Error(Errc::pidfd_failed, "pidfd_open: pid must be positive", EINVAL);
  long const fd = ::syscall(SYS_pidfd_open, pid, 0U);
  if (fd < 0) return pidfd_error("pidfd_open", pid, errno);
  return Pidfd(UniqueFd(static_cast<int>(fd)), pid);
}

Pidfd Pidfd::adopt(UniqueFd fd, std::int32_t pid) noexcept {
  return Pidfd(std::move(fd), pid);
}

Result<Pidfd> Pidfd::dup() const {
  UniqueFd copy = CUSTOS_TRY(fd_.dup());
  Pidfd out(std::move(copy), pid_);
  out.exit_ = exit_;
  return out;
}

Result<bool> Pidfd::send_signal(int sig) const {
  if (::syscall(SYS_pidfd_send_signal, fd_.get(), sig, nullptr, 0U) == 0) return true;
  int const err = errno;
  if (err == ESRCH) return false;
  return pidfd_error("pidfd_send_signal", pid_, err);
}

Result<std::optional<ExitStatus>> Pidfd::try_wait() {
  if (exit_) return exit_;
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  for (;;) {
    if (::waitid(P_PIDFD, static_cast<id_t>(fd_.get()), &info, WEXITED | WNOHANG) == 0) break;
    if (errno != EINTR) return pidfd_error("waitid(P_PIDFD, WNOHANG)", pid_, errno);
  }
  // With WNOHANG a still-running child leaves si_pid zero.
  if (info.si_pid == 0) return std::optional<ExitStatus>();
  exit_ = from_siginfo(info);
  return exit_;
}

Result<std::optional<ExitStatus>> Pidfd::peek_exit() const {
  if (exit_) return exit_;
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  for (;;) {
    if (::waitid(P_PIDFD, static_cast<id_t>(fd_.get()), &info, WEXITED | WNOHANG | WNOWAIT) == 0)
      break;
    if (errno != EINTR) return pidfd_error("waitid(P_PIDFD, WNOHANG|WNOWAIT)", pid_, errno);
  }
  if (info.si_pid == 0) return std::optional<ExitStatus>();
  return std::optional<ExitStatus>(from_siginfo(info));
}

Result<ExitStatus> Pidfd::wait() {
  if (exit_) return *exit_;
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  for (;;) {
    if (::waitid(P_PIDFD, static_cast<id_t>(fd_.get()), &info, WEXITED) == 0) break;
    if (errno != EINTR) return pidfd_error("waitid(P_PIDFD)", pid_, errno);
  }
  exit_ = from_siginfo(info);
  return *exit_;
}

Result<std::optional<ExitStatus>> Pidfd::get_exit_info() const {
  PidfdInfoV0 info;
  std::memset(&info, 0, sizeof info);
  info.mask = kPidfdInfoExit;
  if (::ioctl(fd_.get(), kPidfdGetInfo, &info) != 0) {
    int const err = errno;
    if (err == EINVAL || err == ENOTTY) {
      return Error(Errc::sys_unsupported, "PIDFD_GET_INFO not supported by this kernel", err);
    }
    // A process that exited but is not reaped yet (or had no exit info) reports ESRCH.
    if (err == ESRCH) return std::optional<ExitStatus>();
    return pidfd_error("ioctl(PIDFD_GET_INFO)", pid_, err);
  }
  if ((info.mask & kPidfdInfoExit) == 0) return std::optional<ExitStatus>();
  return std::optional<ExitStatus>(exit_status_from_wait(info.exit_code));
}

bool Pidfd::exit_info_supported() noexcept {
  // Probed once, with a child of our own that exits at once: reaped here, then asked for its
  // exit information. The child runs nothing but _exit (safe in a multi-threaded parent), and
  // it is reaped before this returns, on the calling thread.
  static bool const supported = [] {
    pid_t const pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) ::_exit(0);
    auto fd = Pidfd::open(pid);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!fd) return false;
    auto info = fd->get_exit_info();
    return info && info->has_value();
  }();
  return supported;
}

bool Pidfd::alive() const noexcept {
  if (!fd_.valid()) return false;
  pollfd p{fd_.get(), POLLIN, 0};
  for (;;) {
    int const n = ::poll(&p, 1, 0);
    if (n >= 0) return n == 0;
    if (errno != EINTR) return false;
  }
}

}  // namespace custos::sys
