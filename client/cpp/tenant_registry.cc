#include "client/cpp/tenant_registry.h"

#include "absl/strings/str_cat.h"
#include "retrybudget/names.h"

namespace retrybudget::client_internal {

TenantRegistry::TenantRegistry(Clock* clock, SyncWaker* waker, FallbackConfig fallback)
    : clock_(clock), waker_(waker), fallback_(fallback) {}

absl::StatusOr<TenantBudgetImpl*> TenantRegistry::GetOrCreate(absl::string_view name) {
  {
    MutexLock lock(&mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) return it->second.get();
  }
  if (absl::Status valid = ValidateTenantName(name); !valid.ok()) return valid;
  TenantBudgetImpl* created = nullptr;
  {
    MutexLock lock(&mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) return it->second.get();
    if (closed_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenant ", QuoteForError(name), " requested after the budget client shut down"));
    }
    if (by_name_.size() >= kMaxTenantsPerClient) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant ", QuoteForError(name), " would be tenant number ",
                       by_name_.size() + 1, " of this client; at most ", kMaxTenantsPerClient,
                       " are allowed"));
    }
    auto budget = std::make_unique<TenantBudgetImpl>(std::string(name), waker_, clock_,
                                                     clock_->Now(), fallback_);
    created = budget.get();
    by_name_.emplace(std::string(name), std::move(budget));
    ordered_.push_back(created);
  }
  waker_->Wake();
  return created;
}

std::vector<TenantBudgetImpl*> TenantRegistry::Snapshot() const {
  MutexLock lock(&mu_);
  return ordered_;
}

void TenantRegistry::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace retrybudget::client_internal
