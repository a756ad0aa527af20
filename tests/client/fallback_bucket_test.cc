#include "client/cpp/fallback_bucket.h"

#include <cmath>
#include <cstdint>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace retrybudget::client_internal {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

TEST(FallbackBucketTest, StartsFullAtTheShareCapacityKeepingTheFraction) {
  FallbackBucket bucket({.capacity = 3.7, .refill_per_second = 1}, kStart);
  EXPECT_EQ(bucket.Refill(kStart, 0), 3u);
  EXPECT_TRUE(bucket.Full());  // a fourth whole token does not fit under 3.7
  EXPECT_EQ(bucket.NextTokenAt(), absl::InfiniteFuture());
  // All 3 taken: 0.7 left, the next whole token in 0.3 s.
  EXPECT_EQ(bucket.Refill(kStart, 0), 0u);
  EXPECT_EQ(bucket.NextTokenAt(), kStart + absl::Milliseconds(300));
  EXPECT_EQ(bucket.Refill(kStart + absl::Milliseconds(300), 0), 1u);
}

TEST(FallbackBucketTest, RefillsAtTheRateOnceTokensAreTaken) {
  FallbackBucket bucket({.capacity = 2, .refill_per_second = 4}, kStart);
  ASSERT_EQ(bucket.Refill(kStart, 0), 2u);
  EXPECT_TRUE(bucket.Full());
  EXPECT_EQ(bucket.NextTokenAt(), absl::InfiniteFuture());
  // Both taken; the step that sees it (at once) restarts the refill.
  EXPECT_EQ(bucket.Refill(kStart, 0), 0u);
  EXPECT_EQ(bucket.NextTokenAt(), kStart + absl::Milliseconds(250));
  EXPECT_EQ(bucket.Refill(kStart + absl::Milliseconds(250), 0), 1u);
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(10), 1), 1u);  // capped at 2 held
  EXPECT_TRUE(bucket.Full());
}

TEST(FallbackBucketTest, RefillLostWhileFullIsNeverCredited) {
  FallbackBucket bucket({.capacity = 5, .refill_per_second = 1}, kStart);
  ASSERT_EQ(bucket.Refill(kStart, 0), 5u);
  // Full for 100 s, then all 5 taken: the next step does not hand out 100 s of refill.
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(100), 0), 0u);
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(101), 0), 1u);
}

TEST(FallbackBucketTest, NeverHandsOutMoreThanCapacityPlusRefillTimesElapsed) {
  FallbackBucket bucket({.capacity = 3, .refill_per_second = 0.7}, kStart);
  uint64_t handed = bucket.Refill(kStart, 0);
  uint64_t held = handed;
  for (int ms = 1; ms <= 60'000; ms += 37) {
    held = held > 0 ? held - 1 : 0;  // a worker takes one now and then
    const uint64_t add = bucket.Refill(kStart + absl::Milliseconds(ms), held);
    held += add;
    handed += add;
    EXPECT_LE(static_cast<double>(handed), 3 + 0.7 * ms / 1000.0 + 1e-6) << ms;
  }
  EXPECT_GE(static_cast<double>(handed), 3 + 0.7 * 60 - 2);
}

using Credits = FallbackBucket::Credits;

Credits Successes(uint64_t n) { return {.successes = n}; }
Credits Requests(uint64_t n) { return {.requests = n}; }

// Successes (success_credit) and requests (request_credit) fund the bucket by the same rule:
// each case runs once with each.
class CreditTest : public ::testing::TestWithParam<bool> {
 protected:
  bool requests() const { return GetParam(); }
  BucketShape Shape(double capacity, double refill, double credit) const {
    BucketShape shape{.capacity = capacity, .refill_per_second = refill};
    (requests() ? shape.request_credit : shape.success_credit) = credit;
    return shape;
  }
  Credits Events(uint64_t n) const { return requests() ? Requests(n) : Successes(n); }
  uint64_t Of(const Credits& c) const { return requests() ? c.requests : c.successes; }
  uint64_t Other(const Credits& c) const { return requests() ? c.successes : c.requests; }
};

INSTANTIATE_TEST_SUITE_P(SuccessesAndRequests, CreditTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Requests" : "Successes"; });

TEST_P(CreditTest, CreditFillsTheBucketUpToItsCapacityAndSaysHowManyFit) {
  FallbackBucket bucket(Shape(4, 0, 0.5), kStart);
  Credits credited{.successes = 99, .requests = 99};
  ASSERT_EQ(bucket.Refill(kStart, 0, Events(10), &credited), 4u);
  EXPECT_EQ(Of(credited), 0u);  // full: no room, none credited here
  EXPECT_EQ(Other(credited), 0u);
  // 3 of the 4 taken: room for 3 tokens = 6 events, 3 arrive (1.5 tokens: one whole now).
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(1), 1, Events(3), &credited), 1u);
  EXPECT_EQ(Of(credited), 3u);
  // Room for 1.5 tokens (3 events) of the 10: 2 whole tokens with the half already there.
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(2), 2, Events(10), &credited), 2u);
  EXPECT_EQ(Of(credited), 3u);
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(3), 4, Events(10), &credited), 0u);
  EXPECT_EQ(Of(credited), 0u);  // full again
}

TEST_P(CreditTest, TheOtherKindOfEventEarnsNothing) {
  FallbackBucket bucket(Shape(4, 0, 0.5), kStart);
  ASSERT_EQ(bucket.Refill(kStart, 0), 4u);
  Credits credited;
  const Credits other = requests() ? Successes(10) : Requests(10);
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(1), 0, other, &credited), 0u);
  EXPECT_EQ(credited.successes + credited.requests, 0u);
}

TEST_P(CreditTest, NeverHandsOutMoreThanCapacityRefillAndTheCreditOfWhatItCredited) {
  FallbackBucket bucket(Shape(3, 0.7, 0.1), kStart);
  uint64_t handed = bucket.Refill(kStart, 0);
  uint64_t held = handed;
  uint64_t credited_total = 0;
  for (int ms = 1; ms <= 60'000; ms += 37) {
    held = held > 0 ? held - 1 : 0;
    Credits credited;
    const uint64_t add =
        bucket.Refill(kStart + absl::Milliseconds(ms), held, Events(ms % 7), &credited);
    credited_total += Of(credited);
    held += add;
    handed += add;
    EXPECT_LE(static_cast<double>(handed),
              3 + 0.7 * ms / 1000.0 + 0.1 * static_cast<double>(credited_total) + 1e-6)
        << ms;
  }
  EXPECT_GT(credited_total, 0u);
  // And the credit is spent: more than refill alone could give.
  EXPECT_GT(static_cast<double>(handed), 3 + 0.7 * 60);
}

TEST(FallbackBucketTest, SuccessesAreCreditedBeforeRequests) {
  FallbackBucket bucket({.capacity = 2, .refill_per_second = 0, .success_credit = 0.5,
                         .request_credit = 0.25},
                        kStart, /*start_full=*/false);
  Credits credited;
  // Room for 2 tokens: 3 successes (1.5) first, then 2 of the 5 requests (0.5).
  EXPECT_EQ(bucket.Refill(kStart, 0, {.successes = 3, .requests = 5}, &credited), 2u);
  EXPECT_EQ(credited.successes, 3u);
  EXPECT_EQ(credited.requests, 2u);
}

TEST(FallbackBucketTest, TheSmallerShapeTakesTheSmallerRequestCredit) {
  const BucketShape smaller = SmallerShape()({.capacity = 1, .request_credit = 0.2},
                                             {.capacity = 2, .request_credit = 0.1});
  EXPECT_EQ(smaller.capacity, 1);
  EXPECT_EQ(smaller.request_credit, 0.1);
}

TEST(FallbackBucketTest, AShareBelowOneTokenStillAccumulatesOne) {
  FallbackBucket bucket({.capacity = 0.5, .refill_per_second = 0.25}, kStart);
  EXPECT_EQ(bucket.Refill(kStart, 0), 0u);
  EXPECT_EQ(bucket.NextTokenAt(), kStart + absl::Seconds(2));
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(2), 0), 1u);
  EXPECT_EQ(bucket.Refill(kStart + absl::Seconds(60), 1), 0u);  // at most one
}

TEST(FallbackBucketTest, AZeroShareNeverAllows) {
  FallbackBucket bucket({.capacity = 0, .refill_per_second = 0}, kStart);
  EXPECT_EQ(bucket.Refill(kStart, 0), 0u);
  EXPECT_EQ(bucket.Refill(kStart + absl::Hours(1), 0), 0u);
  EXPECT_EQ(bucket.NextTokenAt(), absl::InfiniteFuture());
}

TEST(FallbackBucketTest, BadValuesCountAsZero) {
  FallbackBucket bucket({.capacity = -3, .refill_per_second = std::nan("")}, kStart);
  EXPECT_EQ(bucket.Refill(kStart + absl::Hours(1), 0), 0u);
  EXPECT_EQ(bucket.shape().capacity, 0);
  EXPECT_EQ(bucket.shape().refill_per_second, 0);
}

}  // namespace
}  // namespace retrybudget::client_internal
