// Pty: a pseudo-terminal pair for executions in PTY mode.
//
// The master stays in the daemon and is non-blocking, so a terminal nobody reads can never block
// a write (and with it cancellation); the slave goes to the child as stdin/stdout/stderr and
// controlling terminal (SpawnSpec::pty_slave_fd), after which the daemon closes its copy so that
// reads on the master end (EIO) once the last slave user is gone.
#pragma once

#include <cstdint>
#include <utility>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

struct WindowSize {
  std::uint16_t rows = 0;
  std::uint16_t cols = 0;
  friend bool operator==(WindowSize const&, WindowSize const&) = default;
};

class Pty {
 public:
  Pty() = default;

  // posix_openpt(O_RDWR|O_NOCTTY|O_CLOEXEC) + unlockpt, slave via TIOCGPTPEER (no path lookup,
  // falls back to ptsname_r + open on kernels without it), window size set before anyone reads.
  // Errors: pty.failed (EINVAL for a zero dimension; ENOENT/EAGAIN/ENOSPC when no pty is free).
  [[nodiscard]] static Result<Pty> open(std::uint16_t rows, std::uint16_t cols);
  // A terminal whose master another image of the daemon opened (a handover): only the master,
  // the slave is the program's. Errors: pty.failed (ENOTTY: `master` is not a terminal master).
  [[nodiscard]] static Result<Pty> from_master(UniqueFd master);

  // TIOCSWINSZ on the master; the kernel sends SIGWINCH to the terminal's foreground group.
  // Errors: pty.failed (EINVAL for a zero dimension, EBADF after the master was taken).
  [[nodiscard]] Result<void> resize(std::uint16_t rows, std::uint16_t cols);

  // TIOCGWINSZ on the master. Errors: pty.failed.
  [[nodiscard]] Result<WindowSize> size() const;

  [[nodiscard]] UniqueFd const& master() const noexcept { return master_; }
  [[nodiscard]] UniqueFd const& slave() const noexcept { return slave_; }

  // The daemon's copy of the slave must be closed once the child holds its own.
  void close_slave() noexcept { slave_.reset(); }
  // Hands the master over (e.g. to an Asio descriptor); resize() then fails with EBADF.
  [[nodiscard]] UniqueFd take_master() noexcept { return std::move(master_); }

 private:
  Pty(UniqueFd master, UniqueFd slave) noexcept
      : master_(std::move(master)), slave_(std::move(slave)) {}

  UniqueFd master_;
  UniqueFd slave_;
};

}  // namespace custos::sys
