// The client library against the real server binary when the server refuses a request as a
// whole: a server that answers is not an outage. With --max_tenants_per_request lower than the
// tenants one client syncs, the client splits its requests (to the limit the error names) and
// every tenant still gets its lease; the refusals are counted by code in the client metrics.
#include <prometheus/registry.h>
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

constexpr int kMaxTenantsPerRequest = 4;
constexpr int kTenants = 11;

double CounterValue(prometheus::Registry& registry, const std::string& name,
                    const std::string& label, const std::string& value) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& l : metric.label) {
        if (l.name == label && l.value == value) return metric.counter.value;
      }
    }
  }
  return 0;
}

TEST(ClientRefusalTest, MoreTenantsThanTheServerTakesPerRequestAllGetLeases) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {absl::StrCat("--max_tenants_per_request=", kMaxTenantsPerRequest)});
  ASSERT_NE(server, nullptr);

  prometheus::Registry registry;
  ClientOptions options;
  options.target = server->target();
  options.metrics_registry = &registry;
  auto client = BudgetClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<TenantBudget*> budgets;
  for (int i = 0; i < kTenants; ++i) {
    auto budget = (*client)->Tenant(absl::StrCat("tenant-", i));
    ASSERT_TRUE(budget.ok()) << budget.status();
    budgets.push_back(*budget);
  }
  // Every tenant reaches a lease (none stays in fallback or without a lease), and can spend it.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  auto all_leased = [&] {
    for (TenantBudget* b : budgets) {
      if (b->Stats().mode != BudgetMode::kLease) return false;
    }
    return true;
  };
  while (!all_leased() && absl::Now() < deadline) {
    for (TenantBudget* b : budgets) (void)b->TryAcquire();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (TenantBudget* b : budgets) {
    EXPECT_EQ(b->Stats().mode, BudgetMode::kLease) << b->tenant();
    EXPECT_TRUE(b->TryAcquire()) << b->tenant();
  }
  // The server's refusal was seen and counted, and did not count as an outage.
  EXPECT_GE(CounterValue(registry, "retry_budget_client_sync_errors_total", "code",
                         "INVALID_ARGUMENT"),
            1);
  EXPECT_EQ(CounterValue(registry, "retry_budget_client_sync_errors_total", "code",
                         "UNAVAILABLE"),
            0);
  for (TenantBudget* b : budgets) EXPECT_EQ(b->Stats().fallback_allowed, 0u) << b->tenant();
  EXPECT_TRUE((*client)->Shutdown().ok());
  EXPECT_EQ(server->Stop(SIGTERM), 0) << server->Output();
}

}  // namespace
}  // namespace retrybudget::testing
