// The private filesystem view (mount_view.hpp) entered by a real staged child: what the child
// sees, what it may write, and that nothing of it reaches the host's mount table.
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/sys/mount_view.hpp"
#include "custos/sys/spawn.hpp"

#include "sys/process_fixture.hpp"
#include "sys/process_util.hpp"

namespace custos::sys {
namespace {

namespace fs = std::filesystem;
using testing::run_capture;
using testing::simple_spec;

class MountViewTest : public testing::FdLeakTest {
 protected:
  void SetUp() override {
    FdLeakTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "mount namespaces need root";
    if (!mount_api_available()) GTEST_SKIP() << "no mount API on this kernel";
    std::string tmpl = (fs::temp_directory_path() / "custos-view-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "w" / "sub");
    fs::create_directories(dir_ / "w" / "secret");
    std::ofstream(dir_ / "w" / "a.txt") << "alpha";
    std::ofstream(dir_ / "w" / "secret" / "s.txt") << "hidden";
    std::ofstream(dir_ / "outside.txt") << "outside";
    ASSERT_EQ(::symlink("w/a.txt", (dir_ / "link").c_str()), 0);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    FdLeakTest::TearDown();
  }

  static std::vector<ViewPath> system() {
    std::vector<ViewPath> v;
    for (auto const* p : {"/usr", "/bin", "/lib", "/lib64"}) {
      v.push_back(ViewPath{p, ViewPath::Kind::visible, true, false, false});
    }
    return v;
  }

  // Runs `script` with /bin/sh inside the view.
  Result<testing::RunOutput> sh(PrivateView const& view, std::string const& script,
                                std::string cwd = "/") {
    auto spec = simple_spec("/bin/sh", {"sh", "-c", script});
    SpawnSandbox sb;
    sb.view = &view;
    sb.cwd = std::move(cwd);
    sb.new_pid_namespace = true;
    spec.sandbox = sb;
    return run_capture(std::move(spec));
  }

  fs::path dir_;
};

TEST_F(MountViewTest, OnlyTheListedPathsExist) {
  auto paths = system();
  paths.push_back(ViewPath{(dir_ / "w").native(), ViewPath::Kind::visible, true, true, false});
  auto view = PrivateView::build(paths);
  ASSERT_TRUE(view) << view.error().message();
  auto r = sh(*view, "cat " + (dir_ / "w" / "a.txt").native() + "; echo; ls / | tr '\\n' ' '; " +
                         "test -e " + (dir_ / "outside.txt").native() + " && echo seen; " +
                         "test -e /etc/passwd && echo etc; true");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->status.code, 0);
  EXPECT_NE(r->out.find("alpha"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("bin lib lib64 tmp usr"), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("seen"), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("etc"), std::string::npos) << r->out;
}

TEST_F(MountViewTest, ReadOnlyAndWritablePathsAreWhatTheyAre) {
  auto paths = system();
  paths.push_back(ViewPath{(dir_ / "w").native(), ViewPath::Kind::visible, true, true, false});
  paths.push_back(
      ViewPath{(dir_ / "w" / "sub").native(), ViewPath::Kind::visible, false, true, false});
  auto view = PrivateView::build(paths);
  ASSERT_TRUE(view) << view.error().message();
  auto w = dir_ / "w";
  auto r = sh(*view, "echo x > " + (w / "a.txt").native() + " 2>/dev/null || echo ro-refused; " +
                         "echo made > " + (w / "sub" / "new.txt").native() + " && echo rw-ok");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_NE(r->out.find("ro-refused"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("rw-ok"), std::string::npos) << r->out;
  std::ifstream a(w / "a.txt");
  std::string content((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "alpha");
  EXPECT_TRUE(fs::exists(w / "sub" / "new.txt"));
}

TEST_F(MountViewTest, AHiddenSubtreeIsEmptyAndASymlinkStaysASymlink) {
  auto paths = system();
  auto w = dir_ / "w";
  paths.push_back(ViewPath{w.native(), ViewPath::Kind::visible, true, true, false});
  paths.push_back(ViewPath{(w / "secret").native(), ViewPath::Kind::hidden, true, true, false});
  paths.push_back(ViewPath{(dir_ / "link").native(), ViewPath::Kind::visible, true, true, false});
  auto view = PrivateView::build(paths);
  ASSERT_TRUE(view) << view.error().message();
  auto r = sh(*view, "ls -A " + (w / "secret").native() + " | wc -l; cat " +
                         (dir_ / "link").native() + "; echo; readlink " + (dir_ / "link").native());
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_NE(r->out.find("0\nalpha\nw/a.txt"), std::string::npos) << r->out;
}

TEST_F(MountViewTest, APathBehindASymlinkIsRefused) {
  auto paths = system();
  paths.push_back(ViewPath{(dir_ / "link" / "x").native(), ViewPath::Kind::visible});
  auto view = PrivateView::build(paths);
  ASSERT_FALSE(view);
  EXPECT_EQ(view.error().code, Errc::workspace_escape);
}

TEST_F(MountViewTest, BadPathsAreRefused) {
  for (auto const& bad : {std::string{"relative"}, std::string{"/a/../b"}, std::string{"/a/"},
                          std::string{"/proc/self"}}) {
    auto view = PrivateView::build({ViewPath{bad, ViewPath::Kind::visible}});
    ASSERT_FALSE(view) << bad;
    EXPECT_EQ(view.error().code, Errc::plan_invalid_value) << bad;
  }
}

TEST_F(MountViewTest, AFreshProcShowsOnlyTheTreeAndTheHostTableIsUntouched) {
  std::string before;
  {
    std::ifstream m("/proc/self/mountinfo");
    before.assign(std::istreambuf_iterator<char>(m), std::istreambuf_iterator<char>());
  }
  auto paths = system();
  paths.push_back(ViewPath{"/proc", ViewPath::Kind::proc, true, true, false});
  auto view = PrivateView::build(paths);
  ASSERT_TRUE(view) << view.error().message();
  auto r = sh(*view, "ls /proc | grep -c '^[0-9]'; echo $$");
  ASSERT_TRUE(r) << r.error().message();
  // sh (pid 1) and ls and grep at most; the host's processes are not there.
  EXPECT_NE(r->out.find("\n1\n"), std::string::npos) << r->out;
  std::ifstream m("/proc/self/mountinfo");
  std::string after((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
  EXPECT_EQ(before, after);
}

TEST_F(MountViewTest, FilesAppearReadOnlyForTheirOwner) {
  auto paths = system();
  ViewFiles files{"/run/s", 65534, 65534, {ViewFile{"token", "s3cr3t"}}};
  auto view = PrivateView::build(paths, &files);
  ASSERT_TRUE(view) << view.error().message();
  auto spec = simple_spec("/bin/sh", {"sh", "-c",
                                      "cat /run/s/token; echo; stat -c '%a %u' /run/s/token; "
                                      "echo x > /run/s/token 2>/dev/null || echo refused"});
  SpawnSandbox sb;
  sb.view = &*view;
  sb.cwd = "/";
  spec.sandbox = sb;
  spec.credentials = SpawnCredentials{65534, 65534, {}};
  auto r = run_capture(std::move(spec));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->out, "s3cr3t\n400 65534\nrefused\n");
}

// The daemon runs with umask 0077: the directories the view makes above a listed path must
// still let a non-root program through to it.
TEST_F(MountViewTest, ANonRootProgramReachesANestedPathWhateverTheUmask) {
  ASSERT_EQ(::chmod((dir_ / "w").c_str(), 0755), 0);
  ASSERT_EQ(::chmod((dir_ / "w" / "a.txt").c_str(), 0644), 0);
  auto paths = system();
  paths.push_back(ViewPath{(dir_ / "w").string(), ViewPath::Kind::visible, true, true, false});
  mode_t const old = ::umask(0077);
  auto view = PrivateView::build(paths);
  ::umask(old);
  ASSERT_TRUE(view) << view.error().message();
  auto spec = simple_spec("/bin/sh", {"sh", "-c", "cat a.txt; echo; stat -c '%a' .."});
  SpawnSandbox sb;
  sb.view = &*view;
  sb.cwd = (dir_ / "w").string();
  spec.sandbox = sb;
  spec.credentials = SpawnCredentials{65534, 65534, {}};
  auto r = run_capture(std::move(spec));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->out, "alpha\n755\n");
}

}  // namespace
}  // namespace custos::sys
