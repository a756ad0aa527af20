// The client's Prometheus metrics: a registry passed in ClientOptions, driven on a FakeClock.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/clock.h"
#include "tests/client/client_test_util.h"
#include "tests/client/fake_cluster.h"

namespace retrybudget {
namespace {

using testing_util::ClientHarness;
using testing_util::Failing;
using testing_util::GrantingWithShare;

// The value of the sample of `name` whose labels include all of `labels`; nullopt if none.
std::optional<double> Value(prometheus::Registry& registry, const std::string& name,
                            const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      size_t matched = 0;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        auto it = labels.find(label.name);
        if (it != labels.end() && it->second == label.value) ++matched;
      }
      if (matched != labels.size()) continue;
      return family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                            : metric.gauge.value;
    }
  }
  return std::nullopt;
}

TEST(ClientMetricsTest, RefresherPublishesTenantCountersModeAndSyncs) {
  prometheus::Registry registry;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.metrics_registry = &registry;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  const absl::Time t0 = h.clock().Now();
  h.set_handler(GrantingWithShare(4, /*share_capacity=*/2, /*share_refill_per_second=*/1,
                                  /*lease_ttl_ms=*/1000));
  h.client().RunOnce();
  const std::map<std::string, std::string> payments = {{"tenant", "payments"}};
  EXPECT_EQ(Value(registry, "retry_budget_client_tokens_held", payments), 4);
  EXPECT_EQ(Value(registry, "retry_budget_client_mode", {{"tenant", "payments"}, {"mode", "lease"}}),
            1);
  EXPECT_EQ(
      Value(registry, "retry_budget_client_mode", {{"tenant", "payments"}, {"mode", "fallback"}}),
      0);

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(budget->TryAcquire());
  budget->RecordSuccess();
  // Nothing on the hot path: the counters move at the refresher's next step.
  EXPECT_EQ(Value(registry, "retry_budget_client_retries_allowed_total", payments), 0);
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Set(t0 + absl::Milliseconds(200));
  h.client().RunOnce();
  EXPECT_EQ(Value(registry, "retry_budget_client_retries_allowed_total", payments), 3);
  EXPECT_EQ(Value(registry, "retry_budget_client_successes_total", payments), 1);
  EXPECT_EQ(Value(registry, "retry_budget_client_tokens_held", payments), 1);
  EXPECT_EQ(Value(registry, "retry_budget_client_syncs_total", {{"result", "ok"}}), 1);
  EXPECT_EQ(Value(registry, "retry_budget_client_syncs_total", {{"result", "error"}}), 1);

  // Past the lease's expiry with the server down: fallback.
  while (budget->Stats().mode != BudgetMode::kFallback) h.clock().Set(h.client().RunOnce());
  ASSERT_TRUE(budget->TryAcquire());
  ASSERT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());
  h.client().RunOnce();
  EXPECT_EQ(
      Value(registry, "retry_budget_client_mode", {{"tenant", "payments"}, {"mode", "fallback"}}),
      1);
  EXPECT_EQ(Value(registry, "retry_budget_client_mode", {{"tenant", "payments"}, {"mode", "lease"}}),
            0);
  EXPECT_EQ(Value(registry, "retry_budget_client_retries_allowed_total", payments), 5);
  EXPECT_EQ(Value(registry, "retry_budget_client_fallback_retries_total", payments), 2);
  EXPECT_EQ(Value(registry, "retry_budget_client_retries_denied_total", payments), 1);
  EXPECT_EQ(Value(registry, "retry_budget_client_tokens_held", payments), 0);
  const std::optional<double> errors =
      Value(registry, "retry_budget_client_syncs_total", {{"result", "error"}});
  ASSERT_TRUE(errors.has_value());
  EXPECT_GT(*errors, 1);
}

TEST(ClientMetricsTest, ARefundAfterPublishingNeverMakesACounterGoBack) {
  prometheus::Registry registry;
  ClientOptions options = ClientHarness::DefaultOptions();
  options.metrics_registry = &registry;
  ClientHarness h(options);
  TenantBudget* budget = h.Tenant("payments");
  h.set_handler(GrantingWithShare(4, 2, 1));
  h.client().RunOnce();
  ASSERT_TRUE(budget->TryAcquire());
  h.client().RunOnce();
  EXPECT_EQ(Value(registry, "retry_budget_client_retries_allowed_total", {{"tenant", "payments"}}),
            1);
  budget->Refund();
  h.client().RunOnce();
  EXPECT_EQ(Value(registry, "retry_budget_client_retries_allowed_total", {{"tenant", "payments"}}),
            1);
}

TEST(ClientMetricsTest, ARegistryWithAClashingNameIsRefused) {
  prometheus::Registry registry;
  prometheus::BuildGauge().Name("retry_budget_client_syncs_total").Register(registry);
  ClientOptions options = ClientHarness::DefaultOptions();
  options.metrics_registry = &registry;
  const absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), ::testing::HasSubstr("metrics_registry"));
}

TEST(ClientMetricsTest, RedirectsAreCounted) {
  prometheus::Registry registry;
  FakeClock clock;
  testing_util::FakeCluster cluster;
  cluster.SetOwner("a", "s2:1");
  cluster.SetOwner("b", "s3:1");
  ClientOptions options = ClientHarness::DefaultOptions();
  options.metrics_registry = &registry;
  options.clock = &clock;
  auto client =
      CreateBudgetClientForTesting(options, cluster.Stub("s1:1"), cluster.Factory()).value();
  ASSERT_TRUE(client->Tenant("a").ok());
  ASSERT_TRUE(client->Tenant("b").ok());
  client->RunOnce();
  EXPECT_EQ(Value(registry, "retry_budget_client_redirects_total", {}), 2);
}

}  // namespace
}  // namespace retrybudget
