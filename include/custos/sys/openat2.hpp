// Path resolution that cannot leave a root directory.
//
// Working directories are resolved in the daemon, before clone3, with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_MAGICLINKS) from the workspace root fd: `..` and symlinks are followed only while
// they stay beneath the root, and /proc magic links are refused. The child then only fchdir()s.
#pragma once

#include <string>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// Opens an existing directory by absolute or relative path (O_DIRECTORY|O_RDONLY|O_CLOEXEC) to
// serve as a root for open_beneath(). Symlinks in `path` are followed: the root is chosen by the
// daemon's configuration, not by an execution.
// Errors: sys.error (ENOENT, ENOTDIR, EACCES ...).
[[nodiscard]] Result<UniqueFd> open_directory(std::string const& path);

// openat2(root, rel, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS). With `directory` the result is an
// O_DIRECTORY|O_RDONLY fd (usable for fchdir and getdents); otherwise O_RDONLY. `extra_flags`
// are OR-ed into the open flags (O_CLOEXEC is always set). An empty `rel` means the root itself.
// Errors: workspace.escape when resolution would leave the root (EXDEV: `..`, absolute path or
// symlink pointing out; ELOOP: a magic link or symlink loop); sys.unsupported when the kernel
// has no openat2 (ENOSYS); sys.error for everything else (ENOENT, ENOTDIR, EACCES, with errno).
[[nodiscard]] Result<UniqueFd> open_beneath(UniqueFd const& root, std::string const& rel,
                                            bool directory, int extra_flags = 0);

// The same with a borrowed root descriptor (SpawnSpec carries borrowed fds).
[[nodiscard]] Result<UniqueFd> open_beneath(int root_fd, std::string const& rel, bool directory,
                                            int extra_flags = 0);

}  // namespace custos::sys
