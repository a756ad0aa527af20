#include "retrybudget/retry.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fake_budget.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/clock.h"

namespace retrybudget {
namespace {

using ::retrybudget::testing::FakeBudget;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

// A random source that replays `values` (the last one forever).
std::function<double()> Replay(std::vector<double> values) {
  auto i = std::make_shared<size_t>(0);
  return [values = std::move(values), i]() {
    const double v = values[std::min(*i, values.size() - 1)];
    ++*i;
    return v;
  };
}

RetryPolicy TestPolicy() {
  RetryPolicy p;
  p.max_attempts = 6;
  p.initial_backoff = Ms(100);
  p.max_backoff = Ms(500);
  p.multiplier = 2.0;
  return p;
}

class RetryTest : public ::testing::Test {
 protected:
  CallControl Control() {
    CallControl c;
    c.stop = stop_.get_token();
    c.clock = &clock_;
    c.random = Replay({0.5});
    return c;
  }

  FakeClock clock_;
  FakeBudget budget_;
  std::stop_source stop_;
};

TEST_F(RetryTest, FirstAttemptSucceedsWithoutTouchingTheBudget) {
  int calls = 0;
  absl::StatusOr<int> r = Retry(budget_, TestPolicy(), Control(), [&](const Attempt& a) {
    ++calls;
    EXPECT_EQ(a.number, 1);
    EXPECT_EQ(a.previous_attempts(), 0);
    return absl::StatusOr<int>(42);
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
  EXPECT_EQ(budget_.successes, 1);
  EXPECT_THAT(clock_.sleeps(), IsEmpty());
}

TEST_F(RetryTest, BackoffIsExponentialCappedAndFullyJittered) {
  std::vector<int> numbers;
  absl::StatusOr<int> r = Retry(budget_, TestPolicy(), Control(), [&](const Attempt& a) {
    numbers.push_back(a.number);
    return absl::StatusOr<int>(absl::UnavailableError(absl::StrCat("down ", a.number)));
  });
  // random = 0.5: half of the ceilings 100, 200, 400, 500 (capped), 500.
  EXPECT_THAT(clock_.sleeps(), ElementsAre(Ms(50), Ms(100), Ms(200), Ms(250), Ms(250)));
  EXPECT_THAT(numbers, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(r.status(), absl::UnavailableError("down 6"));  // the last error, unchanged
  EXPECT_FALSE(IsBudgetExhausted(r.status()));
  EXPECT_EQ(budget_.acquired, 5);
  EXPECT_EQ(budget_.successes, 0);
}

TEST_F(RetryTest, JitterIsDrawnPerRetryWithinZeroAndTheCeiling) {
  CallControl control = Control();
  control.random = Replay({0.0, 0.25, 0.999999, 7.0, -3.0});
  (void)Retry(budget_, TestPolicy(), control, [&](const Attempt&) {
    return absl::UnavailableError("down");
  });
  const std::vector<absl::Duration> sleeps = clock_.sleeps();
  ASSERT_EQ(sleeps.size(), 5u);
  EXPECT_EQ(sleeps[0], absl::ZeroDuration());  // 0.0 * 100ms
  EXPECT_EQ(sleeps[1], Ms(50));                // 0.25 * 200ms
  EXPECT_GT(sleeps[2], Ms(399));               // 0.999999 * 400ms, below the ceiling
  EXPECT_LT(sleeps[2], Ms(400));
  EXPECT_LT(sleeps[3], Ms(500));               // out of range is clamped below the ceiling
  EXPECT_GT(sleeps[3], Ms(499));
  EXPECT_EQ(sleeps[4], absl::ZeroDuration());  // negative is clamped to 0
}

TEST(ComputeBackoffTest, CeilingGrowsByTheMultiplierAndSaturatesAtMax) {
  RetryPolicy p = TestPolicy();
  p.multiplier = 3.0;
  EXPECT_EQ(ComputeBackoff(p, 1, 0.5), Ms(50));
  EXPECT_EQ(ComputeBackoff(p, 2, 0.5), Ms(150));
  EXPECT_EQ(ComputeBackoff(p, 3, 0.5), Ms(250));  // 900ms capped at 500ms
  EXPECT_EQ(ComputeBackoff(p, 10'000, 0.5), Ms(250));  // no overflow
  for (int retry = 1; retry < 8; ++retry) {
    EXPECT_GE(ComputeBackoff(p, retry, 0.0), absl::ZeroDuration());
    EXPECT_LT(ComputeBackoff(p, retry, 0.9999999), p.max_backoff);
  }
}

TEST_F(RetryTest, MaxAttemptsCountsTheFirstAttempt) {
  RetryPolicy p = TestPolicy();
  p.max_attempts = 3;
  int calls = 0;
  absl::Status s = Retry(budget_, p, Control(), [&](const Attempt&) {
    ++calls;
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(budget_.acquired, 2);

  p.max_attempts = 1;
  calls = 0;
  s = Retry(budget_, p, Control(), [&](const Attempt&) {
    ++calls;
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(budget_.acquired, 2);  // no retry, no token
}

TEST_F(RetryTest, NonRetryableErrorIsReturnedAtOnce) {
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](const Attempt&) {
    ++calls;
    return absl::InvalidArgumentError("bad row");
  });
  EXPECT_EQ(s, absl::InvalidArgumentError("bad row"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
}

TEST_F(RetryTest, DefaultRetryableCodes) {
  for (absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kAborted, absl::StatusCode::kDeadlineExceeded}) {
    int calls = 0;
    (void)Retry(budget_, TestPolicy(), Control(), [&](const Attempt&) {
      return ++calls == 1 ? absl::Status(code, "once") : absl::OkStatus();
    });
    EXPECT_EQ(calls, 2) << code;
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kInternal, absl::StatusCode::kNotFound, absl::StatusCode::kUnknown,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kCancelled}) {
    int calls = 0;
    (void)Retry(budget_, TestPolicy(), Control(), [&](const Attempt&) {
      return ++calls == 1 ? absl::Status(code, "once") : absl::OkStatus();
    });
    EXPECT_EQ(calls, 1) << code;
  }
}

TEST_F(RetryTest, UserPredicateCanRefuseARetry) {
  RetryPolicy p = TestPolicy();
  p.is_retryable = [](const absl::Status& s) { return s.message() != "permanent"; };
  int calls = 0;
  absl::Status s = Retry(budget_, p, Control(), [&](const Attempt&) {
    ++calls;
    return absl::UnavailableError(calls < 3 ? "transient" : "permanent");
  });
  EXPECT_EQ(s, absl::UnavailableError("permanent"));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(budget_.acquired, 2);
}

TEST_F(RetryTest, BudgetDenialReturnsTheLastErrorMarkedExhausted) {
  FakeBudget budget(/*tokens=*/1);
  int calls = 0;
  absl::StatusOr<std::string> r =
      Retry(budget, TestPolicy(), Control(), [&](const Attempt& a) -> absl::StatusOr<std::string> {
        ++calls;
        return absl::UnavailableError(absl::StrCat("down ", a.number));
      });
  EXPECT_EQ(calls, 2);  // the first attempt is free, the second took the only token
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "down 2");
  EXPECT_TRUE(IsBudgetExhausted(r.status()));
  EXPECT_EQ(budget.acquired, 1);
  EXPECT_EQ(budget.denied, 1);
  EXPECT_EQ(clock_.sleeps().size(), 1u);  // no sleep after the denial: it fails now
}

TEST(IsBudgetExhaustedTest, FalseForOkAndOrdinaryErrors) {
  EXPECT_FALSE(IsBudgetExhausted(absl::OkStatus()));
  EXPECT_FALSE(IsBudgetExhausted(absl::UnavailableError("down")));
  EXPECT_FALSE(IsBudgetExhausted(absl::ResourceExhaustedError("quota")));
  EXPECT_TRUE(IsBudgetExhausted(MarkBudgetExhausted(absl::UnavailableError("down"), 3)));
  EXPECT_TRUE(MarkBudgetExhausted(absl::OkStatus(), 1).ok());
}

TEST_F(RetryTest, AnInnerLayersBudgetExhaustionIsNotRetriedAgain) {
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](const Attempt&) {
    ++calls;
    return MarkBudgetExhausted(absl::UnavailableError("inner said no"), 2);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(IsBudgetExhausted(s));
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
}

TEST_F(RetryTest, SuccessAfterRetriesRecordsExactlyOneSuccess) {
  int calls = 0;
  absl::StatusOr<int> r = Retry(budget_, TestPolicy(), Control(), [&](const Attempt&) {
    return ++calls < 3 ? absl::StatusOr<int>(absl::UnavailableError("down"))
                       : absl::StatusOr<int>(7);
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 7);
  EXPECT_EQ(budget_.successes, 1);
  EXPECT_EQ(budget_.spent(), 2);
}

TEST_F(RetryTest, FailedCallRecordsNoSuccess) {
  (void)Retry(budget_, TestPolicy(), Control(),
              [&](const Attempt&) { return absl::UnavailableError("down"); });
  EXPECT_EQ(budget_.successes, 0);
}

TEST_F(RetryTest, WorksWithMoveOnlyResults) {
  absl::StatusOr<std::unique_ptr<int>> r =
      Retry(budget_, TestPolicy(), Control(),
            [&](const Attempt&) -> absl::StatusOr<std::unique_ptr<int>> {
              return std::make_unique<int>(5);
            });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(**r, 5);
}

// A clock whose SleepUntil blocks until the stop is requested (time never reaches the
// deadline), and tells the test when someone is asleep.
class BlockingClock : public Clock {
 public:
  absl::Time Now() override { return fake_.Now(); }
  bool SleepUntil(absl::Time, std::stop_token stop) override {
    std::unique_lock lock(mu_);
    ++sleepers_;
    cv_.notify_all();
    cv_.wait(lock, stop, [] { return false; });
    return false;
  }
  void WaitForSleeper() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return sleepers_ > 0; });
  }

 private:
  FakeClock fake_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  int sleepers_ = 0;
};

TEST_F(RetryTest, CancellationDuringBackoffWakesAtOnceAndRefundsTheToken) {
  BlockingClock clock;
  CallControl control = Control();
  control.clock = &clock;
  std::atomic<int> calls{0};
  absl::Status result;
  std::thread caller([&] {
    result = Retry(budget_, TestPolicy(), control, [&](const Attempt&) {
      ++calls;
      return absl::UnavailableError("down");
    });
  });
  clock.WaitForSleeper();  // attempt 1 failed, a token was taken, the backoff began
  EXPECT_EQ(budget_.acquired, 1);
  stop_.request_stop();
  caller.join();  // returns only because the sleep was interrupted
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(result.message(), HasSubstr("down"));
  EXPECT_EQ(calls, 1);  // the retry was never sent...
  EXPECT_EQ(budget_.refunded, 1);  // ...so its token went back
  EXPECT_EQ(budget_.spent(), 0);
}

TEST_F(RetryTest, EachRetryCostsWhatRetryCostSaysOfTheErrorBeforeIt) {
  RetryPolicy p = TestPolicy();
  p.max_attempts = 4;
  p.retry_cost = AwsRetryCost;
  std::vector<absl::Status> errors = {absl::UnavailableError("down"),
                                      absl::DeadlineExceededError("attempt timed out"),
                                      absl::ResourceExhaustedError("busy"),
                                      absl::UnavailableError("down")};
  absl::Status s = Retry(budget_, p, Control(), [&](const Attempt& a) {
    return errors[static_cast<size_t>(a.number - 1)];
  });
  EXPECT_EQ(s, absl::UnavailableError("down"));
  EXPECT_THAT(budget_.costs_asked(), ElementsAre(5, 10, 5));
  EXPECT_EQ(budget_.tokens(), 1'000'000 - 20);
}

TEST(AwsRetryCostTest, FiveForARetryableErrorTenForATimeout) {
  EXPECT_EQ(AwsRetryCost(absl::UnavailableError("x")), 5u);
  EXPECT_EQ(AwsRetryCost(absl::ResourceExhaustedError("x")), 5u);
  EXPECT_EQ(AwsRetryCost(absl::DeadlineExceededError("x")), 10u);
}

TEST_F(RetryTest, ARetryDeniedForItsCostIsBudgetExhausted) {
  FakeBudget budget(/*tokens=*/4);
  RetryPolicy p = TestPolicy();
  p.retry_cost = [](const absl::Status&) -> uint32_t { return 5; };
  absl::Status s = Retry(budget, p, Control(), [](const Attempt&) {
    return absl::UnavailableError("down");
  });
  EXPECT_TRUE(IsBudgetExhausted(s));
  EXPECT_EQ(budget.tokens(), 4);  // all or nothing: no partial take
  EXPECT_THAT(budget.costs_asked(), ElementsAre(5));
}

TEST_F(RetryTest, ACostOutOfRangeEndsTheCallNamingItAndTakesNothing) {
  for (const uint32_t bad : {0u, TenantBudget::kMaxCost + 1}) {
    FakeBudget budget;
    RetryPolicy p = TestPolicy();
    p.retry_cost = [bad](const absl::Status&) { return bad; };
    int calls = 0;
    absl::Status s = Retry(budget, p, Control(), [&](const Attempt&) {
      ++calls;
      return absl::UnavailableError("down");
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("RetryPolicy.retry_cost returned ", bad)));
    EXPECT_THAT(s.message(), HasSubstr("down"));
    EXPECT_EQ(calls, 1);
    EXPECT_THAT(budget.costs_asked(), IsEmpty());
  }
}

TEST_F(RetryTest, ARetryCancelledDuringItsBackoffRefundsItsCost) {
  BlockingClock clock;
  CallControl control = Control();
  control.clock = &clock;
  RetryPolicy p = TestPolicy();
  p.retry_cost = [](const absl::Status&) -> uint32_t { return 7; };
  absl::Status result;
  std::thread caller([&] {
    result = Retry(budget_, p, control, [&](const Attempt&) {
      return absl::UnavailableError("down");
    });
  });
  clock.WaitForSleeper();
  EXPECT_EQ(budget_.tokens(), 1'000'000 - 7);
  stop_.request_stop();
  caller.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(budget_.costs_refunded(), ElementsAre(7));
  EXPECT_EQ(budget_.tokens(), 1'000'000);
}

TEST_F(RetryTest, EachCallRecordsOneRequestWhateverItsAttempts) {
  (void)Retry(budget_, TestPolicy(), Control(), [](const Attempt& a) {
    return a.number < 3 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_EQ(budget_.requests, 1);
  (void)Retry(budget_, TestPolicy(), Control(), [](const Attempt&) {
    return absl::InvalidArgumentError("bad");
  });
  EXPECT_EQ(budget_.requests, 2);
  stop_.request_stop();  // a call that sends nothing is no request
  (void)Retry(budget_, TestPolicy(), Control(), [](const Attempt&) { return absl::OkStatus(); });
  EXPECT_EQ(budget_.requests, 2);
}

TEST_F(RetryTest, CancellationDuringRealClockBackoffReturnsPromptly) {
  RetryPolicy p = TestPolicy();
  p.initial_backoff = absl::Hours(1);
  p.max_backoff = absl::Hours(1);
  CallControl control = Control();
  control.clock = Clock::Real();
  control.random = Replay({0.99});
  const absl::Time start = absl::Now();
  std::jthread stopper([&] {
    absl::SleepFor(Ms(20));
    stop_.request_stop();
  });
  absl::Status s = Retry(budget_, p, control, [](const Attempt&) {
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the hour of backoff
  EXPECT_EQ(budget_.refunded, 1);
}

TEST_F(RetryTest, StopRequestedBeforeTheCallSendsNothing) {
  stop_.request_stop();
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](const Attempt&) {
    ++calls;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(budget_.successes, 0);
}

TEST_F(RetryTest, StopRequestedDuringAnAttemptIsVisibleToItAndEndsTheCall) {
  int calls = 0;
  bool seen_by_attempt = false;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](const Attempt& a) {
    ++calls;
    EXPECT_FALSE(a.stop.stop_requested());
    stop_.request_stop();  // the caller gives up while the attempt runs
    seen_by_attempt = a.stop.stop_requested();
    return absl::UnavailableError("interrupted");
  });
  EXPECT_TRUE(seen_by_attempt);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
  EXPECT_THAT(clock_.sleeps(), IsEmpty());
}

TEST_F(RetryTest, BackoffThatWouldCrossTheDeadlineFailsNowWithoutAToken) {
  CallControl control = Control();
  control.deadline = clock_.Now() + Ms(250);
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), control, [&](const Attempt&) {
    ++calls;
    return absl::UnavailableError("down");
  });
  // Backoffs 50ms (ends at +50) and 100ms (ends at +150) fit; 200ms would end at +350.
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("down"));
  EXPECT_THAT(clock_.sleeps(), ElementsAre(Ms(50), Ms(100)));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(budget_.acquired, 2);  // none for the retry that could not make it
  EXPECT_LE(clock_.Now(), control.deadline);
}

TEST_F(RetryTest, FirstBackoffPastTheDeadlineTakesNoToken) {
  CallControl control = Control();
  control.deadline = clock_.Now() + Ms(10);
  absl::Status s = Retry(budget_, TestPolicy(), control,
                         [&](const Attempt&) { return absl::UnavailableError("down"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
  EXPECT_THAT(clock_.sleeps(), IsEmpty());
}

TEST_F(RetryTest, DeadlinePassedBeforeTheCallSendsNothing) {
  CallControl control = Control();
  control.deadline = clock_.Now();
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), control, [&](const Attempt&) {
    ++calls;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(calls, 0);
}

TEST_F(RetryTest, AnAttemptsTimeoutIsRetriedWhileTheOverallDeadlineHasTime) {
  RetryPolicy p = TestPolicy();
  p.per_attempt_timeout = absl::Seconds(1);
  CallControl control = Control();
  const absl::Time start = clock_.Now();
  control.deadline = start + absl::Seconds(10);
  std::vector<absl::Time> attempt_deadlines;
  int calls = 0;
  absl::Status s = Retry(budget_, p, control, [&](const Attempt& a) {
    EXPECT_EQ(a.deadline, control.deadline);
    attempt_deadlines.push_back(a.attempt_deadline);
    clock_.Advance(absl::Seconds(1));  // the attempt uses up its timeout
    return ++calls < 2 ? absl::DeadlineExceededError("attempt timed out") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(attempt_deadlines,
              ElementsAre(start + absl::Seconds(1), start + absl::Seconds(1) + Ms(50) +
                                                        absl::Seconds(1)));
}

TEST_F(RetryTest, DeadlineExceededAfterTheOverallDeadlineIsNotRetried) {
  CallControl control = Control();
  control.deadline = clock_.Now() + absl::Seconds(1);
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), control, [&](const Attempt& a) {
    ++calls;
    EXPECT_EQ(a.attempt_deadline, control.deadline);
    clock_.Advance(absl::Seconds(2));
    return absl::DeadlineExceededError("rpc deadline");
  });
  EXPECT_EQ(s, absl::DeadlineExceededError("rpc deadline"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
}

TEST_F(RetryTest, OneIdempotencyKeyPerCallSharedByItsAttempts) {
  std::vector<std::string> first, second;
  auto run = [&](std::vector<std::string>& keys, const CallControl& control) {
    int calls = 0;
    (void)Retry(budget_, TestPolicy(), control, [&](const Attempt& a) {
      keys.emplace_back(a.idempotency_key);
      return ++calls < 3 ? absl::UnavailableError("down") : absl::OkStatus();
    });
  };
  run(first, Control());
  run(second, Control());
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(second.size(), 3u);
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 1u);
  EXPECT_EQ(std::set<std::string>(second.begin(), second.end()).size(), 1u);
  EXPECT_NE(first[0], second[0]);
  EXPECT_THAT(first[0], ::testing::MatchesRegex("[0-9a-f]{32}"));

  CallControl mine = Control();
  mine.idempotency_key = "order-1234";
  std::vector<std::string> supplied;
  run(supplied, mine);
  EXPECT_THAT(supplied, ElementsAre("order-1234", "order-1234", "order-1234"));
}

TEST(NewIdempotencyKeyTest, KeysAreDistinct) {
  std::set<std::string> keys;
  for (int i = 0; i < 1000; ++i) keys.insert(NewIdempotencyKey());
  EXPECT_EQ(keys.size(), 1000u);
}

TEST_F(RetryTest, PositivePushbackReplacesTheBackoffExactly) {
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](Attempt& a) {
    if (++calls == 1) {
      a.pushback = Ms(700);  // above max_backoff: the server's word wins
      return absl::UnavailableError("overloaded");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(clock_.sleeps(), ElementsAre(Ms(700)));
  EXPECT_EQ(budget_.acquired, 1);  // pushback still needs a token
}

TEST_F(RetryTest, ZeroPushbackRetriesWithoutWaiting) {
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](Attempt& a) {
    a.pushback = absl::ZeroDuration();
    return ++calls == 1 ? absl::UnavailableError("once") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(clock_.sleeps(), ElementsAre(absl::ZeroDuration()));
}

TEST_F(RetryTest, NegativePushbackStopsRetrying) {
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](Attempt& a) {
    ++calls;
    a.pushback = Ms(-1);
    return absl::UnavailableError("go away");
  });
  EXPECT_EQ(s, absl::UnavailableError("go away"));
  EXPECT_FALSE(IsBudgetExhausted(s));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
}

TEST_F(RetryTest, PushbackPastTheDeadlineFailsNowWithoutAToken) {
  CallControl control = Control();
  control.deadline = clock_.Now() + absl::Seconds(1);
  absl::Status s = Retry(budget_, TestPolicy(), control, [&](Attempt& a) {
    a.pushback = absl::Seconds(5);
    return absl::UnavailableError("overloaded");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
  EXPECT_THAT(clock_.sleeps(), IsEmpty());
}

TEST_F(RetryTest, PushbackDoesNotMakeANonRetryableErrorRetryable) {
  int calls = 0;
  absl::Status s = Retry(budget_, TestPolicy(), Control(), [&](Attempt& a) {
    ++calls;
    a.pushback = Ms(10);
    return absl::InternalError("bug");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
}

TEST_F(RetryTest, InvalidPolicyIsRefusedBeforeAnyAttempt) {
  RetryPolicy p = TestPolicy();
  p.max_attempts = 0;
  int calls = 0;
  absl::Status s = Retry(budget_, p, Control(), [&](const Attempt&) {
    ++calls;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_attempts"));
  EXPECT_EQ(calls, 0);

  p = TestPolicy();
  p.multiplier = 0.5;
  EXPECT_THAT(ValidateRetryPolicy(p).message(), HasSubstr("multiplier"));
  p = TestPolicy();
  p.max_backoff = Ms(1);
  EXPECT_THAT(ValidateRetryPolicy(p).message(), HasSubstr("max_backoff"));
  p = TestPolicy();
  p.initial_backoff = Ms(-1);
  EXPECT_THAT(ValidateRetryPolicy(p).message(), HasSubstr("initial_backoff"));
  p = TestPolicy();
  p.per_attempt_timeout = absl::ZeroDuration();
  EXPECT_THAT(ValidateRetryPolicy(p).message(), HasSubstr("per_attempt_timeout"));
  EXPECT_TRUE(ValidateRetryPolicy(RetryPolicy{}).ok());
}

TEST_F(RetryTest, ConcurrentCallsShareOneBudget) {
  FakeBudget budget(/*tokens=*/50);
  std::atomic<int> attempts{0};
  std::atomic<int> exhausted{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        FakeClock clock;  // one per thread: the shared state under test is the budget
        CallControl control = Control();
        control.clock = &clock;
        for (int i = 0; i < 20; ++i) {
          absl::Status s = Retry(budget, TestPolicy(), control, [&](const Attempt&) {
            ++attempts;
            return absl::UnavailableError("down");
          });
          if (IsBudgetExhausted(s)) ++exhausted;
        }
      });
    }
  }
  // 160 free first attempts plus exactly the 50 tokens: the budget, not the per-call cap, bounds
  // the retries.
  EXPECT_EQ(attempts, 160 + 50);
  EXPECT_EQ(budget.spent(), 50);
  EXPECT_GT(exhausted, 0);
}

}  // namespace
}  // namespace retrybudget
