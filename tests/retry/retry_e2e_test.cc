// The gRPC adapter against a real (flaky) gRPC backend on loopback: what arrives on the wire,
// pushback trailers, budget exhaustion and cancellation. The budget is a fake TenantBudget; the
// same scenarios against the real budget server belong in tests/integration.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fake_budget.h"
#include "flaky_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/clock.h"
#include "retrybudget/retry.h"
#include "retrybudget/retry_grpc.h"

namespace retrybudget {
namespace {

using ::retrybudget::examples::EchoReply;
using ::retrybudget::examples::EchoRequest;
using ::retrybudget::examples::FlakyBackend;
using ::retrybudget::examples::FlakyEcho;
using ::retrybudget::examples::FlakyOptions;
using ::retrybudget::examples::ReceivedCall;
using ::retrybudget::testing::FakeBudget;
using ::testing::ElementsAre;
using ::testing::Optional;

// Polls `pred` (real time) for at most `limit`; for waiting on another process's threads only.
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + limit;
  while (!pred()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class RetryE2eTest : public ::testing::Test {
 protected:
  void StartBackend(FlakyOptions options) {
    auto backend = FlakyBackend::Start("127.0.0.1:0", options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    grpc::ChannelArguments args;
    DisableGrpcBuiltInRetries(args);
    stub_ = FlakyEcho::NewStub(grpc::CreateCustomChannel(
        backend_->target(), grpc::InsecureChannelCredentials(), args));
    policy_.max_attempts = 5;
    policy_.initial_backoff = absl::Milliseconds(100);
    policy_.max_backoff = absl::Seconds(1);
    control_.clock = &clock_;
    control_.random = [] { return 0.5; };
    control_.stop = stop_.get_token();
    control_.deadline = clock_.Now() + absl::Seconds(30);
  }

  absl::StatusOr<EchoReply> Call(const std::string& message) {
    EchoRequest req;
    req.set_message(message);
    return RetryUnary(budget_, policy_, control_, *stub_, &FlakyEcho::Stub::Echo, req);
  }

  std::unique_ptr<FlakyBackend> backend_;
  std::unique_ptr<FlakyEcho::Stub> stub_;
  FakeClock clock_;
  FakeBudget budget_;
  RetryPolicy policy_;
  CallControl control_;
  std::stop_source stop_;
};

TEST_F(RetryE2eTest, MetadataArrivesAsSpecified) {
  StartBackend({.failure_probability = 0.0, .fail_first = 2});
  absl::StatusOr<EchoReply> reply = Call("hello");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->message(), "hello");
  EXPECT_EQ(reply->attempts_seen(), 3u);
  EXPECT_FALSE(reply->duplicate());

  const std::vector<ReceivedCall> calls = backend_->service().calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_THAT(calls[0].idempotency_key, ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(calls[1].idempotency_key, calls[0].idempotency_key);
  EXPECT_EQ(calls[2].idempotency_key, calls[0].idempotency_key);
  EXPECT_EQ(calls[0].previous_attempts, std::nullopt);  // not sent on the first attempt
  EXPECT_EQ(calls[1].previous_attempts, "1");
  EXPECT_EQ(calls[2].previous_attempts, "2");
  EXPECT_EQ(budget_.successes, 1);
  EXPECT_EQ(budget_.spent(), 2);

  // A second logical call gets its own key.
  ASSERT_TRUE(Call("again").ok());
  EXPECT_NE(backend_->service().calls().back().idempotency_key, calls[0].idempotency_key);
}

// Documents why DisableGrpcBuiltInRetries() exists: a channel with gRPC's own retries on (the
// default) strips the application's `grpc-previous-rpc-attempts`; the dedup key survives.
TEST_F(RetryE2eTest, DefaultChannelDropsThePreviousAttemptsHeader) {
  StartBackend({.failure_probability = 0.0, .fail_first = 1});
  stub_ = FlakyEcho::NewStub(
      grpc::CreateChannel(backend_->target(), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(Call("x").ok());
  const std::vector<ReceivedCall> calls = backend_->service().calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].previous_attempts, std::nullopt);
  EXPECT_EQ(calls[1].idempotency_key, calls[0].idempotency_key);
}

TEST_F(RetryE2eTest, CallerSuppliedKeyLetsTheBackendDeduplicate) {
  StartBackend({.failure_probability = 0.0});
  control_.idempotency_key = "order-42";
  ASSERT_TRUE(Call("pay").ok());
  absl::StatusOr<EchoReply> again = Call("pay");  // the caller replays the same logical call
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(backend_->service().calls().back().idempotency_key, "order-42");
}

TEST_F(RetryE2eTest, PositivePushbackWaitsExactlyThatLong) {
  StartBackend({.failure_probability = 0.0, .fail_first = 1, .pushback_ms = "1500"});
  ASSERT_TRUE(Call("x").ok());
  EXPECT_THAT(clock_.sleeps(), ElementsAre(absl::Milliseconds(1500)));  // not the 50ms backoff
  EXPECT_EQ(backend_->service().call_count(), 2);
  EXPECT_EQ(budget_.spent(), 1);
}

TEST_F(RetryE2eTest, NegativeOrUnparsablePushbackStopsRetrying) {
  for (const char* pushback : {"-1", "soon"}) {
    SCOPED_TRACE(pushback);
    StartBackend({.failure_probability = 1.0, .pushback_ms = pushback});
    absl::StatusOr<EchoReply> reply = Call("x");
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(IsBudgetExhausted(reply.status()));
    EXPECT_EQ(backend_->service().call_count(), 1);
  }
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
  EXPECT_THAT(clock_.sleeps(), ::testing::IsEmpty());
}

TEST_F(RetryE2eTest, RetriesStopWhenTheBudgetIsSpent) {
  StartBackend({.failure_probability = 1.0});
  policy_.max_attempts = 100;
  FakeBudget budget(/*tokens=*/2);
  EchoRequest req;
  absl::StatusOr<EchoReply> reply =
      RetryUnary(budget, policy_, control_, *stub_, &FlakyEcho::Stub::Echo, req);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsBudgetExhausted(reply.status()));
  EXPECT_EQ(backend_->service().call_count(), 3);  // the free first attempt + 2 tokens
  EXPECT_EQ(budget.spent(), 2);
}

TEST_F(RetryE2eTest, CancelDuringBackoffLeavesNoRetryRunning) {
  StartBackend({.failure_probability = 1.0});
  control_.clock = Clock::Real();
  control_.deadline = absl::InfiniteFuture();
  policy_.initial_backoff = absl::Hours(1);
  policy_.max_backoff = absl::Hours(1);
  absl::StatusOr<EchoReply> reply;
  std::thread caller([&] { reply = Call("x"); });
  ASSERT_TRUE(WaitFor([&] { return budget_.acquired.load() == 1; }));  // in the backoff
  stop_.request_stop();
  caller.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(budget_.refunded, 1);
  const int seen = backend_->service().call_count();
  absl::SleepFor(absl::Milliseconds(300));  // give a stray retry every chance to arrive
  EXPECT_EQ(backend_->service().call_count(), seen);
  EXPECT_EQ(seen, 1);
}

TEST_F(RetryE2eTest, CancelDuringAnAttemptCancelsTheRpcAndSendsNoRetry) {
  StartBackend({.failure_probability = 1.0, .hold = absl::Seconds(60)});
  control_.clock = Clock::Real();
  control_.deadline = absl::InfiniteFuture();
  policy_.initial_backoff = absl::ZeroDuration();
  absl::StatusOr<EchoReply> reply;
  const absl::Time start = absl::Now();
  std::thread caller([&] { reply = Call("x"); });
  ASSERT_TRUE(WaitFor([&] { return backend_->service().call_count() == 1; }));
  stop_.request_stop();
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the 60s hold
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kCancelled);
  // The backend saw the RPC itself being cancelled (TryCancel), not merely abandoned.
  EXPECT_TRUE(WaitFor([&] { return backend_->service().calls()[0].cancelled; }));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(backend_->service().call_count(), 1);
  EXPECT_EQ(budget_.acquired + budget_.denied, 0);
}

TEST_F(RetryE2eTest, PerAttemptTimeoutRetriesASlowAttempt) {
  // Only the first call hangs.
  StartBackend({.failure_probability = 0.0, .hold = absl::Seconds(60), .hold_calls = 1});
  control_.clock = Clock::Real();
  control_.deadline = absl::Now() + absl::Seconds(30);
  policy_.per_attempt_timeout = absl::Milliseconds(300);
  absl::StatusOr<EchoReply> reply = Call("x");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(WaitFor([&] { return backend_->service().calls()[0].cancelled; }));  // deadline
  EXPECT_EQ(backend_->service().call_count(), 2);
  EXPECT_EQ(budget_.spent(), 1);
}

}  // namespace
}  // namespace retrybudget
