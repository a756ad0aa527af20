// The fallback allowance as the worker computes it: episodes seen by polling the client's mode,
// each with a full bucket of the SafeShare the client last received plus its refill over the
// episode. A fake budget whose mode the test sets, and a FakeClock: no threads, no sleeping.
#include "tools/fleet/fallback_monitor.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "retrybudget/clock.h"

namespace retrybudget::fleet {
namespace {

class ModeBudget : public TenantBudget {
 public:
  bool TryAcquire(uint32_t) override { return false; }
  void Refund(uint32_t) override {}
  void RecordRequest() override {}
  void RecordSuccess() override {}
  const std::string& tenant() const override { return name_; }
  TenantStats Stats() const override { return stats; }

  TenantStats stats;

 private:
  std::string name_ = "t";
};

class FallbackMonitorTest : public ::testing::Test {
 protected:
  FallbackMonitor MakeMonitor() {
    return FallbackMonitor(budget_,
                           {.safe_share = [this] { return share_; },
                            .never_reached = {.capacity = 1, .refill_per_second = 0.1}},
                           &clock_);
  }
  void Poll(FallbackMonitor& m, BudgetMode mode, absl::Duration after) {
    clock_.Advance(after);
    budget_.stats.mode = mode;
    m.Poll(clock_.Now());
  }

  FakeClock clock_;
  ModeBudget budget_;
  std::optional<SafeShareView> share_ = SafeShareView{.capacity = 5, .refill_per_second = 15};
};

TEST_F(FallbackMonitorTest, NoFallbackMeansNoAllowance) {
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kLease, absl::ZeroDuration());
  Poll(m, BudgetMode::kLease, absl::Seconds(3));
  EXPECT_EQ(m.phase(), FallbackPhase::kBeforeFallback);
  const FallbackReport r = m.Finish();
  EXPECT_EQ(r.fallback_entries, 0u);
  EXPECT_EQ(r.fallback_allowance, 0);
  EXPECT_EQ(r.fallback_seconds, 0);
}

TEST_F(FallbackMonitorTest, OneEpisodeIsTheShareCapacityPlusRefillOverItsPollStretchedLength) {
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kLease, absl::ZeroDuration());
  // Seen in fallback 10 ms later: the episode may have begun right after the previous poll.
  Poll(m, BudgetMode::kFallback, absl::Milliseconds(10));
  EXPECT_EQ(m.phase(), FallbackPhase::kInFallback);
  Poll(m, BudgetMode::kFallback, absl::Seconds(2));
  Poll(m, BudgetMode::kLease, absl::Milliseconds(990));  // 3 s after the last poll without it
  EXPECT_EQ(m.phase(), FallbackPhase::kAfterFallback);
  const FallbackReport r = m.Finish();
  EXPECT_EQ(r.fallback_entries, 1u);
  EXPECT_DOUBLE_EQ(r.fallback_seconds, 3.0);
  EXPECT_DOUBLE_EQ(r.fallback_allowance, 5 + 15 * 3.0);
  EXPECT_EQ(r.safe_share_capacity, 5);
  EXPECT_EQ(r.safe_share_refill, 15);
  EXPECT_TRUE(r.lease_after_fallback);
}

TEST_F(FallbackMonitorTest, AnOpenEpisodeIsClosedAtFinish) {
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kFallback, absl::ZeroDuration());
  clock_.Advance(absl::Seconds(2));
  const FallbackReport r = m.Finish();
  EXPECT_DOUBLE_EQ(r.fallback_seconds, 2.0);
  EXPECT_DOUBLE_EQ(r.fallback_allowance, 5 + 15 * 2.0);
  EXPECT_FALSE(r.lease_after_fallback);
}

TEST_F(FallbackMonitorTest, AShareBelowOneTokenThatRefillsMayHoldOneToken) {
  share_ = SafeShareView{.capacity = 0.25, .refill_per_second = 0.5};
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kFallback, absl::ZeroDuration());
  clock_.Advance(absl::Seconds(4));
  const FallbackReport r = m.Finish();
  EXPECT_DOUBLE_EQ(r.fallback_allowance, 1 + 0.5 * 4);
}

TEST_F(FallbackMonitorTest, AClientThatNeverReachedTheServerUsesTheConfiguredBucket) {
  share_ = std::nullopt;
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kFallback, absl::ZeroDuration());
  clock_.Advance(absl::Seconds(10));
  const FallbackReport r = m.Finish();
  EXPECT_DOUBLE_EQ(r.fallback_allowance, 1 + 0.1 * 10);
}

TEST_F(FallbackMonitorTest, AnEpisodeBetweenTwoPollsIsFoundFromFallbackSpending) {
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kLease, absl::ZeroDuration());
  budget_.stats.fallback_allowed = 3;  // spent in fallback, never seen in that mode
  Poll(m, BudgetMode::kLease, absl::Milliseconds(5));
  const FallbackReport r = m.Finish();
  EXPECT_EQ(r.fallback_entries, 1u);
  EXPECT_DOUBLE_EQ(r.fallback_allowance, 5 + 15 * 0.005);
}

TEST_F(FallbackMonitorTest, AGrantDuringAnEpisodeCountsAFreshBucket) {
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kFallback, absl::ZeroDuration());
  budget_.stats.tokens_received = 4;  // leased between the polls: it may have re-entered fallback
  Poll(m, BudgetMode::kFallback, absl::Seconds(1));
  const FallbackReport r = m.Finish();
  EXPECT_EQ(r.fallback_entries, 2u);
  EXPECT_GE(r.fallback_allowance, 2 * 5 + 15 * 1.0);
}

TEST_F(FallbackMonitorTest, AnswersWithoutAGrantKeepOneEpisode) {
  // A cluster whose shard has no owner answers every Sync with the tenant UNAVAILABLE: the
  // client stays in fallback on the same bucket, however many Syncs succeed.
  FallbackMonitor m = MakeMonitor();
  Poll(m, BudgetMode::kFallback, absl::ZeroDuration());
  for (int i = 0; i < 50; ++i) Poll(m, BudgetMode::kFallback, absl::Milliseconds(200));
  const FallbackReport r = m.Finish();
  EXPECT_EQ(r.fallback_entries, 1u);
  EXPECT_DOUBLE_EQ(r.fallback_allowance, 5 + 15 * 10.0);
}

TEST_F(FallbackMonitorTest, PollsOnItsOwnThreadUntilFinish) {
  FallbackMonitor m(budget_, {.safe_share = [this] { return share_; }}, Clock::Real());
  budget_.stats.mode = BudgetMode::kFallback;
  m.Start(absl::Milliseconds(1));
  for (int i = 0; i < 2000 && m.phase() != FallbackPhase::kInFallback; ++i) {
    Clock::Real()->SleepUntil(absl::Now() + absl::Milliseconds(1), std::stop_token());
  }
  EXPECT_EQ(m.phase(), FallbackPhase::kInFallback);
  EXPECT_EQ(m.Finish().fallback_entries, 1u);
}

}  // namespace
}  // namespace retrybudget::fleet
