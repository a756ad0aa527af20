// The gRPC adapter without a network: the call is a lambda that inspects the context it gets.
// End-to-end behaviour (metadata on the wire, pushback trailers, TryCancel) is in
// retry_e2e_test.cc.
#include "retrybudget/retry_grpc.h"

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/test/client_context_test_peer.h>

#include "absl/time/time.h"
#include "fake_budget.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/clock.h"

namespace retrybudget {
namespace {

using ::retrybudget::testing::FakeBudget;
using ::testing::ElementsAre;
using ::testing::Optional;

struct Sent {
  std::multimap<std::string, std::string> metadata;
  std::chrono::system_clock::time_point deadline;
};

std::optional<std::string> Header(const Sent& s, std::string_view key) {
  auto it = s.metadata.find(std::string(key));
  if (it == s.metadata.end()) return std::nullopt;
  return it->second;
}

TEST(StatusConversionTest, KeepsCodeAndMessageBothWays) {
  for (int c = 0; c <= 16; ++c) {
    const absl::Status a(static_cast<absl::StatusCode>(c), c == 0 ? "" : "why " + std::to_string(c));
    const grpc::Status g = StatusToGrpc(a);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), std::string(a.message()));
    EXPECT_EQ(StatusFromGrpc(g), a);
  }
}

TEST(ParseRetryPushbackTest, AbsentNonNegativeNegativeAndGarbage) {
  using Trailers = std::multimap<grpc::string_ref, grpc::string_ref>;
  EXPECT_EQ(ParseRetryPushback(Trailers{}), std::nullopt);
  EXPECT_EQ(ParseRetryPushback(Trailers{{"other", "5"}}), std::nullopt);
  EXPECT_THAT(ParseRetryPushback(Trailers{{"grpc-retry-pushback-ms", "150"}}),
              Optional(absl::Milliseconds(150)));
  EXPECT_THAT(ParseRetryPushback(Trailers{{"grpc-retry-pushback-ms", "0"}}),
              Optional(absl::ZeroDuration()));
  for (const char* bad : {"-1", "-500", "abc", "", "1.5", "10ms"}) {
    std::optional<absl::Duration> p = ParseRetryPushback(Trailers{{"grpc-retry-pushback-ms", bad}});
    ASSERT_TRUE(p.has_value()) << bad;
    EXPECT_LT(*p, absl::ZeroDuration()) << bad;
  }
}

class RetryUnaryTest : public ::testing::Test {
 protected:
  RetryUnaryTest() {
    policy_.max_attempts = 3;
    policy_.initial_backoff = absl::Milliseconds(100);
    policy_.max_backoff = absl::Seconds(1);
    control_.clock = &clock_;
    control_.random = [] { return 0.5; };
  }

  FakeClock clock_;
  FakeBudget budget_;
  RetryPolicy policy_;
  CallControl control_;
};

TEST_F(RetryUnaryTest, FreshContextPerAttemptWithKeyAndPreviousAttempts) {
  std::vector<Sent> sent;
  std::set<grpc::ClientContext*> contexts;
  auto call = [&](grpc::ClientContext* ctx, const std::string& req, std::string* resp) {
    contexts.insert(ctx);
    sent.push_back({grpc::testing::ClientContextTestPeer(ctx).GetSendInitialMetadata(),
                    ctx->deadline()});
    if (sent.size() < 3) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
    *resp = "echo " + req;
    return grpc::Status::OK;
  };
  absl::StatusOr<std::string> r =
      RetryUnary<std::string>(budget_, policy_, control_, call, std::string("hi"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "echo hi");
  ASSERT_EQ(sent.size(), 3u);
  const std::optional<std::string> key = Header(sent[0], kIdempotencyKeyHeader);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(Header(sent[1], kIdempotencyKeyHeader), key);
  EXPECT_EQ(Header(sent[2], kIdempotencyKeyHeader), key);
  // gRPC's convention: absent on the first attempt, then the count of earlier attempts.
  EXPECT_EQ(Header(sent[0], kPreviousAttemptsHeader), std::nullopt);
  EXPECT_EQ(Header(sent[1], kPreviousAttemptsHeader), "1");
  EXPECT_EQ(Header(sent[2], kPreviousAttemptsHeader), "2");
  EXPECT_EQ(budget_.successes, 1);
  EXPECT_EQ(budget_.acquired, 2);
}

TEST_F(RetryUnaryTest, OneRequestPerCallAndEachRetryPricedByTheGrpcStatus) {
  policy_.max_attempts = 4;
  policy_.retry_cost = AwsRetryCost;
  int calls = 0;
  auto call = [&](grpc::ClientContext*, const std::string&, std::string* resp) {
    switch (++calls) {
      case 1:
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "attempt timed out");
      case 2:
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
      default:
        *resp = "ok";
        return grpc::Status::OK;
    }
  };
  absl::StatusOr<std::string> r =
      RetryUnary<std::string>(budget_, policy_, control_, call, std::string("hi"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(budget_.requests, 1);
  EXPECT_THAT(budget_.costs_asked(), ElementsAre(10, 5));  // a timeout, then a retryable error
}

TEST_F(RetryUnaryTest, DeadlineIsTheShorterOfOverallAndPerAttempt) {
  policy_.per_attempt_timeout = absl::Seconds(2);
  control_.deadline = clock_.Now() + absl::Seconds(60);
  std::vector<std::chrono::system_clock::time_point> deadlines;
  auto call = [&](grpc::ClientContext* ctx, const std::string&, std::string*) {
    deadlines.push_back(ctx->deadline());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
  };
  const auto before = std::chrono::system_clock::now();
  (void)RetryUnary<std::string>(budget_, policy_, control_, call, std::string("x"));
  const auto after = std::chrono::system_clock::now();
  ASSERT_EQ(deadlines.size(), 3u);
  for (auto d : deadlines) {
    EXPECT_GE(d, before + std::chrono::seconds(2));
    EXPECT_LE(d, after + std::chrono::seconds(2));
  }

  // The overall deadline is the shorter one.
  policy_.per_attempt_timeout = absl::InfiniteDuration();
  control_.deadline = clock_.Now() + absl::Seconds(5);
  deadlines.clear();
  policy_.max_attempts = 1;
  const auto before2 = std::chrono::system_clock::now();
  (void)RetryUnary<std::string>(budget_, policy_, control_, call, std::string("x"));
  ASSERT_EQ(deadlines.size(), 1u);
  EXPECT_GE(deadlines[0], before2 + std::chrono::seconds(5));
  EXPECT_LE(deadlines[0], std::chrono::system_clock::now() + std::chrono::seconds(5));
}

TEST_F(RetryUnaryTest, NoDeadlineMeansNoContextDeadline) {
  policy_.max_attempts = 1;
  std::chrono::system_clock::time_point seen;
  auto call = [&](grpc::ClientContext* ctx, const std::string&, std::string*) {
    seen = ctx->deadline();
    return grpc::Status::OK;
  };
  ASSERT_TRUE(RetryUnary<std::string>(budget_, policy_, control_, call, std::string("x")).ok());
  EXPECT_EQ(seen, grpc::ClientContext().deadline());  // gRPC's "infinite" default
}

TEST_F(RetryUnaryTest, StatusIsConvertedWithCodeAndMessage) {
  auto call = [&](grpc::ClientContext*, const std::string&, std::string*) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no such row 7");
  };
  absl::StatusOr<std::string> r =
      RetryUnary<std::string>(budget_, policy_, control_, call, std::string("x"));
  EXPECT_EQ(r.status(), absl::FailedPreconditionError("no such row 7"));
}

TEST_F(RetryUnaryTest, ConfigureContextRunsOnEveryAttempt) {
  UnaryRetryOptions options;
  std::vector<int> numbers;
  options.configure_context = [&](grpc::ClientContext& ctx, const Attempt& a) {
    numbers.push_back(a.number);
    ctx.AddMetadata("authorization", "Bearer t");
  };
  int calls = 0;
  auto call = [&](grpc::ClientContext* ctx, const std::string&, std::string*) {
    auto md = grpc::testing::ClientContextTestPeer(ctx).GetSendInitialMetadata();
    EXPECT_EQ(md.count("authorization"), 1u);
    return ++calls < 2 ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "down") : grpc::Status::OK;
  };
  ASSERT_TRUE(
      RetryUnary<std::string>(budget_, policy_, control_, call, std::string("x"), options).ok());
  EXPECT_THAT(numbers, ElementsAre(1, 2));
}

}  // namespace
}  // namespace retrybudget
