// The service layer's own behaviour, through the wire: the authorization and metrics hooks, and
// a clean shutdown that lets in-flight RPCs finish without waiting for idle connections.
#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/mutex.h"
#include "server/service.h"
#include "tests/integration/test_server.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

v1::SyncRequest TwoTenants(uint64_t seq) {
  return Parse<v1::SyncRequest>(absl::StrCat(R"pb(
    instance_id: "w" seq: )pb", seq, R"pb(
    tenants { tenant: "mine" want: 2 }
    tenants { tenant: "secret" want: 2 })pb"));
}

// Refuses any request that names the tenant "secret" (a stand-in for per-tenant credentials).
class DenySecret final : public RequestAuthorizer {
 public:
  absl::Status Authorize(const grpc::ServerContextBase&, Rpc rpc,
                         absl::Span<const absl::string_view> tenants) override {
    for (absl::string_view t : tenants) {
      if (t == "secret") {
        return absl::PermissionDeniedError(absl::StrCat(RpcName(rpc), " on tenant secret"));
      }
    }
    return absl::OkStatus();
  }
};

class RecordingMetrics final : public ServiceMetrics {
 public:
  void RpcFinished(Rpc rpc, absl::StatusCode code, absl::Duration elapsed) override {
    MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat(RpcName(rpc), ":", absl::StatusCodeToString(code)));
    EXPECT_GE(elapsed, absl::ZeroDuration());
  }
  std::vector<std::string> calls() {
    MutexLock lock(&mu_);
    return calls_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(ServiceHooksTest, AuthorizerRefusalIsReturnedAsIsAndAppliesNothing) {
  DenySecret authorizer;
  auto s = TestServer::Start({.authorizer = &authorizer});
  ASSERT_NE(s, nullptr);

  v1::SyncResponse response;
  const grpc::Status refused = s->Sync(TwoTenants(1), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(refused.error_message(), "Sync on tenant secret");
  v1::BudgetStatus budget;
  EXPECT_EQ(s->GetBudget("mine", &budget).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s->GetBudget("secret", &budget).error_code(), grpc::StatusCode::PERMISSION_DENIED);

  v1::SyncRequest allowed = TwoTenants(1);
  allowed.mutable_tenants()->RemoveLast();
  ASSERT_TRUE(s->Sync(allowed, &response).ok());
  EXPECT_EQ(response.tenants(0).granted(), 2u);
}

TEST(ServiceHooksTest, MetricsSeeEveryRpcWithItsFinalCode) {
  RecordingMetrics metrics;
  auto s = TestServer::Start({.metrics = &metrics});
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->Sync(Parse<v1::SyncRequest>(R"pb(instance_id: "w" seq: 1
                                                  tenants { tenant: "t" want: 1 })pb"),
                      &response)
                  .ok());
  EXPECT_FALSE(s->Sync(Parse<v1::SyncRequest>(R"pb(instance_id: "w" seq: 0)pb"), &response).ok());
  EXPECT_TRUE(s->GetBudget("t", &budget).ok());
  EXPECT_FALSE(s->DeleteBudget("absent").ok());

  EXPECT_THAT(metrics.calls(),
              ::testing::ElementsAre("Sync:OK", "Sync:INVALID_ARGUMENT", "GetBudget:OK",
                                     "DeleteBudget:NOT_FOUND"));
}

TEST(ShutdownTest, InFlightSyncFinishesNewRpcsAreRefusedAndIdleConnectionsDoNotDelayIt) {
  // Responses are held back 1 s, so a Sync is surely in flight when shutdown starts.
  auto s = TestServer::Start({.sync_response_delay = absl::Seconds(1)});
  ASSERT_NE(s, nullptr);

  v1::SyncResponse in_flight;
  std::future<grpc::Status> call = std::async(std::launch::async, [&] {
    return s->Sync(Parse<v1::SyncRequest>(R"pb(instance_id: "w" seq: 1
                                               tenants { tenant: "t" want: 6 })pb"),
                   &in_flight);
  });
  // Real time here is waiting for a thread, not for budget: the core has applied the request
  // once it knows the instance.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (s->core().instance_count() == 0 && absl::Now() < give_up) std::this_thread::yield();
  ASSERT_EQ(s->core().instance_count(), 1u);

  const absl::Time start = absl::Now();
  std::thread shutdown([&] { s->server().Shutdown(absl::Seconds(30)); });
  // New RPCs are refused from the moment shutdown starts.
  grpc::StatusCode refused = grpc::StatusCode::OK;
  v1::BudgetStatus budget;
  while (refused != grpc::StatusCode::UNAVAILABLE && absl::Now() < give_up) {
    refused = s->GetBudget("t", &budget).error_code();
  }
  EXPECT_EQ(refused, grpc::StatusCode::UNAVAILABLE);

  const grpc::Status status = call.get();
  shutdown.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(in_flight.tenants(0).granted(), 6u);
  // Done once the in-flight RPC was, far before the 30 s grace (idle connections do not count).
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace retrybudget::testing
