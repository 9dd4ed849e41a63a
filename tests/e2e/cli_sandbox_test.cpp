// `custos run --sandbox FILE.json`, `--sandbox-profile build` and `--check` as a user runs them,
// against the real daemon: the profile as the daemon compiles it (exec.check), the native
// backend's refusal with every missing control, the file's members replacing the profile's, and
// typed errors for a file that is not a sandbox.
#include <fstream>
#include <set>

#include "harness.hpp"

namespace custos::e2e {
namespace {

class CliSandbox : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
    ws_ = daemon_.tmp() / "ws";
    fs::create_directories(ws_);
  }
  CliResult cli(std::vector<std::string> args, std::vector<std::string> env = {}) {
    args.insert(args.begin(), {"--socket", daemon_.socket().native()});
    return run_cli(args, {}, env);
  }
  fs::path write(std::string const& name, std::string const& text) {
    fs::path const p = daemon_.tmp() / name;
    std::ofstream(p) << text;
    return p;
  }
  // The rights the checked plan gives `path` (empty when it is not listed).
  static std::set<std::string> rights_of(json::value const& answer, std::string const& path) {
    std::set<std::string> out;
    for (auto const& r : answer.at("sandbox").at("filesystem").as_array()) {
      if (r.at("path").as_string() != path) continue;
      for (auto const& a : r.at("allow").as_array()) out.emplace(a.as_string());
    }
    return out;
  }
  static std::set<std::string> strings(json::value const& v) {
    std::set<std::string> out;
    for (auto const& s : v.as_array()) out.emplace(s.as_string());
    return out;
  }
  Daemon daemon_;
  fs::path ws_;
};

TEST_F(CliSandbox, BuildProfileAsTheDaemonCompilesIt) {
  // USER and LOGNAME are in the caller's environment but not in the profile's allow list: the
  // CLI leaves them out (the daemon would refuse them at /plan/env/N/name).
  auto r = cli({"--json", "run", "--check", "--sandbox-profile", "build", "--workspace",
                ws_.native(), "--cwd", ws_.native(), "--", "/bin/true"},
               {"USER=someone", "LOGNAME=someone", "LANG=C.UTF-8", "TERM=xterm"});
  json::value const answer = json::parse(r.out);
  // --check exits 0 when the native backend admits the plan here, 65 with the missing controls.
  bool const admitted = answer.at("admission").at("admitted").as_bool();
  EXPECT_EQ(r.status, admitted ? 0 : 65) << r.err;
  std::set<std::string> const all{"discover", "metadata", "read",  "execute",
                                  "create",   "write",    "remove"};
  EXPECT_EQ(rights_of(answer, ws_.native()), all);
  EXPECT_EQ(rights_of(answer, "/usr"),
            (std::set<std::string>{"discover", "metadata", "read", "execute"}));
  EXPECT_EQ(rights_of(answer, "/etc"), (std::set<std::string>{"discover", "metadata", "read"}));
  EXPECT_EQ(rights_of(answer, "/dev/null"), (std::set<std::string>{"metadata", "read", "write"}));
  EXPECT_EQ(rights_of(answer, "/dev/urandom"), (std::set<std::string>{"metadata", "read"}));
  EXPECT_TRUE(rights_of(answer, "/tmp").empty());
  auto const& sb = answer.at("sandbox");
  EXPECT_EQ(sb.at("process").at("descendants").as_bool(), true);
  EXPECT_EQ(sb.at("process").at("max_processes").as_int64(), 256);
  EXPECT_EQ(sb.at("process").at("run_as_root").as_bool(), ::geteuid() == 0);
  EXPECT_EQ(sb.at("network").at("outbound").as_string(), "none");
  EXPECT_EQ(strings(sb.at("environment").at("allow")),
            (std::set<std::string>{"HOME", "LANG", "PATH", "TERM", "TMPDIR"}));
  EXPECT_EQ(strings(sb.at("terminal").at("modes")), (std::set<std::string>{"pipes", "pty"}));
  EXPECT_TRUE(sb.at("terminal").at("input").as_bool());
  EXPECT_TRUE(sb.at("terminal").at("resize").as_bool());
  auto const controls = strings(sb.at("controls"));
  EXPECT_EQ(controls.count("network.none"), 1U);
  EXPECT_EQ(controls.count("process.max_processes"), 1U);
  EXPECT_EQ(controls.count("process.no_descendants"), 0U);
  for (auto const& m : answer.at("admission").at("missing").as_array()) {
    EXPECT_NE(r.err.find(std::string{"missing control: "} + std::string{m.as_string()}),
              std::string::npos)
        << r.err;
  }

  // --read-only: the workspace loses create, write and remove (a read_only workspace refuses
  // them, sandbox.invalid), and the answer is the daemon's again.
  auto ro = cli({"--json", "run", "--check", "--read-only", "--sandbox-profile", "build",
                 "--workspace", ws_.native(), "--cwd", ws_.native(), "--", "/bin/true"});
  EXPECT_EQ(ro.status, json::parse(ro.out).at("admission").at("admitted").as_bool() ? 0 : 65)
      << ro.err;
  EXPECT_EQ(rights_of(json::parse(ro.out), ws_.native()),
            (std::set<std::string>{"discover", "metadata", "read", "execute"}));
}

TEST_F(CliSandbox, TheBuildProfileRunsUnderTheLinuxEnforcement) {
  // The profile as a user runs it: the program runs in the workspace, sees the system
  // directories and nothing of the rest of the host.
  auto chk = cli({"--json", "run", "--check", "--sandbox-profile", "build", "--workspace",
                  ws_.native(), "--cwd", ws_.native(), "--", "/bin/true"});
  if (!json::parse(chk.out).at("admission").at("admitted").as_bool()) {
    GTEST_SKIP() << "this host does not enforce the build profile: " << chk.err;
  }
  auto r = cli({"run", "--sandbox-profile", "build", "--workspace", ws_.native(), "--cwd",
                ws_.native(), "--", "/bin/sh", "-c",
                "echo made > out.txt && cat out.txt; test -e /root && echo root-seen; "
                "test -e /var/lib && echo var-seen; true"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "made\n") << r.err;
  EXPECT_TRUE(fs::exists(ws_ / "out.txt"));
}

TEST_F(CliSandbox, FileMembersReplaceTheProfiles) {
  auto const net = write("net.json", R"({"network": {"outbound": {"tcp_connect": [443]}}})");
  auto r = cli({"--json", "run", "--check", "--sandbox-profile", "build", "--sandbox", net.native(),
                "--workspace", ws_.native(), "--cwd", ws_.native(), "--", "/bin/true"});
  json::value const answer = json::parse(r.out);
  EXPECT_EQ(r.status, answer.at("admission").at("admitted").as_bool() ? 0 : 65) << r.err;
  auto const& sb = answer.at("sandbox");
  EXPECT_EQ(sb.at("network").at("outbound").at("tcp_connect").as_array().at(0).as_int64(), 443);
  EXPECT_FALSE(rights_of(answer, "/usr").empty());  // the profile's filesystem stays
  EXPECT_EQ(strings(sb.at("controls")).count("network.tcp_connect"), 1U);

  // A file alone: exactly what it says, every other domain at its strictest.
  // (A root caller runs as root: the file says so, or the daemon refuses it at run_as_root.)
  auto const only = write("only.json", std::string{R"({"filesystem": [{"path": "/usr",
      "allow": ["discover", "metadata", "read", "execute"]}], "process": {"run_as_root": )"} +
                                           (::geteuid() == 0 ? "true" : "false") + "}}");
  auto o = cli({"--json", "run", "--check", "--clean-env", "--sandbox", only.native(),
                "--workspace", ws_.native(), "--cwd", ws_.native(), "--", "/bin/true"});
  json::value const a2 = json::parse(o.out);
  EXPECT_EQ(o.status, a2.at("admission").at("admitted").as_bool() ? 0 : 65) << o.err;
  EXPECT_EQ(a2.at("sandbox").at("filesystem").as_array().size(), 1U);
  EXPECT_EQ(a2.at("sandbox").at("process").at("descendants").as_bool(), false);
  EXPECT_EQ(strings(a2.at("sandbox").at("controls")).count("process.no_descendants"), 1U);
}

TEST_F(CliSandbox, AFileThatIsNotASandboxIsATypedError) {
  auto const broken = write("broken.json", "{\"filesystem\": [");
  auto r = cli({"run", "--sandbox", broken.native(), "--", "/bin/true"});
  EXPECT_EQ(r.status, 65);
  EXPECT_NE(r.err.find("custos: sandbox.invalid: --sandbox " + broken.native() + ": not JSON"),
            std::string::npos)
      << r.err;
  auto const array = write("array.json", "[1, 2]");
  r = cli({"run", "--sandbox", array.native(), "--", "/bin/true"});
  EXPECT_EQ(r.status, 65);
  EXPECT_NE(r.err.find("must hold a JSON object"), std::string::npos) << r.err;
  r = cli({"run", "--sandbox", (daemon_.tmp() / "absent.json").native(), "--", "/bin/true"});
  EXPECT_EQ(r.status, 65);
  EXPECT_NE(r.err.find("sys.error"), std::string::npos) << r.err;
  // Valid JSON, invalid sandbox: the daemon's refusal with its pointer, printed readably.
  auto const rel = write("rel.json", R"({"filesystem": [{"path": "usr", "allow": ["metadata"]}]})");
  r = cli({"run", "--sandbox", rel.native(), "--workspace", ws_.native(), "--cwd", ws_.native(),
           "--", "/bin/true"});
  EXPECT_EQ(r.status, 65);
  EXPECT_NE(r.err.find("sandbox.invalid at /plan/sandbox/filesystem/0/path"), std::string::npos)
      << r.err;
  // An unknown profile is a usage error.
  r = cli({"run", "--sandbox-profile", "nosuch", "--", "/bin/true"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("nosuch"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace custos::e2e
