// PlanView: the effective values of an ExecutionPlan that the supervisor and backends act on,
// flattened into plain fields with every default already applied. Keeping the mapping in one file
// means the rest of the supervisor does not depend on how core lays out its plan.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"

namespace custos::backend {

struct EnvEntryView {
  std::string name;
  std::optional<std::string> value;  // nullopt: inherited from the caller's environment
};

struct PlanView {
  std::string executable;
  std::vector<std::string> argv;
  std::vector<EnvEntryView> env;
  std::string workspace_root;
  std::string cwd;  // relative to workspace_root; "" = the root

  bool pty = false;
  std::uint16_t rows = 24;
  std::uint16_t cols = 80;
  bool resize = false;

  // Limits; nullopt = unlimited.
  std::optional<std::uint64_t> wall_ms;
  std::optional<std::uint64_t> cpu_ms;
  std::optional<std::uint64_t> memory_bytes;
  std::optional<std::uint64_t> processes;
  std::optional<std::uint64_t> open_files;
  std::optional<std::uint64_t> disk_bytes;
  std::optional<std::uint64_t> output_bytes;
  std::optional<std::uint64_t> stdin_bytes;

  // Output policy.
  std::uint64_t chunk_bytes = 65536;
  std::uint64_t retained_bytes = 1 << 20;
  std::uint64_t spool_bytes = 64ull << 20;
  std::uint64_t max_events = 100000;
  bool cancel_on_limit = false;  // on_limit: cancel (else truncate)

  // Escalation.
  int graceful_signal = 15;
  std::uint64_t grace_ms = 2000;
  std::uint64_t kill_after_ms = 5000;

  // Credentials named by the plan (nullopt: the caller's).
  struct User {
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    std::vector<std::uint32_t> groups;
  };
  std::optional<User> user;
};

[[nodiscard]] PlanView view_plan(core::ExecutionPlan const& plan);
// "sha256:<hex>" of the canonical identity+plan bytes.
[[nodiscard]] Result<std::string> compute_plan_digest(core::ExecutionIdentity const& identity,
                                                      core::ExecutionPlan const& plan);
[[nodiscard]] std::string const& session_of(core::ExecutionIdentity const& identity);
[[nodiscard]] boost::json::value identity_json(core::ExecutionIdentity const& identity);

}  // namespace custos::backend
