#include "server/token_bucket.h"

#include "gtest/gtest.h"

namespace retrybudget {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(TokenBucketTest, StartsAtInitialTokens) {
  TokenBucket b(10, 1, 4, kT0);
  EXPECT_DOUBLE_EQ(b.tokens(), 4);
}

TEST(TokenBucketTest, InitialAboveCapacityIsCapped) {
  TokenBucket b(10, 1, 50, kT0);
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
}

TEST(TokenBucketTest, RefillAddsRateTimesElapsed) {
  TokenBucket b(100, 2, 0, kT0);
  b.Refill(kT0 + absl::Milliseconds(1500));
  EXPECT_DOUBLE_EQ(b.tokens(), 3);
}

TEST(TokenBucketTest, RefillIsCappedAtCapacity) {
  TokenBucket b(5, 2, 0, kT0);
  b.Refill(kT0 + absl::Seconds(60));
  EXPECT_DOUBLE_EQ(b.tokens(), 5);
}

TEST(TokenBucketTest, TimeGoingBackwardsAddsNothing) {
  TokenBucket b(100, 1, 0, kT0);
  b.Refill(kT0 + absl::Seconds(10));
  b.Refill(kT0 + absl::Seconds(5));
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
  b.Refill(kT0 + absl::Seconds(11));  // counts from the latest time seen, not from t=5
  EXPECT_DOUBLE_EQ(b.tokens(), 11);
}

TEST(TokenBucketTest, DepositIsCappedAtCapacity) {
  TokenBucket b(10, 0, 9, kT0);
  b.Deposit(0.5);
  EXPECT_DOUBLE_EQ(b.tokens(), 9.5);
  b.Deposit(7);
  EXPECT_DOUBLE_EQ(b.tokens(), 10);
}

TEST(TokenBucketTest, TakeGivesWholeTokensOnly) {
  TokenBucket b(10, 0, 3.7, kT0);
  EXPECT_EQ(b.Take(10), 3u);
  EXPECT_NEAR(b.tokens(), 0.7, 1e-12);
  EXPECT_EQ(b.Take(1), 0u);
}

TEST(TokenBucketTest, TakeNeverGoesBelowZero) {
  TokenBucket b(10, 0, 2, kT0);
  EXPECT_EQ(b.Take(5), 2u);
  EXPECT_EQ(b.Take(5), 0u);
  EXPECT_GE(b.tokens(), 0);
}

TEST(TokenBucketTest, TenCreditsOfOneTenthMakeOneToken) {
  TokenBucket b(10, 0, 0, kT0);
  for (int i = 0; i < 10; ++i) b.Deposit(0.1);
  EXPECT_EQ(b.Take(5), 1u);
}

TEST(TokenBucketTest, ReconfigureKeepsLevelCappedAtNewCapacity) {
  TokenBucket b(100, 1, 80, kT0);
  b.Reconfigure(50, 3);
  EXPECT_DOUBLE_EQ(b.tokens(), 50);
  b.Take(50);
  b.Refill(kT0 + absl::Seconds(2));
  EXPECT_DOUBLE_EQ(b.tokens(), 6);
}

}  // namespace
}  // namespace retrybudget
