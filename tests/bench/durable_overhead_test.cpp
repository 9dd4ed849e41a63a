// The registry's durable-writes model (bench/support) runs, cleans up after itself and shows group
// commit at work. Ratios are not asserted here (sanitizer build, noisy machine); scripts/bench
// reports them from a release build.
#include "custos/bench/durable_overhead.hpp"

#include <gtest/gtest.h>

#include "registry/helpers.hpp"

namespace custos::bench::test {
namespace {

TEST(DurableOverhead, RowIsMeasuredAndCleanedUp) {
  registry::test::TempDir t;
  auto r = durable_overhead(t.path(), 40, 8);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_GT(r->full_commit_us, 0);
  EXPECT_GT(r->sequential_us, 0);
  EXPECT_GT(r->concurrent_us, 0);
  EXPECT_EQ(r->executions, 40u);
  // The per-transaction figures and SQLite's own transaction beside them were measured.
  EXPECT_GT(r->running_txn_cpu_us, 0);
  EXPECT_GT(r->terminal_txn_cpu_us, 0);
  EXPECT_GT(r->sqlite_txn_cpu_us, 0);
  // 10 writes per execution (claim+record is one); concurrent launches share transactions and
  // fsyncs.
  EXPECT_EQ(r->concurrent_writes, 40u * 10u);
  EXPECT_LT(r->concurrent_transactions, r->concurrent_writes);
  EXPECT_LE(r->concurrent_full_commits, 40u);
  EXPECT_TRUE(std::filesystem::is_empty(t.path()));
}

}  // namespace
}  // namespace custos::bench::test
