// Pidfd: a process reference that cannot be confused with a recycled pid.
//
// Once a Pidfd exists, nothing signals or waits by pid: signals go through pidfd_send_signal,
// exit is observed with waitid(P_PIDFD) (children) or PIDFD_GET_INFO (after reaping, any
// process), and readiness (POLLIN == exited) makes the fd usable as an Asio descriptor after
// fd().dup().
#pragma once

#include <cstdint>
#include <optional>

#include "custos/core/cancellation.hpp"
#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// How a process ended: core's one exit type (code or signal, and core_dumped), which sys fills
// from the kernel's reports.
using core::ExitStatus;

// From a wait(2)-format status word (WIFEXITED/WTERMSIG/WCOREDUMP), as PIDFD_GET_INFO reports it.
[[nodiscard]] ExitStatus exit_status_from_wait(int status) noexcept;

class Pidfd {
 public:
  Pidfd() = default;

  // pidfd_open(pid, 0). The fd is blocking and O_CLOEXEC (the kernel always sets it).
  // Errors: pidfd.failed with ESRCH (no such process), EINVAL (not a thread-group leader);
  // sys.unsupported when the kernel lacks pidfd_open (ENOSYS).
  [[nodiscard]] static Result<Pidfd> open(std::int32_t pid);

  // Takes ownership of a pidfd obtained elsewhere (clone3 CLONE_PIDFD, SO_PEERPIDFD).
  [[nodiscard]] static Pidfd adopt(UniqueFd fd, std::int32_t pid) noexcept;

  [[nodiscard]] std::int32_t pid() const noexcept { return pid_; }
  [[nodiscard]] UniqueFd const& fd() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_.valid(); }

  // A second handle for the same process (dup of the pidfd).
  [[nodiscard]] Result<Pidfd> dup() const;

  // pidfd_send_signal(fd, sig). Returns true when delivered, false when the process is already
  // gone (ESRCH): a late signal to an exited process is expected, not an error.
  // Errors: pidfd.failed (EPERM, EINVAL, EBADF).
  [[nodiscard]] Result<bool> send_signal(int sig) const;

  // waitid(P_PIDFD, WEXITED|WNOHANG): reaps the process if it has exited. Only for our own
  // children. Returns nullopt while it runs. The status is remembered, so a second call after
  // reaping returns the same value instead of ECHILD.
  // Errors: pidfd.failed with ECHILD (not our child, or reaped by someone else).
  [[nodiscard]] Result<std::optional<ExitStatus>> try_wait();

  // waitid(P_PIDFD, WEXITED|WNOHANG|WNOWAIT): the exit status of our own exited child, left
  // unreaped (whoever owns the child still waits for it). nullopt while it runs.
  // Errors: pidfd.failed with ECHILD (not our child, or already reaped).
  [[nodiscard]] Result<std::optional<ExitStatus>> peek_exit() const;

  // waitid(P_PIDFD, WEXITED), blocking (EINTR retried). Same remembering as try_wait().
  [[nodiscard]] Result<ExitStatus> wait();

  // PIDFD_GET_INFO with PIDFD_INFO_EXIT: the exit status of a process that has been reaped (by
  // us or by its own parent). nullopt while it runs or is an unreaped zombie.
  // Errors: sys.unsupported when the kernel has no PIDFD_GET_INFO (EINVAL/ENOTTY);
  // pidfd.failed otherwise.
  [[nodiscard]] Result<std::optional<ExitStatus>> get_exit_info() const;

  // Whether this kernel reports a reaped process's exit status through PIDFD_GET_INFO
  // (PIDFD_INFO_EXIT, Linux 6.15; 6.13 and 6.14 have the ioctl without it). Probed once per
  // process, with a short-lived child of its own.
  [[nodiscard]] static bool exit_info_supported() noexcept;

  // Readiness without blocking: false once the process has exited (zombie or reaped).
  [[nodiscard]] bool alive() const noexcept;

  // The status observed by try_wait()/wait(), if any.
  [[nodiscard]] std::optional<ExitStatus> const& reaped_status() const noexcept { return exit_; }

 private:
  Pidfd(UniqueFd fd, std::int32_t pid) noexcept : fd_(std::move(fd)), pid_(pid) {}

  UniqueFd fd_;
  std::int32_t pid_ = -1;
  std::optional<ExitStatus> exit_;
};

}  // namespace custos::sys
