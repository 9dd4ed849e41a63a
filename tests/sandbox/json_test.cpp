// Parsing sandbox requirements (json.hpp): every rule refused with its exact code and pointer,
// and the parse∘print round trip as a property.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>

#include "sandbox/fixtures.hpp"

namespace custos::sandbox {
namespace {

using testing::js;
using testing::req;

struct Refusal {
  char const* name;
  char const* sandbox;  // the sandbox object's JSON
  Errc code;
  char const* pointer;
};

std::string big_path(std::size_t n) {
  return "/" + std::string(n - 1, 'a');
}

// One rule per row: the requirement breaks exactly it, and it is reported at its pointer.
std::vector<Refusal> const& refusals() {
  static std::vector<Refusal> const kRows = {
      {"NotObject", R"([])", Errc::plan_wrong_type, "/plan/sandbox"},
      {"UnknownDomain", R"({"ipc": {}})", Errc::plan_unknown_field, "/plan/sandbox/ipc"},
      // filesystem
      {"FsNotArray", R"({"filesystem": {}})", Errc::plan_wrong_type, "/plan/sandbox/filesystem"},
      {"FsEntryNotObject", R"({"filesystem": ["/usr"]})", Errc::plan_wrong_type,
       "/plan/sandbox/filesystem/0"},
      {"FsPathMissing", R"({"filesystem": [{"allow": []}]})", Errc::plan_missing_field,
       "/plan/sandbox/filesystem/0/path"},
      {"FsAllowMissing", R"({"filesystem": [{"path": "/usr"}]})", Errc::plan_missing_field,
       "/plan/sandbox/filesystem/0/allow"},
      {"FsUnknownMember", R"({"filesystem": [{"path": "/usr", "allow": [], "deny": []}]})",
       Errc::plan_unknown_field, "/plan/sandbox/filesystem/0/deny"},
      {"FsRelative", R"({"filesystem": [{"path": "usr", "allow": []}]})", Errc::sandbox_invalid,
       "/plan/sandbox/filesystem/0/path"},
      {"FsDotDot", R"({"filesystem": [{"path": "/usr/../etc", "allow": []}]})",
       Errc::sandbox_invalid, "/plan/sandbox/filesystem/0/path"},
      {"FsNul", R"({"filesystem": [{"path": "/usr\u0000", "allow": []}]})", Errc::plan_nul_byte,
       "/plan/sandbox/filesystem/0/path"},
      {"FsUnknownRight",
       R"({"filesystem": [{"path": "/usr", "allow": ["metadata", "read", "chmod"]}]})",
       Errc::sandbox_invalid, "/plan/sandbox/filesystem/0/allow/2"},
      {"FsRightNotString", R"({"filesystem": [{"path": "/usr", "allow": [1]}]})",
       Errc::plan_wrong_type, "/plan/sandbox/filesystem/0/allow/0"},
      {"FsReadWithoutMetadata", R"({"filesystem": [{"path": "/usr", "allow": ["read"]}]})",
       Errc::sandbox_invalid, "/plan/sandbox/filesystem/0/allow"},
      {"FsPathTwiceOtherRights",
       R"({"filesystem": [{"path": "/usr", "allow": ["metadata"]},
                          {"path": "/usr/", "allow": ["metadata", "read"]}]})",
       Errc::sandbox_invalid, "/plan/sandbox/filesystem/1/path"},
      // process
      {"ProcessNotObject", R"({"process": true})", Errc::plan_wrong_type, "/plan/sandbox/process"},
      {"ProcessUnknown", R"({"process": {"fork": false}})", Errc::plan_unknown_field,
       "/plan/sandbox/process/fork"},
      {"DescendantsWithoutMax", R"({"process": {"descendants": true}})", Errc::sandbox_invalid,
       "/plan/sandbox/process/max_processes"},
      {"MaxWithoutDescendants", R"({"process": {"max_processes": 4}})", Errc::sandbox_invalid,
       "/plan/sandbox/process/max_processes"},
      {"MaxZero", R"({"process": {"descendants": true, "max_processes": 0}})",
       Errc::sandbox_invalid, "/plan/sandbox/process/max_processes"},
      {"MaxNegative", R"({"process": {"descendants": true, "max_processes": -1}})",
       Errc::sandbox_invalid, "/plan/sandbox/process/max_processes"},
      {"MaxHuge", R"({"process": {"descendants": true, "max_processes": 9007199254740992}})",
       Errc::sandbox_invalid, "/plan/sandbox/process/max_processes"},
      {"SignalScopeOther", R"({"process": {"signal_scope": "session"}})", Errc::sandbox_invalid,
       "/plan/sandbox/process/signal_scope"},
      {"RunAsRootNotBool", R"({"process": {"run_as_root": "no"}})", Errc::plan_wrong_type,
       "/plan/sandbox/process/run_as_root"},
      // environment
      {"EnvAllowBadName", R"({"environment": {"allow": ["PATH", "1X"]}})", Errc::sandbox_invalid,
       "/plan/sandbox/environment/allow/1"},
      {"EnvAllowNotArray", R"({"environment": {"allow": "PATH"}})", Errc::plan_wrong_type,
       "/plan/sandbox/environment/allow"},
      {"EnvUnknown", R"({"environment": {"deny": []}})", Errc::plan_unknown_field,
       "/plan/sandbox/environment/deny"},
      // network
      {"NetOldShape", R"({"network": {"allow": []}})", Errc::plan_unknown_field,
       "/plan/sandbox/network/allow"},
      {"NetBadWord", R"({"network": {"outbound": "some"}})", Errc::sandbox_invalid,
       "/plan/sandbox/network/outbound"},
      {"NetTcpConnectWord", R"({"network": {"outbound": "tcp_connect"}})", Errc::sandbox_invalid,
       "/plan/sandbox/network/outbound"},
      {"NetNumber", R"({"network": {"outbound": 443}})", Errc::plan_wrong_type,
       "/plan/sandbox/network/outbound"},
      {"NetNoPorts", R"({"network": {"outbound": {"tcp_connect": []}}})", Errc::sandbox_invalid,
       "/plan/sandbox/network/outbound/tcp_connect"},
      {"NetPortZero", R"({"network": {"outbound": {"tcp_connect": [0]}}})", Errc::sandbox_invalid,
       "/plan/sandbox/network/outbound/tcp_connect/0"},
      {"NetPortTooBig", R"({"network": {"outbound": {"tcp_connect": [443, 65536]}}})",
       Errc::sandbox_invalid, "/plan/sandbox/network/outbound/tcp_connect/1"},
      {"NetUdp", R"({"network": {"outbound": {"udp": [53]}}})", Errc::plan_unknown_field,
       "/plan/sandbox/network/outbound/udp"},
      // secrets
      {"SecretBadRef", R"({"secrets": [{"ref": "../x", "to": {"env": "X"}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/0/ref"},
      {"SecretNoTo", R"({"secrets": [{"ref": "x"}]})", Errc::plan_missing_field,
       "/plan/sandbox/secrets/0/to"},
      {"SecretTwoChannels", R"({"secrets": [{"ref": "x", "to": {"env": "X", "fd": 3}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/0/to"},
      {"SecretNoChannel", R"({"secrets": [{"ref": "x", "to": {}}]})", Errc::sandbox_invalid,
       "/plan/sandbox/secrets/0/to"},
      {"SecretBadEnv", R"({"secrets": [{"ref": "x", "to": {"env": "A-B"}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/0/to/env"},
      {"SecretFileWithSlash", R"({"secrets": [{"ref": "x", "to": {"file": "a/b"}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/0/to/file"},
      {"SecretFileDotDot", R"({"secrets": [{"ref": "x", "to": {"file": ".."}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/0/to/file"},
      {"SecretFdStdio", R"({"secrets": [{"ref": "x", "to": {"fd": 2}}]})", Errc::sandbox_invalid,
       "/plan/sandbox/secrets/0/to/fd"},
      {"SecretFdTooBig", R"({"secrets": [{"ref": "x", "to": {"fd": 1024}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/0/to/fd"},
      {"SecretSameTarget",
       R"({"secrets": [{"ref": "a", "to": {"env": "X"}}, {"ref": "b", "to": {"env": "X"}}]})",
       Errc::sandbox_invalid, "/plan/sandbox/secrets/1/to/env"},
      {"SecretValueGiven", R"({"secrets": [{"ref": "a", "value": "s3cr3t", "to": {"fd": 3}}]})",
       Errc::plan_unknown_field, "/plan/sandbox/secrets/0/value"},
      // resources
      {"EnforceUnknown", R"({"resources": {"enforce": ["wall_ms", "gpu"]}})", Errc::sandbox_invalid,
       "/plan/sandbox/resources/enforce/1"},
      {"EnforcePlanName", R"({"resources": {"enforce": ["open_files"]}})", Errc::sandbox_invalid,
       "/plan/sandbox/resources/enforce/0"},
      {"EnforceConcurrency", R"({"resources": {"enforce": ["concurrency"]}})",
       Errc::sandbox_invalid, "/plan/sandbox/resources/enforce/0"},
      // terminal
      {"TerminalNoMode", R"({"terminal": {"modes": []}})", Errc::sandbox_invalid,
       "/plan/sandbox/terminal/modes"},
      {"TerminalBadMode", R"({"terminal": {"modes": ["tty"]}})", Errc::sandbox_invalid,
       "/plan/sandbox/terminal/modes/0"},
      {"TerminalInputNotBool", R"({"terminal": {"input": 1}})", Errc::plan_wrong_type,
       "/plan/sandbox/terminal/input"},
  };
  return kRows;
}

TEST(SandboxJson, EveryRuleIsRefusedAtItsPointer) {
  for (auto const& row : refusals()) {
    SCOPED_TRACE(row.name);
    auto r = parse_requirements(js(row.sandbox), "/plan/sandbox");
    ASSERT_FALSE(r);
    ASSERT_EQ(r.error().diagnostics.size(), 1U) << r.error().message();
    EXPECT_EQ(r.error().code, row.code) << r.error().message();
    EXPECT_EQ(r.error().diagnostics[0].code, row.code);
    EXPECT_EQ(r.error().diagnostics[0].pointer, row.pointer);
  }
}

TEST(SandboxJson, BoundsAreTooLarge) {
  auto list_of = [](std::size_t n, std::string const& item) {
    std::string s = "[";
    for (std::size_t i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
  };
  struct Case {
    std::string sandbox;
    std::string pointer;
  };
  std::vector<Case> const cases = {
      {R"({"filesystem": )" + list_of(kMaxFilesystemEntries + 1, R"({"path": "/a", "allow": []})") +
           "}",
       "/plan/sandbox/filesystem"},
      {R"({"filesystem": [{"path": ")" + big_path(kMaxPathBytes + 1) + R"(", "allow": []}]})",
       "/plan/sandbox/filesystem/0/path"},
      {R"({"filesystem": [{"path": "/a", "allow": )" +
           list_of(kMaxSetListItems + 1, R"("metadata")") + "}]}",
       "/plan/sandbox/filesystem/0/allow"},
      {R"({"environment": {"allow": )" + list_of(kMaxEnvAllow + 1, R"("A")") + "}}",
       "/plan/sandbox/environment/allow"},
      {R"({"network": {"outbound": {"tcp_connect": )" + list_of(kMaxTcpPorts + 1, "443") + "}}}",
       "/plan/sandbox/network/outbound/tcp_connect"},
      {R"({"secrets": )" + list_of(kMaxSecrets + 1, R"({"ref": "a", "to": {"fd": 3}})") + "}",
       "/plan/sandbox/secrets"},
      {R"({"terminal": {"modes": )" + list_of(kMaxSetListItems + 1, R"("pipes")") + "}}",
       "/plan/sandbox/terminal/modes"},
  };
  for (auto const& c : cases) {
    SCOPED_TRACE(c.pointer);
    auto r = parse_requirements(js(c.sandbox), "/plan/sandbox");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::plan_too_large) << r.error().message();
    EXPECT_EQ(r.error().diagnostics.at(0).pointer, c.pointer);
  }
  // At the bound exactly, accepted.
  EXPECT_TRUE(parse_requirements(
      js(R"({"secrets": )" + list_of(kMaxSecrets, R"({"ref": "a", "to": {"fd": 3}})") + "}"),
      "/plan/sandbox"));
  EXPECT_TRUE(parse_requirements(
      js(R"({"filesystem": [{"path": ")" + big_path(kMaxPathBytes) + R"(", "allow": []}]})"),
      "/plan/sandbox"));
}

TEST(SandboxJson, EveryProblemIsReportedAtOnce) {
  auto r = parse_requirements(js(R"({"filesystem": [{"path": "rel", "allow": ["fly"]}],
                                     "process": {"descendants": true},
                                     "network": {"outbound": "some"},
                                     "terminal": {"modes": []}, "x": 1})"),
                              "/plan/sandbox");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::plan_invalid);
  std::vector<std::string> pointers;
  for (auto const& d : r.error().diagnostics) pointers.push_back(d.pointer);
  EXPECT_EQ(pointers,
            (std::vector<std::string>{
                "/plan/sandbox/x", "/plan/sandbox/filesystem/0/path",
                "/plan/sandbox/filesystem/0/allow/0", "/plan/sandbox/process/max_processes",
                "/plan/sandbox/network/outbound", "/plan/sandbox/terminal/modes"}));
}

TEST(SandboxJson, PathsAreNormalizedLexically) {
  auto r = req(
      R"({"filesystem": [{"path": "//usr/./lib//", "allow": []}, {"path": "/", "allow": []}]})");
  ASSERT_TRUE(r.filesystem);
  EXPECT_EQ((*r.filesystem)[0].path, "/usr/lib");
  EXPECT_EQ((*r.filesystem)[1].path, "/");
  // The same path twice with the same rights is one rule, not a conflict.
  auto same = req(R"({"filesystem": [{"path": "/a", "allow": ["read", "metadata"]},
                                     {"path": "/a/", "allow": ["metadata", "read", "read"]}]})");
  EXPECT_EQ(effective(same).filesystem.size(), 1U);
}

TEST(SandboxJson, TheApiExampleParses) {
  auto r = req(R"({
    "filesystem": [{"path": "/usr", "allow": ["discover", "metadata", "read", "execute"]},
                   {"path": "/srv/work/w1", "allow": ["discover", "metadata", "read", "create",
                                                    "write", "remove"]}],
    "process": {"descendants": true, "max_processes": 64, "signal_scope": "own_tree",
                "run_as_root": false},
    "environment": {"allow": ["PATH", "HOME", "LANG"]},
    "network": {"outbound": "none"},
    "secrets": [{"ref": "db-password", "to": {"env": "DB_PASSWORD"}},
                {"ref": "tls-key", "to": {"file": "tls.key"}},
                {"ref": "api-token", "to": {"fd": 3}}],
    "resources": {"enforce": ["wall_ms", "output_bytes", "memory_bytes", "processes"]},
    "terminal": {"modes": ["pipes"], "input": true, "resize": false}})");
  auto const p = effective(r);
  EXPECT_EQ(p.filesystem.size(), 2U);
  EXPECT_TRUE(p.process.descendants);
  EXPECT_EQ(p.process.max_processes, 64U);
  EXPECT_EQ(p.environment.allow, (std::vector<std::string>{"HOME", "LANG", "PATH"}));
  EXPECT_EQ(p.secrets.size(), 3U);
  EXPECT_EQ(p.secrets[0].ref, "api-token");  // sorted by ref
  EXPECT_TRUE(p.terminal.input);
  EXPECT_EQ(p.resources.enforce.members().size(), 4U);
}

TEST(SandboxJson, PrintThenParseGivesTheSameRequirements) {
  auto const r = req(R"({"network": {"outbound": {"tcp_connect": [443, 22, 443]}},
                         "secrets": [{"ref": "k", "to": {"fd": 7}}],
                         "terminal": {"resize": true}})");
  auto again = parse_requirements(to_json(r), "/plan/sandbox");
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(*again, r);
  // Absent stays absent: {} prints as {}.
  EXPECT_EQ(to_json(SandboxRequirements{}), js("{}"));
}

RC_GTEST_PROP(SandboxJsonProps, ParseOfPrintIsIdentity, ()) {
  auto const r = *testing::gen_requirements();
  auto again = parse_requirements(to_json(r), "/plan/sandbox");
  RC_ASSERT(static_cast<bool>(again));
  bool const same = *again == r;
  RC_ASSERT(same);
}

RC_GTEST_PROP(SandboxJsonProps, ThePolicyPrintsAsRequirementsMeaningTheSame, ()) {
  auto const policy = effective(*testing::gen_requirements());
  auto again = parse_requirements(to_json(policy), "/plan/sandbox");
  RC_ASSERT(static_cast<bool>(again));
  bool const same = effective(*again) == policy;
  RC_ASSERT(same);
}

}  // namespace
}  // namespace custos::sandbox
