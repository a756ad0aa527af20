// The retry helper end to end: the real budget server (in process, 127.0.0.1:0), the real client
// library, the gRPC adapter and the flaky gRPC backend on loopback. What arrives on the wire,
// pushback trailers, budget exhaustion and cancellation, checked against the client's TenantStats
// and, after the client's final Sync, the server's totals. (The fake TenantBudget is for the unit
// tests in retry_test.cc only.)
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "flaky_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"
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
using ::retrybudget::examples::FlakyOptions;
using ::retrybudget::examples::ReceivedCall;
using ::testing::ElementsAre;

// The tenant the fixture's calls retry against; the server's default policy is generous for it.
constexpr char kTenant[] = "flaky-echo";
constexpr double kDefaultCapacity = 1000;
// The client asks for this many tokens on top of its estimated spend: its first lease holds
// exactly this many (the bucket has plenty), more than any single test here retries.
constexpr uint64_t kLeaseBurst = 10;

// Polls `pred` (real time) for at most `limit`; for waiting on other threads (the backend's, the
// client's refresher) only.
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + limit;
  while (!pred()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// A fresh client denies every retry until its first lease arrives (DESIGN.md): waits until
// `budget` holds at least `tokens` leased tokens.
::testing::AssertionResult HoldsLease(const TenantBudget& budget, int64_t tokens) {
  if (WaitFor([&] { return budget.Stats().tokens_held >= tokens; })) {
    return ::testing::AssertionSuccess();
  }
  const TenantStats stats = budget.Stats();
  return ::testing::AssertionFailure()
         << "no lease of " << tokens << " tokens for " << budget.tenant() << " within 10s: holds "
         << stats.tokens_held << ", mode " << BudgetModeName(stats.mode) << ", error "
         << stats.error;
}

class RetryE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::PolicyConfig config;
    config.mutable_default_policy()->set_capacity(kDefaultCapacity);
    auto core = BudgetCore::Create({.policy = config});
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);

    ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    server_options.service.core = core_.get();
    auto server = BudgetServer::Start(std::move(server_options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);

    ClientOptions client_options;
    client_options.target = server_->address();
    client_options.lease_burst = kLeaseBurst;
    auto client = BudgetClient::Create(client_options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    budget_ = TenantOrDie(kTenant);
    ASSERT_TRUE(HoldsLease(*budget_, kLeaseBurst));
  }

  void TearDown() override {
    if (client_ != nullptr) {
      EXPECT_TRUE(client_->Shutdown().ok());
    }
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  TenantBudget* TenantOrDie(const std::string& tenant) {
    absl::StatusOr<TenantBudget*> budget = client_->Tenant(tenant);
    EXPECT_TRUE(budget.ok()) << budget.status();
    return budget.ok() ? *budget : nullptr;
  }

  // Ends the client (its final Sync reports every counter and returns every unspent token) and
  // returns what the server then holds for `tenant`.
  v1::BudgetStatus ServerTotalsAfterShutdown(const std::string& tenant = kTenant) {
    EXPECT_TRUE(client_->Shutdown().ok());
    absl::StatusOr<v1::BudgetStatus> status = core_->GetBudget(tenant);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::BudgetStatus();
  }

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
    return RetryUnary(*budget_, policy_, control_, *stub_, &FlakyEcho::Stub::Echo, req);
  }

  // Destroyed in reverse order: the client before the server before the core it serves.
  std::unique_ptr<BudgetCore> core_;
  std::unique_ptr<BudgetServer> server_;
  std::unique_ptr<BudgetClient> client_;
  TenantBudget* budget_ = nullptr;  // owned by client_

  std::unique_ptr<FlakyBackend> backend_;
  std::unique_ptr<FlakyEcho::Stub> stub_;
  FakeClock clock_;  // the retry loop's clock (backoff sleeps); the budget runs on real time
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
  TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.successes, 1u);
  EXPECT_EQ(stats.retries_allowed, 2u);
  EXPECT_EQ(stats.refunds, 0u);

  // A second logical call gets its own key.
  ASSERT_TRUE(Call("again").ok());
  EXPECT_NE(backend_->service().calls().back().idempotency_key, calls[0].idempotency_key);
  stats = budget_->Stats();
  EXPECT_EQ(stats.successes, 2u);
  EXPECT_EQ(stats.retries_allowed, 2u);

  // The server learnt of both successes and of exactly the two retries sent.
  const v1::BudgetStatus server = ServerTotalsAfterShutdown();
  EXPECT_EQ(server.successes_total(), 2u);
  EXPECT_EQ(server.retries_total(), 2u);
  EXPECT_EQ(server.retries_denied_total(), 0u);
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
  EXPECT_EQ(budget_->Stats().retries_allowed, 1u);
}

TEST_F(RetryE2eTest, CallerSuppliedKeyLetsTheBackendDeduplicate) {
  StartBackend({.failure_probability = 0.0});
  control_.idempotency_key = "order-42";
  ASSERT_TRUE(Call("pay").ok());
  absl::StatusOr<EchoReply> again = Call("pay");  // the caller replays the same logical call
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(backend_->service().calls().back().idempotency_key, "order-42");
  EXPECT_EQ(budget_->Stats().successes, 2u);
}

TEST_F(RetryE2eTest, PositivePushbackWaitsExactlyThatLong) {
  StartBackend({.failure_probability = 0.0, .fail_first = 1, .pushback_ms = "1500"});
  ASSERT_TRUE(Call("x").ok());
  EXPECT_THAT(clock_.sleeps(), ElementsAre(absl::Milliseconds(1500)));  // not the 50ms backoff
  EXPECT_EQ(backend_->service().call_count(), 2);
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.retries_allowed, 1u);
  EXPECT_EQ(stats.refunds, 0u);
  EXPECT_EQ(stats.successes, 1u);
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
  // The budget was never asked: no token taken (and refunded), none denied.
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.retries_allowed + stats.refunds + stats.retries_denied, 0u);
  EXPECT_THAT(clock_.sleeps(), ::testing::IsEmpty());
}

TEST_F(RetryE2eTest, RetriesStopWhenTheBudgetIsSpent) {
  // A tenant whose whole budget, ever, is two retries: no refill, no credit for successes.
  v1::BudgetPolicy scarce;
  scarce.set_capacity(2);
  scarce.set_initial_tokens(2);
  scarce.set_refill_per_second(0);
  scarce.set_success_credit(0);
  ASSERT_TRUE(core_->PutPolicy("scarce", scarce).ok());
  budget_ = TenantOrDie("scarce");
  ASSERT_NE(budget_, nullptr);
  ASSERT_TRUE(HoldsLease(*budget_, 2));

  StartBackend({.failure_probability = 1.0});
  policy_.max_attempts = 100;
  absl::StatusOr<EchoReply> reply = Call("x");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsBudgetExhausted(reply.status()));
  EXPECT_EQ(backend_->service().call_count(), 3);  // the free first attempt + 2 tokens
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.retries_allowed, 2u);
  EXPECT_EQ(stats.retries_denied, 1u);
  EXPECT_EQ(stats.tokens_held, 0);

  const v1::BudgetStatus server = ServerTotalsAfterShutdown("scarce");
  EXPECT_EQ(server.retries_total(), 2u);
  EXPECT_EQ(server.retries_denied_total(), 1u);
  EXPECT_EQ(server.granted_total(), 2u);
  EXPECT_LT(server.tokens(), 1.0);  // the fleet's budget is spent, not merely this lease
}

// Many logical calls share one small budget that refills slowly: every call ends on a budget
// denial (none on max_attempts), and the retries the backend actually received stay within what
// the budget can have made (DESIGN.md's fleet-wide invariant).
TEST_F(RetryE2eTest, RetriesStopWhenTheSharedBudgetIsSpent) {
  constexpr double kCapacity = 3;
  constexpr double kRefillPerSecond = 1;
  const absl::Time start = absl::Now();
  v1::BudgetPolicy small;
  small.set_capacity(kCapacity);
  small.set_initial_tokens(kCapacity);
  small.set_refill_per_second(kRefillPerSecond);
  ASSERT_TRUE(core_->PutPolicy("small", small).ok());
  budget_ = TenantOrDie("small");
  ASSERT_NE(budget_, nullptr);
  ASSERT_TRUE(HoldsLease(*budget_, 1));  // so the test shows retries allowed, then refused

  StartBackend({.failure_probability = 1.0});
  control_.clock = Clock::Real();
  policy_.max_attempts = 50;
  policy_.initial_backoff = absl::Milliseconds(1);
  policy_.max_backoff = absl::Milliseconds(2);
  constexpr int kCalls = 20;
  int exhausted = 0;
  for (int i = 0; i < kCalls; ++i) {
    control_.deadline = absl::Now() + absl::Seconds(10);
    absl::StatusOr<EchoReply> reply = Call("x");
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
    if (IsBudgetExhausted(reply.status())) ++exhausted;
  }
  const double elapsed_s = absl::ToDoubleSeconds(absl::Now() - start);

  EXPECT_EQ(exhausted, kCalls);
  const int retries_received = backend_->service().call_count() - kCalls;
  EXPECT_GE(retries_received, 1);
  EXPECT_LE(retries_received, kCapacity + std::ceil(kRefillPerSecond * elapsed_s))
      << "elapsed " << elapsed_s << "s";
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(static_cast<int64_t>(stats.retries_allowed), retries_received);
  EXPECT_EQ(static_cast<int64_t>(stats.retries_denied), kCalls);

  const v1::BudgetStatus server = ServerTotalsAfterShutdown("small");
  EXPECT_EQ(static_cast<int64_t>(server.retries_total()), retries_received);
  EXPECT_EQ(static_cast<int64_t>(server.retries_denied_total()), kCalls);
}

TEST_F(RetryE2eTest, CancelDuringBackoffLeavesNoRetryRunning) {
  StartBackend({.failure_probability = 1.0});
  control_.clock = Clock::Real();
  control_.deadline = absl::InfiniteFuture();
  policy_.initial_backoff = absl::Hours(1);
  policy_.max_backoff = absl::Hours(1);
  absl::StatusOr<EchoReply> reply;
  std::thread caller([&] { reply = Call("x"); });
  // One token taken and not (yet) given back: the caller is in the backoff.
  ASSERT_TRUE(WaitFor([&] { return budget_->Stats().retries_allowed == 1; }));
  stop_.request_stop();
  caller.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kCancelled);
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.refunds, 1u);
  EXPECT_EQ(stats.retries_allowed, 0u);  // the refund undid the take
  const int seen = backend_->service().call_count();
  absl::SleepFor(absl::Milliseconds(300));  // give a stray retry every chance to arrive
  EXPECT_EQ(backend_->service().call_count(), seen);
  EXPECT_EQ(seen, 1);

  // The refunded token went back to the server unspent.
  const v1::BudgetStatus server = ServerTotalsAfterShutdown();
  EXPECT_EQ(server.retries_total(), 0u);
  EXPECT_GE(server.granted_total(), kLeaseBurst);
  EXPECT_EQ(server.returned_total(), server.granted_total());
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
  // The budget was never asked.
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.retries_allowed + stats.refunds + stats.retries_denied, 0u);

  const v1::BudgetStatus server = ServerTotalsAfterShutdown();
  EXPECT_EQ(server.retries_total(), 0u);
  EXPECT_EQ(server.retries_denied_total(), 0u);
  EXPECT_EQ(server.successes_total(), 0u);
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
  const TenantStats stats = budget_->Stats();
  EXPECT_EQ(stats.retries_allowed, 1u);
  EXPECT_EQ(stats.successes, 1u);

  const v1::BudgetStatus server = ServerTotalsAfterShutdown();
  EXPECT_EQ(server.retries_total(), 1u);
  EXPECT_EQ(server.successes_total(), 1u);
}

}  // namespace
}  // namespace retrybudget
