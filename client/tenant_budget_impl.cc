#include "client/tenant_budget_impl.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace retrybudget::client_internal {

TenantBudgetImpl::TenantBudgetImpl(std::string tenant, SyncWaker* waker, absl::Time created)
    : tenant_(std::move(tenant)), waker_(waker), demand_(created) {}

bool TenantBudgetImpl::AcquireSlow() {
  slow_.denied.fetch_add(1, std::memory_order_relaxed);
  RequestSync();
  return false;
}

TenantStats TenantBudgetImpl::Stats() const {
  MutexLock lock(&mu_);
  const uint64_t held = lease_.Held();
  TenantStats stats;
  stats.successes = successes_.value.load(std::memory_order_relaxed);
  stats.retries_allowed = ledger_.ExactSpent(held);
  stats.retries_denied = slow_.denied.load(std::memory_order_relaxed);
  stats.fallback_allowed = 0;
  stats.tokens_received = ledger_.received();
  stats.tokens_returned = ledger_.returned();
  stats.tokens_held = static_cast<int64_t>(held);
  stats.refunds = slow_.refunds.load(std::memory_order_relaxed);
  stats.lease_active = mode_ == LeaseMode::kLeased && lease_.IsOpen();
  stats.error = error_;
  return stats;
}

LeaseMode TenantBudgetImpl::mode() const {
  MutexLock lock(&mu_);
  return mode_;
}

absl::Time TenantBudgetImpl::SyncDueAt() const {
  MutexLock lock(&mu_);
  if (mode_ == LeaseMode::kShutdown) return absl::InfiniteFuture();
  if (sync_wanted_.value.load(std::memory_order_acquire)) {
    // A worker found the lease low or empty: sync now, unless the server told us the bucket is
    // dry (it granted less than we wanted), in which case asking again before its retry-after
    // would only load the server for nothing.
    return std::min(next_due_, dry_until_);
  }
  return next_due_;
}

absl::Time TenantBudgetImpl::ExpireLeaseIfDue(absl::Time now) {
  MutexLock lock(&mu_);
  if (mode_ == LeaseMode::kLeased) {
    if (now < expiry_) return expiry_;
    // The lease ends at send time + TTL: take every unspent token back (one exchange) and report
    // it as returned in the next Sync.
    const uint64_t withdrawn = lease_.WithdrawAndClose();
    ledger_.Withdrew(withdrawn, lease_.Held());
    mode_ = LeaseMode::kExpired;
    return absl::InfiniteFuture();
  }
  // No lease in force: tokens can only be here from a Refund() that raced with the withdrawal.
  // They cannot be spent (the word is closed); give them back too.
  if (lease_.Held() > 0) {
    const uint64_t withdrawn = lease_.WithdrawAndClose();
    ledger_.Withdrew(withdrawn, lease_.Held());
  }
  return absl::InfiniteFuture();
}

void TenantBudgetImpl::FillCounters(uint64_t held, v1::TenantSync* out) {
  out->set_tenant(tenant_);
  out->set_successes(successes_.value.load(std::memory_order_relaxed));
  out->set_retries_spent(ledger_.ReportSpent(held));
  out->set_retries_denied(slow_.denied.load(std::memory_order_relaxed));
  out->set_tokens_returned(ledger_.returned());
  out->set_tokens_received(ledger_.received());
  out->set_fallback_spent(0);
}

void TenantBudgetImpl::FillSync(absl::Time now, const RefreshPolicy& policy,
                                v1::TenantSync* out) {
  MutexLock lock(&mu_);
  const uint64_t held = lease_.Held();
  FillCounters(held, out);
  // Demand is what workers asked for, allowed or not: a starved tenant's denials count, so the
  // server's proportional split sees how much it really needs.
  demand_.Observe(now, out->retries_spent() + out->retries_denied());
  out->set_want(WantFor(demand_.rate(), policy.refresh_period, policy.lease_burst, held));
}

void TenantBudgetImpl::ApplyGrant(const v1::TenantGrant& grant, const v1::TenantSync& sent_entry,
                                  absl::Time sent, absl::Time received,
                                  const RefreshPolicy& policy) {
  MutexLock lock(&mu_);
  if (mode_ == LeaseMode::kShutdown) return;
  // Clear the wake flag before the tokens land: a worker that runs dry after this point wakes
  // the refresher again; one that ran dry before is served by this grant.
  sync_wanted_.value.store(false, std::memory_order_release);
  const uint64_t granted = grant.granted();
  const uint64_t deposited = lease_.Deposit(granted, LowWaterMark(granted));
  ledger_.Received(granted, deposited);
  // The lease (everything held, old tokens included) now ends at the time the request was
  // first SENT plus the TTL: the client's clock can only end it earlier than the server's view.
  // A TTL <= 0 ends it at once (the safe reading of a missing value).
  expiry_ = sent + absl::Milliseconds(std::max<int64_t>(0, grant.lease_ttl_ms()));
  mode_ = LeaseMode::kLeased;
  error_ = absl::OkStatus();
  const absl::Duration delay = NextSyncDelay(grant.next_sync_ms(), policy);
  next_due_ = received + delay;
  // Granted less than asked: the bucket is dry; next_sync_ms is then the server's retry-after.
  dry_until_ = granted < sent_entry.want() ? received + delay : absl::InfinitePast();
}

void TenantBudgetImpl::ApplyRefusal(const v1::TenantError& error, absl::Time received,
                                    const RefreshPolicy& policy) {
  MutexLock lock(&mu_);
  if (mode_ == LeaseMode::kShutdown) return;
  sync_wanted_.value.store(false, std::memory_order_release);
  if (mode_ == LeaseMode::kLeased || lease_.Held() > 0) {
    const uint64_t withdrawn = lease_.WithdrawAndClose();
    ledger_.Withdrew(withdrawn, lease_.Held());
  }
  mode_ = LeaseMode::kRefused;
  const auto code = static_cast<absl::StatusCode>(error.code());
  error_ = absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                        absl::StrCat("budget server refused tenant \"", tenant_,
                                     "\": ", error.message()));
  next_due_ = received + policy.refresh_period;
  dry_until_ = next_due_;
}

void TenantBudgetImpl::FillFinal(v1::TenantSync* out) {
  MutexLock lock(&mu_);
  mode_ = LeaseMode::kShutdown;
  const uint64_t withdrawn = lease_.WithdrawAndClose();
  ledger_.Withdrew(withdrawn, lease_.Held());
  FillCounters(lease_.Held(), out);
  out->set_want(0);
}

}  // namespace retrybudget::client_internal
