// Tree resource sampling and the bounded disk walk (see sampler.hpp).
#include "custos/sys/sampler.hpp"

#include <cerrno>
#include <charconv>
#include <deque>
#include <dirent.h>
#include <fcntl.h>
#include <memory>
#include <set>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

#include "custos/sys/procfs.hpp"

namespace custos::sys {
namespace {

struct DirCloser {
  void operator()(DIR* d) const noexcept { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

// opendir relative to a directory fd; the fd is owned by a UniqueFd until the DIR takes it.
// Returns null with errno set on failure.
DirPtr open_dir_at(int dirfd, char const* name, int extra_flags = 0) {
  UniqueFd fd(::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | extra_flags));
  if (!fd.valid()) return nullptr;
  DirPtr d(::fdopendir(fd.get()));
  if (d) (void)fd.release();
  return d;
}

std::optional<std::uint64_t> to_u64(std::string_view s) {
  std::uint64_t v = 0;
  auto const [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n')) ++i;
    std::size_t const b = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\n') ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

// What one process contributed to a sample.
struct ProcSample {
  std::uint64_t cpu_ticks = 0;  // utime + stime + cutime + cstime
  std::uint64_t rss_pages = 0;
  std::uint64_t fds = 0;
  bool fds_readable = false;  // fd/ needs ptrace access, stat and statm do not
  bool zombie = false;        // exited, not yet reaped: its CPU counts, nothing else does
};

enum class ReadOutcome : std::uint8_t { ok, gone, unreadable };

ReadOutcome classify(int err) {
  return (err == ENOENT || err == ESRCH) ? ReadOutcome::gone : ReadOutcome::unreadable;
}

ReadOutcome sample_process(UniqueFd const& proc, std::int32_t pid, ProcSample& out) {
  std::string const base = std::to_string(pid);
  auto stat = read_file_at(proc, base + "/stat", 4096);
  if (!stat) return classify(stat.error().sys_errno);
  // The command name is in parentheses and may itself hold spaces and ')': fields restart after
  // the last ')'. Then: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
  std::size_t const close = stat->rfind(')');
  if (close == std::string::npos) return ReadOutcome::unreadable;
  std::vector<std::string_view> const f = words(std::string_view(*stat).substr(close + 1));
  if (f.size() < 15) return ReadOutcome::unreadable;
  for (std::size_t i = 11; i <= 14; ++i) {  // f[0] is field 3, so field 14 is f[11]
    // cutime/cstime are signed in the kernel's format; a negative value never occurs in practice.
    if (auto const v = to_u64(f[i])) out.cpu_ticks += *v;
  }
  if (f[0] == "Z") {
    out.zombie = true;
    return ReadOutcome::ok;
  }
  auto statm = read_file_at(proc, base + "/statm", 4096);
  if (!statm) return classify(statm.error().sys_errno);
  std::vector<std::string_view> const m = words(*statm);
  if (m.size() >= 2) {
    if (auto const v = to_u64(m[1])) out.rss_pages = *v;
  }
  DirPtr const d = open_dir_at(proc.get(), (base + "/fd").c_str());
  if (!d) {
    if (classify(errno) == ReadOutcome::gone) return ReadOutcome::gone;
    return ReadOutcome::ok;  // counted for cpu and memory; fds_readable stays false
  }
  out.fds_readable = true;
  while (dirent const* e = ::readdir(d.get())) {
    if (e->d_name[0] != '.') ++out.fds;
  }
  return ReadOutcome::ok;
}

// The fallback pids and their living descendants (through task/*/children), at most `limit`.
std::vector<std::int32_t> expand_descendants(UniqueFd const& proc, std::vector<pid_t> const& roots,
                                             std::uint32_t limit) {
  std::vector<std::int32_t> out;
  std::set<std::int32_t> seen;
  std::deque<std::int32_t> queue(roots.begin(), roots.end());
  while (!queue.empty() && out.size() < limit) {
    std::int32_t const pid = queue.front();
    queue.pop_front();
    if (pid <= 0 || !seen.insert(pid).second) continue;
    out.push_back(pid);
    std::string const task = std::to_string(pid) + "/task";
    DirPtr const d = open_dir_at(proc.get(), task.c_str());
    if (!d) continue;
    while (dirent const* e = ::readdir(d.get())) {
      if (e->d_name[0] == '.') continue;
      auto text = read_file_at(proc, task + "/" + e->d_name + "/children", 1u << 20);
      if (!text) continue;
      for (std::string_view const w : words(*text)) {
        if (auto const v = to_u64(w); v && *v > 0 && *v <= 0x7fffffff)
          queue.push_back(static_cast<std::int32_t>(*v));
      }
    }
  }
  return out;
}

}  // namespace

Result<TreeUsage> sample_tree(CgroupDir const* cgroup, std::vector<pid_t> const& fallback_pids,
                              SampleOptions const& options) {
  auto proc_dir = open_dir_path(options.proc_root);
  if (!proc_dir)
    return Error(Errc::procfs_failed, "open " + options.proc_root, proc_dir.error().sys_errno);
  UniqueFd const& proc = *proc_dir;

  TreeUsage u;
  std::vector<std::int32_t> pids;
  std::optional<CgroupStats> cg;
  if (cgroup != nullptr) {
    pids = CUSTOS_TRY(cgroup->tree_procs(options.max_processes));
    cg = CUSTOS_TRY(cgroup->stats());
    u.source = SampleSource::cgroup;
  } else {
    pids = expand_descendants(proc, fallback_pids, options.max_processes);
    u.source = SampleSource::procfs;
  }

  ProcSample sum;
  std::uint64_t live = 0;
  std::uint64_t fds_hidden = 0;
  for (std::int32_t const pid : pids) {
    ProcSample one;
    switch (sample_process(proc, pid, one)) {
      case ReadOutcome::ok:
        sum.cpu_ticks += one.cpu_ticks;
        if (one.zombie) break;
        ++live;
        sum.rss_pages += one.rss_pages;
        sum.fds += one.fds;
        if (!one.fds_readable) ++fds_hidden;
        break;
      case ReadOutcome::unreadable:
        ++u.unreadable;
        break;
      case ReadOutcome::gone:
        break;
    }
  }
  // With a cgroup the list is complete, so a sum over it is a measurement even when it is
  // zero. Without one, a sum over no readable process measured nothing.
  bool const sums_valid = (cgroup != nullptr || live > 0) && u.unreadable == 0;
  Fidelity const summed = sums_valid ? Fidelity::sampled : Fidelity::unavailable;
  auto const tck = static_cast<std::uint64_t>(::sysconf(_SC_CLK_TCK));
  auto const page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));

  if (cg && cg->cpu_usage_usec) {
    u.cpu_ms = {*cg->cpu_usage_usec / 1000, Fidelity::sampled};
  } else {
    u.cpu_ms = {tck > 0 ? sum.cpu_ticks * 1000 / tck : 0, tck > 0 ? summed : Fidelity::unavailable};
  }
  if (cg && cg->memory_current) {
    u.rss_bytes = {*cg->memory_current, cg->memory_max ? Fidelity::hard : Fidelity::sampled};
  } else {
    u.rss_bytes = {sum.rss_pages * page, summed};
  }
  if (cg && cg->pids_current) {
    u.processes = {*cg->pids_current, cg->pids_max ? Fidelity::hard : Fidelity::sampled};
  } else {
    // Counting the processes we could see is a measurement even when some were unreadable.
    u.processes = {live + u.unreadable, (cgroup != nullptr || !fallback_pids.empty())
                                            ? Fidelity::sampled
                                            : Fidelity::unavailable};
  }
  u.open_fds = {sum.fds, fds_hidden == 0 ? summed : Fidelity::unavailable};
  return u;
}

Result<DiskUsage> walk_disk_usage(UniqueFd const& root, std::uint64_t max_entries,
                                  std::uint32_t max_depth) {
  struct stat root_st {};
  if (::fstat(root.get(), &root_st) != 0) return Error(Errc::sys_error, "fstat walk root", errno);
  if (!S_ISDIR(root_st.st_mode))
    return Error(Errc::sys_error, "walk root is not a directory", ENOTDIR);
  // fdopendir takes over its fd, and the caller keeps `root`: list a fresh open of ".".
  DirPtr top = open_dir_at(root.get(), ".");
  if (!top) return Error(Errc::sys_error, "open walk root", errno);

  DiskUsage du;
  std::set<std::pair<dev_t, ino_t>> linked;  // files with st_nlink > 1 already counted
  std::vector<DirPtr> stack;
  stack.push_back(std::move(top));
  while (!stack.empty()) {
    DIR* const d = stack.back().get();
    errno = 0;
    dirent const* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) ++du.unreadable;
      stack.pop_back();
      continue;
    }
    if (std::string_view(e->d_name) == "." || std::string_view(e->d_name) == "..") continue;
    if (du.entries >= max_entries) {
      du.truncated = true;
      break;
    }
    ++du.entries;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // vanished
    bool const counted_before =
        st.st_nlink > 1 && !S_ISDIR(st.st_mode) && !linked.emplace(st.st_dev, st.st_ino).second;
    if (!counted_before) {
      du.bytes += static_cast<std::uint64_t>(st.st_blocks) * 512u;
      if (S_ISREG(st.st_mode)) du.apparent_bytes += static_cast<std::uint64_t>(st.st_size);
    }
    if (!S_ISDIR(st.st_mode)) continue;  // symlinks included: counted, never followed
    if (st.st_dev != root_st.st_dev) {
      ++du.other_device;
      continue;
    }
    if (stack.size() >= max_depth) {
      du.truncated = true;
      continue;
    }
    // O_NOFOLLOW: if the entry was swapped for a symlink since fstatat, the open fails.
    DirPtr sub = open_dir_at(::dirfd(d), e->d_name, O_NOFOLLOW);
    if (!sub) {
      ++du.unreadable;
      continue;
    }
    struct stat opened {};
    if (::fstat(::dirfd(sub.get()), &opened) != 0 || opened.st_dev != st.st_dev ||
        opened.st_ino != st.st_ino) {
      ++du.unreadable;  // replaced between fstatat and openat: not the directory we counted
      continue;
    }
    stack.push_back(std::move(sub));
  }
  return du;
}

}  // namespace custos::sys
