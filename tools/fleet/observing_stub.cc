#include "tools/fleet/observing_stub.h"

#include <algorithm>
#include <utility>

namespace retrybudget::fleet {

SyncObservingStub::SyncObservingStub(std::unique_ptr<v1::RetryBudgetService::StubInterface> inner)
    : inner_(std::move(inner)) {}

grpc::Status SyncObservingStub::Sync(grpc::ClientContext* context,
                                     const v1::SyncRequest& request,
                                     v1::SyncResponse* response) {
  grpc::Status status = inner_->Sync(context, request, response);
  const absl::Time received = Clock::Real()->Now();  // the workers' clients run on the real clock
  MutexLock lock(&mu_);
  if (!status.ok()) {
    ++syncs_failed_;
    return status;
  }
  ++syncs_ok_;
  if (response->stale()) return status;
  for (const v1::TenantGrant& grant : response->tenants()) {
    if (grant.has_error() && grant.error().code() != 0) continue;
    if (!grant.has_safe_share()) continue;
    Shares& shares = safe_shares_[grant.tenant()];
    shares.last_at = received;
    shares.recent.Note({.capacity = grant.safe_share().capacity(),
                        .refill_per_second = grant.safe_share().refill_per_second()},
                       received);
  }
  return status;
}

SafeShareView SyncObservingStub::SmallerShare::operator()(const SafeShareView& a,
                                                          const SafeShareView& b) const {
  return {.capacity = std::min(a.capacity, b.capacity),
          .refill_per_second = std::min(a.refill_per_second, b.refill_per_second)};
}

std::optional<SafeShareView> SyncObservingStub::FallbackShare(absl::string_view tenant) {
  MutexLock lock(&mu_);
  auto it = safe_shares_.find(tenant);
  if (it == safe_shares_.end()) return std::nullopt;
  return it->second.recent.Get(it->second.last_at);
}

uint64_t SyncObservingStub::syncs_ok() const {
  MutexLock lock(&mu_);
  return syncs_ok_;
}

uint64_t SyncObservingStub::syncs_failed() const {
  MutexLock lock(&mu_);
  return syncs_failed_;
}

grpc::ClientAsyncResponseReaderInterface<v1::SyncResponse>* SyncObservingStub::AsyncSyncRaw(
    grpc::ClientContext* context, const v1::SyncRequest& request, grpc::CompletionQueue* cq) {
  return inner_->AsyncSync(context, request, cq).release();
}

grpc::ClientAsyncResponseReaderInterface<v1::SyncResponse>*
SyncObservingStub::PrepareAsyncSyncRaw(grpc::ClientContext* context,
                                       const v1::SyncRequest& request,
                                       grpc::CompletionQueue* cq) {
  return inner_->PrepareAsyncSync(context, request, cq).release();
}

}  // namespace retrybudget::fleet
