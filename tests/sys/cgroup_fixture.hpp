// Test helpers for the cgroup, marker and sampler tests: a per-test cgroup under the v2 mount
// (custos-test-<pid>-<n>, killed and removed in TearDown), temp directories, and child trees
// started with plain fork+exec (these tests exercise sys/ independently of spawn).
#pragma once

#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <optional>
#include <signal.h>
#include <stdlib.h>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/sys/cgroup.hpp"
#include "custos/sys/pidfd.hpp"

#include "sys/process_fixture.hpp"

namespace custos::sys::testing {

inline int next_test_serial() {
  static int n = 0;
  return ++n;
}

// A temp directory removed (recursively, without following symlinks) at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "custos-sys-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made != nullptr) path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(TempDir const&) = delete;
  TempDir& operator=(TempDir const&) = delete;
  [[nodiscard]] std::string const& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_text(std::string const& path, std::string const& text) {
  int const fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
}

// The command name of a process ("" once it is gone).
inline std::string comm_of(std::int32_t pid) {
  std::string s;
  int const fd = ::open(("/proc/" + std::to_string(pid) + "/comm").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[64];
  ssize_t const n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n > 0) s.assign(buf, static_cast<std::size_t>(n));
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Polls `cond` every 5 ms until it holds or `timeout` passes.
inline bool eventually(std::function<bool()> const& cond,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// fork + (optionally join `cgroup_procs_path`) + setsid + execve(/bin/sh -c script, envp).
// Everything the child needs is prepared before fork; the child only makes syscalls.
// Returns the child's pidfd (opened at once: it is our unreaped child, so its pid cannot have
// been recycled); every later signal and wait goes through it.
inline Pidfd start_shell(std::string const& script, std::vector<std::string> const& env,
                         std::string const& cgroup_procs_path = {}) {
  std::vector<char*> envp;
  for (auto const& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  char const* argv[] = {"sh", "-c", script.c_str(), nullptr};
  char const* procs = cgroup_procs_path.empty() ? nullptr : cgroup_procs_path.c_str();
  pid_t const pid = ::fork();
  if (pid == 0) {
    if (procs != nullptr) {
      // Join the cgroup first, so every descendant is born inside it.
      int const fd = ::open(procs, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(120);
      ::close(fd);
    }
    ::setsid();
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  auto pidfd = Pidfd::open(pid);
  EXPECT_TRUE(pidfd) << "pidfd_open of a fresh child";
  return pidfd ? std::move(*pidfd) : Pidfd();
}

// Kills (SIGKILL through the pidfd) and reaps a direct child; a no-op for an invalid handle.
inline void kill_and_reap(Pidfd& child) {
  if (!child.valid()) return;
  (void)child.send_signal(SIGKILL);
  EXPECT_TRUE(child.wait());
  child = Pidfd();
}

// A cgroup of its own for each test, under the cgroup2 mount; skipped where none is writable.
class CgroupTest : public FdLeakTest {
 protected:
  void SetUp() override {
    FdLeakTest::SetUp();
    auto mount = find_cgroup2_mount();
    if (!mount) GTEST_SKIP() << "no cgroup2 mount: " << mount.error().message();
    auto root = CgroupDir::open(mount->path);
    if (!root) GTEST_SKIP() << "cgroup2 mount not openable: " << root.error().message();
    std::string const name =
        "custos-test-" + std::to_string(::getpid()) + "-" + std::to_string(next_test_serial());
    auto made = CgroupDir::create(*root, name);
    if (!made) GTEST_SKIP() << "cgroup2 root not writable: " << made.error().message();
    cg_ = std::move(*made);
  }

  void TearDown() override {
    if (cg_.valid()) {
      // Child cgroups made by the test first, deepest last-created first.
      for (auto it = extra_.rbegin(); it != extra_.rend(); ++it) cleanup(*it);
      extra_.clear();
      cleanup(cg_);
      cg_ = CgroupDir();
    }
    FdLeakTest::TearDown();
  }

  static void cleanup(CgroupDir& dir) {
    if (!dir.valid()) return;
    if (::faccessat(dir.fd().get(), "cgroup.events", F_OK, 0) != 0) {  // the test removed it
      dir = CgroupDir();
      return;
    }
    (void)dir.kill();  // reaches every cgroup below too
    EXPECT_TRUE(dir.wait_empty(std::chrono::seconds(10)));
    // Child cgroups a failed test did not register are removed too, deepest first, so no
    // custos-test-* directory outlives the test whatever happened in it.
    remove_children(dir.path());
    EXPECT_TRUE(dir.remove()) << dir.path();
    dir = CgroupDir();
  }

  static void remove_children(std::string const& path) {
    std::error_code ec;
    for (auto const& e : std::filesystem::directory_iterator(path, ec)) {
      if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
      remove_children(e.path().string());
      EXPECT_EQ(::rmdir(e.path().c_str()), 0) << e.path() << ": " << std::strerror(errno);
    }
  }

  [[nodiscard]] std::string procs_path() const { return cg_.path() + "/cgroup.procs"; }

  CgroupDir cg_;
  std::vector<CgroupDir> extra_;
};

}  // namespace custos::sys::testing
