// The marker boundary's scan (procfs.hpp, docs/boundaries.md): the marker value, reading a
// process's environ, one pass over /proc for many markers at once, and the start-time cache that
// spares re-reading what did not change between passes.
#include "marker_scan.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <span>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "custos/sys/procfs.hpp"

namespace custos::sys {
namespace {

using detail::EnvironState;
using detail::expected_ns;
using detail::marker_needle;
using detail::scan_pass;
using detail::ScanParams;
using detail::ScanTarget;

bool parse_pid(char const* name, std::int32_t& out) {
  if (name[0] == '\0') return false;
  std::int64_t v = 0;
  for (char const* p = name; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') return false;
    v = v * 10 + (*p - '0');
    if (v > 0x7fffffff) return false;
  }
  if (v <= 0) return false;
  out = static_cast<std::int32_t>(v);
  return true;
}

bool errno_means_gone(int err) {
  return err == ENOENT || err == ESRCH;
}

// Streams <proc_root>/<pid>/environ looking for whole entries "\0CUSTOS_MARKER=<hex>\0" (one
// per needle) without holding more than one chunk plus a needle in memory. `found[i]` is set
// for each needle seen. The result is `gone`/`unreadable` when the file could not be read to
// its end (needles already found stay found), `marked` when every needle was found, else
// `unmarked`.
EnvironState read_environ_multi(std::string const& proc_root, std::int32_t pid,
                                std::span<std::string const* const> needles, std::size_t max_bytes,
                                std::vector<char>& found) {
  found.assign(needles.size(), 0);
  std::string const path = proc_root + "/" + std::to_string(pid) + "/environ";
  int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno_means_gone(errno) ? EnvironState::gone : EnvironState::unreadable;
  UniqueFd const guard(fd);
  std::size_t longest = 1;
  for (std::string const* n : needles) longest = std::max(longest, n->size());
  std::size_t missing = needles.size();
  auto look = [&](std::string const& window) {
    for (std::size_t i = 0; i < needles.size(); ++i) {
      if (found[i] == 0 && window.find(*needles[i]) != std::string::npos) {
        found[i] = 1;
        --missing;
      }
    }
  };
  // `window` always starts with the byte before the unconsumed data (a NUL at the very start),
  // so a match at the beginning of the block and in the middle look the same.
  std::string window(1, '\0');
  char buf[16 * 1024];
  std::size_t total = 0;
  for (;;) {
    ssize_t const n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_means_gone(errno) ? EnvironState::gone : EnvironState::unreadable;
    }
    if (n == 0) break;
    total += static_cast<std::size_t>(n);
    window.append(buf, static_cast<std::size_t>(n));
    look(window);
    if (missing == 0) return EnvironState::marked;
    // Past the bound a marker could still follow: what was not found is unknown.
    if (total > max_bytes) return EnvironState::unreadable;
    // Keep just enough tail for a needle that straddles two reads.
    if (window.size() > longest) window.erase(0, window.size() - (longest - 1));
  }
  // The last entry may lack its terminating NUL (a process can rewrite its own environ area).
  window.push_back('\0');
  look(window);
  return missing == 0 ? EnvironState::marked : EnvironState::unmarked;
}

// ns/pid inode of one process: nullopt + state when it could not be determined.
struct NsProbe {
  std::optional<std::uint64_t> inode;
  EnvironState state = EnvironState::unmarked;  // gone / unreadable when inode is empty
};

NsProbe process_pid_ns(std::string const& proc_root, std::int32_t pid) {
  std::string const path = proc_root + "/" + std::to_string(pid) + "/ns/pid";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return NsProbe{std::nullopt,
                   errno_means_gone(errno) ? EnvironState::gone : EnvironState::unreadable};
  }
  return NsProbe{static_cast<std::uint64_t>(st.st_ino), EnvironState::unmarked};
}

// Field 22 (starttime, clock ticks after boot) of <proc_root>/<pid>/stat, which stays
// world-readable when environ is not. nullopt when it cannot be read or parsed.
std::optional<std::uint64_t> start_ticks(std::string const& proc_root, std::int32_t pid) {
  std::string const path = proc_root + "/" + std::to_string(pid) + "/stat";
  int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  UniqueFd const guard(fd);
  char buf[1024];
  ssize_t const n = ::read(fd, buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  std::string_view const text(buf, static_cast<std::size_t>(n));
  // The command name may hold spaces and ')': fields restart after the last ')', at field 3.
  std::size_t const close = text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::size_t i = close + 1;
  int field = 2;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    std::size_t const b = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\n') ++i;
    if (i == b) break;
    if (++field == 22) {
      std::uint64_t v = 0;
      for (std::size_t k = b; k < i; ++k) {
        if (text[k] < '0' || text[k] > '9') return std::nullopt;
        v = v * 10 + static_cast<std::uint64_t>(text[k] - '0');
      }
      return v;
    }
  }
  return std::nullopt;
}

constexpr long kProcSuperMagic = 0x9fa0;

// Whether readdir of /proc can be trusted to report the inode of the *live* process behind a
// pid. readdir looks pid dentries up without revalidating them, so it reports whatever dentry
// is hashed. Since Linux 6.15 release_task() flushes a dead process's /proc dentries before it
// frees its pid number (free_pids() after proc_flush_pid()), so by the time the number can name
// a successor the old dentry is gone and readdir instantiates a fresh inode. Before 6.15 the
// number was freed first, leaving a short window in which readdir could report the dead
// process's inode for its successor: there every inode number is taken with fstatat(), whose
// lookup revalidates the dentry (0.8 us per process here).
bool readdir_inode_is_live() {
  static bool const live = [] {
    struct utsname u {};
    if (::uname(&u) != 0) return false;
    unsigned major = 0;
    unsigned minor = 0;
    char const* p = u.release;
    while (*p >= '0' && *p <= '9') major = major * 10 + static_cast<unsigned>(*p++ - '0');
    if (*p++ != '.') return false;
    while (*p >= '0' && *p <= '9') minor = minor * 10 + static_cast<unsigned>(*p++ - '0');
    return major > 6 || (major == 6 && minor >= 15);
  }();
  return live;
}

// The entries of a /proc directory for one pass, either from a descriptor held across passes
// (rewound to offset 0 and read with getdents64 into a buffer that is kept too) or from a
// directory opened for this pass alone.
class ProcListing {
 public:
  struct Entry {
    std::uint64_t d_ino;
    char const* d_name;
  };

  ProcListing(int held_fd, std::vector<char>& buffer) : fd_(held_fd), buf_(&buffer) {
    if (buf_->size() < kBufferBytes) buf_->resize(kBufferBytes);
    if (::lseek(fd_, 0, SEEK_SET) != 0) err_ = errno != 0 ? errno : EIO;
  }
  explicit ProcListing(std::string const& path)
      : own_(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)),
        fd_(own_.get()),
        buf_(&local_) {
    if (!own_.valid()) {
      err_ = errno;
    } else {
      local_.resize(kBufferBytes);
    }
  }

  [[nodiscard]] bool ok() const noexcept { return err_ == 0; }
  [[nodiscard]] int error() const noexcept { return err_; }
  [[nodiscard]] int fd() const noexcept { return fd_; }

  // The next entry, or nullptr at the end of the directory or on an error (error() tells).
  Entry const* next() {
    for (;;) {
      if (pos_ < len_) {
        // struct linux_dirent64: u64 d_ino, s64 d_off, u16 d_reclen, u8 d_type, char d_name[].
        char const* rec = buf_->data() + pos_;
        std::uint16_t reclen = 0;
        std::memcpy(&reclen, rec + 16, sizeof reclen);
        if (reclen == 0) {
          err_ = EIO;
          return nullptr;
        }
        std::memcpy(&cur_.d_ino, rec, sizeof cur_.d_ino);
        cur_.d_name = rec + 19;
        pos_ += reclen;
        return &cur_;
      }
      if (err_ != 0 || done_) return nullptr;
      long const n = ::syscall(SYS_getdents64, fd_, buf_->data(), buf_->size());
      if (n < 0) {
        if (errno == EINTR) continue;
        err_ = errno;
        return nullptr;
      }
      if (n == 0) {
        done_ = true;
        return nullptr;
      }
      pos_ = 0;
      len_ = static_cast<std::size_t>(n);
    }
  }

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{32} * 1024;
  UniqueFd own_;
  int fd_ = -1;
  std::vector<char> local_;
  std::vector<char>* buf_;
  std::size_t pos_ = 0;
  std::size_t len_ = 0;
  bool done_ = false;
  int err_ = 0;
  Entry cur_{};
};

char hex_digit(unsigned v) {
  return "0123456789abcdef"[v & 0xfu];
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// When a process started, and its cache entry when the cache is used: from the cache while the
// pid still names the process it recorded (the same /proc/<pid> inode), else from its stat file.
struct Dated {
  ProcStartCache::Entry* cached = nullptr;
  std::optional<std::uint64_t> started;
};

Dated date_process(ProcStartCache* cache, int proc_fd, ProcListing::Entry const& e,
                   std::int32_t pid, std::string const& proc_root, bool trust_readdir) {
  Dated d;
  if (cache == nullptr) {
    d.started = start_ticks(proc_root, pid);
    return d;
  }
  std::uint64_t dir_inode = 0;
  // 0 or 1 from readdir: procfs could not instantiate the entry (the process is going).
  if (trust_readdir && e.d_ino > 1) {
    dir_inode = static_cast<std::uint64_t>(e.d_ino);
  } else {
    // fstatat revalidates /proc/<pid>: the inode number is that of the live process.
    struct stat st {};
    if (::fstatat(proc_fd, e.d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      dir_inode = static_cast<std::uint64_t>(st.st_ino);
    }
  }
  if (dir_inode > 1) d.cached = cache->find(pid, dir_inode);
  if (d.cached != nullptr) {
    cache->count_hit();
    d.started = d.cached->start_ticks;
    return d;
  }
  d.started = start_ticks(proc_root, pid);
  cache->count_stat_read();
  // A process that vanished between the two reads leaves a harmless stale entry: its pid comes
  // back, if ever, under another inode number.
  if (d.started && dir_inode > 1) d.cached = &cache->store(pid, dir_inode, *d.started);
  return d;
}

// The pid namespace of a process: from its cache entry when it was read before (a process never
// changes its own pid namespace), else from /proc, remembered in the entry.
NsProbe pid_ns_of(ProcStartCache::Entry* cached, std::string const& proc_root, std::int32_t pid) {
  if (cached != nullptr && cached->ns_inode)
    return NsProbe{cached->ns_inode, EnvironState::unmarked};
  NsProbe probe = process_pid_ns(proc_root, pid);
  if (probe.inode && cached != nullptr) cached->ns_inode = probe.inode;
  return probe;
}

}  // namespace

namespace detail {

EnvironState read_environ_state(std::string const& proc_root, std::int32_t pid,
                                std::string const& needle, std::size_t max_bytes) {
  std::string const* const one[] = {&needle};
  std::vector<char> found;
  EnvironState const st = read_environ_multi(proc_root, pid, one, max_bytes, found);
  if (st == EnvironState::gone || st == EnvironState::unreadable) return st;
  return found[0] != 0 ? EnvironState::marked : EnvironState::unmarked;
}

std::string marker_needle(Marker const& marker) {
  std::string n(1, '\0');
  n += marker.env_entry();
  n.push_back('\0');
  return n;
}

// Signalling by pid is only meaningful when the pids listed under proc_root are pids of our own
// namespace: the real /proc, or another procfs mount of the same namespace. A fake tree (tests)
// or a container's procfs is scanned but never signalled through.
bool proc_root_is_ours(std::string const& proc_root) {
  if (proc_root == "/proc") return true;
  struct stat theirs {};
  struct stat mine {};
  std::string const path = proc_root + "/self/ns/pid";
  if (::stat(path.c_str(), &theirs) != 0 || ::stat("/proc/self/ns/pid", &mine) != 0) return false;
  return theirs.st_dev == mine.st_dev && theirs.st_ino == mine.st_ino;
}

Result<std::uint64_t> expected_ns(std::optional<std::uint64_t> given,
                                  std::string const& proc_root) {
  if (given) return *given;
  return pid_namespace_inode("self", proc_root);
}

namespace {

// The buffers of one pass, kept across its processes.
struct Scratch {
  std::vector<std::size_t> candidates;
  std::vector<std::string const*> needles;
  std::vector<char> found;
};

// Reads the environ of `pid` once for all the candidate targets and records, for each, a match
// or an unreadable process.
void read_candidates(std::vector<ScanTarget> const& targets, ScanParams const& sp, std::int32_t pid,
                     Scratch& x, std::vector<MarkerScanResult>& out) {
  auto const& candidates = x.candidates;
  auto& needles = x.needles;
  auto& found = x.found;
  needles.clear();
  for (std::size_t const t : candidates) needles.push_back(&targets[t].needle);
  EnvironState const st =
      read_environ_multi(sp.proc_root, pid, needles, sp.max_environ_bytes, found);
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    MarkerScanResult& r = out[candidates[k]];
    if (found[k] != 0) {
      r.matched.push_back(pid);
    } else if (st == EnvironState::unreadable) {
      r.unreadable.push_back(pid);
    }
  }
}

}  // namespace

// One pass over <proc_root> for the targets listed in `active` (indexes into `targets`);
// out[i] is filled for each active i. Every process is dated once (cache or stat), its
// namespace checked once, and its environ read once for all the targets it may belong to.
Result<void> scan_pass(std::vector<ScanTarget> const& targets,
                       std::vector<std::size_t> const& active, ScanParams const& sp,
                       std::vector<MarkerScanResult>& out) {
  std::string const& proc_root = sp.proc_root;
  // The cache's held procfs directory when there is one (see ProcStartCache::proc_dir),
  // otherwise a directory opened for this pass.
  int const held = sp.cache != nullptr ? sp.cache->proc_dir(proc_root) : -1;
  std::optional<ProcListing> listing;
  if (held >= 0) {
    listing.emplace(held, sp.cache->listing_buffer());
  } else {
    listing.emplace(proc_root);
  }
  if (!listing->ok()) return Error(Errc::procfs_failed, "open " + proc_root, listing->error());
  for (std::size_t const t : active) out[t] = MarkerScanResult{};
  bool any_bound = false;
  for (std::size_t const t : active) any_bound = any_bound || targets[t].not_before_ticks;
  // Only a real procfs gives recycled pids fresh inode numbers (see ProcStartCache); a held
  // directory was checked to be one when it was opened.
  ProcStartCache* cache = nullptr;
  if (sp.cache != nullptr && any_bound) {
    struct statfs fs {};
    if (held >= 0 || (::fstatfs(listing->fd(), &fs) == 0 && fs.f_type == kProcSuperMagic))
      cache = sp.cache;
  }
  auto const now = std::chrono::steady_clock::now();
  if (cache != nullptr) cache->begin_pass(now);
  bool const trust_readdir = readdir_inode_is_live();
  std::int32_t const self = static_cast<std::int32_t>(::getpid());
  Scratch scratch;
  std::vector<std::size_t>& candidates = scratch.candidates;
  for (;;) {
    ProcListing::Entry const* e = listing->next();
    if (e == nullptr) {
      if (int const err = listing->error(); err != 0)
        return Error(Errc::procfs_failed, "readdir " + proc_root, err);
      break;
    }
    std::int32_t pid = 0;
    if (!parse_pid(e->d_name, pid)) continue;
    for (std::size_t const t : active) ++out[t].scanned;
    if (pid == self) continue;

    ProcStartCache::Entry* cached = nullptr;
    std::optional<std::uint64_t> started;
    if (any_bound) {
      Dated const d = date_process(cache, listing->fd(), *e, pid, proc_root, trust_readdir);
      cached = d.cached;
      started = d.started;
    }
    // Started before an execution's first process: cannot be one of its descendants. An
    // unreadable stat is no proof of age, so such a process is inspected for every target.
    candidates.clear();
    for (std::size_t const t : active) {
      auto const& nb = targets[t].not_before_ticks;
      if (nb && started && *started < *nb) {
        ++out[t].older;
      } else {
        candidates.push_back(t);
      }
    }
    if (candidates.empty()) continue;

    NsProbe const probe = pid_ns_of(cached, proc_root, pid);
    if (!probe.inode) {
      if (probe.state == EnvironState::unreadable) {
        for (std::size_t const t : candidates) out[t].unreadable.push_back(pid);
      }
      continue;
    }
    if (*probe.inode != sp.ns_inode) continue;  // another pid namespace: never ours to touch

    read_candidates(targets, sp, pid, scratch, out);
  }
  if (cache != nullptr) cache->end_pass(now);
  return ok();
}

}  // namespace detail

Result<Marker> Marker::generate() {
  Marker m;
  std::size_t got = 0;
  while (got < m.bits.size()) {
    ssize_t const n = ::getrandom(m.bits.data() + got, m.bits.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(Errc::sys_error, "getrandom", errno);
    }
    got += static_cast<std::size_t>(n);
  }
  return m;
}

Result<Marker> Marker::from_hex(std::string_view hex) {
  Marker m;
  if (hex.size() != m.bits.size() * 2)
    return Error(Errc::procfs_failed, "marker: expected 32 hex digits");
  for (std::size_t i = 0; i < m.bits.size(); ++i) {
    int const hi = hex_value(hex[2 * i]);
    int const lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Error(Errc::procfs_failed, "marker: not lowercase hex");
    m.bits[i] = static_cast<std::uint8_t>((hi << 4) | lo);
  }
  return m;
}

std::string Marker::env_value() const {
  std::string out;
  out.reserve(bits.size() * 2);
  for (std::uint8_t const b : bits) {
    out.push_back(hex_digit(b >> 4u));
    out.push_back(hex_digit(b));
  }
  return out;
}

std::string Marker::env_entry() const {
  std::string out(env_name());
  out.push_back('=');
  out += env_value();
  return out;
}

bool environ_has_marker(std::string_view environ, Marker const& marker) {
  std::string block(1, '\0');
  block.append(environ);
  block.push_back('\0');
  return block.find(marker_needle(marker)) != std::string::npos;
}

Result<MarkerScanResult> marker_scan(Marker const& marker, MarkerScanOptions const& options) {
  std::uint64_t const ns = CUSTOS_TRY(expected_ns(options.pid_ns_inode, options.proc_root));
  std::vector<ScanTarget> const targets{
      ScanTarget{marker_needle(marker), options.not_before_ticks}};
  std::vector<MarkerScanResult> out(1);
  CUSTOS_TRYV(scan_pass(targets, {0},
                        ScanParams{ns, options.proc_root, options.max_environ_bytes, options.cache},
                        out));
  return std::move(out[0]);
}

// ---- ProcStartCache ------------------------------------------------------------------------

void ProcStartCache::begin_pass(std::chrono::steady_clock::time_point now) {
  // Too long since the last pass: inode numbers may have wrapped meanwhile (see the header).
  if (last_pass_ && now - *last_pass_ > max_idle_) entries_.clear();
  ++pass_;
}

ProcStartCache::Entry* ProcStartCache::find(std::int32_t pid, std::uint64_t dir_inode) {
  auto it = entries_.find(pid);
  if (it == entries_.end()) return nullptr;
  if (it->second.dir_inode != dir_inode) {
    entries_.erase(it);  // the pid now names another process
    return nullptr;
  }
  it->second.seen_pass = pass_;
  return &it->second;
}

ProcStartCache::Entry& ProcStartCache::store(std::int32_t pid, std::uint64_t dir_inode,
                                             std::uint64_t start_ticks) {
  Entry& e = entries_[pid];
  e = Entry{dir_inode, start_ticks, std::nullopt, pass_};
  return e;
}

int ProcStartCache::proc_dir(std::string const& proc_root) {
  if (proc_dir_.valid() && proc_dir_root_ == proc_root) return proc_dir_.get();
  proc_dir_.reset(::open(proc_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  proc_dir_root_ = proc_root;
  struct statfs fs {};
  if (proc_dir_.valid() && (::fstatfs(proc_dir_.get(), &fs) != 0 || fs.f_type != kProcSuperMagic)) {
    proc_dir_.reset();
  }
  return proc_dir_.valid() ? proc_dir_.get() : -1;
}

void ProcStartCache::drop_proc_dir() noexcept {
  proc_dir_.reset();
  proc_dir_root_.clear();
}

void ProcStartCache::end_pass(std::chrono::steady_clock::time_point now) {
  std::erase_if(entries_, [&](auto const& kv) { return kv.second.seen_pass != pass_; });
  last_pass_ = now;
}

}  // namespace custos::sys
