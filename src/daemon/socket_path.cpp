// Lock files and the connect probe that keep two daemons off one socket.
#include "socket_path.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <system_error>
#include <unistd.h>

namespace custos::daemon {

namespace fs = std::filesystem;

namespace {

Result<void> make_dir(fs::path const& dir, mode_t mode) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return ok();
  if (!dir.parent_path().empty() && dir.parent_path() != dir) {
    CUSTOS_TRYV(make_dir(dir.parent_path(), 0755));
  }
  if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return Error{Errc::sys_error, "mkdir " + dir.native(), errno};
  }
  return ok();
}

Result<sys::UniqueFd> lock_file(fs::path const& path, Errc busy, std::string const& what) {
  sys::UniqueFd fd{::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (!fd.valid()) return Error{Errc::sys_error, "open " + path.native(), errno};
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    int const err = errno;
    if (err == EWOULDBLOCK) return Error{busy, what + " (" + path.native() + " is locked)"};
    return Error{Errc::sys_error, "flock " + path.native(), err};
  }
  return fd;
}

}  // namespace

Result<sys::UniqueFd> lock_state_dir(fs::path const& state_dir) {
  CUSTOS_TRYV(make_dir(state_dir, 0700));
  return lock_file(state_dir / "custos.lock", Errc::registry_locked,
                   "another custos daemon uses this state directory");
}

Result<sys::UniqueFd> claim_socket_path(fs::path const& path) {
  CUSTOS_TRYV(make_dir(path.parent_path(), 0755));
  auto lock = CUSTOS_TRY(lock_file(fs::path{path.native() + ".lock"}, Errc::rpc_unavailable,
                                   "another custos daemon serves this socket"));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return lock;
    return Error{Errc::sys_error, "lstat " + path.native(), errno};
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Error{Errc::rpc_unavailable,
                 path.native() + " exists and is not a socket; not removing it"};
  }
  // The lock says no custos daemon holds it, but something else might listen there: probe.
  sys::UniqueFd probe{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!probe.valid()) return Error{Errc::sys_error, "socket", errno};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.native().size() + 1);
  if (::connect(probe.get(), reinterpret_cast<sockaddr const*>(&addr), sizeof addr) == 0) {
    return Error{Errc::rpc_unavailable, "something already listens on " + path.native()};
  }
  int const err = errno;
  if (err != ECONNREFUSED && err != ENOENT) {
    return Error{Errc::rpc_unavailable, "cannot tell whether " + path.native() + " is live", err};
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Error{Errc::sys_error, "unlink stale socket " + path.native(), errno};
  }
  return lock;
}

}  // namespace custos::daemon
