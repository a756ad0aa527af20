// A client made by BudgetClient::Create() against the REAL retry-budget-server process, as a
// program that starts, calls and retries once uses it: its first call, which fails once, gets
// its success (the retry waits for the tenant's first answer instead of being denied), and a
// retry cancelled during its backoff gives its token back to the server's bucket, which counts
// only the retries sent. Real processes and wall-clock time; the bounds are behavioural.
#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

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

class ClientFirstCallTest : public ::retrybudget::testing::RealServerClientTest {
 protected:
  std::unique_ptr<BudgetClient> NewClient() { return CreateClient(); }  // the defaults
};

// The call of a program whose first action it is: the first attempt fails at once (so the
// retry is asked for within microseconds of Tenant()), the second succeeds.
absl::Status FailOnceThenSucceed(TenantBudget& budget) {
  return Retry(budget, RetryPolicy{}, {.deadline = absl::Now() + absl::Seconds(20)},
               [](const Attempt& a) {
                 return a.number == 1 ? absl::UnavailableError("the backend blinked")
                                      : absl::OkStatus();
               });
}

TEST_F(ClientFirstCallTest, ANewClientsFirstCallThatFailsOnceGetsItsSuccess) {
  constexpr int kClients = 20;
  for (int i = 0; i < kClients; ++i) {
    std::unique_ptr<BudgetClient> client = NewClient();
    ASSERT_NE(client, nullptr);
    TenantBudget* budget = client->Tenant("first-call").value();
    const absl::Status status = FailOnceThenSucceed(*budget);
    ASSERT_TRUE(status.ok()) << "client " << i << ": " << status;
    EXPECT_EQ(budget->Stats().retries_denied, 0u);
    EXPECT_EQ(budget->Stats().retries_allowed, 1u);
    ASSERT_TRUE(client->Shutdown().ok());
  }
  // Every retry was sent, and the server counted each once.
  EXPECT_EQ(GetBudget("first-call").retries_total(), static_cast<uint64_t>(kClients));
}

TEST_F(ClientFirstCallTest, WaitReadyReturnsWithTheFirstLease) {
  std::unique_ptr<BudgetClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  TenantBudget* budget = client->Tenant("wait-ready").value();
  const absl::Status ready = budget->WaitReady(absl::Now() + absl::Seconds(20), {});
  ASSERT_TRUE(ready.ok()) << ready;
  EXPECT_TRUE(budget->Stats().lease_active);
  EXPECT_TRUE(budget->TryAcquire());
}

TEST_F(ClientFirstCallTest, ACancelledBackoffsTokenGoesBackToTheServersBucket) {
  // 10 tokens, no refill, no credit for successes: the bucket's level counts every token that
  // did not come back.
  v1::BudgetPolicy policy;
  policy.set_capacity(10);
  policy.set_refill_per_second(0);
  policy.set_success_credit(0);
  ASSERT_NO_FATAL_FAILURE(PutPolicy("refund", policy));

  std::unique_ptr<BudgetClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  TenantBudget* budget = client->Tenant("refund").value();
  ASSERT_TRUE(budget->WaitReady(absl::Now() + absl::Seconds(20), {}).ok());

  // A retry that is sent.
  ASSERT_TRUE(FailOnceThenSucceed(*budget).ok());

  // A call whose retry waits a long backoff (5 s), cancelled during it, after a Sync has
  // reported its token spent.
  std::stop_source stop;
  absl::Status cancelled_status;
  std::thread cancelled([&] {
    RetryPolicy long_backoff;
    long_backoff.initial_backoff = absl::Seconds(10);
    long_backoff.max_backoff = absl::Seconds(10);
    cancelled_status = Retry(*budget, long_backoff,
                             {.stop = stop.get_token(),
                              .deadline = absl::Now() + absl::Seconds(60),
                              .random = [] { return 0.5; }},
                             [](const Attempt& a) {
                               return a.number == 1 ? absl::UnavailableError("down")
                                                    : absl::OkStatus();
                             });
  });
  // The server hears of the token taken (the refresher syncs at least every refresh period).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (GetBudget("refund").retries_total() < 2 && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(GetBudget("refund").retries_total(), 2u) << "the spent token was never reported";
  stop.request_stop();
  cancelled.join();
  EXPECT_EQ(cancelled_status.code(), absl::StatusCode::kCancelled) << cancelled_status;

  const TenantStats stats = budget->Stats();
  EXPECT_EQ(stats.retries_allowed, 1u);
  EXPECT_EQ(stats.refunds, 1u);
  EXPECT_EQ(stats.tokens_received,
            stats.retries_allowed + stats.tokens_returned +
                static_cast<uint64_t>(stats.tokens_held));

  // The final Sync reports the refund and returns every unspent token, the refunded one
  // included.
  ASSERT_TRUE(client->Shutdown().ok());
  const TenantStats last = budget->Stats();
  EXPECT_EQ(last.tokens_held, 0);
  EXPECT_EQ(last.tokens_received, last.retries_allowed + last.tokens_returned);
  const v1::BudgetStatus server = GetBudget("refund");
  EXPECT_EQ(server.retries_total(), 1u);  // the retry sent, not the one cancelled
  EXPECT_EQ(server.refunded_total(), 1u);
  EXPECT_DOUBLE_EQ(server.tokens(), 9.0);  // only the sent retry's token is gone
}

}  // namespace
}  // namespace retrybudget
