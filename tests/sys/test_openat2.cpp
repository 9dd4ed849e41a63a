#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/sys/identity.hpp"
#include "custos/sys/openat2.hpp"
#include "custos/sys/rlimits.hpp"

#include "sys/process_fixture.hpp"

namespace custos::sys {
namespace {

namespace fs = std::filesystem;
using testing::FdLeakTest;

class Openat2Test : public FdLeakTest {
 protected:
  void SetUp() override {
    FdLeakTest::SetUp();
    std::string tmpl = (fs::temp_directory_path() / "custos-openat2-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "root" / "a" / "b");
    std::ofstream(dir_ / "root" / "a" / "file") << "inside\n";
    std::ofstream(dir_ / "secret") << "outside\n";
    fs::create_symlink(dir_ / "secret", dir_ / "root" / "abs_out");
    fs::create_symlink("../../secret", dir_ / "root" / "a" / "rel_out");
    fs::create_symlink("b", dir_ / "root" / "a" / "rel_in");
    fs::create_symlink("/proc/self/root", dir_ / "root" / "magic");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    FdLeakTest::TearDown();
  }
  fs::path dir_;
};

TEST_F(Openat2Test, ResolvesInsideAndRefusesEscapes) {
  auto root = open_directory((dir_ / "root").string());
  ASSERT_TRUE(root) << root.error().message();

  auto sub = open_beneath(*root, "a/b", true);
  ASSERT_TRUE(sub) << sub.error().message();
  EXPECT_EQ(::fcntl(sub->get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto via_link = open_beneath(*root, "a/rel_in", true);
  ASSERT_TRUE(via_link) << via_link.error().message();
  struct stat s1 {
  }, s2{};
  ASSERT_EQ(::fstat(sub->get(), &s1), 0);
  ASSERT_EQ(::fstat(via_link->get(), &s2), 0);
  EXPECT_EQ(s1.st_ino, s2.st_ino);
  auto self = open_beneath(*root, "", true);
  ASSERT_TRUE(self);
  auto file = open_beneath(*root, "a/file", false);
  ASSERT_TRUE(file) << file.error().message();
  char buf[16] = {};
  EXPECT_EQ(::read(file->get(), buf, sizeof buf), 7);

  for (char const* escape :
       {"..", "a/../..", "abs_out", "a/rel_out", "/etc", "magic", "magic/etc"}) {
    auto r = open_beneath(*root, escape, false);
    ASSERT_FALSE(r) << escape;
    EXPECT_EQ(r.error().code, Errc::workspace_escape) << escape << ": " << r.error().message();
  }
  auto missing = open_beneath(*root, "nope", true);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::sys_error);
  EXPECT_EQ(missing.error().sys_errno, ENOENT);
  auto not_dir = open_beneath(*root, "a/file", true);
  ASSERT_FALSE(not_dir);
  EXPECT_EQ(not_dir.error().sys_errno, ENOTDIR);
  auto no_root = open_directory((dir_ / "absent").string());
  ASSERT_FALSE(no_root);
  EXPECT_EQ(no_root.error().code, Errc::sys_error);
}

class RlimitTest : public FdLeakTest {};

TEST_F(RlimitTest, NamesValidationAndOwnLimits) {
  EXPECT_EQ(rlimit_resource_from_name("nofile"), RLIMIT_NOFILE);
  EXPECT_EQ(rlimit_resource_from_name("nproc"), RLIMIT_NPROC);
  EXPECT_EQ(rlimit_resource_from_name("bogus"), std::nullopt);
  EXPECT_TRUE(validate_rlimit(Rlimit{RLIMIT_CORE, 0, kRlimInfinity}));
  EXPECT_EQ(validate_rlimit(Rlimit{RLIMIT_CORE, 2, 1}).error().code, Errc::plan_invalid_limit);
  EXPECT_EQ(validate_rlimit(Rlimit{999, 1, 1}).error().code, Errc::plan_invalid_limit);

  auto core = get_rlimit(RLIMIT_CORE);
  ASSERT_TRUE(core);
  auto self_by_pid = get_rlimit(static_cast<std::int32_t>(::getpid()), RLIMIT_CORE);
  ASSERT_TRUE(self_by_pid);
  EXPECT_EQ(*core, *self_by_pid);
  // Lower the soft limit and restore it: a change the test process can always undo.
  Rlimit lowered = *core;
  lowered.soft = 0;
  ASSERT_TRUE(set_rlimit(lowered));
  EXPECT_EQ(get_rlimit(RLIMIT_CORE)->soft, 0U);
  ASSERT_TRUE(set_rlimit(*core));
  EXPECT_EQ(*get_rlimit(RLIMIT_CORE), *core);
}

class IdentityTest : public FdLeakTest {};

TEST_F(IdentityTest, BootIdAndOwnStartTime) {
  auto boot = read_boot_id();
  ASSERT_TRUE(boot) << boot.error().message();
  EXPECT_EQ(boot->size(), 36U);
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(*boot, line);

  auto self = Pidfd::open(static_cast<std::int32_t>(::getpid()));
  ASSERT_TRUE(self);
  auto id = read_identity(*self);
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(id->pid, ::getpid());
  EXPECT_GT(id->start_time_ticks, 0U);
  EXPECT_NE(id->pidfs_ino, 0U);
  auto missing = read_start_time(0x7ffffff0);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::procfs_failed);
  EXPECT_EQ(missing.error().sys_errno, ENOENT);
}

}  // namespace
}  // namespace custos::sys
