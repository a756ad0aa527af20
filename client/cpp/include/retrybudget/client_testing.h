// Test support for code that uses the client library: a BudgetClient over any Sync stub (a
// gMock MockRetryBudgetServiceStub, a fake, or a real stub) whose refresher the test drives step
// by step, on a FakeClock, without a background thread and without sleeping.
//
//   auto stub = std::make_unique<retrybudget::v1::MockRetryBudgetServiceStub>();
//   auto* mock = stub.get();
//   retrybudget::FakeClock clock;
//   auto client = retrybudget::CreateBudgetClientForTesting({.clock = &clock}, std::move(stub));
//   TenantBudget* budget = (*client)->Tenant("payments-db").value();
//   EXPECT_CALL(*mock, Sync(_, _, _)).WillOnce(...grant 10...);
//   (*client)->RunOnce();            // sends the first Sync, applies the grant
//   EXPECT_TRUE(budget->TryAcquire());
#ifndef RETRYBUDGET_CLIENT_TESTING_H_
#define RETRYBUDGET_CLIENT_TESTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/client.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget {

// A BudgetClient with its refresher exposed. Thread-safe like BudgetClient.
class TestingBudgetClient : public BudgetClient {
 public:
  // One refresher step at clock->Now(): ends leases whose expiry passed, enters, refills or
  // leaves fallback, then sends at most one Sync attempt if one is due (a new request, or the
  // resend of a failed one) and applies its response, and updates the metrics. Blocks only for
  // the stub call. Returns when the next step is due (the next sync, retry, lease expiry or
  // fallback token); InfiniteFuture when nothing is scheduled. The test advances the FakeClock
  // to that time (or not) and calls RunOnce() again; the real refresher thread also steps at
  // once when wake_requested() (a worker took the first token of a full fallback bucket, or
  // found its lease low or empty).
  virtual absl::Time RunOnce() = 0;

  // True when something woke the refresher (a worker found a lease low or empty, a tenant was
  // created) since the last RunOnce() began.
  virtual bool wake_requested() const = 0;

  // The seq of the last Sync request built (0 before the first).
  virtual uint64_t last_seq() const = 0;

  // The status of the last Sync attempt (OK before the first).
  virtual absl::Status last_sync_status() const = 0;
};

// Creates a client that talks through `stub` (owned) instead of a channel to options.target
// (ignored). Time comes from options.clock (Clock::Real() if null). With
// `start_refresher_thread` false (the default) nothing runs in the background: the test calls
// RunOnce(). With true, the usual refresher thread runs as in BudgetClient::Create (RunOnce()
// may still be called; steps never overlap). INVALID_ARGUMENT for bad options or a null stub.
absl::StatusOr<std::unique_ptr<TestingBudgetClient>> CreateBudgetClientForTesting(
    ClientOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    bool start_refresher_thread = false);

// Makes the stub for an owner address (HOST:PORT) a server redirected a tenant to.
using OwnerStubFactory = std::function<std::unique_ptr<v1::RetryBudgetService::StubInterface>(
    const std::string& address)>;

// As above, and redirects (TenantError.owner) are followed through stubs from `owner_stubs`,
// one per owner address (a fake standing in for several servers of a cluster). Null: redirects
// are not followed (the tenant is handled as UNAVAILABLE).
absl::StatusOr<std::unique_ptr<TestingBudgetClient>> CreateBudgetClientForTesting(
    ClientOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    OwnerStubFactory owner_stubs, bool start_refresher_thread = false);

// The channel BudgetClient::Create() makes for `options` (target, round_robin over its
// addresses, channel_credentials or insecure, max_reconnect_backoff, no transparent retries,
// keepalive), for a caller that wraps the stub (to observe or fault its Syncs) and passes it to
// CreateBudgetClientForTesting(): the client then reconnects exactly as one made by Create().
// INVALID_ARGUMENT for bad options.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateBudgetChannel(const ClientOptions& options);

}  // namespace retrybudget

#endif  // RETRYBUDGET_CLIENT_TESTING_H_
