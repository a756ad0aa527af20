// Fallback while the budget server is unreachable: the lease is spent to its expiry, then a
// local bucket sized by the recent SafeShares (or the configured bucket), or deny; back to leases
// when the server answers, reporting the fallback spending exactly. Every request the tests
// send is checked against the server's validation rules (ClientHarness).
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "tests/client/client_test_util.h"

namespace retrybudget {
namespace {

using testing_util::ClientHarness;
using testing_util::Failing;
using testing_util::GrantAll;
using testing_util::Granting;
using testing_util::GrantingWithShare;

// Takes tokens until one is refused; returns how many were taken.
int TakeAll(TenantBudget* budget) {
  int taken = 0;
  while (budget->TryAcquire()) ++taken;
  return taken;
}

// Runs refresher steps at the times they ask for until the tenant is in `mode` (the clock is
// left at the step that switched it).
void StepUntilMode(ClientHarness& h, TenantBudget* budget, BudgetMode mode,
                   absl::Duration at_most = absl::Minutes(1)) {
  const absl::Time give_up = h.clock().Now() + at_most;
  absl::Time next = h.client().RunOnce();
  while (budget->Stats().mode != mode) {
    ASSERT_LE(next, give_up) << "still in " << BudgetModeName(budget->Stats().mode);
    h.clock().Set(next);
    next = h.client().RunOnce();
  }
}

// Runs refresher steps at the times they ask for until `until` (and at once when a worker woke
// it, as its thread would), taking every token as soon as it is there. Returns the tokens taken.
int SpendGreedilyUntil(ClientHarness& h, TenantBudget* budget, absl::Time until) {
  int taken = TakeAll(budget);
  while (true) {
    absl::Time next = h.client().RunOnce();
    taken += TakeAll(budget);
    while (h.client().wake_requested()) {
      next = h.client().RunOnce();
      taken += TakeAll(budget);
    }
    if (next > until) break;
    h.clock().Set(next);
  }
  h.clock().Set(until);
  h.client().RunOnce();
  return taken + TakeAll(budget);
}

TEST(FallbackTest, LeaseIsSpentUntilItsExpiryThenTheSafeShareBucketTakesOver) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(5, /*share_capacity=*/3, /*share_refill_per_second=*/2,
                                  /*lease_ttl_ms=*/1000));
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kLease);

  // The server goes away: the lease stays good until t0 + 1 s.
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  ASSERT_TRUE(budget->TryAcquire());
  ASSERT_TRUE(budget->TryAcquire());
  h.clock().Set(t0 + absl::Milliseconds(200));
  h.client().RunOnce();
  h.clock().Set(t0 + absl::Milliseconds(999));
  h.client().RunOnce();
  EXPECT_EQ(h.client().last_sync_status().code(), absl::StatusCode::kUnavailable);
  TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.mode, BudgetMode::kLease);
  EXPECT_EQ(stats.tokens_held, 3);
  EXPECT_EQ(stats.fallback_allowed, 0u);

  h.clock().Set(t0 + absl::Seconds(1));
  h.client().RunOnce();
  stats = budget->Stats();
  EXPECT_EQ(stats.mode, BudgetMode::kFallback);
  EXPECT_FALSE(stats.lease_active);
  EXPECT_EQ(stats.tokens_returned, 3u);  // the unspent leased tokens
  EXPECT_EQ(stats.tokens_held, 3);       // the share's burst
  EXPECT_EQ(TakeAll(budget), 3);
  stats = budget->Stats();
  EXPECT_EQ(stats.fallback_allowed, 3u);
  EXPECT_EQ(stats.retries_allowed, 5u);
}

TEST(FallbackTest, FallbackRateAndBurstAreTheLastSafeShare) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  // The lease (150 ms) ends before the server has been down for a refresh period (200 ms): the
  // bucket starts full (a spent lease falling back early would start empty).
  h.set_handler(GrantingWithShare(0, /*share_capacity=*/4, /*share_refill_per_second=*/2.5,
                                  /*lease_ttl_ms=*/150));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::DEADLINE_EXCEEDED));
  // Step until the lease has ended and the fallback begun.
  StepUntilMode(h, budget, BudgetMode::kFallback);
  const absl::Time start = h.clock().Now();
  const size_t syncs_before = h.sync_count();

  const absl::Duration elapsed = absl::Seconds(30);
  const int allowed = SpendGreedilyUntil(h, budget, start + elapsed);
  const double bound = 4 + 2.5 * absl::ToDoubleSeconds(elapsed);  // 79
  EXPECT_LE(allowed, bound);
  EXPECT_GE(allowed, bound - 2);
  EXPECT_EQ(budget->Stats().fallback_allowed, static_cast<uint64_t>(allowed));
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kFallback);
  // Sync kept being retried, never more than ~1 s apart.
  EXPECT_GE(h.sync_count() - syncs_before, 29u);

  // An idle bucket fills to the share's burst, not beyond.
  h.clock().Advance(absl::Minutes(5));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 4);
}

// A restarted (or hung) server sees the fleet rejoin one by one and offers the first instances
// back a share of a smaller fleet. If it goes away again at once, the fallback bucket is the
// smallest share of the minute before its last answer, not that inflated last one.
TEST(FallbackTest, FallbackBurstIsTheSmallestShareOfTheLastMinute) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  // Leases of 150 ms end before the server has been down for a refresh period (200 ms): each
  // fallback bucket starts full, at its share's burst.
  h.set_handler(GrantingWithShare(0, /*share_capacity=*/3, /*share_refill_per_second=*/1,
                                  /*lease_ttl_ms=*/150));
  h.client().RunOnce();
  h.clock().Advance(absl::Seconds(20));
  h.set_handler(GrantingWithShare(0, /*share_capacity=*/12, /*share_refill_per_second=*/4,
                                  /*lease_ttl_ms=*/150));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  StepUntilMode(h, budget, BudgetMode::kFallback);
  EXPECT_EQ(TakeAll(budget), 3);

  // A fleet that really shrank: once the small share is more than two minutes old, the larger
  // one is the share.
  h.set_handler(GrantingWithShare(0, /*share_capacity=*/12, /*share_refill_per_second=*/4,
                                  /*lease_ttl_ms=*/150));
  StepUntilMode(h, budget, BudgetMode::kLease);
  for (int i = 0; i < 5; ++i) {
    h.clock().Advance(absl::Seconds(30));
    h.client().RunOnce();
  }
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  StepUntilMode(h, budget, BudgetMode::kFallback);
  EXPECT_EQ(TakeAll(budget), 12);
}

TEST(FallbackTest, AClientThatNeverReachedTheServerUsesTheConfiguredBucket) {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.fallback_capacity = 2;
  options.fallback_refill_per_second = 0.5;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  EXPECT_FALSE(budget->TryAcquire());  // before the first attempt: no lease, not yet unreachable
  const absl::Time start = h.clock().Now();
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kFallback);
  const int allowed = SpendGreedilyUntil(h, budget, start + absl::Seconds(20));
  EXPECT_EQ(allowed, 2 + 10);
}

TEST(FallbackTest, DefaultConfiguredBucketIsOneTokenThenOnePerTenSeconds) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  const absl::Time start = h.clock().Now();
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 1);
  EXPECT_EQ(SpendGreedilyUntil(h, budget, start + absl::Seconds(9)), 0);
  EXPECT_EQ(SpendGreedilyUntil(h, budget, start + absl::Seconds(10)), 1);
}

TEST(FallbackTest, DenyModeDeniesOnceTheLeaseHasExpired) {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.fallback = FallbackMode::kDeny;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(2, 10, 10, /*lease_ttl_ms=*/1000));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  ASSERT_TRUE(budget->TryAcquire());  // the lease is still spent
  const int after = SpendGreedilyUntil(h, budget, t0 + absl::Seconds(20));
  EXPECT_EQ(after, 1);  // the lease's last token, nothing after its expiry
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.mode, BudgetMode::kDenyFallback);
  EXPECT_EQ(stats.fallback_allowed, 0u);
  EXPECT_EQ(stats.tokens_held, 0);
  EXPECT_FALSE(budget->TryAcquire());

  // The server returns: leases again.
  h.set_handler(Granting(3));
  h.clock().Set(h.client().RunOnce());
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kLease);
  EXPECT_TRUE(budget->TryAcquire());
}

TEST(FallbackTest, BackToLeasesReportsFallbackSpendingExactlyAndReturnsOnlyLeasedTokens) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(5, /*share_capacity=*/4, /*share_refill_per_second=*/1,
                                  /*lease_ttl_ms=*/1000));
  h.client().RunOnce();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(budget->TryAcquire());  // 3 leased spent, 2 left

  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  StepUntilMode(h, budget, BudgetMode::kFallback);
  EXPECT_EQ(h.clock().Now(), t0 + absl::Seconds(1));
  int fallback_taken = TakeAll(budget);
  EXPECT_EQ(fallback_taken, 4);
  fallback_taken += SpendGreedilyUntil(h, budget, t0 + absl::Seconds(6));
  EXPECT_EQ(fallback_taken, 4 + 5);
  // Let the bucket refill a little and leave those tokens unspent: they must not be returned.
  h.clock().Set(t0 + absl::Seconds(9));
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().tokens_held, 3);
  EXPECT_EQ(budget->Stats().fallback_allowed, 9u);

  // The server answers again: back to leases within about a second.
  const absl::Time back = h.clock().Now();
  h.set_handler(GrantingWithShare(6, 4, 1));
  StepUntilMode(h, budget, BudgetMode::kLease, /*at_most=*/absl::Seconds(1));
  EXPECT_LE(h.clock().Now() - back, absl::Seconds(1));
  TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.tokens_held, 6);  // the 3 fallback tokens were withdrawn, not kept
  EXPECT_EQ(stats.tokens_returned, 2u);

  // The Sync that got through was built fresh (the failing one was abandoned after a refresh
  // period), so it already carried the fallback spending; so does every later one.
  const v1::TenantSync through = h.last_request().tenants(0);
  EXPECT_EQ(through.fallback_spent(), 9u);
  EXPECT_EQ(through.retries_spent(), 3u + 9u);
  EXPECT_EQ(through.tokens_returned(), 2u);
  EXPECT_EQ(through.tokens_received(), 5u);

  ASSERT_TRUE(budget->TryAcquire());
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  const v1::TenantSync next = h.last_request().tenants(0);
  EXPECT_EQ(next.fallback_spent(), 9u);
  EXPECT_EQ(next.retries_spent(), 3u + 9u + 1u);
  EXPECT_EQ(next.tokens_returned(), 2u);  // never the fallback tokens
  EXPECT_EQ(next.tokens_received(), 11u);

  ASSERT_TRUE(h.client().Shutdown().ok());
  const v1::TenantSync last = h.last_request().tenants(0);
  EXPECT_EQ(last.retries_spent() - last.fallback_spent() + last.tokens_returned(),
            last.tokens_received());
  EXPECT_EQ(last.fallback_spent(), 9u);
  EXPECT_THAT(h.violations(), ::testing::IsEmpty());
}

TEST(FallbackTest, SuccessesInFallbackFundItsBucketOnceAndAreReportedAsCreditedLocally) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  // A share of 4 tokens that never refills; each success in fallback is worth half a token.
  h.set_handler(GrantingWithShare(5, /*share_capacity=*/4, /*share_refill_per_second=*/0,
                                  /*lease_ttl_ms=*/1000, /*next_sync_ms=*/200,
                                  /*share_success_credit=*/0.5));
  h.client().RunOnce();
  // Two successes, then the server goes away: the failing requests carry them, so the server
  // may have credited them (a lost response): they must never fund the fallback bucket.
  budget->RecordSuccess();
  budget->RecordSuccess();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).successes(), 2u);
  StepUntilMode(h, budget, BudgetMode::kFallback);
  EXPECT_EQ(TakeAll(budget), 4);  // the share's capacity, nothing from the 2 successes
  EXPECT_EQ(budget->Stats().successes_credited_locally, 0u);

  // Six successes in fallback: 3 tokens at the next step, and they are counted as credited.
  for (int i = 0; i < 6; ++i) budget->RecordSuccess();
  h.clock().Advance(absl::Milliseconds(10));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 3);
  EXPECT_EQ(budget->Stats().successes_credited_locally, 6u);
  // Credit never lifts the bucket past its capacity: 20 more successes fill it to 4, and the
  // 12 whose credit did not fit stay the server's to credit.
  for (int i = 0; i < 20; ++i) budget->RecordSuccess();
  h.clock().Advance(absl::Milliseconds(10));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 4);
  EXPECT_EQ(budget->Stats().successes_credited_locally, 6u + 8u);

  // Back to leases: the request says which successes were credited locally, so the server
  // credits only 28 - 14 of them.
  h.set_handler(GrantingWithShare(5, 4, 0, 1000, 200, 0.5));
  StepUntilMode(h, budget, BudgetMode::kLease, /*at_most=*/absl::Seconds(2));
  const v1::TenantSync through = h.last_request().tenants(0);
  EXPECT_EQ(through.successes(), 28u);
  EXPECT_EQ(through.successes_credited_locally(), 14u);
  EXPECT_EQ(through.fallback_spent(), 4u + 3u + 4u);
  ASSERT_TRUE(h.client().Shutdown().ok());
  EXPECT_EQ(h.last_request().tenants(0).successes_credited_locally(), 14u);
  EXPECT_THAT(h.violations(), ::testing::IsEmpty());
}

TEST(FallbackTest, WithoutASuccessCreditFromTheServerFallbackIsFundedByRefillAlone) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingWithShare(5, /*share_capacity=*/2, /*share_refill_per_second=*/0,
                                  /*lease_ttl_ms=*/1000));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  StepUntilMode(h, budget, BudgetMode::kFallback);
  EXPECT_EQ(TakeAll(budget), 2);
  for (int i = 0; i < 100; ++i) budget->RecordSuccess();
  h.clock().Advance(absl::Milliseconds(10));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 0);
  EXPECT_EQ(budget->Stats().successes_credited_locally, 0u);
}

TEST(FallbackTest, ASpentLeaseFallsBackOnceTheServerHasBeenDownForARefreshPeriod) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(3, /*share_capacity=*/2, /*share_refill_per_second=*/10,
                                  /*lease_ttl_ms=*/5000));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(TakeAll(budget), 3);  // the lease is spent; it would last until t0 + 5 s
  // The first failures are a blip: no fallback yet, the spent lease denies.
  absl::Time next = h.client().RunOnce();
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kLease);
  EXPECT_FALSE(budget->TryAcquire());
  // Down for a refresh period (200 ms from the first failed attempt): fall back now, not at
  // the lease's expiry.
  while (budget->Stats().mode != BudgetMode::kFallback) {
    ASSERT_LT(next, t0 + absl::Seconds(1)) << "no fallback within a second of the outage";
    h.clock().Set(next);
    next = h.client().RunOnce();
  }
  EXPECT_GE(h.clock().Now() - t0, absl::Milliseconds(200));
  // The bucket starts empty: the share of the burst went in the lease (a slow server is down
  // too, and a full bucket would let the instance spend its lease and its share again). Only
  // the share's refill funds it: one token per 100 ms.
  EXPECT_EQ(TakeAll(budget), 0);
  h.clock().Advance(absl::Milliseconds(100));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 1);
  // Back to leases when the server answers; the fallback spending is reported.
  h.set_handler(GrantingWithShare(3, 2, 10, 5000));
  StepUntilMode(h, budget, BudgetMode::kLease, /*at_most=*/absl::Seconds(2));
  EXPECT_EQ(h.last_request().tenants(0).fallback_spent(), budget->Stats().fallback_allowed);
  EXPECT_GE(budget->Stats().fallback_allowed, 1u);
  EXPECT_THAT(h.violations(), ::testing::IsEmpty());
}

// After one failed attempt the next ones wait for the channel to connect, each up to its deadline
// (sync_timeout, 1 s). The server turns "down" a refresh period after the first failure, and the
// attempt waiting then is cut short for it: the spent lease falls back at that moment, not when the
// wait gives up (a second of retries denied after every kill -9 of a server, before this).
TEST(FallbackTest, AnAttemptWaitingForTheServerIsCutShortWhenTheServerTurnsDown) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingWithShare(3, /*share_capacity=*/2, /*share_refill_per_second=*/10,
                                  /*lease_ttl_ms=*/5000));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 3);
  const absl::Time t0 = h.clock().Now();
  // The first attempt fails at once (connection refused); the later ones wait out their
  // deadline, as a wait_for_ready call on a dead address does.
  bool first = true;
  h.set_handler([&](const v1::SyncRequest&, v1::SyncResponse*) {
    if (first) {
      first = false;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
    }
    h.clock().Advance(h.last_timeout());
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "waited for the channel");
  });
  StepUntilMode(h, budget, BudgetMode::kFallback, /*at_most=*/absl::Seconds(3));
  EXPECT_GE(h.clock().Now() - t0, absl::Milliseconds(200));
  EXPECT_LE(h.clock().Now() - t0, absl::Milliseconds(250))
      << "the spent lease fell back only when an attempt gave up";
  // The handler above refers to this test's locals; the final Sync (at the harness's end) must
  // not reach it.
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
}

TEST(FallbackTest, ALeaseWithTokensLeftIsSpentWhileTheServerIsDown) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(10, /*share_capacity=*/5, /*share_refill_per_second=*/0,
                                  /*lease_ttl_ms=*/5000));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  ASSERT_TRUE(budget->TryAcquire());
  absl::Time next = h.client().RunOnce();
  while (next < t0 + absl::Seconds(2)) {
    h.clock().Set(next);
    next = h.client().RunOnce();
  }
  // Down for far more than a refresh period, but the lease still holds 9 tokens: no fallback
  // bucket on top of them.
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kLease);
  EXPECT_EQ(TakeAll(budget), 9);
  EXPECT_EQ(budget->Stats().fallback_allowed, 0u);
}

TEST(FallbackTest, OneLostResponseDoesNotOpenAFallbackBucket) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingWithShare(2, /*share_capacity=*/5, /*share_refill_per_second=*/0,
                                  /*lease_ttl_ms=*/5000));
  h.client().RunOnce();
  EXPECT_EQ(TakeAll(budget), 2);
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Advance(absl::Milliseconds(10));
  const absl::Time next = h.client().RunOnce();  // one failed attempt
  h.set_handler(GrantingWithShare(0, 5, 0, 5000));  // answering again: the bucket is dry
  h.clock().Set(next);
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kLease);
  EXPECT_EQ(TakeAll(budget), 0);
  EXPECT_EQ(budget->Stats().fallback_allowed, 0u);
}

TEST(FallbackTest, AFailingRequestIsReplacedByAFreshOneAfterARefreshPeriod) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(10));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Advance(absl::Milliseconds(200));
  const absl::Time first_sent = h.clock().Now();
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().seq(), 2u);
  ASSERT_TRUE(budget->TryAcquire());
  absl::Time next = h.client().RunOnce();
  while (next < first_sent + absl::Milliseconds(200)) {
    h.clock().Set(next);
    next = h.client().RunOnce();
    EXPECT_EQ(h.last_request().seq(), 2u);  // resent unchanged
    EXPECT_EQ(h.last_request().tenants(0).retries_spent(), 0u);
  }
  EXPECT_GE(h.sync_count(), 4u);
  // The next attempt, once the request is a refresh period old, is a new request.
  const size_t sent = h.sync_count();
  while (h.sync_count() == sent) {
    h.clock().Set(next);
    next = h.client().RunOnce();
  }
  EXPECT_EQ(h.last_request().seq(), 3u);
  EXPECT_EQ(h.last_request().tenants(0).retries_spent(), 1u);
}

TEST(FallbackTest, AnUnauthenticatedClientDoesNotFallBack) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(2, 10, 10, /*lease_ttl_ms=*/1000));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(SpendGreedilyUntil(h, budget, t0 + absl::Seconds(5)), 2);  // the lease only
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kNoLease);

  // Unreachable: fallback; then refused again: out of fallback.
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  SpendGreedilyUntil(h, budget, t0 + absl::Seconds(7));
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kFallback);
  h.set_handler(Failing(grpc::StatusCode::PERMISSION_DENIED));
  SpendGreedilyUntil(h, budget, t0 + absl::Seconds(9));
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kNoLease);
  EXPECT_FALSE(budget->TryAcquire());
}

TEST(FallbackTest, ATenantTheServerRefusedStaysDeniedWhenTheServerIsUnreachable) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler([](const v1::SyncRequest& request, v1::SyncResponse* response) {
    GrantAll(request, response, 0);
    response->mutable_tenants(0)->mutable_error()->set_code(
        static_cast<int>(absl::StatusCode::kNotFound));
    return grpc::Status::OK;
  });
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(SpendGreedilyUntil(h, budget, h.clock().Now() + absl::Seconds(10)), 0);
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kNoLease);
}

TEST(FallbackTest, AStaleAnswerDoesNotEndTheFallback) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.client().RunOnce();
  ASSERT_EQ(budget->Stats().mode, BudgetMode::kFallback);
  h.set_handler([](const v1::SyncRequest&, v1::SyncResponse* response) {
    response->set_stale(true);
    return grpc::Status::OK;
  });
  h.clock().Set(h.client().RunOnce());
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kFallback);
}

}  // namespace
}  // namespace retrybudget
