// The tenants a BudgetClient knows, by name, with stable addresses.
#ifndef RETRYBUDGET_CLIENT_TENANT_REGISTRY_H_
#define RETRYBUDGET_CLIENT_TENANT_REGISTRY_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "retrybudget/mutex.h"
#include "client/cpp/tenant_budget_impl.h"
#include "retrybudget/clock.h"

namespace retrybudget::client_internal {

// Most tenants one client may use: one Sync carries at most 256 entries (budget.proto).
inline constexpr size_t kMaxTenantsPerClient = 256;

// Thread-safe. Handles live as long as the registry; their addresses never change.
class TenantRegistry {
 public:
  // `clock` and `waker` (not owned) must outlive the registry; `waker` is told when a tenant is
  // created so that its first lease is asked for at once. Every tenant falls back per
  // `fallback`.
  TenantRegistry(Clock* clock, SyncWaker* waker, FallbackConfig fallback = {});

  // The handle for `name`, created on first use. INVALID_ARGUMENT for a malformed name,
  // RESOURCE_EXHAUSTED past kMaxTenantsPerClient tenants, FAILED_PRECONDITION for a new name
  // after Close(). Takes a lock: callers should keep the pointer rather than look it up per call.
  absl::StatusOr<TenantBudgetImpl*> GetOrCreate(absl::string_view name);

  // Every tenant, in creation order.
  std::vector<TenantBudgetImpl*> Snapshot() const;

  // Refuses new tenants from now on (existing ones are still returned).
  void Close();

 private:
  Clock* const clock_;
  SyncWaker* const waker_;
  const FallbackConfig fallback_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<TenantBudgetImpl>> by_name_ ABSL_GUARDED_BY(mu_);
  std::vector<TenantBudgetImpl*> ordered_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_TENANT_REGISTRY_H_
