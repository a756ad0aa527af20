// The C++ client made by BudgetClient::Create() against the REAL retry-budget-server process:
// a retry of cost 5 takes 5 tokens from the server's bucket (and counts one retry), a shadow
// tenant's client denies nothing and the server counts the would-be denials the client saw, a
// switch of the mode reaches the client within a refresh, and every request recorded is counted
// once. Real processes and wall-clock time; the bounds are behavioural.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/client/real_server_client_test.h"

namespace retrybudget {
namespace {

// A classic bucket of `capacity` tokens that never refills nor credits: its level counts every
// token that did not come back.
v1::BudgetPolicy FixedBucket(double capacity, v1::Mode mode = v1::MODE_ENFORCE) {
  v1::BudgetPolicy policy;
  policy.set_capacity(capacity);
  policy.set_refill_per_second(0);
  policy.set_success_credit(0);
  policy.set_mode(mode);
  return policy;
}

class ClientCostShadowTest : public ::retrybudget::testing::RealServerClientTest {
 protected:
  std::unique_ptr<BudgetClient> NewClient(uint64_t lease_burst = 2,
                                          absl::Duration refresh = absl::Milliseconds(200)) {
    ClientOptions options;
    options.lease_burst = lease_burst;
    options.refresh_period = refresh;
    return CreateClient(std::move(options));
  }
};

TEST_F(ClientCostShadowTest, ARetryOfCostFiveTakesFiveTokensFromTheServersBucket) {
  ASSERT_NO_FATAL_FAILURE(PutPolicy("llm", FixedBucket(20)));
  std::unique_ptr<BudgetClient> client = NewClient(/*lease_burst=*/10);
  ASSERT_NE(client, nullptr);
  TenantBudget* budget = client->Tenant("llm").value();
  ASSERT_TRUE(budget->WaitReady(absl::Now() + absl::Seconds(20), {}).ok());
  ASSERT_EQ(budget->Stats().tokens_held, 10);
  EXPECT_TRUE(budget->TryAcquire(5));
  EXPECT_TRUE(budget->TryAcquire(5));
  EXPECT_FALSE(budget->TryAcquire(5));  // the lease is empty: nothing partial
  ASSERT_TRUE(client->Shutdown().ok());

  const v1::BudgetStatus status = GetBudget("llm");
  EXPECT_EQ(status.retries_total(), 10u);         // tokens
  EXPECT_EQ(status.retries_allowed_total(), 2u);  // retries
  EXPECT_EQ(status.retries_denied_total(), 1u);
  EXPECT_DOUBLE_EQ(status.tokens(), 10);  // 20 - 10 spent: the rest came back
}

TEST_F(ClientCostShadowTest, AShadowTenantDeniesNothingAndTheServerCountsTheWouldBeDenials) {
  ASSERT_NO_FATAL_FAILURE(PutPolicy("dry-run", FixedBucket(3, v1::MODE_SHADOW)));
  std::unique_ptr<BudgetClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  TenantBudget* budget = client->Tenant("dry-run").value();
  ASSERT_TRUE(budget->WaitReady(absl::Now() + absl::Seconds(20), {}).ok());
  ASSERT_TRUE(budget->Stats().shadow);
  constexpr int kRetries = 20;
  for (int i = 0; i < kRetries; ++i) {
    budget->RecordRequest();
    EXPECT_TRUE(budget->TryAcquire()) << i;
  }
  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.retries_allowed + stats.shadow_denied, static_cast<uint64_t>(kRetries));
  EXPECT_GE(stats.shadow_denied, static_cast<uint64_t>(kRetries - 3));  // 3 tokens at most
  EXPECT_EQ(stats.retries_denied, 0u);
  ASSERT_TRUE(client->Shutdown().ok());

  const v1::BudgetStatus status = GetBudget("dry-run");
  EXPECT_EQ(status.shadow_denied_total(), stats.shadow_denied);
  EXPECT_EQ(status.retries_total(), stats.tokens_spent);
  EXPECT_EQ(status.retries_denied_total(), 0u);
  EXPECT_EQ(status.requests_total(), static_cast<uint64_t>(kRetries));
}

TEST_F(ClientCostShadowTest, ASwitchOfTheModeReachesTheClientWithinARefresh) {
  ASSERT_NO_FATAL_FAILURE(PutPolicy("switch", FixedBucket(1)));
  std::unique_ptr<BudgetClient> client =
      NewClient(/*lease_burst=*/2, /*refresh=*/absl::Milliseconds(50));
  ASSERT_NE(client, nullptr);
  TenantBudget* budget = client->Tenant("switch").value();
  ASSERT_TRUE(budget->WaitReady(absl::Now() + absl::Seconds(20), {}).ok());
  EXPECT_FALSE(budget->Stats().shadow);

  const auto wait_for_mode = [&](bool shadow) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);  // a safety net, not a bound
    while (budget->Stats().shadow != shadow && absl::Now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return budget->Stats().shadow == shadow;
  };
  ASSERT_NO_FATAL_FAILURE(PutPolicy("switch", FixedBucket(1, v1::MODE_SHADOW)));
  ASSERT_TRUE(wait_for_mode(true));
  while (budget->Stats().tokens_held > 0) ASSERT_TRUE(budget->TryAcquire());
  EXPECT_TRUE(budget->TryAcquire());  // empty, and allowed
  EXPECT_GE(budget->Stats().shadow_denied, 1u);

  ASSERT_NO_FATAL_FAILURE(PutPolicy("switch", FixedBucket(1, v1::MODE_ENFORCE)));
  ASSERT_TRUE(wait_for_mode(false));
  while (budget->Stats().tokens_held > 0) ASSERT_TRUE(budget->TryAcquire());
  EXPECT_FALSE(budget->TryAcquire());  // enforced again
  EXPECT_GE(budget->Stats().retries_denied, 1u);
  ASSERT_TRUE(client->Shutdown().ok());
}

}  // namespace
}  // namespace retrybudget
