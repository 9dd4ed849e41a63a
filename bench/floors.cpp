// The kernel floors: the cheapest way to do each thing at all, measured with raw syscalls and no
// custos code, so a product row's ratio shows what custos itself costs.
//
// Every process started here is created in this run's cgroup (custos-bench-<pid>) or is this
// process's own child, and is reaped before the floor returns; every cgroup is removed.
#include <sqlite3.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <string>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "bench.hpp"

namespace custos::bench {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint64_t kGiB = 1ULL << 30;
constexpr std::size_t kChunk = 64 * 1024;

// Owns one fd (the bench does not link custos_sys: floors must not depend on the code they judge).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(Fd const&) = delete;
  Fd& operator=(Fd const&) = delete;
  ~Fd() { reset(); }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// rmdir with a short retry: a cgroup whose last process was just reaped can report EBUSY for a
// moment while the kernel finishes the exit.
bool remove_cgroup(std::string const& path) {
  for (int i = 0; i < 1000; ++i) {
    if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY) return false;
    ::usleep(1000);
  }
  return false;
}

// clone3 with CLONE_PIDFD|CLONE_INTO_CGROUP (+ CLONE_VFORK when `vfork`). Returns the pid (0 in
// the child) and stores the pidfd; -1 with errno on failure.
long raw_clone3(int cgroup_fd, int* pidfd, bool vfork) {
  clone_args args{};
  args.flags = CLONE_PIDFD | CLONE_INTO_CGROUP | (vfork ? CLONE_VFORK : 0);
  args.pidfd = reinterpret_cast<std::uintptr_t>(pidfd);
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<std::uint64_t>(cgroup_fd);
  return ::syscall(SYS_clone3, &args, sizeof args);
}

// waitid(P_PIDFD): P_PIDFD is idtype 3 (Linux 5.4); spelled numerically for older libc headers.
bool wait_pidfd(int pidfd) {
  siginfo_t info{};
  for (;;) {
    if (::waitid(static_cast<idtype_t>(3), static_cast<id_t>(pidfd), &info, WEXITED) == 0)
      return true;
    if (errno != EINTR) return false;
  }
}

// One launch of the floor: fresh cgroup, clone3 of the static no-op into it, wait through the
// pidfd, remove the cgroup. Returns false (with nothing left behind) if any step failed.
bool launch_once(Env const& env, std::string const& leaf) {
  std::string const dir = env.cgroup_root + "/" + leaf;
  if (::mkdir(dir.c_str(), 0755) != 0) return false;
  Fd cg{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!cg.valid()) {
    remove_cgroup(dir);
    return false;
  }
  // Prepared before the clone: the child may only call execve and exit.
  char const* argv[] = {env.noop_path.c_str(), nullptr};
  char const* envp[] = {nullptr};
  int pidfd = -1;
  long const pid = raw_clone3(cg.get(), &pidfd, /*vfork=*/true);
  if (pid == 0) {
    ::syscall(SYS_execve, argv[0], argv, envp);
    ::syscall(SYS_exit_group, 127);
  }
  cg.reset();
  if (pid < 0) {
    remove_cgroup(dir);
    return false;
  }
  Fd pfd{pidfd};
  bool const waited = wait_pidfd(pfd.get());
  return remove_cgroup(dir) && waited;
}

// ---- (a) launch ----------------------------------------------------------------------------

void floor_launch(Env const& env, Floors& f) {
  if (env.cgroup_root.empty()) return;
  std::size_t const n = env.quick ? 60 : 400;
  std::vector<double> ms;
  std::size_t i = 0;
  bool failed = false;
  bounded_loop(n, milliseconds(env.quick ? 5000 : 20000), [&] {
    auto const t0 = Clock::now();
    if (!launch_once(env, "s" + std::to_string(i++))) {
      failed = true;
      return false;
    }
    ms.push_back(seconds_since(t0) * 1000.0);
    return true;
  });
  if (!failed && !ms.empty()) f.launch_seq_ms = median(ms);

  // 16 concurrent launchers, each on its own thread, for a fixed number of launches each.
  constexpr int kLaunchers = 16;
  std::size_t const per = env.quick ? 20 : 120;
  std::atomic<std::size_t> done{0};
  std::atomic<bool> bad{false};
  auto const t0 = Clock::now();
  auto const stop_at = t0 + milliseconds(env.quick ? 10000 : 30000);
  std::vector<std::thread> threads;
  threads.reserve(kLaunchers);
  for (int t = 0; t < kLaunchers; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t k = 0; k < per && Clock::now() < stop_at; ++k) {
        if (!launch_once(env, "c" + std::to_string(t) + "-" + std::to_string(k))) {
          bad = true;
          return;
        }
        ++done;
      }
    });
  }
  for (auto& th : threads) th.join();
  double const secs = seconds_since(t0);
  if (!bad && done > 0 && secs > 0)
    f.launch_concurrent_per_s = static_cast<double>(done.load()) / secs;
}

// ---- (b) pipe -> file, (c) pty -> file -----------------------------------------------------

// Writes `total` bytes to `fd` in 64 KiB chunks, in a forked child; returns its pid.
pid_t fork_writer(int fd, std::uint64_t total, int close_in_child) {
  pid_t const pid = ::fork();
  if (pid != 0) return pid;
  if (close_in_child >= 0) ::close(close_in_child);
  static char buf[kChunk];
  std::memset(buf, 'x', sizeof buf);
  std::uint64_t left = total;
  while (left > 0) {
    std::size_t const want = left < sizeof buf ? static_cast<std::size_t>(left) : sizeof buf;
    ssize_t const w = ::write(fd, buf, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::_exit(1);
    }
    left -= static_cast<std::uint64_t>(w);
  }
  ::_exit(0);
}

// Reads from `in` into a new file in the work dir until EOF/EIO or `total` bytes; returns
// GiB/s or nothing if fewer bytes arrived than were sent.
//
// Every run writes a file of its own and KEEPS it until the floor is done (remove_drain_files),
// exactly as the supervisor keeps every execution's spool: on these VMs a write into page-cache
// pages the guest has never touched runs at 0.3-0.5 GB/s, into pages just freed by unlinking the
// previous run's file at 1.7 GB/s (dd, same disk). A floor that recycled its pages while the
// product cannot would measure the hypervisor, not the pipe.
std::optional<double> drain_to_file(Env const& env, int in, std::uint64_t total, pid_t writer,
                                    Clock::time_point t0) {
  static int run = 0;
  std::string const path = env.work_dir + "/drain-" + std::to_string(run++) + ".out";
  Fd out{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
  std::vector<char> buf(kChunk);
  std::uint64_t got = 0;
  bool ok = out.valid();
  while (ok && got < total) {
    ssize_t const r = ::read(in, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // EOF on a pipe, EIO on a PTY master once the slave is gone
    got += static_cast<std::uint64_t>(r);
    for (ssize_t off = 0; off < r;) {
      ssize_t const w = ::write(out.get(), buf.data() + off, static_cast<std::size_t>(r - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ok = false;
        break;
      }
      off += w;
    }
  }
  double const secs = seconds_since(t0);
  int status = 0;
  ::waitpid(writer, &status, 0);
  if (!ok || got != total || secs <= 0) return std::nullopt;
  return static_cast<double>(got) / static_cast<double>(kGiB) / secs;
}

std::optional<double> pipe_once(Env const& env, std::uint64_t total) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return std::nullopt;
  Fd rd{p[0]};
  Fd wr{p[1]};
  auto const t0 = Clock::now();
  pid_t const writer = fork_writer(wr.get(), total, rd.get());
  if (writer < 0) return std::nullopt;
  wr.reset();
  return drain_to_file(env, rd.get(), total, writer, t0);
}

std::optional<double> pty_once(Env const& env, std::uint64_t total) {
  Fd master{::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)};
  if (!master.valid() || ::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0)
    return std::nullopt;
  char name[128];
  if (::ptsname_r(master.get(), name, sizeof name) != 0) return std::nullopt;
  Fd slave{::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)};
  if (!slave.valid()) return std::nullopt;
  termios tio{};
  if (::tcgetattr(slave.get(), &tio) != 0) return std::nullopt;
  ::cfmakeraw(&tio);  // byte-transparent: no newline translation, no echo, no signals
  if (::tcsetattr(slave.get(), TCSANOW, &tio) != 0) return std::nullopt;
  auto const t0 = Clock::now();
  pid_t const writer = fork_writer(slave.get(), total, master.get());
  if (writer < 0) return std::nullopt;
  slave.reset();
  return drain_to_file(env, master.get(), total, writer, t0);
}

void remove_drain_files(Env const& env) {
  std::error_code ec;
  for (auto const& e : std::filesystem::directory_iterator(env.work_dir, ec)) {
    auto const name = e.path().filename().string();
    if (name.starts_with("drain-") && name.ends_with(".out")) std::filesystem::remove(e.path(), ec);
  }
}

template <class F>
std::optional<double> best_median(Env const& env, int runs, F&& once) {
  std::vector<double> v;
  for (int i = 0; i < runs; ++i) {
    settle_page_cache(env);  // each run starts with no dirty pages, as each product run does
    auto const r = once();
    if (!r.has_value()) return std::nullopt;
    v.push_back(*r);
  }
  return median(v);
}

// ---- (d) SQLite ----------------------------------------------------------------------------

std::optional<double> sqlite_commit_us(Env const& env) {
  std::string const path = env.work_dir + "/floor.sqlite";
  sqlite3* db = nullptr;
  std::optional<double> result;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) == SQLITE_OK &&
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                   "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);",
                   nullptr, nullptr, nullptr) == SQLITE_OK) {
    sqlite3_stmt* ins = nullptr;
    if (sqlite3_prepare_v2(db, "INSERT INTO t(v) VALUES(?1)", -1, &ins, nullptr) == SQLITE_OK) {
      std::vector<char> blob(256, 'r');  // about one execution record's worth of columns
      std::vector<double> us;
      bool ok = true;
      int const n = env.quick ? 100 : 600;
      for (int i = 0; i < n && ok; ++i) {
        auto const t0 = Clock::now();
        // One autocommit INSERT is one WAL transaction with an fsync of the WAL at commit.
        ok = sqlite3_bind_blob(ins, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_STATIC) ==
                 SQLITE_OK &&
             sqlite3_step(ins) == SQLITE_DONE && sqlite3_reset(ins) == SQLITE_OK;
        us.push_back(seconds_since(t0) * 1e6);
      }
      if (ok) result = median(us);
      sqlite3_finalize(ins);
    }
  }
  sqlite3_close(db);
  for (char const* suffix : {"", "-wal", "-shm"}) ::unlink((path + suffix).c_str());
  return result;
}

// ---- (e) cgroup.kill of a 1,000-process tree ---------------------------------------------

constexpr int kTreeSize = 1000;

// Runs in the tree's root child (a fork-style clone3 copy of this process). Only syscalls are
// used after the clone.
[[noreturn]] void tree_root_main() {
  fork_tree(kTreeSize);
  for (;;) ::pause();
}

std::size_t count_procs(std::string const& dir) {
  Fd fd{::open((dir + "/cgroup.procs").c_str(), O_RDONLY | O_CLOEXEC)};
  if (!fd.valid()) return 0;
  std::string text;
  char buf[16384];
  for (;;) {
    ssize_t const r = ::read(fd.get(), buf, sizeof buf);
    if (r <= 0) break;
    text.append(buf, static_cast<std::size_t>(r));
  }
  std::size_t lines = 0;
  for (char c : text) lines += c == '\n' ? 1 : 0;
  return lines;
}

bool populated(int events_fd) {
  char buf[256];
  ssize_t const r = ::pread(events_fd, buf, sizeof buf - 1, 0);
  if (r <= 0) return true;  // unreadable: assume still populated, the caller's deadline decides
  buf[r] = '\0';
  return std::strstr(buf, "populated 1") != nullptr;
}

void reap_all_available() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

std::optional<double> tree_kill_once(Env const& env, int run) {
  std::string const dir = env.cgroup_root + "/tree" + std::to_string(run);
  if (::mkdir(dir.c_str(), 0755) != 0) return std::nullopt;
  std::optional<double> result;
  {
    Fd cg{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    Fd events{::open((dir + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC)};
    Fd kill{::open((dir + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC)};
    int pidfd = -1;
    long const pid =
        (cg.valid() && events.valid() && kill.valid()) ? raw_clone3(cg.get(), &pidfd, false) : -1;
    if (pid == 0) tree_root_main();
    Fd pfd{pidfd};
    if (pid > 0) {
      // Wait (bounded) until the whole tree is inside the cgroup.
      // Three full readings in a row: the short-lived middles of the double forks can make one
      // reading reach the size before every grandchild exists.
      auto const ready_by = Clock::now() + milliseconds(30000);
      int full = 0;
      while (full < 3 && Clock::now() < ready_by) {
        full = count_procs(dir) >= static_cast<std::size_t>(kTreeSize) ? full + 1 : 0;
        ::usleep(2000);
      }
      bool const ready = full == 3;
      auto const t0 = Clock::now();
      bool const killed = ::write(kill.get(), "1", 1) == 1;
      // Wait for `populated 0`, reaping as the daemon would (this process is a subreaper, so
      // the tree's orphans are its children).
      auto const empty_by = Clock::now() + milliseconds(30000);
      bool empty = false;
      while (killed && Clock::now() < empty_by) {
        reap_all_available();
        if (!populated(events.get())) {
          empty = true;
          break;
        }
        pollfd p{events.get(), POLLPRI, 0};
        ::poll(&p, 1, 5);
      }
      double const ms = seconds_since(t0) * 1000.0;
      if (ready && killed && empty) result = ms;
      if (!killed || !empty) {
        // Last resort so nothing outlives the bench: kill again and wait for the kernel.
        [[maybe_unused]] auto const w = ::write(kill.get(), "1", 1);
        ::usleep(100000);
      }
      wait_pidfd(pfd.get());
      reap_all_available();
    }
  }
  remove_cgroup(dir);
  return result;
}

Row floor_row(std::string name, std::string unit, std::optional<double> v, Better better,
              std::string const& why_missing) {
  Row r;
  r.name = "floor: " + name;
  r.unit = std::move(unit);
  r.value = v;
  r.floor_name = name;
  r.floor_value = v;
  r.better = better;
  if (!v.has_value()) r.note = "could not be measured on this host: " + why_missing;
  return r;
}

}  // namespace

Floors measure_floors(Env const& env) {
  Floors f;
  // Orphans of the tree floor must come back to this process to be reaped, as they would to
  // the daemon (which is a subreaper too), not to the host's init.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

  floor_launch(env, f);
  std::uint64_t const pipe_bytes = env.quick ? kGiB / 8 : kGiB;
  f.pipe_gib_s = best_median(env, env.quick ? 1 : 3, [&] { return pipe_once(env, pipe_bytes); });
  remove_drain_files(env);
  std::uint64_t const pty_bytes = env.quick ? kGiB / 64 : kGiB / 4;
  f.pty_gib_s = best_median(env, env.quick ? 1 : 3, [&] { return pty_once(env, pty_bytes); });
  remove_drain_files(env);
  settle_page_cache(env);
  f.sqlite_full_commit_us = sqlite_commit_us(env);
  if (!env.cgroup_root.empty()) {
    int run = 0;
    f.tree_kill_ms =
        best_median(env, env.quick ? 1 : 3, [&] { return tree_kill_once(env, run++); });
  }

  std::string const no_cg = env.cgroup_root.empty() ? "no writable cgroup v2" : "a launch failed";
  f.rows.push_back(floor_row("clone3 into fresh cgroup + pidfd wait + rmdir (median)", "ms",
                             f.launch_seq_ms, Better::lower, no_cg));
  f.rows.push_back(floor_row("same, 16 concurrent launchers", "launches/s",
                             f.launch_concurrent_per_s, Better::higher, no_cg));
  f.rows.push_back(floor_row(env.quick ? "pipe -> file, 128 MiB" : "pipe -> file, 1 GiB", "GiB/s",
                             f.pipe_gib_s, Better::higher, "pipe or file write failed"));
  f.rows.push_back(floor_row(env.quick ? "raw PTY -> file, 16 MiB" : "raw PTY -> file, 256 MiB",
                             "GiB/s", f.pty_gib_s, Better::higher, "PTY unavailable"));
  f.rows.push_back(floor_row("SQLite WAL synchronous=FULL commit (median)", "us",
                             f.sqlite_full_commit_us, Better::lower,
                             "SQLite failed in the work dir"));
  f.rows.push_back(
      floor_row("cgroup.kill + wait-empty, 1,000-process tree", "ms", f.tree_kill_ms, Better::lower,
                env.cgroup_root.empty() ? no_cg : "the tree did not build or empty in time"));
  return f;
}

}  // namespace custos::bench
