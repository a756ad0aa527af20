#include "tools/fleet/observing_stub.h"

#include <algorithm>
#include <utility>

namespace retrybudget::fleet {

SyncObservingStub::SyncObservingStub(std::unique_ptr<v1::RetryBudgetService::StubInterface> inner)
    : SyncObservingStub(std::move(inner), std::make_shared<Observations>()) {}

SyncObservingStub::SyncObservingStub(std::unique_ptr<v1::RetryBudgetService::StubInterface> inner,
                                     std::shared_ptr<Observations> observations)
    : inner_(std::move(inner)), observed_(std::move(observations)) {}

std::unique_ptr<SyncObservingStub> SyncObservingStub::Sibling(
    std::unique_ptr<v1::RetryBudgetService::StubInterface> inner) const {
  return std::unique_ptr<SyncObservingStub>(new SyncObservingStub(std::move(inner), observed_));
}

std::optional<SyncObservingStub::GrantGap> SyncObservingStub::LongestGrantGap(
    absl::string_view tenant, absl::Time now) const {
  MutexLock lock(&observed_->mu);
  auto it = observed_->answers.find(tenant);
  if (it == observed_->answers.end()) return std::nullopt;
  const Answers& a = it->second;
  if (now - a.last_at > a.longest_gap) return GrantGap{now - a.last_at, now};
  return GrantGap{a.longest_gap, a.longest_ended_at};
}

grpc::Status SyncObservingStub::Sync(grpc::ClientContext* context,
                                     const v1::SyncRequest& request,
                                     v1::SyncResponse* response) {
  grpc::Status status = inner_->Sync(context, request, response);
  const absl::Time received = Clock::Real()->Now();  // the workers' clients run on the real clock
  Observations& o = *observed_;
  MutexLock lock(&o.mu);
  if (!status.ok()) {
    ++o.syncs_failed;
    return status;
  }
  ++o.syncs_ok;
  if (response->stale()) return status;
  for (const v1::TenantGrant& grant : response->tenants()) {
    if (grant.has_error() && grant.error().code() != 0) continue;
    auto [answers, first] = o.answers.try_emplace(grant.tenant());
    Answers& a = answers->second;
    if (!first && received - a.last_at > a.longest_gap) {
      a.longest_gap = received - a.last_at;
      a.longest_ended_at = received;
    }
    if (first) a.longest_ended_at = received;
    a.last_at = received;
    if (const bool shadow = grant.mode() == v1::MODE_SHADOW; shadow != a.shadow) {
      a.shadow = shadow;
      a.mode_changes.push_back(received);
    }
    if (!grant.has_safe_share()) continue;
    Shares& shares = o.safe_shares[grant.tenant()];
    shares.last_at = received;
    shares.recent.Note({.capacity = grant.safe_share().capacity(),
                        .refill_per_second = grant.safe_share().refill_per_second()},
                       received);
  }
  return status;
}

std::vector<absl::Time> SyncObservingStub::ModeChanges(absl::string_view tenant) const {
  MutexLock lock(&observed_->mu);
  auto it = observed_->answers.find(tenant);
  if (it == observed_->answers.end()) return {};
  return it->second.mode_changes;
}

SafeShareView SyncObservingStub::SmallerShare::operator()(const SafeShareView& a,
                                                          const SafeShareView& b) const {
  return {.capacity = std::min(a.capacity, b.capacity),
          .refill_per_second = std::min(a.refill_per_second, b.refill_per_second)};
}

std::optional<SafeShareView> SyncObservingStub::FallbackShare(absl::string_view tenant) {
  MutexLock lock(&observed_->mu);
  auto it = observed_->safe_shares.find(tenant);
  if (it == observed_->safe_shares.end()) return std::nullopt;
  return it->second.recent.Get(it->second.last_at);
}

uint64_t SyncObservingStub::syncs_ok() const {
  MutexLock lock(&observed_->mu);
  return observed_->syncs_ok;
}

uint64_t SyncObservingStub::syncs_failed() const {
  MutexLock lock(&observed_->mu);
  return observed_->syncs_failed;
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
