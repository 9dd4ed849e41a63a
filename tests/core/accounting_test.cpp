// Output accounting: exact counts at the retention bound, explicit drops, overflow, and the
// invariant under any sequence of chunks and limits.
#include "custos/core/accounting.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <limits>
#include <vector>

namespace custos::core {
namespace {

constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();

TEST(Accounting, StreamWireNames) {
  EXPECT_EQ(stream_wire(Stream::stdout_stream), "stdout");
  EXPECT_EQ(stream_wire(Stream::stderr_stream), "stderr");
  EXPECT_EQ(stream_wire(Stream::pty), "pty");
  for (auto s : {Stream::stdout_stream, Stream::stderr_stream, Stream::pty}) {
    EXPECT_EQ(stream_from_wire(stream_wire(s)), s);
  }
  EXPECT_EQ(stream_from_wire("stdin"), std::nullopt);
}

TEST(Accounting, RetainsUpToTheBoundThenDrops) {
  StreamAccounting a;
  a = account_chunk(a, 600, 1000).value();
  EXPECT_EQ(a, (StreamAccounting{600, 600, 0, true}));
  a = account_chunk(a, 600, 1000).value();
  EXPECT_EQ(a, (StreamAccounting{1200, 1000, 200, false}));
  a = account_chunk(a, 50, 1000).value();
  EXPECT_EQ(a, (StreamAccounting{1250, 1000, 250, false}));
  // Exactly at the bound is still complete.
  auto b = account_chunk(StreamAccounting{}, 1000, 1000).value();
  EXPECT_EQ(b, (StreamAccounting{1000, 1000, 0, true}));
  // A zero-byte chunk changes nothing.
  EXPECT_EQ(account_chunk(b, 0, 1000).value(), b);
  // A limit lowered below what is already retained drops everything new, keeps what is kept.
  EXPECT_EQ(account_chunk(b, 10, 10).value(), (StreamAccounting{1010, 1000, 10, false}));
}

TEST(Accounting, ExplicitDropsAndLosses) {
  auto a = account_chunk(StreamAccounting{}, 100, 1000).value();
  a = account_drop(a, 30).value();
  EXPECT_EQ(a, (StreamAccounting{130, 100, 30, false}));
  a = account_lose_retained(a, 40).value();
  EXPECT_EQ(a, (StreamAccounting{130, 60, 70, false}));
  EXPECT_EQ(account_lose_retained(a, 61).error().code, Errc::accounting_invariant);
  auto c = account_mark_incomplete(StreamAccounting{5, 5, 0, true}).value();
  EXPECT_EQ(c, (StreamAccounting{5, 5, 0, false}));
  EXPECT_TRUE(c.check());
  // Dropping nothing keeps a complete stream complete.
  EXPECT_EQ(account_drop(StreamAccounting{5, 5, 0, true}, 0).value(),
            (StreamAccounting{5, 5, 0, true}));
}

TEST(Accounting, InvariantViolationsAreDetected) {
  EXPECT_EQ((StreamAccounting{10, 5, 4, false}).check().error().code, Errc::accounting_invariant);
  EXPECT_EQ((StreamAccounting{10, 5, 5, true}).check().error().code, Errc::accounting_invariant);
  EXPECT_EQ((StreamAccounting{kMax, kMax, 1, false}).check().error().code,
            Errc::accounting_invariant);
  // Operations refuse to build on a broken value.
  EXPECT_EQ(account_chunk(StreamAccounting{10, 5, 4, false}, 1, 100).error().code,
            Errc::accounting_invariant);
  OutputAccounting out{{Stream::stdout_stream, {1, 1, 0, true}},
                       {Stream::stderr_stream, {2, 1, 0, true}}};
  auto r = check(out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::accounting_invariant);
  EXPECT_NE(r.error().context.find("stderr"), std::string::npos);
}

TEST(Accounting, OverflowIsAnErrorNotAWrap) {
  StreamAccounting a{kMax - 1, 0, kMax - 1, false};
  ASSERT_TRUE(a.check());
  EXPECT_EQ(account_chunk(a, 2, 0).error().code, Errc::accounting_invariant);
  EXPECT_EQ(account_drop(a, 2).error().code, Errc::accounting_invariant);
  auto b = account_chunk(a, 1, 0);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->observed, kMax);
  EXPECT_EQ(account_chunk(*b, 1, kMax).error().code, Errc::accounting_invariant);
  EXPECT_TRUE(account_chunk(*b, 0, kMax));
}

// Operation kinds for the property: chunk with a limit, drop, lose retained, mark incomplete.
RC_GTEST_PROP(AccountingProps, InvariantHoldsUnderAnySequence, ()) {
  auto const n = *rc::gen::inRange(0, 200);
  StreamAccounting a;
  for (int i = 0; i < n; ++i) {
    auto const op = *rc::gen::inRange(0, 4);
    // Mostly small numbers, sometimes near the top of u64 to exercise overflow.
    auto const bytes = *rc::gen::oneOf(rc::gen::inRange<std::uint64_t>(0, 70000),
                                       rc::gen::inRange<std::uint64_t>(kMax - 100000, kMax));
    auto const limit = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    Result<StreamAccounting> r = a;
    switch (op) {
      case 0:
        r = account_chunk(a, bytes, limit);
        break;
      case 1:
        r = account_drop(a, bytes);
        break;
      case 2:
        r = account_lose_retained(a, bytes % (a.retained + 1));
        break;
      default:
        r = account_mark_incomplete(a);
        break;
    }
    if (!r) {
      // Only an overflow may fail here, and it must leave the previous value valid.
      RC_ASSERT(r.error().code == Errc::accounting_invariant);
      RC_ASSERT(bytes > kMax - a.observed);
      continue;
    }
    RC_ASSERT(bool(r->check()));
    RC_ASSERT(r->observed >= a.observed);
    RC_ASSERT(r->dropped >= a.dropped);
    if (a.dropped > 0 || !a.complete) RC_ASSERT(!r->complete);  // incompleteness is permanent
    if (op == 0) {
      RC_ASSERT(r->retained <= std::max(a.retained, limit));
      RC_ASSERT(r->observed - a.observed == bytes);
    }
    a = *r;
  }
  RC_ASSERT(a.observed == a.retained + a.dropped);
  RC_ASSERT(a.dropped == 0 || !a.complete);
}

}  // namespace
}  // namespace custos::core
