#include "custos/sys/dir_chain.hpp"

#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

namespace {

Result<DirId> id_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error(Errc::sys_error, "fstat", errno);
  return DirId{st.st_dev, st.st_ino};
}

// The path the kernel resolved for an open descriptor.
Result<std::string> path_of(int fd) {
  std::string const link = "/proc/self/fd/" + std::to_string(fd);
  std::string buf(PATH_MAX, '\0');
  ssize_t const n = ::readlink(link.c_str(), buf.data(), buf.size());
  if (n < 0) return Error(Errc::sys_error, "readlink " + link, errno);
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

// `above` is `below` or a directory above it, comparing whole components.
bool path_at_or_above(std::string const& above, std::string const& below) {
  if (above == "/") return true;
  if (!below.starts_with(above)) return false;
  return below.size() == above.size() || below[above.size()] == '/';
}

}  // namespace

Result<DirChain> dir_chain(std::string const& path) {
  DirChain chain;
  int const fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int const err = errno;
    if (err != ENOENT) return Error(Errc::sys_error, "open " + path, err);
    chain.path = std::filesystem::path{path}.lexically_normal().native();
    if (chain.path.size() > 1 && chain.path.back() == '/') chain.path.pop_back();
    return chain;
  }
  UniqueFd cur(fd);
  chain.path = CUSTOS_TRY(path_of(cur.get()));
  // Up through "..": the root is the directory that is its own parent.
  for (;;) {
    DirId const id = CUSTOS_TRY(id_of(cur.get()));
    if (!chain.ids.empty() && chain.ids.back() == id) break;
    chain.ids.push_back(id);
    int const up = ::openat(cur.get(), "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (up < 0) return Error(Errc::sys_error, "open .. above " + path, errno);
    cur = UniqueFd(up);
  }
  return chain;
}

Result<bool> at_or_above(int dir_fd, DirChain const& chain) {
  DirId const id = CUSTOS_TRY(id_of(dir_fd));
  for (auto const& above : chain.ids) {
    if (above == id) return true;
  }
  std::string const path = CUSTOS_TRY(path_of(dir_fd));
  return path_at_or_above(path, chain.path);
}

}  // namespace custos::sys
