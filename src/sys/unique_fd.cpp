#include "custos/sys/unique_fd.hpp"

#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

namespace custos::sys {

void UniqueFd::reset(int fd) noexcept {
  int const old = std::exchange(fd_, fd);
  if (old >= 0) {
    // The result is deliberately ignored: after close() the number is released whatever it
    // returns (EINTR/EIO included), and retrying would race with other threads' open().
    static_cast<void>(::close(old));
  }
}

Result<UniqueFd> UniqueFd::dup() const {
  int const copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return Error(Errc::sys_error, "fcntl(F_DUPFD_CLOEXEC)", errno);
  return UniqueFd(copy);
}

Result<std::pair<UniqueFd, UniqueFd>> make_pipe(int flags) {
  int fds[2] = {-1, -1};
  if (::pipe2(fds, flags | O_CLOEXEC) != 0) return Error(Errc::sys_error, "pipe2", errno);
  return std::pair<UniqueFd, UniqueFd>(UniqueFd(fds[0]), UniqueFd(fds[1]));
}

}  // namespace custos::sys
