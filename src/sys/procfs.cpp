// procfs and cgroupfs small-file helpers and the mountinfo reading (see procfs.hpp). The marker
// boundary is in marker_scan.cpp and marker_sweep.cpp.
#include "custos/sys/procfs.hpp"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace custos::sys {
namespace {

std::vector<std::string_view> fields_of(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    std::size_t const b = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

// mountinfo escapes space, tab, newline and backslash as \ooo (octal).
std::string unescape_octal(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto is_oct = [](char c) { return c >= '0' && c <= '7'; };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && is_oct(s[i + 1]) && is_oct(s[i + 2]) &&
        is_oct(s[i + 3])) {
      out.push_back(
          static_cast<char>(((s[i + 1] - '0') << 6) | ((s[i + 2] - '0') << 3) | (s[i + 3] - '0')));
      i += 3;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::optional<MountInfoEntry> parse_mountinfo_line(std::string_view line) {
  std::vector<std::string_view> const f = fields_of(line);
  // id parent maj:min root mountpoint options [optional fields...] - fstype source superoptions
  auto const dash = std::find(f.begin(), f.end(), std::string_view("-"));
  if (dash == f.end() || dash - f.begin() < 6 || f.end() - dash < 4) return std::nullopt;
  return MountInfoEntry{unescape_octal(f[3]), unescape_octal(f[4]),    std::string(f[5]),
                        std::string(dash[1]), unescape_octal(dash[2]), std::string(dash[3])};
}

bool mount_option_present(std::string_view options, std::string_view name) {
  std::size_t i = 0;
  while (i <= options.size()) {
    std::size_t const comma = std::min(options.find(',', i), options.size());
    std::string_view const opt = options.substr(i, comma - i);
    if (opt == name ||
        (opt.size() > name.size() && opt.starts_with(name) && opt[name.size()] == '='))
      return true;
    i = comma + 1;
  }
  return false;
}

bool proc_hides_processes(std::string_view mountinfo, std::string const& proc_root) {
  bool hides = false;
  std::size_t pos = 0;
  while (pos < mountinfo.size()) {
    std::size_t const eol = std::min(mountinfo.find('\n', pos), mountinfo.size());
    auto const e = parse_mountinfo_line(mountinfo.substr(pos, eol - pos));
    pos = eol + 1;
    if (!e || e->fstype != "proc" || e->mount_point != proc_root) continue;
    // The last mount at a mount point is the visible one, so later lines override.
    hides = false;
    for (std::string_view const opts :
         {std::string_view(e->super_options), std::string_view(e->mount_options)}) {
      for (std::string_view const v :
           {"hidepid=2", "hidepid=invisible", "hidepid=4", "hidepid=ptraceable"}) {
        std::size_t const at = opts.find(v);
        if (at != std::string_view::npos && (at == 0 || opts[at - 1] == ',') &&
            (at + v.size() == opts.size() || opts[at + v.size()] == ',')) {
          hides = true;
        }
      }
    }
  }
  return hides;
}

Result<UniqueFd> open_dir_path(std::string const& path) {
  int const fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error(Errc::sys_error, "open " + path, errno);
  return UniqueFd(fd);
}

namespace {

Result<std::string> read_at(UniqueFd const& dir, std::string const& name, std::size_t max_bytes,
                            bool short_read_is_end) {
  int const fd = ::openat(dir.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Error(Errc::sys_error, "open " + name, errno);
  UniqueFd const guard(fd);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t const n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(Errc::sys_error, "read " + name, errno);
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) {
      return Error(Errc::sys_error,
                   "read " + name + ": larger than " + std::to_string(max_bytes) + " bytes", EFBIG);
    }
    out.append(buf, static_cast<std::size_t>(n));
    if (short_read_is_end && static_cast<std::size_t>(n) < sizeof buf) break;
  }
  return out;
}

}  // namespace

Result<std::string> read_file_at(UniqueFd const& dir, std::string const& name,
                                 std::size_t max_bytes) {
  return read_at(dir, name, max_bytes, false);
}

Result<std::string> read_shown_file_at(UniqueFd const& dir, std::string const& name,
                                       std::size_t max_bytes) {
  return read_at(dir, name, max_bytes, true);
}

Result<void> write_file_at(UniqueFd const& dir, std::string const& name, std::string_view data) {
  int const fd = ::openat(dir.get(), name.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Error(Errc::sys_error, "open " + name, errno);
  UniqueFd const guard(fd);
  for (;;) {
    ssize_t const n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(Errc::sys_error, "write " + name, errno);
    }
    // cgroupfs and procfs take a value in one write; a short write means it was not taken.
    if (static_cast<std::size_t>(n) != data.size())
      return Error(Errc::sys_error, "short write " + name, EIO);
    return ok();
  }
}

Result<std::uint64_t> pid_namespace_inode(std::string const& pid, std::string const& proc_root) {
  std::string const path = proc_root + "/" + pid + "/ns/pid";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Error(Errc::procfs_failed, "stat " + path, errno);
  return static_cast<std::uint64_t>(st.st_ino);
}

}  // namespace custos::sys
