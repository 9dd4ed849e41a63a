// Shared fixture for the process tests: every test must leave the fd table as it found it.
#pragma once

#include <gtest/gtest.h>

#include <dirent.h>
#include <set>
#include <string>

namespace custos::sys::testing {

inline std::set<int> open_fds() {
  std::set<int> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  int const own = ::dirfd(d);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    int const fd = std::stoi(e->d_name);
    if (fd != own) out.insert(fd);
  }
  ::closedir(d);
  return out;
}

class FdLeakTest : public ::testing::Test {
 protected:
  void SetUp() override { before_ = open_fds(); }
  void TearDown() override { EXPECT_EQ(before_, open_fds()) << "file descriptors leaked"; }

 private:
  std::set<int> before_;
};

}  // namespace custos::sys::testing
