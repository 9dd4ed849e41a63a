// Is one directory at or above another? Asked of a plan's workspace against the daemon's state
// directory: the registry must live outside every workspace an execution can see.
//
// A path comparison alone is dodged by a symlink or a bind mount (the same directory under
// another name), so both are compared: the device and inode of the candidate against those of
// the target and of every directory above it (walking "..", as the kernel resolves it in this
// mount namespace), and the resolved paths.
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

#include "custos/core/result.hpp"

namespace custos::sys {

struct DirId {
  dev_t dev = 0;
  ino_t ino = 0;
  friend bool operator==(DirId const&, DirId const&) = default;
};

// A directory and every directory above it, from itself up to the root of this namespace.
struct DirChain {
  // The resolved path (symlinks followed) when the directory exists; else the lexically
  // normalized absolute path it was given (ids then empty: nothing to compare but the path).
  std::string path;
  std::vector<DirId> ids;
};

// The chain of `path` (absolute). A directory that does not exist (ENOENT) gives its lexical
// path and no ids. Errors: sys.error (EACCES, ENOTDIR, ...).
[[nodiscard]] Result<DirChain> dir_chain(std::string const& path);

// Whether the directory open as `dir_fd` is the chain's directory or one above it: its device
// and inode are one of the chain's, or its resolved path is the chain's path or a prefix of it
// at a component boundary. Errors: sys.error (fstat, readlink of /proc/self/fd).
[[nodiscard]] Result<bool> at_or_above(int dir_fd, DirChain const& chain);

}  // namespace custos::sys
