// PidfsIdentity: the only positive evidence that a process is the one we launched.
//
// (boot_id, pidfs st_dev, pidfs st_ino) from fstat() on a pidfd names one process for the whole
// boot; pid and start time are kept only as negative evidence (they can rule a candidate out,
// never in), because both are recycled.
#pragma once

#include <cstdint>
#include <string>

#include "custos/core/result.hpp"
#include "custos/sys/pidfd.hpp"

namespace custos::sys {

struct PidfsIdentity {
  std::string boot_id;                 // /proc/sys/kernel/random/boot_id, 36 chars, no newline
  std::uint64_t pidfs_dev = 0;         // st_dev of the pidfd
  std::uint64_t pidfs_ino = 0;         // st_ino of the pidfd (unique per boot on pidfs)
  std::int32_t pid = 0;                // negative evidence only
  std::uint64_t start_time_ticks = 0;  // field 22 of /proc/PID/stat, clock ticks since boot

  friend bool operator==(PidfsIdentity const&, PidfsIdentity const&) = default;
};

// Errors: sys.error when the file cannot be read or is malformed.
[[nodiscard]] Result<std::string> read_boot_id();

// Start time (clock ticks after boot) from /proc/PID/stat. This reads by pid, so on its own it
// says nothing about *which* process it was; read_identity() re-verifies through a pidfd.
// Errors: procfs.failed (ENOENT when the process is gone, EINVAL when the file is malformed).
[[nodiscard]] Result<std::uint64_t> read_start_time(std::int32_t pid);

// Now, in the unit of read_start_time (clock ticks since boot, CLOCK_BOOTTIME): a process that
// starts after this call has a start time >= the value. Errors: sys.error from clock_gettime.
[[nodiscard]] Result<std::uint64_t> boot_ticks_now();

// Reads the identity of the process behind `pidfd`. The start time is read by pid and then the
// pidfd is checked to be still alive: a live process holds its pid, so the /proc entry read in
// between cannot have belonged to a successor.
// Errors: sys.unsupported when pidfds are not pidfs inodes (old kernels give every pidfd the same
// anon inode, which would make the identity meaningless); identity.mismatch when the process
// exited during the read; procfs.failed / sys.error from the reads.
[[nodiscard]] Result<PidfsIdentity> read_identity(Pidfd const& pidfd);
// The same, and from the same read of /proc/PID/stat the process's ignored-signal mask as it
// was at that read (field 33: bit n-1 for signal n; the kernel shows only signals 1..31 there).
// spawn_staged uses it to check, at no extra syscall, that its child resets every standard
// signal it inherited as SIG_IGN.
[[nodiscard]] Result<PidfsIdentity> read_identity(Pidfd const& pidfd,
                                                  std::uint64_t& ignored_signals);

}  // namespace custos::sys
