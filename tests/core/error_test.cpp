#include "custos/core/error.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace custos {
namespace {

TEST(Errors, EveryCodeHasOneUniqueWireString) {
  std::set<std::string_view> wires;
  std::set<Errc> codes;
  for (auto code : all_errcs()) {
    EXPECT_TRUE(codes.insert(code).second) << static_cast<int>(code);
    auto wire = errc_wire(code);
    EXPECT_TRUE(wires.insert(wire).second) << wire;
    EXPECT_NE(wire.find('.'), std::string_view::npos) << wire;
    EXPECT_EQ(errc_from_wire(wire), code);
  }
}

TEST(Errors, StableWireStrings) {
  // These strings are API (docs/api.md, docs/architecture.md "Errors"): they must never change.
  EXPECT_EQ(errc_wire(Errc::plan_invalid_cwd), "plan.invalid_cwd");
  EXPECT_EQ(errc_wire(Errc::sandbox_unsupported), "sandbox.unsupported");
  EXPECT_EQ(errc_wire(Errc::auth_stale_epoch), "auth.stale_epoch");
  EXPECT_EQ(errc_wire(Errc::spawn_failed), "spawn.failed");
  EXPECT_EQ(errc_wire(Errc::recovery_indeterminate), "recovery.indeterminate");
  EXPECT_EQ(errc_wire(Errc::exec_wait_timeout), "exec.wait_timeout");
  EXPECT_EQ(errc_wire(Errc::auth_denied), "auth.denied");
  EXPECT_EQ(static_cast<int>(Errc::plan_invalid_cwd), 1012);
}

TEST(Errors, EngineCodesMatchTheContract) {
  // API.md "Container executions" names these; the numbers are those the 8xxx range had.
  EXPECT_EQ(errc_wire(Errc::engine_unavailable), "engine.unavailable");
  EXPECT_EQ(errc_wire(Errc::engine_failed), "engine.failed");
  EXPECT_EQ(errc_wire(Errc::engine_container_not_found), "engine.container_not_found");
  EXPECT_EQ(errc_wire(Errc::engine_container_not_running), "engine.container_not_running");
  EXPECT_EQ(errc_wire(Errc::engine_gate_unavailable), "engine.gate_unavailable");
  EXPECT_EQ(static_cast<int>(Errc::engine_unavailable), 8000);
  EXPECT_EQ(static_cast<int>(Errc::engine_failed), 8001);
  EXPECT_EQ(static_cast<int>(Errc::engine_container_not_found), 8002);
  EXPECT_EQ(static_cast<int>(Errc::engine_container_not_running), 8003);
  EXPECT_EQ(static_cast<int>(Errc::engine_gate_unavailable), 8004);
  EXPECT_EQ(Error(Errc::engine_unavailable).recovery(), Recovery::preparation_retry);
  EXPECT_EQ(Error(Errc::engine_failed).recovery(), Recovery::preparation_retry);
  EXPECT_EQ(Error(Errc::engine_container_not_found).recovery(), Recovery::caller_correction);
  EXPECT_EQ(Error(Errc::engine_container_not_running).recovery(), Recovery::preparation_retry);
  EXPECT_EQ(Error(Errc::engine_gate_unavailable).recovery(), Recovery::caller_correction);
}

TEST(Errors, SandboxCodesMatchTheContract) {
  // API.md "Sandbox requirements and contracts" names these.
  EXPECT_EQ(errc_wire(Errc::sandbox_invalid), "sandbox.invalid");
  EXPECT_EQ(errc_wire(Errc::sandbox_undeclared), "sandbox.undeclared");
  EXPECT_EQ(errc_wire(Errc::sandbox_unsupported), "sandbox.unsupported");
  EXPECT_EQ(errc_wire(Errc::sandbox_required), "sandbox.required");
  EXPECT_EQ(errc_wire(Errc::sandbox_secret_unknown), "sandbox.secret_unknown");
  EXPECT_EQ(static_cast<int>(Errc::sandbox_required), 7004);
  EXPECT_EQ(static_cast<int>(Errc::sandbox_secret_unknown), 7005);
  for (auto c : {Errc::sandbox_invalid, Errc::sandbox_undeclared, Errc::sandbox_unsupported,
                 Errc::sandbox_required, Errc::sandbox_secret_unknown}) {
    EXPECT_EQ(Error(c).recovery(), Recovery::caller_correction) << errc_wire(c);
  }
}

TEST(Errors, SecretStoreCodesFollowTheSandboxRange) {
  // docs/api.md "Secrets" names these; appended after sandbox.secret_unknown, never renumbered.
  EXPECT_EQ(errc_wire(Errc::secret_invalid_name), "secret.invalid_name");
  EXPECT_EQ(errc_wire(Errc::secret_too_large), "secret.too_large");
  EXPECT_EQ(errc_wire(Errc::secret_read_only), "secret.read_only");
  EXPECT_EQ(errc_wire(Errc::secret_store_unsafe), "secret.store_unsafe");
  EXPECT_EQ(static_cast<int>(Errc::secret_invalid_name), 7006);
  EXPECT_EQ(static_cast<int>(Errc::secret_too_large), 7007);
  EXPECT_EQ(static_cast<int>(Errc::secret_read_only), 7008);
  EXPECT_EQ(static_cast<int>(Errc::secret_store_unsafe), 7009);
  for (auto c : {Errc::secret_invalid_name, Errc::secret_too_large, Errc::secret_read_only}) {
    EXPECT_EQ(Error(c).recovery(), Recovery::caller_correction) << errc_wire(c);
  }
  EXPECT_EQ(Error(Errc::secret_store_unsafe).recovery(), Recovery::quarantine);
}

TEST(Errors, RecoveryClasses) {
  EXPECT_EQ(Error(Errc::plan_invalid_cwd).recovery(), Recovery::caller_correction);
  EXPECT_EQ(Error(Errc::auth_stale_epoch).recovery(), Recovery::reauthorize);
  EXPECT_EQ(Error(Errc::registry_corrupt_record).recovery(), Recovery::quarantine);
  EXPECT_EQ(recovery_wire(Recovery::cancel_reap), "cancel_reap");
}

TEST(Errors, FromDiagnostics) {
  auto one = Error::from_diagnostics({{Errc::plan_invalid_cwd, "/plan/cwd", "escapes"}});
  EXPECT_EQ(one.code, Errc::plan_invalid_cwd);
  auto two = Error::from_diagnostics({{Errc::plan_invalid_cwd, "/plan/cwd", "escapes"},
                                      {Errc::plan_empty_argv, "/plan/command/argv", "empty"}});
  EXPECT_EQ(two.code, Errc::plan_invalid);
  EXPECT_EQ(two.diagnostics.size(), 2U);
}

}  // namespace
}  // namespace custos
