#include "server/token_bucket.h"

#include "gtest/gtest.h"

namespace retrybudget {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

BucketLimits Limits(double capacity, double refill_per_second, double leased = 0) {
  return BucketLimits{
      .capacity = capacity, .refill_per_second = refill_per_second, .leased = leased};
}

TEST(TokenBucketTest, StartsAtInitialTokens) {
  TokenBucket b(4, 10, kT0);
  EXPECT_DOUBLE_EQ(b.tokens(), 4);
}

TEST(TokenBucketTest, InitialAboveCapacityIsCapped) {
  TokenBucket b(50, 10, kT0);
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
}

TEST(TokenBucketTest, RefillAddsRateTimesElapsed) {
  TokenBucket b(0, 100, kT0);
  b.Refill(Limits(100, 2), kT0 + absl::Milliseconds(1500));
  EXPECT_DOUBLE_EQ(b.tokens(), 3);
}

TEST(TokenBucketTest, RefillIsCappedAtCapacity) {
  TokenBucket b(0, 5, kT0);
  b.Refill(Limits(5, 2), kT0 + absl::Seconds(60));
  EXPECT_DOUBLE_EQ(b.tokens(), 5);
}

TEST(TokenBucketTest, TimeGoingBackwardsAddsNothing) {
  TokenBucket b(0, 100, kT0);
  b.Refill(Limits(100, 1), kT0 + absl::Seconds(10));
  b.Refill(Limits(100, 1), kT0 + absl::Seconds(5));
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
  b.Refill(Limits(100, 1), kT0 + absl::Seconds(11));  // counts from the latest time seen
  EXPECT_DOUBLE_EQ(b.tokens(), 11);
}

TEST(TokenBucketTest, DepositIsCappedAtCapacity) {
  TokenBucket b(9, 10, kT0);
  b.Deposit(Limits(10, 0), 0.5);
  EXPECT_DOUBLE_EQ(b.tokens(), 9.5);
  b.Deposit(Limits(10, 0), 7);
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
}

// Tokens the fleet holds count against the capacity: the level plus what is leased never
// passes it, and a level already above capacity - leased is not lowered, only not grown.
TEST(TokenBucketTest, LeasedTokensCountAgainstTheCapacity) {
  TokenBucket b(2, 10, kT0);
  b.Refill(Limits(10, 100, /*leased=*/6), kT0 + absl::Seconds(1));
  EXPECT_DOUBLE_EQ(b.tokens(), 4);
  b.Deposit(Limits(10, 100, 6), 5);
  EXPECT_DOUBLE_EQ(b.tokens(), 4);
  b.Deposit(Limits(10, 100, 9), 5);  // more leased since: kept at 4, not lowered to 1
  EXPECT_DOUBLE_EQ(b.tokens(), 4);
  b.Refill(Limits(10, 100, 0), kT0 + absl::Seconds(2));  // the leases came back
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
}

TEST(TokenBucketTest, TakeGivesWholeTokensOnly) {
  TokenBucket b(3.7, 10, kT0);
  EXPECT_EQ(b.Take(10), 3u);
  EXPECT_NEAR(b.tokens(), 0.7, 1e-12);
  EXPECT_EQ(b.Take(1), 0u);
}

TEST(TokenBucketTest, TakeNeverGoesBelowZero) {
  TokenBucket b(2, 10, kT0);
  EXPECT_EQ(b.Take(5), 2u);
  EXPECT_EQ(b.Take(5), 0u);
  EXPECT_GE(b.tokens(), 0);
}

TEST(TokenBucketTest, TenCreditsOfOneTenthMakeOneToken) {
  TokenBucket b(0, 10, kT0);
  for (int i = 0; i < 10; ++i) b.Deposit(Limits(10, 0), 0.1);
  EXPECT_EQ(b.Take(5), 1u);
}

TEST(TokenBucketTest, CapAtKeepsLevelCappedAtNewCapacity) {
  TokenBucket b(80, 100, kT0);
  b.CapAt(50);
  EXPECT_DOUBLE_EQ(b.tokens(), 50);
  b.Take(50);
  b.Refill(Limits(50, 3), kT0 + absl::Seconds(2));
  EXPECT_DOUBLE_EQ(b.tokens(), 6);
}

TEST(TokenBucketTest, RestoreKeepsADebtAndCapsAtCapacity) {
  TokenBucket b(5, 10, kT0);
  b.Restore(-3, 10, kT0 + absl::Seconds(1));
  EXPECT_DOUBLE_EQ(b.tokens(), -3);
  EXPECT_EQ(b.last_refill(), kT0 + absl::Seconds(1));
  b.Refill(Limits(10, 1), kT0 + absl::Seconds(3));  // refill pays the debt off first
  EXPECT_DOUBLE_EQ(b.tokens(), -1);
  b.Restore(40, 10, kT0 + absl::Seconds(4));
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
}

}  // namespace
}  // namespace retrybudget
