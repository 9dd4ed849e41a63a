#include "custos/sys/identity.hpp"

#include <array>
#include <cerrno>
#include <charconv>
#include <fcntl.h>
#include <mutex>
#include <string_view>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

namespace custos::sys {
namespace {

// "PIDF": the statfs magic of pidfs (Linux 6.9+). Before pidfs, pidfds were anon inodes.
constexpr long kPidfsMagic = 0x50494446;

// Reads a small /proc file whole. /proc files report size 0, so read until EOF into a bounded
// buffer; a stat line is far below 4 KiB even with a 15-char comm and 52 fields.
Result<std::string> read_small_file(std::string const& path, Errc code) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) return Error(code, "open " + path, errno);
  std::string out;
  std::array<char, 4096> buf{};
  for (;;) {
    ssize_t const n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(code, "read " + path, errno);
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<std::size_t>(n));
    if (out.size() > std::size_t{64} * 1024)
      return Error(code, path + " is unexpectedly large", EFBIG);
  }
  return out;
}

}  // namespace

Result<std::string> read_boot_id() {
  // The boot id cannot change while this process lives, and every spawn needs it: read the file
  // once. A failed read is not cached, so a transient failure does not stick.
  static std::mutex mu;
  static std::string cached;
  std::lock_guard const lock(mu);
  if (!cached.empty()) return cached;
  std::string s = CUSTOS_TRY(read_small_file("/proc/sys/kernel/random/boot_id", Errc::sys_error));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() != 36) return Error(Errc::sys_error, "boot_id has unexpected length", EINVAL);
  cached = s;
  return s;
}

Result<std::uint64_t> read_start_time(std::int32_t pid) {
  std::string const path = "/proc/" + std::to_string(pid) + "/stat";
  std::string const stat = CUSTOS_TRY(read_small_file(path, Errc::procfs_failed));
  // comm (field 2) may hold spaces and parentheses; it ends at the *last* ')'.
  auto const close = stat.rfind(')');
  if (close == std::string::npos)
    return Error(Errc::procfs_failed, path + ": no comm field", EINVAL);
  std::string_view rest(stat);
  rest.remove_prefix(close + 1);
  // After ')' come fields 3.. separated by single spaces; starttime is field 22.
  int field = 2;
  std::size_t pos = 0;
  while (field < 22) {
    pos = rest.find(' ', pos);
    if (pos == std::string_view::npos) break;
    ++pos;
    ++field;
  }
  if (field != 22) return Error(Errc::procfs_failed, path + ": too few fields", EINVAL);
  std::uint64_t value = 0;
  auto const* begin = rest.data() + pos;
  auto const* end = rest.data() + rest.size();
  auto const [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin) {
    return Error(Errc::procfs_failed, path + ": bad starttime", EINVAL);
  }
  return value;
}

Result<PidfsIdentity> read_identity(Pidfd const& pidfd) {
  if (!pidfd.valid()) return Error(Errc::pidfd_failed, "read_identity on an empty Pidfd", EBADF);
  struct statfs fs {};
  if (::fstatfs(pidfd.fd().get(), &fs) != 0) return Error(Errc::sys_error, "fstatfs(pidfd)", errno);
  if (fs.f_type != kPidfsMagic) {
    return Error(Errc::sys_unsupported, "pidfds are not pidfs inodes on this kernel", 0);
  }
  struct stat st {};
  if (::fstat(pidfd.fd().get(), &st) != 0) return Error(Errc::sys_error, "fstat(pidfd)", errno);

  PidfsIdentity id;
  id.boot_id = CUSTOS_TRY(read_boot_id());
  id.pidfs_dev = static_cast<std::uint64_t>(st.st_dev);
  id.pidfs_ino = static_cast<std::uint64_t>(st.st_ino);
  id.pid = pidfd.pid();
  auto start = read_start_time(pidfd.pid());
  // Re-verify after the /proc read: if the process had exited, its pid may have been reused and
  // the start time read above may belong to someone else.
  if (!pidfd.alive()) {
    return Error(Errc::identity_mismatch,
                 "process " + std::to_string(pidfd.pid()) + " exited while its identity was read",
                 ESRCH);
  }
  if (!start) return std::move(start).error();
  id.start_time_ticks = *start;
  return id;
}

}  // namespace custos::sys
