// Issue 36's client rules through the whole client (BudgetClientImpl over a mock stub, on a
// FakeClock): retries that cost more than one token, shadow mode, requests reported. The
// conformance corpus pins the same rules step by step (client/conformance/RULES.md: cost.*,
// shadow.*, requests.*, retries-allowed.reported); these tests check the C++ surface: Stats,
// the wake-up, metrics.
#include <map>
#include <optional>
#include <string>

#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/v1/budget.pb.h"
#include "tests/client/client_test_util.h"

namespace retrybudget {
namespace {

using testing_util::ClientHarness;
using testing_util::GrantAll;
using testing_util::Granting;
using testing_util::SyncHandler;

// Grants `granted` to every tenant with `mode`.
SyncHandler GrantingInMode(uint64_t granted, v1::Mode mode) {
  return [=](const v1::SyncRequest& request, v1::SyncResponse* response) {
    GrantAll(request, response, granted);
    for (v1::TenantGrant& grant : *response->mutable_tenants()) grant.set_mode(mode);
    return grpc::Status::OK;
  };
}

// The next request's entry for the (only) tenant, after the refresh period.
v1::TenantSync NextReport(ClientHarness& h) {
  h.clock().Advance(absl::Milliseconds(200));
  h.client().RunOnce();
  return h.last_request().tenants(0);
}

TEST(CostTest, ACostIsTakenAllOrNothingAndCountsTokensAndOneRetry) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("llm");
  h.set_handler(Granting(10));
  h.client().RunOnce();
  EXPECT_TRUE(budget->TryAcquire(4));
  EXPECT_FALSE(budget->TryAcquire(7));  // 6 left: none taken
  EXPECT_EQ(budget->Stats().tokens_held, 6);
  EXPECT_TRUE(budget->TryAcquire(6));
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.retries_allowed, 2u);
  EXPECT_EQ(stats.tokens_spent, 10u);
  EXPECT_EQ(stats.retries_denied, 1u);
  EXPECT_EQ(stats.tokens_received, stats.tokens_spent + stats.tokens_returned +
                                       static_cast<uint64_t>(stats.tokens_held));
  h.set_handler(Granting(0));
  const v1::TenantSync report = NextReport(h);
  EXPECT_EQ(report.retries_spent(), 10u);
  EXPECT_EQ(report.retries_allowed(), 2u);
  EXPECT_EQ(report.retries_denied(), 1u);
}

TEST(CostTest, ARefundOfACostGivesItsTokensBack) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("llm");
  h.set_handler(Granting(10));
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire(8));
  budget->Refund(8);
  EXPECT_EQ(budget->Stats().tokens_held, 10);
  EXPECT_EQ(budget->Stats().retries_allowed, 0u);
  EXPECT_EQ(budget->Stats().refunds, 1u);
  EXPECT_TRUE(budget->TryAcquire(10));
}

TEST(CostTest, ACostOutOfRangeIsDeniedCountsNothingAndWakesNothing) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("llm");
  h.set_handler(Granting(10));
  h.client().RunOnce();
  ASSERT_FALSE(h.client().wake_requested());
  EXPECT_FALSE(budget->TryAcquire(0));
  EXPECT_FALSE(budget->TryAcquire(TenantBudget::kMaxCost + 1));
  budget->Refund(0);
  budget->Refund(TenantBudget::kMaxCost + 1);
  EXPECT_FALSE(h.client().wake_requested());
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.retries_denied, 0u);
  EXPECT_EQ(stats.refunds, 0u);
  EXPECT_EQ(stats.tokens_held, 10);
  EXPECT_FALSE(budget->TryAcquire(TenantBudget::kMaxCost));  // in range: a denial
  EXPECT_EQ(budget->Stats().retries_denied, 1u);
}

TEST(CostTest, DemandCountsTheTokensAskedSoTheLeaseIsSizedInTokens) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("llm");
  h.set_handler(Granting(0));
  h.client().RunOnce();
  EXPECT_FALSE(budget->TryAcquire(50));
  // 50 tokens of demand: ceil(50/s * 0.2 s) + lease_burst 2.
  EXPECT_EQ(NextReport(h).want(), 12u);
}

TEST(ShadowTest, AShadowTenantAllowsWhatEnforcementWouldDenyAndCountsIt) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingInMode(2, v1::MODE_SHADOW));
  h.client().RunOnce();
  EXPECT_TRUE(budget->Stats().shadow);
  ASSERT_FALSE(h.client().wake_requested());
  EXPECT_TRUE(budget->TryAcquire(3));  // 2 held: enforcement would deny
  EXPECT_TRUE(h.client().wake_requested());
  TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.tokens_held, 2);  // no token taken
  EXPECT_EQ(stats.shadow_denied, 1u);
  EXPECT_EQ(stats.retries_denied, 0u);
  EXPECT_EQ(stats.retries_allowed, 0u);
  EXPECT_TRUE(budget->TryAcquire(2));  // the tokens are there: taken as in enforce mode
  EXPECT_EQ(budget->Stats().tokens_held, 0);
  const v1::TenantSync report = NextReport(h);
  EXPECT_EQ(report.shadow_denied(), 1u);
  EXPECT_EQ(report.retries_denied(), 0u);
  EXPECT_EQ(report.retries_spent(), 2u);
  EXPECT_EQ(report.retries_allowed(), 1u);
}

TEST(ShadowTest, ARefundCancelsPermitsWithoutATokenFirst) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingInMode(3, v1::MODE_SHADOW));
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire(3));  // backed
  ASSERT_TRUE(budget->TryAcquire(2));  // unbacked: 2 out
  budget->Refund(2);                   // cancels the unbacked permit: no token back
  EXPECT_EQ(budget->Stats().tokens_held, 0);
  EXPECT_EQ(budget->Stats().refunds, 0u);
  budget->Refund(3);  // nothing unbacked left: a normal refund
  EXPECT_EQ(budget->Stats().tokens_held, 3);
  EXPECT_EQ(budget->Stats().refunds, 1u);
}

TEST(ShadowTest, TheModeFollowsEveryAnswerAndAnErrorKeepsIt) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  EXPECT_FALSE(budget->TryAcquire());  // a new tenant enforces until its first answer
  h.set_handler(GrantingInMode(0, v1::MODE_SHADOW));
  h.client().RunOnce();
  EXPECT_TRUE(budget->TryAcquire());
  h.set_handler([](const v1::SyncRequest& request, v1::SyncResponse* response) {
    v1::TenantGrant* grant = response->add_tenants();
    grant->set_tenant(request.tenants(0).tenant());
    grant->mutable_error()->set_code(static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
    return grpc::Status::OK;
  });
  NextReport(h);
  EXPECT_TRUE(budget->Stats().shadow);
  EXPECT_TRUE(budget->TryAcquire());  // refused, and still in shadow
  h.set_handler(Granting(0));         // MODE_UNSPECIFIED: enforce
  NextReport(h);
  EXPECT_FALSE(budget->Stats().shadow);
  EXPECT_FALSE(budget->TryAcquire());
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.shadow_denied, 2u);
  EXPECT_EQ(stats.retries_denied, 2u);
}

TEST(RequestsTest, RecordRequestIsReportedInEveryEntryAndTheFinalOne) {
  ClientHarness h;
  TenantBudget* budget = h.Tenant("payments");
  budget->RecordRequest();
  h.set_handler(Granting(2));
  h.client().RunOnce();
  EXPECT_EQ(h.last_request().tenants(0).requests(), 1u);
  ASSERT_FALSE(h.client().wake_requested());
  budget->RecordRequest();
  budget->RecordRequest();
  EXPECT_FALSE(h.client().wake_requested());
  EXPECT_EQ(budget->Stats().requests, 3u);
  EXPECT_EQ(NextReport(h).requests(), 3u);
  ASSERT_TRUE(h.client().Shutdown().ok());
  EXPECT_TRUE(h.last_request().final());
  EXPECT_EQ(h.last_request().tenants(0).requests(), 3u);
}

// The value of the counter `name` for tenant "payments"; nullopt if none.
std::optional<double> PaymentsCounter(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "tenant" && label.value == "payments") return metric.counter.value;
      }
    }
  }
  return std::nullopt;
}

TEST(CostShadowMetricsTest, ShadowDenialsRequestsAndRetriesAreCounted) {
  prometheus::Registry registry;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.metrics_registry = &registry;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingInMode(5, v1::MODE_SHADOW));
  h.client().RunOnce();
  budget->RecordRequest();
  ASSERT_TRUE(budget->TryAcquire(5));
  ASSERT_TRUE(budget->TryAcquire(5));  // would-be denial
  NextReport(h);
  EXPECT_EQ(PaymentsCounter(registry, "retry_budget_client_shadow_denied_total"), 1);
  EXPECT_EQ(PaymentsCounter(registry, "retry_budget_client_requests_total"), 1);
  EXPECT_EQ(PaymentsCounter(registry, "retry_budget_client_retries_allowed_total"), 1);
  EXPECT_EQ(PaymentsCounter(registry, "retry_budget_client_retries_denied_total"), 0);
}

}  // namespace
}  // namespace retrybudget
