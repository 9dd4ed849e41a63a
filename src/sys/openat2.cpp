#include "custos/sys/openat2.hpp"

#include <cerrno>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace custos::sys {

Result<UniqueFd> open_directory(std::string const& path) {
  int const fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error(Errc::sys_error, "open directory " + path, errno);
  return UniqueFd(fd);
}

Result<UniqueFd> open_beneath(UniqueFd const& root, std::string const& rel, bool directory,
                              int extra_flags) {
  return open_beneath(root.get(), rel, directory, extra_flags);
}

Result<UniqueFd> open_beneath(int root_fd, std::string const& rel, bool directory,
                              int extra_flags) {
  if (root_fd < 0) return Error(Errc::sys_error, "open_beneath: no root directory", EBADF);
  open_how how{};
  how.flags = static_cast<std::uint64_t>(O_RDONLY | O_CLOEXEC | O_NOCTTY | extra_flags |
                                         (directory ? O_DIRECTORY : 0));
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  char const* path = rel.empty() ? "." : rel.c_str();
  for (;;) {
    long const fd = ::syscall(SYS_openat2, root_fd, path, &how, sizeof how);
    if (fd >= 0) return UniqueFd(static_cast<int>(fd));
    int const err = errno;
    // EAGAIN: a concurrent rename raced the lookup (RESOLVE_BENEATH refuses to guess); retrying
    // is what the man page asks for.
    if (err == EINTR || err == EAGAIN) continue;
    if (err == EXDEV || err == ELOOP) {
      return Error(Errc::workspace_escape, "'" + rel + "' resolves outside the workspace root",
                   err);
    }
    if (err == ENOSYS) return Error(Errc::sys_unsupported, "openat2 is not available", err);
    return Error(Errc::sys_error, "openat2 '" + rel + "'", err);
  }
}

}  // namespace custos::sys
