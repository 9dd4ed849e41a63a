// LaunchPermit: the only key to ExecutionManager::start (ARCHITECTURE.md step 5, "no public raw
// spawn"). The gateway mints one after its authorizing transaction committed (claim consumed,
// budget begun, lease used) for exactly one execution id, one (action, process) claim and one
// plan digest; start() takes it by value and refuses it unless it matches the request. It is
// move-only, and a moved-from permit is empty (valid() == false), so one authorization launches
// at most one execution.
//
// Who can mint: the constructor is private. Its friends are
//   - gateway::PermitMinter, defined only in src/gateway/gateway.cpp (the daemon's one door);
//   - supervisor::TestPermitMinter, declared here and DEFINED only in tests/support (used by the
//     test suites and the benchmark, which drive the manager below the gateway). scripts/lint
//     fails when any file under src/ defines it, so the daemon binary can never contain it.
// The supervisor layer sits below the gateway, so the friend is named by forward declaration.
#pragma once

#include <string>
#include <utility>

#include "custos/core/result.hpp"

namespace custos::gateway {
class PermitMinter;
}

namespace custos::supervisor {

class TestPermitMinter;

class LaunchPermit {
 public:
  LaunchPermit(LaunchPermit&& other) noexcept
      : execution_id_(std::exchange(other.execution_id_, {})),
        action_id_(std::exchange(other.action_id_, {})),
        process_id_(std::exchange(other.process_id_, {})),
        plan_digest_(std::exchange(other.plan_digest_, {})),
        user_checked_(std::exchange(other.user_checked_, false)),
        valid_(std::exchange(other.valid_, false)) {}
  LaunchPermit& operator=(LaunchPermit&& other) noexcept {
    if (this != &other) {
      execution_id_ = std::exchange(other.execution_id_, {});
      action_id_ = std::exchange(other.action_id_, {});
      process_id_ = std::exchange(other.process_id_, {});
      plan_digest_ = std::exchange(other.plan_digest_, {});
      user_checked_ = std::exchange(other.user_checked_, false);
      valid_ = std::exchange(other.valid_, false);
    }
    return *this;
  }
  LaunchPermit(LaunchPermit const&) = delete;
  LaunchPermit& operator=(LaunchPermit const&) = delete;
  ~LaunchPermit() = default;

  // False for a moved-from (spent) permit.
  [[nodiscard]] bool valid() const noexcept { return valid_; }
  // The execution id the authorization was consumed for; start() gives the execution this id.
  [[nodiscard]] std::string const& execution_id() const noexcept { return execution_id_; }
  // The (action, process) claim that was consumed: must be the request identity's.
  [[nodiscard]] std::string const& action_id() const noexcept { return action_id_; }
  [[nodiscard]] std::string const& process_id() const noexcept { return process_id_; }
  // The plan digest that was authorized: must be the digest of the request's identity + plan.
  [[nodiscard]] std::string const& plan_digest() const noexcept { return plan_digest_; }
  // True when the minter already checked the plan's `user` against the caller's authority (the
  // gateway's run_as_uids check); the manager then does not repeat its own "a non-root caller
  // runs only as itself" rule.
  [[nodiscard]] bool user_checked() const noexcept { return user_checked_; }

 private:
  friend class gateway::PermitMinter;
  friend class TestPermitMinter;
  LaunchPermit(std::string execution_id, std::string action_id, std::string process_id,
               std::string plan_digest, bool user_checked)
      : execution_id_(std::move(execution_id)),
        action_id_(std::move(action_id)),
        process_id_(std::move(process_id)),
        plan_digest_(std::move(plan_digest)),
        user_checked_(user_checked),
        valid_(true) {}

  std::string execution_id_;
  std::string action_id_;
  std::string process_id_;
  std::string plan_digest_;
  bool user_checked_ = false;
  bool valid_ = false;
};

// A fresh execution id ("ex-" + 16 hex digits from getrandom): ids are not guessable sequence
// numbers (they name executions across restarts). Minters use it before the authorization.
[[nodiscard]] Result<std::string> new_execution_id();

}  // namespace custos::supervisor
