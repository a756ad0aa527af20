// No denial before the first answer, on a FakeClock and a mock stub (never sleeping): a new
// tenant's first Sync goes out at once, TenantBudget::WaitReady() returns once the tenant's
// first answer is in (a grant, a refusal, the fallback verdict), and Retry() waits for it within
// its backoff, bounded by the deadline and cancelled by the stop token.
#include <functional>
#include <stop_token>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"
#include "retrybudget/retry.h"
#include "tests/client/client_test_util.h"

namespace retrybudget {
namespace {

using ::retrybudget::testing_util::ClientHarness;
using ::retrybudget::testing_util::Failing;
using ::retrybudget::testing_util::Granting;

TEST(FirstAnswerTest, ANewTenantsFirstSyncIsNotHeldBackByTheMinSyncInterval) {
  ClientHarness h;
  h.set_handler(Granting(5));
  h.Tenant("a");
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 1u);
  // Created in the same instant as the Sync that just went out: its own first Sync goes out at
  // the next step, not min_sync_interval (5 ms) later.
  TenantBudget* b = h.Tenant("b");
  EXPECT_TRUE(h.client().wake_requested());
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 2u);
  ASSERT_EQ(h.last_request().tenants_size(), 2);
  EXPECT_EQ(h.last_request().tenants(1).tenant(), "b");
  EXPECT_TRUE(b->TryAcquire());
  // Once sent, the interval holds again: a wake at the same instant does not sync.
  ASSERT_TRUE(b->TryAcquire());
  while (b->TryAcquire()) {}  // run the lease dry (5 tokens): wakes the refresher
  h.client().RunOnce();
  EXPECT_EQ(h.sync_count(), 2u);
}

TEST(FirstAnswerTest, WaitReadyReturnsOnceTheFirstGrantIsIn) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time start = h.clock().Now();
  // No answer yet: the wait runs to its deadline (the fake clock jumps there).
  EXPECT_EQ(budget->WaitReady(start + absl::Milliseconds(30), {}).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(h.clock().Now(), start + absl::Milliseconds(30));
  EXPECT_FALSE(budget->TryAcquire());

  h.set_handler(Granting(5));
  h.client().RunOnce();
  const size_t sleeps = h.clock().sleeps().size();
  EXPECT_TRUE(budget->WaitReady(h.clock().Now() + absl::Seconds(10), {}).ok());
  EXPECT_EQ(h.clock().sleeps().size(), sleeps);  // answered: no sleep at all
  EXPECT_TRUE(budget->TryAcquire());
}

TEST(FirstAnswerTest, WaitReadyIsCancelledByTheStopToken) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  std::stop_source stop;
  stop.request_stop();
  const absl::Time start = h.clock().Now();
  EXPECT_EQ(budget->WaitReady(start + absl::Seconds(10), stop.get_token()).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(h.clock().Now(), start);
}

TEST(FirstAnswerTest, ARefusalIsAnAnswer) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler([](const v1::SyncRequest& request, v1::SyncResponse* response) {
    v1::TenantGrant* grant = response->add_tenants();
    grant->set_tenant(request.tenants(0).tenant());
    grant->mutable_error()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
    grant->mutable_error()->set_message("no such tenant");
    return grpc::Status::OK;
  });
  h.client().RunOnce();
  EXPECT_TRUE(budget->WaitReady(h.clock().Now(), {}).ok());
  EXPECT_EQ(budget->Stats().error.code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(budget->TryAcquire());
}

TEST(FirstAnswerTest, AnUnreachableServerIsAnAnswerAndTheLocalFallbackApplies) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.client().RunOnce();
  EXPECT_TRUE(budget->WaitReady(h.clock().Now(), {}).ok());
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kFallback);
  // The configured bucket of a tenant the server never answered for: one token, then none.
  EXPECT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
}

TEST(FirstAnswerTest, AnUnreachableServerWithFallbackDenyIsAnAnswerThatDenies) {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.fallback = FallbackMode::kDeny;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.client().RunOnce();
  EXPECT_TRUE(budget->WaitReady(h.clock().Now(), {}).ok());
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kDenyFallback);
  EXPECT_FALSE(budget->TryAcquire());  // never fail open
}

TEST(FirstAnswerTest, ShutdownIsAnAnswer) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  ASSERT_FALSE(h.client().Shutdown().ok());
  EXPECT_TRUE(budget->WaitReady(h.clock().Now(), {}).ok());
  EXPECT_FALSE(budget->TryAcquire());
}

// A FakeClock on which something happens while a caller sleeps: `during_sleep` runs at the
// start of each SleepUntil (e.g. the refresher's step that brings the first answer), then the
// sleep behaves as FakeClock's (it returns at once, the time jumping to the deadline unless the
// stop was requested meanwhile).
class EventfulClock : public FakeClock {
 public:
  bool SleepUntil(absl::Time deadline, std::stop_token stop) override {
    if (during_sleep) {
      std::function<void()> event = std::move(during_sleep);
      during_sleep = nullptr;
      event();
    }
    return FakeClock::SleepUntil(deadline, stop);
  }
  std::function<void()> during_sleep;
};

// A call whose first attempt fails (UNAVAILABLE) and whose second succeeds, on `clock`.
absl::Status FailOnceThenSucceed(TenantBudget& budget, Clock* clock, absl::Time deadline,
                                 std::stop_token stop = {}, int* attempts = nullptr) {
  RetryPolicy policy;  // 50 ms initial backoff
  return Retry(budget, policy,
               {.stop = std::move(stop), .deadline = deadline, .clock = clock,
                .random = [] { return 0.5; }},  // backoff 25 ms, ceiling 50 ms
               [&](const Attempt& a) {
                 if (attempts != nullptr) *attempts = a.number;
                 return a.number == 1 ? absl::UnavailableError("first attempt fails")
                                      : absl::OkStatus();
               });
}

TEST(FirstAnswerTest, RetryWaitsForTheFirstAnswerBeforeTakingAToken) {
  EventfulClock clock;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.clock = &clock;
  ClientHarness h(options);
  h.set_handler(Granting(5));
  TenantBudget* budget = h.Tenant("payments");
  // The first answer arrives while the retry waits for it.
  clock.during_sleep = [&h] { h.client().RunOnce(); };
  const absl::Time start = clock.Now();
  int attempts = 0;
  EXPECT_TRUE(FailOnceThenSucceed(*budget, &clock, start + absl::Seconds(10), {}, &attempts).ok());
  EXPECT_EQ(attempts, 2);
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.retries_allowed, 1u);
  EXPECT_EQ(stats.retries_denied, 0u);
  // The wait was for kFirstAnswerWait (1 s, longer than the 50 ms backoff ceiling) and the
  // answer ended it at once; the retry still waited its own backoff (25 ms).
  ASSERT_GE(clock.sleeps().size(), 2u);
  EXPECT_EQ(clock.sleeps()[0], kFirstAnswerWait);
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(25));
}

TEST(FirstAnswerTest, WithoutTheWaitTheSameRetryIsDenied) {
  // The same call on a budget that says it is ready while it is not (the TenantBudget default):
  // the retry is denied. This is what the wait above prevents.
  EventfulClock clock;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.clock = &clock;
  ClientHarness h(options);
  h.set_handler(Granting(5));
  TenantBudget* budget = h.Tenant("payments");
  class NoWait : public TenantBudget {
   public:
    explicit NoWait(TenantBudget& inner) : inner_(inner) {}
    bool TryAcquire(uint32_t cost) override { return inner_.TryAcquire(cost); }
    void Refund(uint32_t cost) override { inner_.Refund(cost); }
    void RecordRequest() override { inner_.RecordRequest(); }
    void RecordSuccess() override { inner_.RecordSuccess(); }
    const std::string& tenant() const override { return inner_.tenant(); }
    TenantStats Stats() const override { return inner_.Stats(); }

   private:
    TenantBudget& inner_;
  } no_wait(*budget);
  clock.during_sleep = [&h] { h.client().RunOnce(); };
  const absl::Status status = FailOnceThenSucceed(no_wait, &clock, clock.Now() + absl::Seconds(10));
  EXPECT_TRUE(IsBudgetExhausted(status)) << status;
}

TEST(FirstAnswerTest, RetryWaitsForTheFirstAnswerNoLongerThanTheDeadline) {
  EventfulClock clock;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.clock = &clock;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");  // the refresher never steps: no answer
  const absl::Time start = clock.Now();
  int attempts = 0;
  const absl::Status status =
      FailOnceThenSucceed(*budget, &clock, start + absl::Milliseconds(30), {}, &attempts);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(30));  // not kFirstAnswerWait
  EXPECT_EQ(budget->Stats().retries_denied, 0u);           // no token asked for
}

TEST(FirstAnswerTest, RetryWaitingForTheFirstAnswerIsCancelledByTheStopToken) {
  EventfulClock clock;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.clock = &clock;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  std::stop_source stop;
  clock.during_sleep = [&stop] { stop.request_stop(); };
  const absl::Time start = clock.Now();
  int attempts = 0;
  const absl::Status status = FailOnceThenSucceed(*budget, &clock, start + absl::Seconds(10),
                                                  stop.get_token(), &attempts);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(budget->Stats().retries_denied, 0u);
  EXPECT_EQ(budget->Stats().refunds, 0u);  // no token was taken
}

TEST(FirstAnswerTest, RetryOnAnUnreachableServerGetsTheFallbackToken) {
  EventfulClock clock;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.clock = &clock;
  ClientHarness h(options);
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  TenantBudget* budget = h.Tenant("payments");
  clock.during_sleep = [&h] { h.client().RunOnce(); };
  EXPECT_TRUE(FailOnceThenSucceed(*budget, &clock, clock.Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(budget->Stats().fallback_allowed, 1u);
}

}  // namespace
}  // namespace retrybudget
