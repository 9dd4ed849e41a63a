// UniqueFd: the one owner of a file descriptor.
//
// Move-only and noexcept; no implicit conversion to int, so an fd can only leave its owner through
// get() (borrow) or release() (hand over, rare). close() is never retried on EINTR: on Linux the
// descriptor is gone even when close() reports EINTR, and a retry could close an fd another
// thread has just been given.
#pragma once

#include <utility>

#include "custos/core/result.hpp"

namespace custos::sys {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd const&) = delete;
  UniqueFd& operator=(UniqueFd const&) = delete;
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }

  // Gives up ownership without closing; the caller now owns the returned descriptor.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the current descriptor (if any) and takes ownership of `fd`.
  void reset(int fd = -1) noexcept;

  // A second descriptor for the same open file, created O_CLOEXEC (F_DUPFD_CLOEXEC).
  // Errors: sys.error (EMFILE, EBADF).
  [[nodiscard]] Result<UniqueFd> dup() const;

 private:
  int fd_ = -1;
};

// pipe2() with O_CLOEXEC always added to `flags` (O_NONBLOCK, O_DIRECT may be given).
// Returns {read end, write end}. Errors: sys.error (EMFILE, ENFILE).
[[nodiscard]] Result<std::pair<UniqueFd, UniqueFd>> make_pipe(int flags = 0);

}  // namespace custos::sys
