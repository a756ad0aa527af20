#include "client/cpp/demand_estimator.h"

#include "absl/time/time.h"
#include "client/cpp/refresh_policy.h"
#include "gtest/gtest.h"

namespace retrybudget::client_internal {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(DemandEstimatorTest, StartsAtZero) {
  DemandEstimator demand(kStart);
  EXPECT_EQ(demand.rate(), 0);
  demand.Observe(kStart + absl::Seconds(1), 0);
  EXPECT_EQ(demand.rate(), 0);
}

TEST(DemandEstimatorTest, ConvergesToASteadyRate) {
  DemandEstimator demand(kStart);
  uint64_t total = 0;
  for (int i = 1; i <= 200; ++i) {
    total += 10;  // 10 per 100 ms = 100/s
    demand.Observe(kStart + i * absl::Milliseconds(100), total);
  }
  EXPECT_NEAR(demand.rate(), 100, 6);
}

TEST(DemandEstimatorTest, DecaysWhenDemandStops) {
  DemandEstimator demand(kStart);
  demand.Observe(kStart + absl::Milliseconds(100), 100);
  const double high = demand.rate();
  demand.Observe(kStart + absl::Seconds(5), 100);
  EXPECT_LT(demand.rate(), high / 100);
}

TEST(DemandEstimatorTest, SameInstantObservationsStayFinite) {
  DemandEstimator demand(kStart);
  demand.Observe(kStart, 50);
  EXPECT_EQ(demand.rate(), 50);
}

TEST(WantForTest, RateTimesPeriodPlusBurstMinusHeld) {
  EXPECT_EQ(WantFor(100, absl::Milliseconds(200), 2, 0), 22u);
  EXPECT_EQ(WantFor(100, absl::Milliseconds(200), 2, 10), 12u);
  EXPECT_EQ(WantFor(100, absl::Milliseconds(200), 2, 50), 0u);
  EXPECT_EQ(WantFor(1e12, absl::Seconds(1), 2, 0), kMaxWant);
}

TEST(RefreshPolicyTest, LowWaterMarkIsTwentyPercentRoundedUp) {
  EXPECT_EQ(LowWaterMark(0), 0u);
  EXPECT_EQ(LowWaterMark(1), 1u);
  EXPECT_EQ(LowWaterMark(10), 2u);
  EXPECT_EQ(LowWaterMark(11), 3u);
}

TEST(RefreshPolicyTest, NextSyncDelayIsTheServerHintBoundedByOptions) {
  RefreshPolicy policy{.refresh_period = absl::Milliseconds(200),
                       .min_sync_interval = absl::Milliseconds(5)};
  EXPECT_EQ(NextSyncDelay(0, policy), absl::Milliseconds(200));
  EXPECT_EQ(NextSyncDelay(50, policy), absl::Milliseconds(50));
  EXPECT_EQ(NextSyncDelay(1, policy), absl::Milliseconds(5));
  EXPECT_EQ(NextSyncDelay(60'000, policy), absl::Milliseconds(200));
}

TEST(RefreshPolicyTest, RetryBackoffDoublesAndIsCapped) {
  RefreshPolicy policy{.min_sync_interval = absl::Milliseconds(5)};
  EXPECT_EQ(RetryBackoff(1, policy), absl::Milliseconds(20));
  EXPECT_EQ(RetryBackoff(2, policy), absl::Milliseconds(40));
  EXPECT_EQ(RetryBackoff(30, policy), absl::Seconds(1));
}

}  // namespace
}  // namespace retrybudget::client_internal
