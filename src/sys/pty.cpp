#include "custos/sys/pty.hpp"

#include <array>
#include <cerrno>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

namespace custos::sys {
namespace {

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

Result<void> set_winsize(int fd, std::uint16_t rows, std::uint16_t cols) {
  if (rows == 0 || cols == 0)
    return Error(Errc::pty_failed, "window size must be at least 1x1", EINVAL);
  struct winsize ws {};
  ws.ws_row = rows;
  ws.ws_col = cols;
  if (::ioctl(fd, TIOCSWINSZ, &ws) != 0) return Error(Errc::pty_failed, "ioctl(TIOCSWINSZ)", errno);
  return ok();
}

Result<UniqueFd> open_slave(UniqueFd const& master) {
  int const fd = ::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (fd >= 0) return UniqueFd(fd);
  if (errno != EINVAL && errno != ENOTTY)
    return Error(Errc::pty_failed, "ioctl(TIOCGPTPEER)", errno);
  // Kernels before 4.13: open the slave by name.
  std::array<char, 128> name{};
  if (::ptsname_r(master.get(), name.data(), name.size()) != 0) {
    return Error(Errc::pty_failed, "ptsname_r", errno);
  }
  int const by_name = ::open(name.data(), O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (by_name < 0) return Error(Errc::pty_failed, "open pty slave", errno);
  return UniqueFd(by_name);
}

}  // namespace

Result<Pty> Pty::open(std::uint16_t rows, std::uint16_t cols) {
  if (rows == 0 || cols == 0)
    return Error(Errc::pty_failed, "window size must be at least 1x1", EINVAL);
  UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!master.valid()) return Error(Errc::pty_failed, "posix_openpt", errno);
  if (::unlockpt(master.get()) != 0) return Error(Errc::pty_failed, "unlockpt", errno);
  UniqueFd slave = CUSTOS_TRY(open_slave(master));
  CUSTOS_TRYV(set_winsize(master.get(), rows, cols));
  int const fl = ::fcntl(master.get(), F_GETFL);
  if (fl < 0 || ::fcntl(master.get(), F_SETFL, fl | O_NONBLOCK) != 0) {
    return Error(Errc::pty_failed, "fcntl(O_NONBLOCK) on the pty master", errno);
  }
  return Pty(std::move(master), std::move(slave));
}

Result<Pty> Pty::from_master(UniqueFd master) {
  unsigned int n = 0;
  // TIOCGPTN answers only on a master (the slave and any other file refuse it).
  if (!master.valid() || ::ioctl(master.get(), TIOCGPTN, &n) != 0)
    return Error(Errc::pty_failed, "not a terminal master", master.valid() ? errno : EBADF);
  return Pty(std::move(master), UniqueFd{});
}

Result<void> Pty::resize(std::uint16_t rows, std::uint16_t cols) {
  if (!master_.valid())
    return Error(Errc::pty_failed, "resize: the pty master was handed over", EBADF);
  return set_winsize(master_.get(), rows, cols);
}

Result<WindowSize> Pty::size() const {
  struct winsize ws {};
  if (::ioctl(master_.get(), TIOCGWINSZ, &ws) != 0)
    return Error(Errc::pty_failed, "ioctl(TIOCGWINSZ)", errno);
  return WindowSize{ws.ws_row, ws.ws_col};
}

}  // namespace custos::sys
