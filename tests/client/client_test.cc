// The leasing protocol of the client, driven step by step on a FakeClock through a mock stub.
#include <limits>
#include <string>

#include "absl/status/status.h"
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

// Deny fallback: these tests are about what happens without a lease, not about the local bucket.
ClientOptions DenyFallbackOptions() {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.fallback = FallbackMode::kDeny;
  return options;
}

TEST(BudgetClientTest, TryAcquireDeniesWithoutLeaseAndWakesRefresher) {
  ClientHarness h(DenyFallbackOptions());
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.client().RunOnce();  // the creation wake is consumed; the Sync fails: still no lease
  ASSERT_FALSE(h.client().wake_requested());

  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_TRUE(h.client().wake_requested());
  EXPECT_EQ(budget->Stats().retries_denied, 1u);
  EXPECT_FALSE(budget->Stats().lease_active);
}

TEST(BudgetClientTest, OnlyTheFirstDenialNotifiesUntilTheNextResponse) {
  ClientHarness h(DenyFallbackOptions());
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.client().RunOnce();
  EXPECT_FALSE(budget->TryAcquire());
  h.client().RunOnce();  // consumes the wake (retry not due yet)
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_FALSE(h.client().wake_requested());
  EXPECT_EQ(budget->Stats().retries_denied, 2u);
}

TEST(BudgetClientTest, GrantedTokensBecomeSpendable) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(3));
  h.client().RunOnce();

  ASSERT_EQ(h.sync_count(), 1u);
  const v1::SyncRequest first = h.last_request();
  EXPECT_EQ(first.instance_id(), "test-instance");
  EXPECT_EQ(first.seq(), 1u);
  ASSERT_EQ(first.tenants_size(), 1);
  EXPECT_EQ(first.tenants(0).tenant(), "payments");
  EXPECT_EQ(first.tenants(0).want(), 2u);  // lease_burst, no demand yet
  EXPECT_FALSE(first.final());

  EXPECT_TRUE(budget->TryAcquire());
  EXPECT_TRUE(budget->TryAcquire());
  EXPECT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.tokens_received, 3u);
  EXPECT_EQ(stats.retries_allowed, 3u);
  EXPECT_EQ(stats.retries_denied, 1u);
  EXPECT_EQ(stats.tokens_held, 0);
  EXPECT_TRUE(stats.lease_active);
}

TEST(BudgetClientTest, NoSyncWithoutTenants) {
  ClientHarness h;
  EXPECT_EQ(h.client().RunOnce(), absl::InfiniteFuture());
  EXPECT_EQ(h.sync_count(), 0u);
}

TEST(BudgetClientTest, OneSyncCarriesEveryTenant) {
  ClientHarness h;
  h.Tenant("a");
  h.Tenant("b");
  h.Tenant("c");
  h.set_handler(Granting(1));
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 1u);
  const v1::SyncRequest request = h.last_request();
  ASSERT_EQ(request.tenants_size(), 3);
  EXPECT_EQ(request.tenants(0).tenant(), "a");
  EXPECT_EQ(request.tenants(1).tenant(), "b");
  EXPECT_EQ(request.tenants(2).tenant(), "c");
}

TEST(BudgetClientTest, RequestsCarryCumulativeCounters) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(10));
  h.client().RunOnce();

  for (int i = 0; i < 4; ++i) ASSERT_TRUE(budget->TryAcquire());
  for (int i = 0; i < 3; ++i) budget->RecordSuccess();
  h.set_handler(Granting(0));
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 2u);
  v1::TenantSync second = h.last_request().tenants(0);
  EXPECT_EQ(h.last_request().seq(), 2u);
  EXPECT_EQ(second.successes(), 3u);
  EXPECT_EQ(second.retries_spent(), 4u);
  EXPECT_EQ(second.retries_denied(), 0u);
  EXPECT_EQ(second.tokens_received(), 10u);
  EXPECT_EQ(second.tokens_returned(), 0u);
  EXPECT_EQ(second.fallback_spent(), 0u);

  for (int i = 0; i < 6; ++i) ASSERT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
  budget->RecordSuccess();
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 3u);
  v1::TenantSync third = h.last_request().tenants(0);
  EXPECT_EQ(h.last_request().seq(), 3u);
  EXPECT_EQ(third.successes(), 4u);
  EXPECT_EQ(third.retries_spent(), 10u);
  EXPECT_EQ(third.retries_denied(), 2u);
  EXPECT_EQ(third.tokens_received(), 10u);
}

TEST(BudgetClientTest, FailedSyncIsRetriedWithSameSeqAndContent) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(5));
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire());

  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Advance(absl::Milliseconds(200));
  const absl::Time first_attempt = h.clock().Now();
  EXPECT_EQ(h.client().RunOnce(), first_attempt + absl::Milliseconds(20));  // backoff
  EXPECT_EQ(h.client().last_sync_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(h.client().last_seq(), 2u);

  // Counters move between attempts; the resend must not pick them up.
  ASSERT_TRUE(budget->TryAcquire());
  budget->RecordSuccess();
  h.set_handler(Failing(grpc::StatusCode::DEADLINE_EXCEEDED));
  h.clock().Advance(absl::Milliseconds(10));
  h.client().RunOnce();  // backoff not over: no attempt
  EXPECT_EQ(h.sync_count(), 2u);
  h.clock().Advance(absl::Milliseconds(10));
  EXPECT_EQ(h.client().RunOnce(), h.clock().Now() + absl::Milliseconds(40));
  h.set_handler(Granting(0));
  h.clock().Advance(absl::Milliseconds(40));
  h.client().RunOnce();

  const std::vector<v1::SyncRequest> requests = h.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[1].seq(), 2u);
  EXPECT_EQ(requests[1].SerializeAsString(), requests[2].SerializeAsString());
  EXPECT_EQ(requests[1].SerializeAsString(), requests[3].SerializeAsString());
  EXPECT_EQ(requests[1].tenants(0).retries_spent(), 1u);
  EXPECT_EQ(requests[1].tenants(0).successes(), 0u);
  EXPECT_TRUE(h.client().last_sync_status().ok());

  // Only after a response does a new request get a new seq, with the new counters.
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 5u);
  EXPECT_EQ(h.last_request().seq(), 3u);
  EXPECT_EQ(h.last_request().tenants(0).retries_spent(), 2u);
  EXPECT_EQ(h.last_request().tenants(0).successes(), 1u);
}

TEST(BudgetClientTest, SeqStartsAtOneAndIncrementsOnlyAfterAResponse) {
  ClientHarness h;
  h.Tenant("payments");
  EXPECT_EQ(h.client().last_seq(), 0u);
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  for (int i = 0; i < 3; ++i) {
    h.clock().Set(h.client().RunOnce());
  }
  EXPECT_EQ(h.sync_count(), 3u);
  for (const v1::SyncRequest& request : h.requests()) EXPECT_EQ(request.seq(), 1u);
  h.set_handler(Granting(1));
  h.clock().Set(h.client().RunOnce());
  EXPECT_EQ(h.last_request().seq(), 1u);
  h.client().RunOnce();
  EXPECT_EQ(h.sync_count(), 5u);
  EXPECT_EQ(h.last_request().seq(), 2u);
}

TEST(BudgetClientTest, LeaseExpiresAtSendTimePlusTtl) {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.refresh_period = absl::Hours(1);  // no scheduled sync gets in the way
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time sent = h.clock().Now();
  h.set_handler([&h](const v1::SyncRequest& request, v1::SyncResponse* response) {
    h.clock().Advance(absl::Seconds(1));  // the response takes 1 s to arrive
    return GrantAll(request, response, 5, /*lease_ttl_ms=*/5000, /*next_sync_ms=*/600'000);
  });
  // The next step is the lease's end, measured from the send, not from the receipt.
  EXPECT_EQ(h.client().RunOnce(), sent + absl::Seconds(5));
  ASSERT_TRUE(budget->TryAcquire());
  ASSERT_TRUE(budget->TryAcquire());

  h.clock().Set(sent + absl::Seconds(5) - absl::Milliseconds(1));
  h.client().RunOnce();
  EXPECT_TRUE(budget->TryAcquire());
  EXPECT_TRUE(budget->Stats().lease_active);

  h.clock().Set(sent + absl::Seconds(5));
  h.client().RunOnce();
  EXPECT_EQ(h.sync_count(), 1u);
  EXPECT_FALSE(budget->TryAcquire());
  TenantStats stats = budget->Stats();
  EXPECT_FALSE(stats.lease_active);
  EXPECT_EQ(stats.tokens_returned, 2u);
  EXPECT_EQ(stats.tokens_held, 0);
  EXPECT_EQ(stats.retries_allowed, 3u);

  // The denial wakes the refresher; the next Sync reports the unspent tokens as returned.
  h.set_handler(Granting(0));
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 2u);
  const v1::TenantSync entry = h.last_request().tenants(0);
  EXPECT_EQ(entry.tokens_returned(), 2u);
  EXPECT_EQ(entry.retries_spent(), 3u);
  EXPECT_EQ(entry.tokens_received(), 5u);
}

TEST(BudgetClientTest, SuccessfulSyncRenewsTheLeaseOfTokensHeld) {
  ClientHarness h(DenyFallbackOptions());
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(Granting(5, /*lease_ttl_ms=*/5000, /*next_sync_ms=*/200));
  h.client().RunOnce();
  h.clock().Set(t0 + absl::Seconds(3));
  h.set_handler(Granting(0, /*lease_ttl_ms=*/5000, /*next_sync_ms=*/200));
  h.client().RunOnce();  // renews everything held until t0 + 3 s + 5 s
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Set(t0 + absl::Seconds(6));
  h.client().RunOnce();
  EXPECT_TRUE(budget->TryAcquire());
  h.clock().Set(t0 + absl::Seconds(8));
  h.client().RunOnce();
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(budget->Stats().tokens_returned, 4u);
}

TEST(BudgetClientTest, AGrantNamingALeaseLongerThanAnyPolicyAllowsEndsAfterTenMinutes) {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.refresh_period = absl::Hours(1);
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time sent = h.clock().Now();
  h.set_handler([](const v1::SyncRequest& request, v1::SyncResponse* response) {
    return GrantAll(request, response, 5, /*lease_ttl_ms=*/std::numeric_limits<int64_t>::max(),
                    /*next_sync_ms=*/600'000);
  });
  EXPECT_EQ(h.client().RunOnce(), sent + absl::Minutes(10));
  ASSERT_TRUE(budget->TryAcquire());
  h.clock().Set(sent + absl::Minutes(10) - absl::Milliseconds(1));
  h.client().RunOnce();
  EXPECT_TRUE(budget->Stats().lease_active);
  h.set_handler(Granting(0));
  h.clock().Set(sent + absl::Minutes(10));
  h.client().RunOnce();
  EXPECT_EQ(budget->Stats().tokens_returned, 4u);  // the lease ended: its 4 tokens went back
  EXPECT_FALSE(budget->TryAcquire());
}

TEST(BudgetClientTest, GrantThatOutlivedItsTtlInFlightIsReturnedAtOnce) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler([&h](const v1::SyncRequest& request, v1::SyncResponse* response) {
    h.clock().Advance(absl::Seconds(2));
    return GrantAll(request, response, 5, /*lease_ttl_ms=*/1000);
  });
  h.client().RunOnce();
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(budget->Stats().tokens_received, 5u);
  EXPECT_EQ(budget->Stats().tokens_returned, 5u);
}

TEST(BudgetClientTest, WantGrowsWithDemandAndIsReducedByTokensHeld) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(10));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).want(), 2u);

  // Holding 10 with no demand: nothing more wanted.
  h.set_handler(Granting(0));
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).want(), 0u);

  // 100 retries asked in 200 ms (10 allowed, 90 denied): ~100/s over a 200 ms period + burst 2.
  for (int i = 0; i < 100; ++i) budget->TryAcquire();
  h.set_handler(Granting(5));
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  const uint64_t hungry = h.last_request().tenants(0).want();
  EXPECT_EQ(hungry, 22u);

  // The same (decaying) demand while holding the 5 just granted: the 5 are deducted.
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  const uint64_t holding = h.last_request().tenants(0).want();
  EXPECT_EQ(holding, 14u);  // ceil(100 * e^-0.2 * 0.2) + 2 - 5
  EXPECT_LT(holding, hungry);
}

TEST(BudgetClientTest, LowLeaseWakesRefresherEarlyButNotBeforeMinSyncInterval) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(10));  // low-water mark 2
  const absl::Time sent = h.clock().Now();
  h.client().RunOnce();
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(h.client().wake_requested());
  ASSERT_TRUE(budget->TryAcquire());  // 2 left: low
  EXPECT_TRUE(h.client().wake_requested());

  EXPECT_EQ(h.client().RunOnce(), sent + absl::Milliseconds(5));
  EXPECT_EQ(h.sync_count(), 1u);
  h.clock().Set(sent + absl::Milliseconds(5));
  h.client().RunOnce();
  EXPECT_EQ(h.sync_count(), 2u);
  EXPECT_EQ(budget->Stats().tokens_held, 12);
}

TEST(BudgetClientTest, EmptyLeaseWaitsForServerRetryAfterWhenBucketWasDry) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(1, /*lease_ttl_ms=*/5000, /*next_sync_ms=*/100));  // wanted 2: dry
  const absl::Time received = h.clock().Now();
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(h.client().RunOnce(), received + absl::Milliseconds(100));
  h.clock().Set(received + absl::Milliseconds(50));
  h.client().RunOnce();
  EXPECT_EQ(h.sync_count(), 1u);
}

TEST(BudgetClientTest, EmptyLeaseSyncsAtOnceWhenLastGrantWasFull) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(2, /*lease_ttl_ms=*/5000, /*next_sync_ms=*/100));  // wanted 2: full
  const absl::Time sent = h.clock().Now();
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire());
  ASSERT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(h.client().RunOnce(), sent + absl::Milliseconds(5));
}

TEST(BudgetClientTest, RefundKeepsSpentExact) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(Granting(5));
  h.client().RunOnce();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(budget->TryAcquire());
  budget->Refund();
  TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.retries_allowed, 2u);
  EXPECT_EQ(stats.refunds, 1u);
  EXPECT_EQ(stats.tokens_held, 3);

  h.set_handler(Granting(0));
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).retries_spent(), 2u);

  // A refund after the report: the spent counter does not go backwards, the refund is reported
  // as refunded (the net is the retries sent), Stats stays exact, and the final report gives the
  // refunded token back (sent + returned == received).
  ASSERT_TRUE(budget->TryAcquire());
  ASSERT_TRUE(budget->TryAcquire());
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).retries_spent(), 4u);
  EXPECT_EQ(h.last_request().tenants(0).retries_refunded(), 0u);
  budget->Refund();
  EXPECT_EQ(budget->Stats().retries_allowed, 3u);
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).retries_spent(), 4u);
  EXPECT_EQ(h.last_request().tenants(0).retries_refunded(), 1u);

  ASSERT_TRUE(h.client().Shutdown().ok());
  const v1::TenantSync last = h.last_request().tenants(0);
  EXPECT_TRUE(h.last_request().final());
  EXPECT_EQ(last.retries_spent(), 4u);
  EXPECT_EQ(last.retries_refunded(), 1u);
  EXPECT_EQ(last.retries_spent() - last.retries_refunded() + last.tokens_returned(),
            last.tokens_received());
  const TenantStats stats_after = budget->Stats();
  EXPECT_EQ(stats_after.retries_allowed, 3u);
  EXPECT_EQ(stats_after.tokens_received,
            stats_after.retries_allowed + stats_after.tokens_returned +
                static_cast<uint64_t>(stats_after.tokens_held));
  EXPECT_EQ(stats_after.tokens_returned, last.tokens_returned());
}

TEST(BudgetClientTest, ShutdownSendsFinalSyncReturningAllTokens) {
  ClientHarness h;
  TenantBudget* a = h.Tenant("a");
  TenantBudget* b = h.Tenant("b");
  h.set_handler(Granting(7));
  h.client().RunOnce();
  ASSERT_TRUE(a->TryAcquire());
  ASSERT_TRUE(a->TryAcquire());
  a->RecordSuccess();

  ASSERT_TRUE(h.client().Shutdown().ok());
  ASSERT_EQ(h.sync_count(), 2u);
  const v1::SyncRequest final_request = h.last_request();
  EXPECT_TRUE(final_request.final());
  EXPECT_EQ(final_request.seq(), 2u);
  ASSERT_EQ(final_request.tenants_size(), 2);
  EXPECT_EQ(final_request.tenants(0).tokens_returned(), 5u);
  EXPECT_EQ(final_request.tenants(0).retries_spent(), 2u);
  EXPECT_EQ(final_request.tenants(0).successes(), 1u);
  EXPECT_EQ(final_request.tenants(0).tokens_received(), 7u);
  EXPECT_EQ(final_request.tenants(0).want(), 0u);
  EXPECT_EQ(final_request.tenants(1).tokens_returned(), 7u);

  EXPECT_FALSE(a->TryAcquire());
  EXPECT_FALSE(b->TryAcquire());
  EXPECT_EQ(a->Stats().tokens_held, 0);
  // Idempotent: no second final Sync; no more syncs at all.
  EXPECT_TRUE(h.client().Shutdown().ok());
  EXPECT_EQ(h.client().RunOnce(), absl::InfiniteFuture());
  EXPECT_EQ(h.sync_count(), 2u);
  // Handles stay valid; new tenants are refused.
  EXPECT_EQ(h.client().Tenant("a").value(), a);
  EXPECT_EQ(h.client().Tenant("c").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BudgetClientTest, ShutdownRetriesFinalSyncWithSameSeqAndReportsFailure) {
  ClientHarness h;
  h.Tenant("a");
  h.set_handler(Granting(3));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  const absl::Status status = h.client().Shutdown();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  const std::vector<v1::SyncRequest> requests = h.requests();
  ASSERT_EQ(requests.size(), 4u);  // 1 + 3 final attempts
  for (size_t i = 1; i < requests.size(); ++i) {
    EXPECT_TRUE(requests[i].final());
    EXPECT_EQ(requests[i].SerializeAsString(), requests[1].SerializeAsString());
  }
  EXPECT_EQ(h.client().Shutdown().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(h.sync_count(), 4u);
}

TEST(BudgetClientTest, DestructorSendsFinalSync) {
  ClientHarness h;
  h.Tenant("a");
  h.set_handler(Granting(3));
  h.client().RunOnce();
  h.DestroyClient();
  ASSERT_EQ(h.sync_count(), 2u);
  EXPECT_TRUE(h.last_request().final());
  EXPECT_EQ(h.last_request().tenants(0).tokens_returned(), 3u);
}

TEST(BudgetClientTest, StaleResponseIsIgnored) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler([](const v1::SyncRequest& request, v1::SyncResponse* response) {
    GrantAll(request, response, 5);
    response->set_stale(true);
    return grpc::Status::OK;
  });
  h.client().RunOnce();
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(budget->Stats().tokens_received, 0u);
  EXPECT_FALSE(budget->Stats().lease_active);
  // The response was received, so the next request is new.
  h.set_handler(Granting(1));
  h.clock().Advance(absl::Milliseconds(5));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().seq(), 2u);
  EXPECT_EQ(h.last_request().tenants(0).tokens_received(), 0u);
  EXPECT_TRUE(budget->TryAcquire());
}

TEST(BudgetClientTest, PerTenantErrorKeepsDenyingThatTenantOnly) {
  ClientHarness h;
  TenantBudget* good = h.Tenant("good");
  TenantBudget* refused = h.Tenant("refused");
  h.set_handler([](const v1::SyncRequest& request, v1::SyncResponse* response) {
    GrantAll(request, response, 5);
    for (v1::TenantGrant& grant : *response->mutable_tenants()) {
      if (grant.tenant() == "refused") {
        grant.set_granted(0);
        grant.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
        grant.mutable_error()->set_message("unknown tenant on a strict server");
      }
    }
    return grpc::Status::OK;
  });
  h.client().RunOnce();
  EXPECT_TRUE(good->TryAcquire());
  EXPECT_FALSE(refused->TryAcquire());
  const TenantStats stats = refused->Stats();
  EXPECT_EQ(stats.error.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(stats.error.message()), ::testing::HasSubstr("strict server"));
  EXPECT_FALSE(stats.lease_active);
  EXPECT_TRUE(good->Stats().error.ok());

  // A later grant lifts the refusal.
  h.set_handler(Granting(2));
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_TRUE(refused->TryAcquire());
  EXPECT_TRUE(refused->Stats().error.ok());
}

TEST(BudgetClientTest, ResponseEntryForAnotherTenantIsNotApplied) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler([](const v1::SyncRequest&, v1::SyncResponse* response) {
    v1::TenantGrant* grant = response->add_tenants();
    grant->set_tenant("someone-else");
    grant->set_granted(5);
    grant->set_lease_ttl_ms(5000);
    return grpc::Status::OK;
  });
  h.client().RunOnce();
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(budget->Stats().tokens_received, 0u);
}

TEST(BudgetClientTest, BadTenantNamesAreRejected) {
  ClientHarness h;
  for (const std::string& bad :
       {std::string(), std::string(129, 'a'), std::string("has space"), std::string("tab\t"),
        std::string("caf\xc3\xa9")}) {
    const absl::StatusOr<TenantBudget*> budget = h.client().Tenant(bad);
    EXPECT_EQ(budget.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(h.client().Tenant(std::string(128, 'a')).ok());
  EXPECT_TRUE(h.client().Tenant("svc.team_1:db/read-replica").ok());
}

TEST(BudgetClientTest, TenantReturnsTheSameHandleForTheSameName) {
  ClientHarness h;
  TenantBudget* first = h.Tenant("payments");
  EXPECT_EQ(h.Tenant("payments"), first);
  EXPECT_NE(h.Tenant("orders"), first);
  EXPECT_EQ(first->tenant(), "payments");
}

TEST(BudgetClientTest, AtMost256TenantsPerClient) {
  ClientHarness h;
  for (int i = 0; i < 256; ++i) ASSERT_TRUE(h.client().Tenant("t" + std::to_string(i)).ok());
  EXPECT_EQ(h.client().Tenant("one-too-many").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(BudgetClientTest, CreateRejectsBadOptions) {
  auto with = [](auto change) {
    ClientOptions options;
    change(options);
    return BudgetClient::Create(options).status();
  };
  EXPECT_EQ(with([](ClientOptions& o) { o.target = ""; }).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status period = with([](ClientOptions& o) { o.refresh_period = absl::ZeroDuration(); });
  EXPECT_EQ(period.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(period.message()), ::testing::HasSubstr("refresh_period"));
  EXPECT_EQ(with([](ClientOptions& o) { o.instance_id = "has space"; }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](ClientOptions& o) { o.sync_timeout = absl::ZeroDuration(); }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](ClientOptions& o) { o.min_sync_interval = absl::Seconds(1); }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](ClientOptions& o) { o.lease_burst = 2'000'000; }).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status backoff =
      with([](ClientOptions& o) { o.max_reconnect_backoff = absl::ZeroDuration(); });
  EXPECT_EQ(backoff.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backoff.message()), ::testing::HasSubstr("max_reconnect_backoff"));
  EXPECT_EQ(with([](ClientOptions& o) { o.max_reconnect_backoff = absl::Hours(2); }).code(),
            absl::StatusCode::kInvalidArgument);
  ClientOptions no_target;
  no_target.target = "";
  EXPECT_EQ(CreateBudgetChannel(no_target).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BudgetClientTest, CreateBudgetChannelMakesTheClientsChannel) {
  ClientOptions options;
  options.target = "127.0.0.1:1";
  options.max_reconnect_backoff = absl::Milliseconds(250);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateBudgetChannel(options);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_NE(*channel, nullptr);
}

// ---- A Sync never holds up the duties of the refresher ----

TEST(BudgetClientTest, SyncDeadlineNeverOutlivesTheLease) {
  ClientHarness h(DenyFallbackOptions());
  h.Tenant("payments");
  const absl::Time sent = h.clock().Now();
  h.set_handler(Granting(5, /*lease_ttl_ms=*/300, /*next_sync_ms=*/200));
  h.client().RunOnce();
  // A full sync_timeout (1 s) when no duty comes sooner.
  EXPECT_GT(h.last_timeout(), absl::Milliseconds(900));
  // 200 ms later the lease ends in 100 ms: the next Sync's deadline is cut to it.
  h.clock().Set(sent + absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_LE(h.last_timeout(), absl::Milliseconds(100));
  EXPECT_GT(h.last_timeout(), absl::Milliseconds(50));
}

TEST(BudgetClientTest, ASyncCutShortAtTheLeaseExpiryEndsTheLeaseAndIsResentWithTheSameSeq) {
  ClientHarness h(DenyFallbackOptions());
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time sent = h.clock().Now();
  h.set_handler(Granting(5, /*lease_ttl_ms=*/300, /*next_sync_ms=*/200));
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire());
  // The next Sync blocks until its deadline, the lease's end (the server is hung).
  h.set_handler([&h, sent](const v1::SyncRequest&, v1::SyncResponse*) {
    h.clock().Set(sent + absl::Milliseconds(300));
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline");
  });
  h.clock().Set(sent + absl::Milliseconds(200));
  // The step ends the lease at once and asks for the resend at once.
  EXPECT_EQ(h.client().RunOnce(), sent + absl::Milliseconds(300));
  EXPECT_FALSE(budget->TryAcquire());
  EXPECT_EQ(budget->Stats().tokens_returned, 4u);
  // No verdict on the server yet: the lease ended (deny), not a fallback.
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kNoLease);
  const uint64_t seq = h.client().last_seq();
  h.set_handler(Granting(3, /*lease_ttl_ms=*/300, /*next_sync_ms=*/200));
  h.client().RunOnce();
  const std::vector<v1::SyncRequest> requests = h.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[2].seq(), seq);
  EXPECT_EQ(requests[1].SerializeAsString(), requests[2].SerializeAsString());
  // The grant of the resend starts at the FIRST send of the request.
  EXPECT_EQ(budget->Stats().mode, BudgetMode::kLease);
  EXPECT_EQ(h.client().RunOnce(), sent + absl::Milliseconds(500));
}

TEST(BudgetClientTest, InFallbackASyncIsCutShortForTheNextFallbackToken) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  // A share of 1 token and 10/s: a token every 100 ms in fallback.
  h.set_handler(testing_util::GrantingWithShare(0, 1, 10, /*lease_ttl_ms=*/300));
  h.client().RunOnce();
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  for (int i = 0; i < 20 && budget->Stats().mode != BudgetMode::kFallback; ++i) {
    h.clock().Set(h.client().RunOnce());
  }
  ASSERT_EQ(budget->Stats().mode, BudgetMode::kFallback);
  ASSERT_TRUE(budget->TryAcquire());  // the bucket is empty: its next token is 100 ms away
  h.clock().Set(h.client().RunOnce());
  EXPECT_LE(h.last_timeout(), absl::Milliseconds(100));
}

TEST(BudgetClientTest, CreateDoesNotWaitForTheServerAndDeniesUntilALease) {
  ClientOptions options;
  options.target = "127.0.0.1:1";  // nothing listens there
  absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->instance_id().empty());
  // No tenant: Shutdown has nothing to report and sends nothing.
  EXPECT_TRUE((*client)->Shutdown().ok());
}

TEST(BudgetClientTest, RandomInstanceIdsDiffer) {
  auto a = BudgetClient::Create({});
  auto b = BudgetClient::Create({});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*a)->instance_id(), (*b)->instance_id());
}

}  // namespace
}  // namespace retrybudget
