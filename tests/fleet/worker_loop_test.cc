// What one worker thread does with a failed attempt, per strategy: retry only on a token, end
// the call on a denial, report successes. A fake budget and a scripted backend, no server.
#include "tools/fleet/worker_loop.h"

#include <deque>
#include <stop_token>
#include <string>

#include "gtest/gtest.h"
#include "retrybudget/clock.h"
#include "retrybudget/retry.h"

namespace retrybudget::fleet {
namespace {

class FakeBudget : public TenantBudget {
 public:
  explicit FakeBudget(int tokens) : tokens_(tokens) {}
  using TenantBudget::Refund;
  using TenantBudget::TryAcquire;
  // All or nothing, as the client's.
  bool TryAcquire(uint32_t cost) override {
    ++acquires;
    if (tokens_ < static_cast<int>(cost)) return false;
    tokens_ -= static_cast<int>(cost);
    return true;
  }
  void Refund(uint32_t cost) override { tokens_ += static_cast<int>(cost); }
  void RecordRequest() override { ++requests; }
  void RecordSuccess() override { ++successes; }
  const std::string& tenant() const override { return name_; }
  TenantStats Stats() const override { return {}; }

  int acquires = 0;
  int requests = 0;
  int successes = 0;

 private:
  int tokens_;
  std::string name_ = "t";
};

// Attempts succeed or fail as scripted; past the script they fail.
class ScriptedBackend : public Backend {
 public:
  explicit ScriptedBackend(std::deque<bool> script) : script_(std::move(script)) {}
  bool Call() override {
    ++calls;
    if (script_.empty()) return false;
    bool ok = script_.front();
    script_.pop_front();
    return ok;
  }
  int calls = 0;

 private:
  std::deque<bool> script_;
};

TEST(RunLogicalCallTest, BudgetRetriesWhileTokensLastThenTheDenialEndsTheCall) {
  FakeBudget budget(2);
  ScriptedBackend backend({false, false, false, false});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kBudget, {}, backend, &budget, stop.get_token(), counts);
  EXPECT_EQ(backend.calls, 3);  // first attempt + 2 retries, then denied
  EXPECT_EQ(counts.calls, 1u);
  EXPECT_EQ(counts.attempts, 3u);
  EXPECT_EQ(counts.retries_allowed, 2u);
  EXPECT_EQ(counts.retries_denied, 1u);
  EXPECT_EQ(counts.failures, 1u);
  EXPECT_EQ(counts.successes, 0u);
  EXPECT_EQ(budget.successes, 0);
}

TEST(RunLogicalCallTest, BudgetSuccessAfterARetryRecordsOneSuccess) {
  FakeBudget budget(5);
  ScriptedBackend backend({false, true});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kBudget, {}, backend, &budget, stop.get_token(), counts);
  EXPECT_EQ(counts.attempts, 2u);
  EXPECT_EQ(counts.retries_allowed, 1u);
  EXPECT_EQ(counts.successes, 1u);
  EXPECT_EQ(counts.failures, 0u);
  EXPECT_EQ(budget.successes, 1);
}

TEST(RunLogicalCallTest, BudgetRecordsOneRequestPerCallAndTakesTheCostOfEveryRetry) {
  FakeBudget budget(12);  // two retries of 5, then 2 left: the third is denied (all or nothing)
  ScriptedBackend backend({false, false, false, false});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kBudget, {.retry_cost = 5}, backend, &budget, stop.get_token(),
                 counts);
  EXPECT_EQ(budget.requests, 1);
  EXPECT_EQ(counts.requests, 1u);
  EXPECT_EQ(counts.retries_allowed, 2u);
  EXPECT_EQ(counts.tokens_spent, 10u);
  EXPECT_EQ(counts.retries_denied, 1u);
  EXPECT_EQ(budget.acquires, 3);
}

TEST(RunLogicalCallTest, FirstAttemptSuccessNeverAsksTheBudget) {
  FakeBudget budget(0);
  ScriptedBackend backend({true});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kBudget, {}, backend, &budget, stop.get_token(), counts);
  EXPECT_EQ(budget.acquires, 0);
  EXPECT_EQ(counts.successes, 1u);
}

TEST(RunLogicalCallTest, MaxAttemptsCapsABudgetedCallWithoutSpendingATokenForIt) {
  FakeBudget budget(100);
  ScriptedBackend backend({});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kBudget, {.max_attempts = 3}, backend, &budget, stop.get_token(), counts);
  EXPECT_EQ(counts.attempts, 3u);
  EXPECT_EQ(counts.retries_allowed, 2u);
  EXPECT_EQ(budget.acquires, 2);
  EXPECT_EQ(counts.failures, 1u);
}

TEST(RunLogicalCallTest, StopEndsTheCallWithoutTakingAToken) {
  FakeBudget budget(100);
  ScriptedBackend backend({});
  std::stop_source stop;
  stop.request_stop();
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kBudget, {}, backend, &budget, stop.get_token(), counts);
  EXPECT_EQ(counts.attempts, 1u);
  EXPECT_EQ(budget.acquires, 0);
  EXPECT_EQ(counts.retries_denied, 0u);
  EXPECT_EQ(counts.failures, 1u);
}

TEST(RunLogicalCallTest, UnbudgetedRetriesUpToFourAttemptsWithNoBudget) {
  ScriptedBackend backend({});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kUnbudgeted, {}, backend, nullptr, stop.get_token(), counts);
  EXPECT_EQ(counts.attempts, 4u);
  EXPECT_EQ(counts.retries_allowed, 3u);
  EXPECT_EQ(counts.retries_denied, 0u);
  EXPECT_EQ(counts.failures, 1u);
}

// The retry helper, with no sleeping worth the name: zero backoff.
constexpr CallOptions kNoBackoff = {.backoff_initial = absl::ZeroDuration(),
                                    .backoff_max = absl::ZeroDuration()};

TEST(RunLogicalCallTest, RetryHelperCountsLikeBudgetAndItsDenialIsBudgetExhausted) {
  FakeBudget budget(2);
  ScriptedBackend backend({false, false, false, false});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kRetryHelper, kNoBackoff, backend, &budget, stop.get_token(),
                 counts);
  EXPECT_EQ(backend.calls, 3);  // first attempt + 2 retries, then the budget said no
  EXPECT_EQ(budget.acquires, 3);
  EXPECT_EQ(counts.calls, 1u);
  EXPECT_EQ(counts.attempts, 3u);
  EXPECT_EQ(counts.retries_allowed, 2u);
  EXPECT_EQ(counts.retries_denied, 1u);
  EXPECT_EQ(counts.failures, 1u);
  EXPECT_EQ(counts.successes, 0u);
}

TEST(RunLogicalCallTest, RetryHelperRecordsTheRequestAndPricesEveryRetryAtTheCost) {
  FakeBudget budget(7);  // one retry of 5, then 2 left: denied
  ScriptedBackend backend({false, false, false});
  std::stop_source stop;
  CallCounts counts;
  CallOptions options = kNoBackoff;
  options.retry_cost = 5;
  RunLogicalCall(RetryStrategy::kRetryHelper, options, backend, &budget, stop.get_token(),
                 counts);
  EXPECT_EQ(budget.requests, 1);
  EXPECT_EQ(counts.requests, 1u);
  EXPECT_EQ(counts.retries_allowed, 1u);
  EXPECT_EQ(counts.tokens_spent, 5u);
  EXPECT_EQ(counts.retries_denied, 1u);
}

TEST(RunLogicalCallTest, RetryHelperSuccessAfterARetryRecordsOneSuccess) {
  FakeBudget budget(5);
  ScriptedBackend backend({false, false, true});
  std::stop_source stop;
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kRetryHelper, kNoBackoff, backend, &budget, stop.get_token(),
                 counts);
  EXPECT_EQ(counts.attempts, 3u);
  EXPECT_EQ(counts.retries_allowed, 2u);
  EXPECT_EQ(counts.retries_denied, 0u);
  EXPECT_EQ(counts.successes, 1u);
  EXPECT_EQ(budget.successes, 1);
}

TEST(RunLogicalCallTest, RetryHelperMaxAttemptsEndsTheCallWithoutADenial) {
  FakeBudget budget(100);
  ScriptedBackend backend({});
  std::stop_source stop;
  CallCounts counts;
  CallOptions options = kNoBackoff;
  options.max_attempts = 3;
  RunLogicalCall(RetryStrategy::kRetryHelper, options, backend, &budget, stop.get_token(),
                 counts);
  EXPECT_EQ(counts.attempts, 3u);
  EXPECT_EQ(counts.retries_allowed, 2u);
  EXPECT_EQ(counts.retries_denied, 0u);
  EXPECT_EQ(counts.failures, 1u);
}

TEST(RunLogicalCallTest, RetryHelperStoppedMakesNoAttemptAndSpendsNoToken) {
  FakeBudget budget(100);
  ScriptedBackend backend({});
  std::stop_source stop;
  stop.request_stop();
  CallCounts counts;
  RunLogicalCall(RetryStrategy::kRetryHelper, kNoBackoff, backend, &budget, stop.get_token(),
                 counts);
  EXPECT_EQ(backend.calls, 0);  // the helper sends nothing once the caller gave up
  EXPECT_EQ(counts.retries_allowed, 0u);
  EXPECT_EQ(counts.retries_denied, 0u);
  EXPECT_EQ(counts.failures, 1u);
  EXPECT_EQ(budget.acquires, 0);
}

TEST(RetryStrategyTest, NamesRoundTripAndUnknownIsRefused) {
  for (RetryStrategy s :
       {RetryStrategy::kBudget, RetryStrategy::kUnbudgeted, RetryStrategy::kRetryHelper}) {
    absl::StatusOr<RetryStrategy> parsed = ParseRetryStrategy(RetryStrategyName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  absl::StatusOr<RetryStrategy> bad = ParseRetryStrategy("yolo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("yolo"), std::string::npos);
}

TEST(SimulatedBackendTest, FailsAtTheConfiguredRateAndSleepsTheLatencyOnTheClock) {
  FakeClock clock;
  SimulatedBackend backend({.failure_rate = 0.3, .latency = absl::Milliseconds(1), .seed = 42,
                            .clock = &clock});
  const absl::Time start = clock.Now();
  int failures = 0;
  constexpr int kCalls = 20'000;
  for (int i = 0; i < kCalls; ++i) failures += backend.Call() ? 0 : 1;
  EXPECT_NEAR(failures / double{kCalls}, 0.3, 0.02);
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(kCalls));
}

TEST(SimulatedBackendTest, RatesZeroAndOneAreExact) {
  FakeClock clock;
  SimulatedBackend never({.failure_rate = 0, .latency = absl::ZeroDuration(), .clock = &clock});
  SimulatedBackend always({.failure_rate = 1, .latency = absl::ZeroDuration(), .clock = &clock});
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(never.Call());
    ASSERT_FALSE(always.Call());
  }
}

}  // namespace
}  // namespace retrybudget::fleet
