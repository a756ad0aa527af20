// A BudgetClient over a gMock stub on a FakeClock, for the client tests.
#ifndef RETRYBUDGET_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
#define RETRYBUDGET_TESTS_CLIENT_CLIENT_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <mutex>
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.pb.h"
#include "retrybudget/v1/budget_mock.grpc.pb.h"

namespace retrybudget::testing_util {

// What the fake server does with one Sync.
using SyncHandler = std::function<grpc::Status(const v1::SyncRequest&, v1::SyncResponse*)>;

// Answers every tenant of `request` with `granted` tokens.
inline grpc::Status GrantAll(const v1::SyncRequest& request, v1::SyncResponse* response,
                             uint64_t granted, int64_t lease_ttl_ms = 5000,
                             int64_t next_sync_ms = 200) {
  for (const v1::TenantSync& entry : request.tenants()) {
    v1::TenantGrant* grant = response->add_tenants();
    grant->set_tenant(entry.tenant());
    grant->set_granted(request.final() ? 0 : granted);
    grant->set_lease_ttl_ms(lease_ttl_ms);
    grant->set_next_sync_ms(next_sync_ms);
  }
  return grpc::Status::OK;
}

inline SyncHandler Granting(uint64_t granted, int64_t lease_ttl_ms = 5000,
                            int64_t next_sync_ms = 200) {
  return [=](const v1::SyncRequest& request, v1::SyncResponse* response) {
    return GrantAll(request, response, granted, lease_ttl_ms, next_sync_ms);
  };
}

inline SyncHandler Failing(grpc::StatusCode code) {
  return [=](const v1::SyncRequest&, v1::SyncResponse*) {
    return grpc::Status(code, "injected failure");
  };
}

// Owns a FakeClock, a mock stub (through the client) and a testing client. Every Sync is
// recorded and answered by `handler`, which tests swap between steps.
class ClientHarness {
 public:
  explicit ClientHarness(ClientOptions options = DefaultOptions(),
                         bool start_refresher_thread = false) {
    auto stub = std::make_unique<v1::MockRetryBudgetServiceStub>();
    EXPECT_CALL(*stub, Sync(::testing::_, ::testing::_, ::testing::_))
        .WillRepeatedly([this](grpc::ClientContext*, const v1::SyncRequest& request,
                               v1::SyncResponse* response) {
          SyncHandler handler;
          {
            std::lock_guard<std::mutex> lock(mu_);
            requests_.push_back(request);
            handler = handler_;
          }
          return handler(request, response);
        });
    if (options.clock == nullptr) options.clock = &clock_;
    client_ = CreateBudgetClientForTesting(std::move(options), std::move(stub),
                                           start_refresher_thread)
                  .value();
  }

  static ClientOptions DefaultOptions() {
    ClientOptions options;
    options.instance_id = "test-instance";
    options.refresh_period = absl::Milliseconds(200);
    options.min_sync_interval = absl::Milliseconds(5);
    options.lease_burst = 2;
    return options;
  }

  void set_handler(SyncHandler handler) {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(handler);
  }

  std::vector<v1::SyncRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  size_t sync_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.size();
  }
  v1::SyncRequest last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.empty() ? v1::SyncRequest() : requests_.back();
  }

  FakeClock& clock() { return clock_; }
  TestingBudgetClient& client() { return *client_; }
  TenantBudget* Tenant(absl::string_view name) { return client_->Tenant(name).value(); }

  // Destroys the client (a final Sync goes through the handler) before the harness members.
  void DestroyClient() { client_.reset(); }
  ~ClientHarness() { DestroyClient(); }

 private:
  FakeClock clock_;
  // std::mutex rather than absl::Mutex: visible to TSan (see client/mutex.h).
  std::mutex mu_;
  std::vector<v1::SyncRequest> requests_ ABSL_GUARDED_BY(mu_);
  SyncHandler handler_ ABSL_GUARDED_BY(mu_) = Granting(0);
  std::unique_ptr<TestingBudgetClient> client_;
};

}  // namespace retrybudget::testing_util

#endif  // RETRYBUDGET_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
