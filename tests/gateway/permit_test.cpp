// The launch permit (supervisor/launch_permit.hpp) as the only key to ExecutionManager::start:
// it cannot be built or copied outside its minters, a spent (moved-from) permit launches
// nothing, and a permit minted for another plan, another claim or an id already in use is
// refused before anything exists. Real manager, real processes.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "custos/supervisor/launch_permit.hpp"

#include "supervisor/harness.hpp"
#include "support/launch_permit_minter.hpp"

namespace custos::supervisor {
namespace {

using testing::SupervisorTest;

// Nothing outside the minters constructs a permit, and none is ever copied.
static_assert(!std::is_default_constructible_v<LaunchPermit>);
static_assert(!std::is_copy_constructible_v<LaunchPermit>);
static_assert(!std::is_copy_assignable_v<LaunchPermit>);
static_assert(!std::is_constructible_v<LaunchPermit, std::string, std::string, std::string,
                                       std::string, bool>);
static_assert(std::is_nothrow_move_constructible_v<LaunchPermit>);

class PermitTest : public SupervisorTest {};

TEST_F(PermitTest, StartGivesTheExecutionThePermitsIdAndASpentPermitLaunchesNothing) {
  manager();
  auto req = request(sh("exit 0"));
  auto minted = TestPermitMinter::for_request(req);
  ASSERT_TRUE(minted.has_value());
  std::string const id = minted->execution_id();
  LaunchPermit taken = std::move(*minted);
  EXPECT_TRUE(taken.valid());
  // The moved-from permit is empty: it is the same authorization, already taken.
  EXPECT_FALSE(minted->valid());  // NOLINT(bugprone-use-after-move): that is the point
  auto refused =
      start_with_permit(*manager_, req, std::move(*minted));  // NOLINT(bugprone-use-after-move)
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::auth_denied);
  EXPECT_TRUE(manager_->list({}).empty());

  auto r = start_with_permit(*manager_, req, std::move(taken));
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->execution_id, id);
  ASSERT_TRUE(terminal(r->execution_id));
  EXPECT_EQ(manager_->list({}).size(), 1U);
}

TEST_F(PermitTest, APermitForAnotherPlanClaimOrUsedIdLaunchesNothing) {
  manager();
  auto req = request(sh("exit 0"));
  auto other = request(sh("exit 1"));
  // Another plan: the digest does not match.
  auto for_other = TestPermitMinter::for_request(other);
  ASSERT_TRUE(for_other.has_value());
  auto r1 = start_with_permit(*manager_, req, std::move(*for_other));
  ASSERT_FALSE(r1.has_value());
  EXPECT_EQ(r1.error().code, Errc::auth_digest_mismatch);

  // The right digest but another (action, process) claim.
  auto digest = core::plan_digest(req.identity, req.plan);
  ASSERT_TRUE(digest.has_value());
  auto r2 = start_with_permit(*manager_, req,
                              TestPermitMinter::mint("ex-claim-test", "act-other",
                                                     req.identity.process_id, digest->to_string()));
  ASSERT_FALSE(r2.has_value());
  EXPECT_EQ(r2.error().code, Errc::auth_denied);
  auto r3 = start_with_permit(*manager_, req,
                              TestPermitMinter::mint("ex-claim-test", req.identity.action_id,
                                                     "proc-other", digest->to_string()));
  ASSERT_FALSE(r3.has_value());
  EXPECT_EQ(r3.error().code, Errc::auth_denied);
  EXPECT_TRUE(manager_->list({}).empty()) << "a refused permit created an execution";

  // A valid permit, then a second one naming the id now in use.
  auto ok = start_with_permit(*manager_, req,
                              TestPermitMinter::mint("ex-reused-id", req.identity.action_id,
                                                     req.identity.process_id, digest->to_string()));
  ASSERT_TRUE(ok.has_value()) << ok.error().message();
  auto again = start_with_permit(
      *manager_, other,
      TestPermitMinter::mint("ex-reused-id", other.identity.action_id, other.identity.process_id,
                             core::plan_digest(other.identity, other.plan)->to_string()));
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, Errc::auth_denied);
  ASSERT_TRUE(terminal("ex-reused-id"));
  EXPECT_EQ(manager_->list({}).size(), 1U);
}

TEST_F(PermitTest, AnUncheckedPermitKeepsTheNonRootCallerRunsAsItselfRule) {
  manager();
  auto req = request(plan({"/bin/true"}));
  req.caller.uid = 1000;
  req.caller.gid = 1000;
  req.plan.user = core::UserSpec{0, 0, {}};
  auto r = start_with_test_permit(*manager_, req, /*user_checked=*/false);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::auth_user);
  EXPECT_TRUE(manager_->list({}).empty());
}

}  // namespace
}  // namespace custos::supervisor
