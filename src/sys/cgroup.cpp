// cgroup v2 shell (see cgroup.hpp).
#include "custos/sys/cgroup.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <dirent.h>
#include <fcntl.h>
#include <memory>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "custos/sys/procfs.hpp"

namespace custos::sys {
namespace {

using Clock = std::chrono::steady_clock;

// Re-labels a file-helper error as a cgroup error, keeping errno and context.
Error as_cgroup_error(Error e, std::string const& where) {
  e.code = Errc::cgroup_failed;
  e.context = where + ": " + e.context;
  return e;
}

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    std::size_t const start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\n') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  std::uint64_t v = 0;
  auto const [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

bool valid_component(std::string const& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

Result<std::set<std::string>> read_word_set(CgroupDir const& dir, std::string const& file) {
  auto text = read_file_at(dir.fd(), file);
  if (!text) return as_cgroup_error(std::move(text).error(), dir.path());
  std::set<std::string> out;
  for (std::string_view const w : split_ws(*text)) out.emplace(w);
  return out;
}

std::optional<std::uint64_t> read_optional_u64(CgroupDir const& dir, std::string const& file) {
  auto text = read_file_at(dir.fd(), file);
  if (!text) return std::nullopt;
  return parse_u64(*text);  // "max" parses as nullopt: no limit is not a number
}

// A controller's interface files exist in a cgroup exactly when the controller is enabled for
// it (listed in its cgroup.controllers), so the write itself answers whether the limit can be
// set: ENOENT is "not enabled". Reading cgroup.controllers first cost an open, a read and a
// close on every launch with a limit (most hosts here enable no controller, so every launch).
Result<void> write_limit(CgroupDir const& dir, std::string const& controller,
                         std::string const& file, std::string const& value) {
  auto w = write_file_at(dir.fd(), file, value);
  if (!w) {
    if (w.error().sys_errno == ENOENT) {
      return Error(Errc::sys_unsupported, "controller '" + controller + "' is not enabled for " +
                                              dir.path() + " (no " + file + ")");
    }
    return as_cgroup_error(std::move(w).error(), dir.path());
  }
  return ok();
}

}  // namespace

Result<CgroupMount> parse_cgroup2_mount(std::string_view mountinfo) {
  std::size_t pos = 0;
  while (pos < mountinfo.size()) {
    std::size_t const eol = std::min(mountinfo.find('\n', pos), mountinfo.size());
    std::string_view const line = mountinfo.substr(pos, eol - pos);
    pos = eol + 1;
    std::vector<std::string_view> const f = split_ws(line);
    auto const dash = std::find(f.begin(), f.end(), std::string_view("-"));
    if (dash == f.end() || dash + 1 == f.end() || *(dash + 1) != "cgroup2") continue;
    auto const e = parse_mountinfo_line(line);
    if (!e)
      return Error(Errc::cgroup_failed,
                   "malformed cgroup2 line in mountinfo: " + std::string(line));
    return CgroupMount{e->mount_point, mount_option_present(e->mount_options, "nsdelegate") ||
                                           mount_option_present(e->super_options, "nsdelegate")};
  }
  return Error(Errc::cgroup_unavailable, "no cgroup2 mount in mountinfo");
}

Result<CgroupMount> find_cgroup2_mount(std::string const& mountinfo_path) {
  auto dir = open_dir_path("/");
  if (!dir) return std::move(dir).error();
  // mountinfo can be long on busy hosts; 4 MiB bounds it while covering thousands of mounts.
  auto text =
      read_file_at(*dir, mountinfo_path.front() == '/' ? mountinfo_path.substr(1) : mountinfo_path,
                   std::size_t{4} * 1024 * 1024);
  if (!text)
    return Error(Errc::cgroup_unavailable, "read " + mountinfo_path, text.error().sys_errno);
  return parse_cgroup2_mount(*text);
}

Result<std::string> parse_own_cgroup(std::string_view proc_cgroup) {
  std::size_t pos = 0;
  while (pos < proc_cgroup.size()) {
    std::size_t const eol = std::min(proc_cgroup.find('\n', pos), proc_cgroup.size());
    std::string_view const line = proc_cgroup.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.starts_with("0::")) {
      std::string_view path = line.substr(3);
      if (path.empty() || path.front() != '/') {
        return Error(Errc::cgroup_failed, "malformed 0:: line: " + std::string(line));
      }
      return std::string(path);
    }
  }
  return Error(Errc::cgroup_unavailable, "no 0:: line (process is not in a cgroup2 hierarchy)");
}

Result<std::string> own_cgroup(std::string const& proc_cgroup_path) {
  auto dir = open_dir_path("/");
  if (!dir) return std::move(dir).error();
  auto text = read_file_at(
      *dir, proc_cgroup_path.front() == '/' ? proc_cgroup_path.substr(1) : proc_cgroup_path);
  if (!text)
    return Error(Errc::cgroup_unavailable, "read " + proc_cgroup_path, text.error().sys_errno);
  return parse_own_cgroup(*text);
}

Result<CgroupDir> CgroupDir::open(std::string path) {
  int const fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error(Errc::cgroup_failed, "open " + path, errno);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return CgroupDir(UniqueFd(fd), std::move(path));
}

Result<CgroupDir> CgroupDir::create(CgroupDir const& parent, std::string const& name) {
  if (!valid_component(name))
    return Error(Errc::cgroup_failed, "invalid cgroup name '" + name + "'", EINVAL);
  if (::mkdirat(parent.fd().get(), name.c_str(), 0755) != 0) {
    return Error(Errc::cgroup_failed, "mkdir " + parent.path() + "/" + name, errno);
  }
  return open_child(parent, name);
}

Result<CgroupDir> CgroupDir::open_child(CgroupDir const& parent, std::string const& name) {
  if (!valid_component(name))
    return Error(Errc::cgroup_failed, "invalid cgroup name '" + name + "'", EINVAL);
  int const fd =
      ::openat(parent.fd().get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Error(Errc::cgroup_failed, "open " + parent.path() + "/" + name, errno);
  return CgroupDir(UniqueFd(fd), parent.path() + "/" + name);
}

Result<void> CgroupDir::kill() const {
  auto w = write_file_at(fd_, "cgroup.kill", "1");
  if (!w) {
    if (w.error().sys_errno == ENOENT)
      return Error(Errc::sys_unsupported, "no cgroup.kill in " + path_, ENOENT);
    return as_cgroup_error(std::move(w).error(), path_);
  }
  return ok();
}

Result<bool> CgroupDir::populated() const {
  auto text = read_shown_file_at(fd_, "cgroup.events");
  if (!text) return as_cgroup_error(std::move(text).error(), path_);
  std::vector<std::string_view> const w = split_ws(*text);
  for (std::size_t i = 0; i + 1 < w.size(); ++i) {
    if (w[i] == "populated") return w[i + 1] != "0";
  }
  return Error(Errc::cgroup_failed, path_ + ": cgroup.events has no populated key");
}

Result<void> CgroupDir::wait_empty(std::chrono::milliseconds timeout) const {
  auto const deadline = Clock::now() + timeout;
  // The kernel signals a change of cgroup.events as a modify event. The watch goes through
  // /proc/self/fd so it lands on the directory we hold, whatever its path is now.
  UniqueFd const ino(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  bool watching = false;
  if (ino.valid()) {
    std::string const events = "/proc/self/fd/" + std::to_string(fd_.get()) + "/cgroup.events";
    watching = ::inotify_add_watch(ino.get(), events.c_str(), IN_MODIFY) >= 0;
  }
  for (;;) {
    bool const busy = CUSTOS_TRY(populated());
    if (!busy) return ok();
    auto const now = Clock::now();
    if (now >= deadline) {
      return Error(Errc::cleanup_unconfirmed,
                   path_ + " still populated after " + std::to_string(timeout.count()) + " ms",
                   ETIMEDOUT);
    }
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                      std::chrono::milliseconds(1);
    if (watching) {
      // Capped at 100 ms so that a missed event costs at most one extra re-read.
      pollfd p{ino.get(), POLLIN, 0};
      int const wait_ms = static_cast<int>(std::min<std::int64_t>(left.count(), 100));
      if (::poll(&p, 1, wait_ms) > 0) {
        char buf[4096];
        while (::read(ino.get(), buf, sizeof buf) > 0) {
        }
      }
    } else {
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(10)));
    }
  }
}

Result<std::vector<std::int32_t>> CgroupDir::procs() const {
  // pid_max is at most 2^22, so 8 bytes per pid bounds the file.
  auto text = read_file_at(fd_, "cgroup.procs", std::size_t{8} << 22);
  if (!text) return as_cgroup_error(std::move(text).error(), path_);
  std::vector<std::int32_t> out;
  for (std::string_view const w : split_ws(*text)) {
    if (auto const v = parse_u64(w); v && *v > 0 && *v <= 0x7fffffff)
      out.push_back(static_cast<std::int32_t>(*v));
  }
  return out;
}

Result<std::vector<std::int32_t>> CgroupDir::tree_procs(std::size_t max_pids) const {
  std::vector<std::int32_t> out = CUSTOS_TRY(procs());
  // Breadth-first over child directories; each level is opened relative to its parent's fd.
  struct Level {
    CgroupDir dir;
    int depth;
  };
  std::vector<Level> queue;
  auto push_children = [&queue](CgroupDir const& parent, int depth) {
    UniqueFd listing(::openat(parent.fd().get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!listing.valid()) return;
    std::unique_ptr<DIR, int (*)(DIR*)> const d(::fdopendir(listing.get()), &::closedir);
    if (!d) return;
    (void)listing.release();  // now owned by the DIR stream
    while (dirent const* e = ::readdir(d.get())) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      if (auto child = CgroupDir::open_child(parent, e->d_name))
        queue.push_back(Level{std::move(*child), depth + 1});
    }
  };
  push_children(*this, 0);
  for (std::size_t i = 0; i < queue.size() && out.size() < max_pids; ++i) {
    if (auto p = queue[i].dir.procs()) out.insert(out.end(), p->begin(), p->end());
    if (queue[i].depth < 16) push_children(queue[i].dir, queue[i].depth);
    queue[i].dir = CgroupDir();  // keep at most the unvisited levels' fds open
  }
  if (out.size() > max_pids) out.resize(max_pids);
  return out;
}

Result<void> CgroupDir::attach(pid_t pid) const {
  auto w = write_file_at(fd_, "cgroup.procs", std::to_string(pid));
  if (!w) return as_cgroup_error(std::move(w).error(), path_);
  return ok();
}

Result<void> CgroupDir::remove() const {
  // rmdir goes by path: make sure the path still names the directory we hold (a cgroup can be
  // renamed within its parent), so we never remove a different cgroup.
  struct stat held {};
  struct stat named {};
  if (::fstat(fd_.get(), &held) != 0) return Error(Errc::cgroup_failed, "fstat " + path_, errno);
  if (::stat(path_.c_str(), &named) != 0) {
    if (errno == ENOENT) return ok();
    return Error(Errc::cgroup_failed, "stat " + path_, errno);
  }
  if (named.st_dev != held.st_dev || named.st_ino != held.st_ino) {
    return Error(Errc::cgroup_failed, path_ + " now names another directory; not removed", ESTALE);
  }
  auto const deadline = Clock::now() + std::chrono::seconds(1);
  for (;;) {
    if (::rmdir(path_.c_str()) == 0 || errno == ENOENT) return ok();
    int const err = errno;
    if (err != EBUSY || Clock::now() >= deadline)
      return Error(Errc::cgroup_failed, "rmdir " + path_, err);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<std::set<std::string>> CgroupDir::controllers() const {
  return read_word_set(*this, "cgroup.controllers");
}

Result<std::set<std::string>> CgroupDir::subtree_control() const {
  return read_word_set(*this, "cgroup.subtree_control");
}

Result<void> CgroupDir::enable_controllers(std::set<std::string> const& wanted) const {
  if (wanted.empty()) return ok();
  std::set<std::string> const have = CUSTOS_TRY(controllers());
  std::string line;
  for (std::string const& c : wanted) {
    if (!have.contains(c)) {
      return Error(Errc::sys_unsupported, "controller '" + c + "' is not available in " + path_);
    }
    if (!line.empty()) line.push_back(' ');
    line += "+" + c;
  }
  auto w = write_file_at(fd_, "cgroup.subtree_control", line);
  if (!w) return as_cgroup_error(std::move(w).error(), path_);
  return ok();
}

Result<void> CgroupDir::set_memory_max(std::uint64_t bytes) const {
  return write_limit(*this, "memory", "memory.max", std::to_string(bytes));
}

Result<void> CgroupDir::set_pids_max(std::uint64_t count) const {
  return write_limit(*this, "pids", "pids.max", std::to_string(count));
}

Result<void> CgroupDir::set_cpu_max(std::uint64_t quota_usec, std::uint64_t period_usec) const {
  return write_limit(*this, "cpu", "cpu.max",
                     std::to_string(quota_usec) + " " + std::to_string(period_usec));
}

Result<CgroupStats> CgroupDir::stats() const {
  CgroupStats s;
  s.populated = CUSTOS_TRY(populated());
  if (auto text = read_file_at(fd_, "cpu.stat")) {
    std::vector<std::string_view> const w = split_ws(*text);
    for (std::size_t i = 0; i + 1 < w.size(); i += 2) {
      if (w[i] == "usage_usec") s.cpu_usage_usec = parse_u64(w[i + 1]);
    }
  }
  s.memory_current = read_optional_u64(*this, "memory.current");
  s.memory_peak = read_optional_u64(*this, "memory.peak");
  s.memory_max = read_optional_u64(*this, "memory.max");
  s.pids_current = read_optional_u64(*this, "pids.current");
  s.pids_max = read_optional_u64(*this, "pids.max");
  return s;
}

Result<CgroupDir> ensure_subtree(CgroupDir const& parent, std::string const& name,
                                 std::set<std::string> const& wanted) {
  auto made = CgroupDir::create(parent, name);
  CgroupDir dir;
  if (made) {
    dir = std::move(*made);
  } else if (made.error().sys_errno == EEXIST) {
    dir = CUSTOS_TRY(CgroupDir::open_child(parent, name));
  } else {
    return std::move(made).error();
  }
  if (!wanted.empty()) {
    if (auto have = dir.controllers()) {
      for (std::string const& c : wanted) {
        // One at a time, so that one refused controller does not keep the others out.
        if (have->contains(c)) (void)dir.enable_controllers({c});
      }
    }
  }
  return dir;
}

Result<ExecutionRoot> prepare_execution_root(std::string const& daemon_cgroup_dir,
                                             std::set<std::string> const& wanted,
                                             std::string const& leaf, std::string const& subtree) {
  auto opened = CgroupDir::open(daemon_cgroup_dir);
  if (!opened) {
    if (opened.error().sys_errno == ENOENT) {
      return Error(Errc::cgroup_unavailable,
                   "daemon cgroup " + daemon_cgroup_dir + " does not exist", ENOENT);
    }
    return std::move(opened).error();
  }
  CgroupDir const own = std::move(*opened);
  ExecutionRoot out;
  std::set<std::string> const available = CUSTOS_TRY(own.controllers());
  std::set<std::string> want;
  for (std::string const& c : wanted) {
    if (available.contains(c)) want.insert(c);
  }
  // The v2 root is exempt from the no-internal-processes rule; it is the only cgroup without a
  // cgroup.type file.
  bool const is_root = ::faccessat(own.fd().get(), "cgroup.type", F_OK, 0) != 0;
  std::set<std::string> enabled = CUSTOS_TRY(own.subtree_control());
  bool const missing = std::any_of(want.begin(), want.end(),
                                   [&](std::string const& c) { return !enabled.contains(c); });
  if (missing) {
    if (!is_root) {
      auto procs = own.procs();
      bool const has_self =
          procs && std::find(procs->begin(), procs->end(), static_cast<std::int32_t>(::getpid())) !=
                       procs->end();
      if (has_self) {
        CgroupDir const leaf_dir = CUSTOS_TRY(ensure_subtree(own, leaf));
        CUSTOS_TRYV(leaf_dir.attach(::getpid()));
        out.moved_self = true;
      }
    }
    for (std::string const& c : want) {
      if (!enabled.contains(c) && own.enable_controllers({c})) enabled.insert(c);
    }
  }
  std::set<std::string> usable;
  for (std::string const& c : want) {
    if (enabled.contains(c)) usable.insert(c);
  }
  out.dir = CUSTOS_TRY(ensure_subtree(own, subtree, usable));
  // What each execution cgroup will see is what the subtree enables for its children.
  out.controllers = CUSTOS_TRY(out.dir.subtree_control());
  return out;
}

}  // namespace custos::sys
