// Compilation (compile.hpp): default denial per domain, the rules against the plan and the
// caller, the contract (required, undeclared: every domain, with pointers), the secret store,
// and the order of the errors.
#include <gtest/gtest.h>

#include <string>

#include "custos/sandbox/controls.hpp"

#include "sandbox/fixtures.hpp"

namespace custos::sandbox {
namespace {

using testing::req;
using testing::roomy_plan;

std::vector<std::string> pointers(Error const& e) {
  std::vector<std::string> out;
  for (auto const& d : e.diagnostics) out.push_back(d.pointer);
  return out;
}

// ------------------------------------------------------------------------------ default denial

TEST(SandboxDefaults, AnEmptySandboxIsDeniedAtItsStrictest) {
  auto const p = effective(req("{}"));
  EXPECT_TRUE(p.filesystem.empty());  // nothing visible
  EXPECT_EQ(p.process, (ProcessPolicy{false, 1, SignalScope::own_tree, false}));
  EXPECT_TRUE(p.environment.allow.empty());
  EXPECT_EQ(p.network.outbound, Outbound::none);
  EXPECT_TRUE(p.network.tcp_ports.empty());
  EXPECT_TRUE(p.secrets.empty());
  EXPECT_TRUE(p.resources.enforce.empty());
  EXPECT_EQ(p.terminal, (TerminalPolicy{ModeSet{core::IoMode::pipes}, false, false}));
  EXPECT_EQ(p, SandboxPolicy{});
}

TEST(SandboxDefaults, AListedDomainWithoutItsFieldsIsAsStrictAsAnAbsentOne) {
  auto const p = effective(req(R"({"filesystem": [], "process": {}, "environment": {},
                                  "network": {}, "secrets": [], "resources": {},
                                  "terminal": {}})"));
  EXPECT_EQ(p, SandboxPolicy{});
}

TEST(SandboxDefaults, EachMissingFieldTakesItsStrictValue) {
  auto const p = effective(req(R"({"process": {"run_as_root": true},
                                  "terminal": {"input": true}})"));
  EXPECT_FALSE(p.process.descendants);
  EXPECT_EQ(p.process.max_processes, 1U);
  EXPECT_TRUE(p.process.run_as_root);
  EXPECT_EQ(p.terminal.modes, ModeSet{core::IoMode::pipes});
  EXPECT_TRUE(p.terminal.input);
  EXPECT_FALSE(p.terminal.resize);
}

TEST(SandboxDefaults, TheStrictestSandboxNeedsTheBaseControls) {
  auto checked = compile_plan(req("{}"), roomy_plan());
  ASSERT_TRUE(checked) << checked.error().message();
  EXPECT_EQ(checked->controls,
            (std::vector<std::string>{"environment.allow", "filesystem.mount_namespace",
                                      "network.no_inbound", "network.none",
                                      "process.no_descendants", "process.no_new_privs",
                                      "process.non_root", "process.pid_namespace"}));
}

// ------------------------------------------------------------------------------ plan rules

TEST(SandboxPlanRules, EnvironmentNamesMustBeAllowed) {
  auto plan = roomy_plan();
  plan.env = {{"PATH", std::nullopt}, {"CI", std::string{"1"}}, {"HOME", std::nullopt}};
  auto r = compile_plan(req(R"({"environment": {"allow": ["PATH"]}})"), plan);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_invalid);
  EXPECT_EQ(pointers(r.error()),
            (std::vector<std::string>{"/plan/env/1/name", "/plan/env/2/name"}));
  EXPECT_TRUE(compile_plan(req(R"({"environment": {"allow": ["PATH", "HOME", "CI"]}})"), plan));
}

TEST(SandboxPlanRules, TheIoModeAndResizeMustBeAllowed) {
  auto plan = roomy_plan();
  plan.io = {core::IoMode::pty, 24, 80, true};
  auto r = compile_plan(req("{}"), plan);
  ASSERT_FALSE(r);
  EXPECT_EQ(pointers(r.error()), (std::vector<std::string>{"/plan/io/mode", "/plan/io/resize"}));
  EXPECT_TRUE(compile_plan(req(R"({"terminal": {"modes": ["pty"], "resize": true}})"), plan));
  plan.io.resize = false;
  EXPECT_TRUE(compile_plan(req(R"({"terminal": {"modes": ["pty", "pipes"]}})"), plan));
}

TEST(SandboxPlanRules, EnforcingAnUnlimitedDimensionIsRefused) {
  auto plan = roomy_plan();
  plan.limits.memory_bytes = std::nullopt;
  plan.limits.open_files = std::nullopt;
  auto r = compile_plan(
      req(R"({"resources": {"enforce": ["wall_ms", "memory_bytes", "descriptors", "memory_bytes"]}})"),
      plan);
  ASSERT_FALSE(r);
  EXPECT_EQ(pointers(r.error()), (std::vector<std::string>{"/plan/sandbox/resources/enforce/1",
                                                           "/plan/sandbox/resources/enforce/2"}));
  EXPECT_NE(r.error().diagnostics[1].message.find("open_files"), std::string::npos);
}

TEST(SandboxPlanRules, SecretsDoNotCollideWithThePlan) {
  auto plan = roomy_plan();
  plan.env = {{"TOKEN", std::nullopt}, {"CUSTOS_SECRETS_DIR", std::string{"/tmp"}}};
  plan.limits.open_files = 64;
  auto r = compile_plan(req(R"({"environment": {"allow": ["TOKEN", "CUSTOS_SECRETS_DIR"]},
                                "secrets": [{"ref": "t", "to": {"env": "TOKEN"}},
                                            {"ref": "k", "to": {"file": "k"}},
                                            {"ref": "f", "to": {"fd": 64}}]})"),
                        plan);
  ASSERT_FALSE(r);
  EXPECT_EQ(pointers(r.error()),
            (std::vector<std::string>{"/plan/sandbox/secrets/0/to/env",
                                      "/plan/sandbox/secrets/2/to/fd", "/plan/env/1/name"}));
}

TEST(SandboxPlanRules, AReadOnlyWorkspaceStaysReadOnly) {
  auto plan = roomy_plan();
  plan.workspace = {"/srv/w", core::WorkspaceAccess::read_only};
  // An ancestor's write reaches the workspace; a rule inside it too; a sibling does not.
  auto r = compile_plan(req(R"({"filesystem": [
            {"path": "/srv", "allow": ["metadata", "read", "write"]},
            {"path": "/srv/w/out", "allow": ["metadata", "create", "remove", "create"]},
            {"path": "/srv/wx", "allow": ["metadata", "write"]}]})"),
                        plan);
  ASSERT_FALSE(r);
  EXPECT_EQ(pointers(r.error()), (std::vector<std::string>{"/plan/sandbox/filesystem/0/allow/2",
                                                           "/plan/sandbox/filesystem/1/allow/1",
                                                           "/plan/sandbox/filesystem/1/allow/2"}));
  // A rule at the root that narrows the ancestor back to read-only makes it fine.
  EXPECT_TRUE(compile_plan(req(R"({"filesystem": [
            {"path": "/srv", "allow": ["metadata", "read", "write"]},
            {"path": "/srv/w", "allow": ["metadata", "read", "discover"]}]})"),
                           plan));
  plan.workspace.access = core::WorkspaceAccess::writable;
  EXPECT_TRUE(compile_plan(
      req(R"({"filesystem": [{"path": "/srv", "allow": ["metadata", "write"]}]})"), plan));
}

// ------------------------------------------------------------------------------ compile()

struct Compiler {
  core::ExecutionPlan plan = roomy_plan();
  std::optional<SandboxRequirements> requirements;
  std::optional<SandboxRequirements> contract;
  std::uint32_t caller_uid = 1000;
  std::function<bool(std::string_view)> secret_exists;

  Result<std::optional<CheckedSandboxPlan>> run() const {
    CompileInput in;
    in.plan = &plan;
    in.requirements = requirements ? &*requirements : nullptr;
    in.contract = contract ? &*contract : nullptr;
    in.contract_of = "grant g7";
    in.caller_uid = caller_uid;
    in.secret_exists = secret_exists;
    return compile(in);
  }
};

TEST(SandboxCompile, UnsandboxedWithoutAContractIsNothingToCompile) {
  Compiler c;
  auto r = c.run();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_value());
}

TEST(SandboxCompile, AContractRequiresASandbox) {
  Compiler c;
  c.contract = req(R"({"network": {"outbound": "any"}})");
  auto r = c.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_required);
  EXPECT_EQ(r.error().recovery(), Recovery::caller_correction);
  EXPECT_EQ(pointers(r.error()), (std::vector<std::string>{"/plan/sandbox"}));
  // An empty contract is a contract too: it demands the strictest sandbox.
  c.contract = req("{}");
  EXPECT_EQ(c.run().error().code, Errc::sandbox_required);
}

TEST(SandboxCompile, TheCheckedPlanDoesNotDependOnTheContract) {
  Compiler c;
  c.requirements = req(R"({"network": {"outbound": {"tcp_connect": [443]}}})");
  auto alone = c.run();
  c.contract = req(R"({"network": {"outbound": "any"}, "process": {"run_as_root": true}})");
  auto under = c.run();
  ASSERT_TRUE(alone && under);
  EXPECT_EQ(**alone, **under);
  EXPECT_EQ(**alone, compile_plan(*c.requirements, c.plan).value());
}

TEST(SandboxCompile, ARootCallerNeedsRunAsRoot) {
  Compiler c;
  c.caller_uid = 0;
  c.requirements = req("{}");
  auto r = c.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_invalid);
  EXPECT_EQ(pointers(r.error()), (std::vector<std::string>{"/plan/sandbox/process/run_as_root"}));
  c.requirements = req(R"({"process": {"run_as_root": true}})");
  EXPECT_TRUE(c.run());
  // A non-root plan.user runs as that user: no run_as_root needed.
  c.requirements = req("{}");
  c.plan.user = core::UserSpec{1000, 1000, {}};
  EXPECT_TRUE(c.run());
  // And a plan.user of uid 0 needs it whoever asks.
  c.caller_uid = 1000;
  c.plan.user = core::UserSpec{0, 0, {}};
  EXPECT_EQ(pointers(c.run().error()),
            (std::vector<std::string>{"/plan/sandbox/process/run_as_root"}));
}

TEST(SandboxCompile, InvalidComesBeforeUndeclared) {
  Compiler c;
  c.caller_uid = 0;
  c.requirements = req(R"({"network": {"outbound": "any"}})");
  c.contract = req("{}");
  EXPECT_EQ(c.run().error().code, Errc::sandbox_invalid);
  c.caller_uid = 1000;
  EXPECT_EQ(c.run().error().code, Errc::sandbox_undeclared);
}

TEST(SandboxCompile, UnknownSecretsAfterTheContract) {
  Compiler c;
  c.requirements = req(R"({"secrets": [{"ref": "db", "to": {"env": "DB"}},
                                       {"ref": "api", "to": {"fd": 3}}]})");
  // No store: no ref is known.
  auto r = c.run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_secret_unknown);
  EXPECT_EQ(pointers(r.error()), (std::vector<std::string>{"/plan/sandbox/secrets/0/ref",
                                                           "/plan/sandbox/secrets/1/ref"}));
  // The store's answer decides per ref.
  c.secret_exists = [](std::string_view ref) { return ref == "db"; };
  EXPECT_EQ(pointers(c.run().error()), (std::vector<std::string>{"/plan/sandbox/secrets/1/ref"}));
  c.secret_exists = [](std::string_view) { return true; };
  ASSERT_TRUE(c.run());
  // A contract that does not declare a secret refuses it before the store is asked.
  bool asked = false;
  c.secret_exists = [&asked](std::string_view) { return asked = true; };
  c.contract = req(R"({"secrets": [{"ref": "db", "to": {"env": "DB"}}]})");
  auto u = c.run();
  ASSERT_FALSE(u);
  EXPECT_EQ(u.error().code, Errc::sandbox_undeclared);
  EXPECT_EQ(pointers(u.error()), (std::vector<std::string>{"/plan/sandbox/secrets/1"}));
  EXPECT_FALSE(asked);
}

// ------------------------------------------------------------------------------ undeclared

std::vector<std::string> undeclared_at(std::string_view plan, std::string_view contract) {
  std::vector<std::string> out;
  for (auto const& d : undeclared(req(plan), req(contract), "/plan/sandbox", "grant g7")) {
    EXPECT_EQ(d.code, Errc::sandbox_undeclared);
    EXPECT_NE(d.message.find("grant g7"), std::string::npos) << d.message;
    out.push_back(d.pointer);
  }
  return out;
}

using Ptrs = std::vector<std::string>;

TEST(SandboxUndeclared, TheStrictestPlanFitsEveryContract) {
  EXPECT_EQ(undeclared_at("{}", "{}"), Ptrs{});
  EXPECT_EQ(undeclared_at(R"({"process": {}, "terminal": {"modes": ["pipes"]}})", "{}"), Ptrs{});
}

TEST(SandboxUndeclared, FilesystemRightsArePerRightAndPerPath) {
  char const* contract = R"({"filesystem": [
      {"path": "/usr", "allow": ["discover", "metadata", "read", "execute"]},
      {"path": "/srv/w", "allow": ["discover", "metadata", "read", "write", "create", "remove"]},
      {"path": "/srv/w/.git", "allow": ["metadata", "read"]}]})";
  // Within: a subset, and a deeper path under a wider rule.
  EXPECT_EQ(
      undeclared_at(R"({"filesystem": [{"path": "/usr/bin", "allow": ["metadata", "execute"]}]})",
                    contract),
      Ptrs{});
  // A right the contract does not give there, and a path it does not list at all.
  EXPECT_EQ(undeclared_at(R"({"filesystem": [
                {"path": "/usr", "allow": ["metadata", "read", "write", "remove"]},
                {"path": "/etc", "allow": ["metadata"]}]})",
                          contract),
            (Ptrs{"/plan/sandbox/filesystem/0/allow/2", "/plan/sandbox/filesystem/0/allow/3",
                  "/plan/sandbox/filesystem/1/allow/0"}));
  // A plan rule above the contract's carve-out reaches into it: write on /srv/w reaches
  // /srv/w/.git, where the contract gives read only.
  EXPECT_EQ(undeclared_at(R"({"filesystem": [
                {"path": "/srv/w", "allow": ["metadata", "read", "write"]}]})",
                          contract),
            (Ptrs{"/plan/sandbox/filesystem/0/allow/2"}));
  // ... unless the plan narrows it there itself.
  EXPECT_EQ(undeclared_at(R"({"filesystem": [
                {"path": "/srv/w", "allow": ["metadata", "read", "write"]},
                {"path": "/srv/w/.git", "allow": []}]})",
                          contract),
            Ptrs{});
  // A plan rule at "/" reaches everything the contract lists less for.
  EXPECT_EQ(undeclared_at(R"({"filesystem": [{"path": "/", "allow": ["metadata"]}]})", contract),
            (Ptrs{"/plan/sandbox/filesystem/0/allow/0"}));
}

TEST(SandboxUndeclared, ProcessFields) {
  char const* contract = R"({"process": {"descendants": true, "max_processes": 8}})";
  EXPECT_EQ(undeclared_at(R"({"process": {"descendants": true, "max_processes": 8}})", contract),
            Ptrs{});
  EXPECT_EQ(undeclared_at(R"({"process": {"descendants": true, "max_processes": 9,
                                          "run_as_root": true}})",
                          contract),
            (Ptrs{"/plan/sandbox/process/max_processes", "/plan/sandbox/process/run_as_root"}));
  EXPECT_EQ(undeclared_at(R"({"process": {"descendants": true, "max_processes": 2}})", "{}"),
            (Ptrs{"/plan/sandbox/process/descendants"}));
}

TEST(SandboxUndeclared, EnvironmentNetworkSecretsTerminal) {
  EXPECT_EQ(undeclared_at(R"({"environment": {"allow": ["PATH", "HOME", "HOME"]}})",
                          R"({"environment": {"allow": ["PATH"]}})"),
            (Ptrs{"/plan/sandbox/environment/allow/1"}));
  EXPECT_EQ(undeclared_at(R"({"network": {"outbound": "any"}})",
                          R"({"network": {"outbound": {"tcp_connect": [443]}}})"),
            (Ptrs{"/plan/sandbox/network/outbound"}));
  EXPECT_EQ(undeclared_at(R"({"network": {"outbound": {"tcp_connect": [443, 22]}}})",
                          R"({"network": {"outbound": {"tcp_connect": [443]}}})"),
            (Ptrs{"/plan/sandbox/network/outbound/tcp_connect/1"}));
  EXPECT_EQ(undeclared_at(R"({"network": {"outbound": {"tcp_connect": [22]}}})",
                          R"({"network": {"outbound": "any"}})"),
            Ptrs{});
  // A secret is declared with its destination: the same ref elsewhere is another item.
  EXPECT_EQ(undeclared_at(R"({"secrets": [{"ref": "k", "to": {"env": "K"}},
                                          {"ref": "k", "to": {"file": "k"}}]})",
                          R"({"secrets": [{"ref": "k", "to": {"env": "K"}}]})"),
            (Ptrs{"/plan/sandbox/secrets/1"}));
  EXPECT_EQ(undeclared_at(R"({"terminal": {"modes": ["pty", "pipes"], "input": true,
                                           "resize": true}})",
                          R"({"terminal": {"modes": ["pipes"]}})"),
            (Ptrs{"/plan/sandbox/terminal/modes/0", "/plan/sandbox/terminal/input",
                  "/plan/sandbox/terminal/resize"}));
  // A contract that allows pty only does not allow the default pipes either.
  EXPECT_EQ(undeclared_at("{}", R"({"terminal": {"modes": ["pty"]}})"), (Ptrs{"/plan/sandbox"}));
}

TEST(SandboxUndeclared, TheContractsEnforcementIsAFloor) {
  char const* contract = R"({"resources": {"enforce": ["wall_ms", "output_bytes"]}})";
  EXPECT_EQ(undeclared_at(R"({"resources": {"enforce": ["output_bytes", "wall_ms", "cpu_ms"]}})",
                          contract),
            Ptrs{});
  EXPECT_EQ(undeclared_at(R"({"resources": {"enforce": ["wall_ms"]}})", contract),
            (Ptrs{"/plan/sandbox/resources/enforce"}));
  EXPECT_EQ(undeclared_at(R"({"resources": {}})", contract),
            (Ptrs{"/plan/sandbox/resources", "/plan/sandbox/resources"}));
  EXPECT_EQ(undeclared_at("{}", contract), (Ptrs{"/plan/sandbox", "/plan/sandbox"}));
}

}  // namespace
}  // namespace custos::sandbox
