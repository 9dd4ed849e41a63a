// The plan's workspace and cwd against the host, through the real daemon (issue 19): a cwd that
// leaves the workspace through a symlink is refused before the claim is consumed (the same
// action id starts afterwards), one that stays inside runs there; a workspace that is, or
// contains, the daemon's state directory is refused, under any name (a symlink, a bind mount).
#include <sys/mount.h>

#include "custos/core/base64.hpp"

#include "harness.hpp"

namespace custos::e2e {
namespace {

class WorkspaceChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
    ws_ = daemon_.tmp() / "ws";
    fs::create_directories(ws_ / "sub");
  }

  // exec.start params of `argv` in workspace `root` at `cwd` (a fresh action id each call).
  static json::object params(std::vector<std::string> const& argv, fs::path const& root,
                             std::string const& cwd) {
    auto p = start_params(argv);
    auto& plan = p["plan"].as_object();
    plan["workspace"].as_object()["root"] = root.native();
    plan["cwd"] = cwd;
    return p;
  }

  static std::string pointer_of(json::object const& response) {
    auto const& diags = response.at("error").at("data").at("detail").at("diagnostics").as_array();
    if (diags.size() != 1) return "diagnostics: " + json::serialize(diags);
    return std::string{diags[0].at("pointer").as_string()};
  }

  // exec.check and exec.start both refuse `p` with `code` at `pointer`; nothing was recorded.
  void expect_refused(LineClient& c, json::object const& p, std::string const& code,
                      std::string const& pointer) {
    auto check = c.call(next_++, "exec.check", p);
    ASSERT_TRUE(check);
    EXPECT_EQ(error_code_of(*check), code) << json::serialize(*check);
    if (check->contains("error")) {
      EXPECT_EQ(pointer_of(*check), pointer);
    }
    auto start = c.call(next_++, "exec.start", p);
    ASSERT_TRUE(start);
    EXPECT_EQ(error_code_of(*start), code) << json::serialize(*start);
    if (start->contains("error")) {
      EXPECT_EQ(pointer_of(*start), pointer);
    }
    auto list = c.call(next_++, "exec.list", {{"limit", 10}});
    ASSERT_TRUE(list && list->contains("result"));
    EXPECT_TRUE(list->at("result").at("executions").as_array().empty()) << json::serialize(*list);
  }

  // Starts `p`, waits for its end and returns its stdout (the test fails on any refusal).
  std::string run(LineClient& c, json::object const& p) {
    auto r = c.call(next_++, "exec.start", p);
    EXPECT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "no reply");
    if (!r || !r->contains("result")) return "<refused>";
    std::string const id{r->at("result").at("execution_id").as_string()};
    auto w = c.call(next_++, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}});
    EXPECT_TRUE(w && w->contains("result"));
    if (w && w->contains("result")) {
      EXPECT_EQ(w->at("result").at("classification").as_string(), "exited") << json::serialize(*w);
    }
    auto o = c.call(next_++, "exec.output", {{"execution_id", id}, {"stream", "stdout"}});
    if (!o || !o->contains("result")) return "<no output>";
    auto data = core::base64_decode(o->at("result").at("data_b64").as_string());
    return data ? std::string(data->begin(), data->end()) : "<bad base64>";
  }

  Daemon daemon_;
  fs::path ws_;
  std::int64_t next_ = 1;
};

TEST_F(WorkspaceChecks, CwdThroughASymlinkOutIsRefusedBeforeTheClaim) {
  fs::create_symlink("/etc", ws_ / "link");
  fs::create_symlink("../..", ws_ / "sub" / "up");
  auto c = daemon_.client();
  auto p = params({"/bin/pwd", "-P"}, ws_, "link");
  expect_refused(c, p, "workspace.escape", "/plan/cwd");
  expect_refused(c, params({"/bin/pwd", "-P"}, ws_, "sub/up"), "workspace.escape", "/plan/cwd");
  // The same action id, the plan corrected: the claim was not consumed by the refusal.
  p["plan"].as_object()["cwd"] = "sub";
  EXPECT_EQ(run(c, p), fs::canonical(ws_ / "sub").native() + "\n");
}

TEST_F(WorkspaceChecks, CwdThroughASymlinkInsideRunsThere) {
  fs::create_symlink("sub", ws_ / "inside");
  fs::create_symlink("../sub", ws_ / "sub" / "self");
  auto c = daemon_.client();
  std::string const sub = fs::canonical(ws_ / "sub").native() + "\n";
  EXPECT_EQ(run(c, params({"/bin/pwd", "-P"}, ws_, "inside")), sub);
  EXPECT_EQ(run(c, params({"/bin/pwd", "-P"}, ws_, "sub/self")), sub);
}

TEST_F(WorkspaceChecks, WorkspaceHoldingTheStateDirIsRefused) {
  fs::path const state = fs::canonical(daemon_.state());
  fs::create_symlink(state.parent_path(), daemon_.tmp() / "state-link");
  auto c = daemon_.client();
  for (fs::path const& root : {state, state.parent_path(), fs::path{"/var/tmp"}, fs::path{"/"},
                               daemon_.tmp() / "state-link"}) {
    SCOPED_TRACE(root.native());
    expect_refused(c, params({"/bin/true"}, root, "."), "workspace.state_dir",
                   "/plan/workspace/root");
  }
  // Beside the state directory is fine, and the refused action id is still unused.
  auto p = params({"/bin/pwd", "-P"}, state.parent_path(), ".");
  expect_refused(c, p, "workspace.state_dir", "/plan/workspace/root");
  p["plan"].as_object()["workspace"].as_object()["root"] = ws_.native();
  EXPECT_EQ(run(c, p), fs::canonical(ws_).native() + "\n");
}

TEST_F(WorkspaceChecks, BindMountOfTheStateDirIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "bind mounts need root";
  fs::path const state = fs::canonical(daemon_.state());
  fs::path const bind = daemon_.tmp() / "bind";
  fs::create_directories(bind);
  if (::mount(state.parent_path().c_str(), bind.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    GTEST_SKIP() << "bind mount refused here: " << std::strerror(errno);
  }
  auto c = daemon_.client();
  // The bind mount's path shares nothing with the state directory's: its device and inode do.
  expect_refused(c, params({"/bin/true"}, bind, "."), "workspace.state_dir",
                 "/plan/workspace/root");
  EXPECT_EQ(::umount2(bind.c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

}  // namespace
}  // namespace custos::e2e
