// The BudgetClient behind the public factory: a tenant registry and a refresher.
#ifndef RETRYBUDGET_CLIENT_CLIENT_IMPL_H_
#define RETRYBUDGET_CLIENT_CLIENT_IMPL_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/refresher.h"
#include "client/cpp/tenant_registry.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"

namespace retrybudget::client_internal {

// Checks `options` (naming the bad field and value) and fills the defaults: a random
// instance_id, Clock::Real().
absl::StatusOr<ClientOptions> ValidateAndDefault(ClientOptions options);

class BudgetClientImpl;

// A client over `stub` (owned), not started, with its metrics registered into
// options.metrics_registry when set. `options` must have been through ValidateAndDefault().
// INVALID_ARGUMENT when the metrics cannot be registered.
// `owner_stubs` makes the stubs for the owners a cluster redirects to (null: not followed).
absl::StatusOr<std::unique_ptr<BudgetClientImpl>> NewBudgetClientImpl(
    const ClientOptions& options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    StubFactory owner_stubs = nullptr);

// Thread-safe. Owns one refresher (one thread once started) whatever the number of tenants.
class BudgetClientImpl final : public TestingBudgetClient {
 public:
  // `options` must have been through ValidateAndDefault(). `metrics` (owned) may be null.
  BudgetClientImpl(const ClientOptions& options,
                   std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
                   std::unique_ptr<ClientMetrics> metrics = nullptr,
                   StubFactory owner_stubs = nullptr);
  // Shutdown(), then stops everything.
  ~BudgetClientImpl() override;

  // Starts the refresher thread.
  void Start() { refresher_.Start(); }

  absl::StatusOr<TenantBudget*> Tenant(absl::string_view tenant) override;
  absl::Status Shutdown() override { return refresher_.Shutdown(); }
  const std::string& instance_id() const override { return instance_id_; }

  absl::Time RunOnce() override { return refresher_.RunOnce(); }
  bool wake_requested() const override { return refresher_.wake_requested(); }
  uint64_t last_seq() const override { return refresher_.last_seq(); }
  absl::Status last_sync_status() const override { return refresher_.last_sync_status(); }

 private:
  const std::string instance_id_;
  // Declared before the refresher, which uses it until it stops (destroyed after it).
  TenantRegistry tenants_;
  Refresher refresher_;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_CLIENT_IMPL_H_
