// The whole path: the real budget server (in process, 127.0.0.1:0), the real client library, the
// gRPC adapter and the flaky backend. Retries stop when the tenant's budget is spent, and the
// fleet-wide invariant of DESIGN.md holds for what the backend actually received.
#include <cmath>
#include <memory>
#include <string>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "flaky_backend.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"
#include "retrybudget/retry_grpc.h"
#include "server/budget_core.h"
#include "server/budget_server.h"

namespace retrybudget {
namespace {

using ::retrybudget::examples::EchoReply;
using ::retrybudget::examples::EchoRequest;
using ::retrybudget::examples::FlakyBackend;
using ::retrybudget::examples::FlakyEcho;

constexpr double kCapacity = 3;
constexpr double kRefillPerSecond = 1;  // the server's floor: 0 would mean "default"

TEST(RetryWithBudgetServerTest, RetriesStopWhenTheSharedBudgetIsSpent) {
  v1::PolicyConfig config;
  v1::BudgetPolicy* policy = config.mutable_default_policy();
  policy->set_capacity(kCapacity);
  policy->set_initial_tokens(kCapacity);
  policy->set_refill_per_second(kRefillPerSecond);
  auto core = BudgetCore::Create({.policy = config});
  ASSERT_TRUE(core.ok()) << core.status();
  ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  server_options.service.core = core->get();
  auto server = BudgetServer::Start(std::move(server_options));
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Time start = absl::Now();

  auto backend = FlakyBackend::Start("127.0.0.1:0", {.failure_probability = 1.0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  grpc::ChannelArguments args;
  DisableGrpcBuiltInRetries(args);
  auto stub = FlakyEcho::NewStub(grpc::CreateCustomChannel(
      (*backend)->target(), grpc::InsecureChannelCredentials(), args));

  ClientOptions client_options;
  client_options.target = (*server)->address();
  client_options.refresh_period = absl::Milliseconds(20);
  auto client = BudgetClient::Create(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<TenantBudget*> budget = (*client)->Tenant("flaky-echo");
  ASSERT_TRUE(budget.ok()) << budget.status();

  // A fresh client denies until its first lease arrives (DESIGN.md): wait for it, so the test
  // shows retries being allowed and then refused.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while ((*budget)->Stats().tokens_held == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GT((*budget)->Stats().tokens_held, 0) << "no lease from the budget server";

  RetryPolicy retry;
  retry.max_attempts = 50;
  retry.initial_backoff = absl::Milliseconds(1);
  retry.max_backoff = absl::Milliseconds(2);
  constexpr int kCalls = 20;
  int exhausted = 0;
  for (int i = 0; i < kCalls; ++i) {
    CallControl control;
    control.deadline = absl::Now() + absl::Seconds(10);
    absl::StatusOr<EchoReply> reply =
        RetryUnary(**budget, retry, control, *stub, &FlakyEcho::Stub::Echo, EchoRequest());
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
    if (IsBudgetExhausted(reply.status())) ++exhausted;
  }
  const double elapsed_s = absl::ToDoubleSeconds(absl::Now() - start);

  // Every call ended on a budget denial, none on max_attempts: the budget, not the per-call
  // cap, stopped the retries.
  EXPECT_EQ(exhausted, kCalls);
  const int retries_received = (*backend)->service().call_count() - kCalls;
  EXPECT_GE(retries_received, 1);
  EXPECT_LE(retries_received, kCapacity + std::ceil(kRefillPerSecond * elapsed_s))
      << "elapsed " << elapsed_s << "s";
  EXPECT_EQ(static_cast<int64_t>((*budget)->Stats().retries_allowed), retries_received);
  EXPECT_EQ(static_cast<int64_t>((*budget)->Stats().retries_denied), kCalls);
  EXPECT_TRUE((*client)->Shutdown().ok());
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace retrybudget
