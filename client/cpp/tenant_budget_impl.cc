#include "client/cpp/tenant_budget_impl.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include <grpc/support/log.h>

#include "absl/strings/str_cat.h"

namespace retrybudget::client_internal {
namespace {

BudgetMode PublicMode(LeaseMode mode) {
  switch (mode) {
    case LeaseMode::kLeased:
      return BudgetMode::kLease;
    case LeaseMode::kFallback:
      return BudgetMode::kFallback;
    case LeaseMode::kDenyFallback:
      return BudgetMode::kDenyFallback;
    case LeaseMode::kAwaitingLease:
    case LeaseMode::kExpired:
    case LeaseMode::kRefused:
    case LeaseMode::kShutdown:
      break;
  }
  return BudgetMode::kNoLease;
}

uint64_t Sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// A cost out of range is a caller's bug on the hot path: deny (or ignore the refund), never
// throw, and say so at most once a second per process, whatever the rate of bad calls.
void LogBadCost(const char* call, const std::string& tenant, uint32_t cost) {
  static std::atomic<int64_t> next_log_ns{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t next = next_log_ns.load(std::memory_order_relaxed);
  if (now < next || !next_log_ns.compare_exchange_strong(next, now + 1'000'000'000,
                                                         std::memory_order_relaxed)) {
    return;
  }
  gpr_log(GPR_ERROR,
          "retrybudget: %s(cost=%u) on tenant \"%s\": cost must be in [1, %u]; %s (further "
          "bad costs are not logged for a second)",
          call, cost, tenant.c_str(), TenantBudget::kMaxCost,
          std::string_view(call) == "Refund" ? "ignored" : "denied, nothing counted");
}

bool CostInRange(uint32_t cost) { return cost >= 1 && cost <= TenantBudget::kMaxCost; }

}  // namespace

TenantBudgetImpl::TenantBudgetImpl(std::string tenant, SyncWaker* waker, Clock* clock,
                                   absl::Time created, FallbackConfig fallback)
    : tenant_(std::move(tenant)),
      waker_(waker),
      clock_(clock),
      fallback_config_(fallback),
      demand_(created) {}

absl::Status TenantBudgetImpl::WaitReady(absl::Time deadline, std::stop_token stop) {
  if (answered_.load(std::memory_order_acquire)) return absl::OkStatus();
  // One stop source the answer and the caller's stop both end the sleep with: the Clock's sleep
  // takes a single stop token.
  std::stop_source wake;
  std::stop_callback forward(stop, [&wake] { wake.request_stop(); });
  {
    MutexLock lock(&mu_);
    if (answered_.load(std::memory_order_relaxed)) return absl::OkStatus();
    ready_waiters_.push_back(&wake);
  }
  clock_->SleepUntil(deadline, wake.get_token());
  {
    MutexLock lock(&mu_);
    ready_waiters_.erase(std::find(ready_waiters_.begin(), ready_waiters_.end(), &wake));
  }
  if (answered_.load(std::memory_order_acquire)) return absl::OkStatus();
  if (stop.stop_requested()) {
    return absl::CancelledError(
        absl::StrCat("cancelled while waiting for the first answer for tenant \"", tenant_, "\""));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no answer for tenant \"", tenant_, "\" yet (the first Sync is on its way or failing)"));
}

void TenantBudgetImpl::NoteAnsweredLocked() {
  if (mode_ == LeaseMode::kAwaitingLease || answered_.load(std::memory_order_relaxed)) return;
  answered_.store(true, std::memory_order_release);
  for (std::stop_source* waiter : ready_waiters_) waiter->request_stop();
}

bool TenantBudgetImpl::TryAcquireCost(uint32_t cost) {
  if (!CostInRange(cost)) {
    LogBadCost("TryAcquire", tenant_, cost);
    return false;
  }
  // Counted before the take (and taken back if it fails): the refresher reads `extra` after the
  // word, so a take it sees always has its extra tokens counted (TenantLedger::Takes never
  // counts a take of cost c as c retries).
  slow_.extra.fetch_add(cost - 1, std::memory_order_relaxed);
  if (Took(lease_.TryTake(cost))) return true;
  slow_.extra.fetch_sub(cost - 1, std::memory_order_relaxed);
  return AcquireSlow(cost);
}

bool TenantBudgetImpl::AcquireSlow(uint32_t cost) {
  // Demand counts what workers asked for, allowed or not, in tokens: a starved tenant's
  // denials (and a shadow tenant's would-be denials) size its next lease.
  slow_.denied_tokens.fetch_add(cost, std::memory_order_relaxed);
  const bool shadow = shadow_.load(std::memory_order_relaxed);
  if (shadow) {
    slow_.unbacked.fetch_add(cost, std::memory_order_relaxed);
    slow_.shadow_denied.fetch_add(1, std::memory_order_relaxed);
  } else {
    slow_.denied.fetch_add(1, std::memory_order_relaxed);
  }
  RequestSync();
  return shadow;
}

bool TenantBudgetImpl::TakeUnbacked(uint32_t cost) {
  uint64_t unbacked = slow_.unbacked.load(std::memory_order_relaxed);
  while (unbacked >= cost) {
    if (slow_.unbacked.compare_exchange_weak(unbacked, unbacked - cost,
                                             std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

void TenantBudgetImpl::Refund(uint32_t cost) {
  if (!CostInRange(cost)) {
    LogBadCost("Refund", tenant_, cost);
    return;
  }
  // A shadow permit given without a token is cancelled first (conservative: a token-backed
  // permit refunded while unbacked ones are out leaves its tokens spent).
  if (TakeUnbacked(cost)) return;
  lease_.Refund(cost);
  // After the word (release): a Snapshot() that reads this count reads the word with the tokens.
  slow_.refunded_tokens.fetch_add(cost, std::memory_order_release);
  slow_.refunds.fetch_add(1, std::memory_order_relaxed);
}

WordSnapshot TenantBudgetImpl::Snapshot() const {
  WordSnapshot word;
  word.refunded = slow_.refunded_tokens.load(std::memory_order_acquire);
  word.held = lease_.Held();  // acquire: every extra count made before a take it sees is seen
  word.extra = slow_.extra.load(std::memory_order_relaxed);
  return word;
}

TenantStats TenantBudgetImpl::Stats() const {
  MutexLock lock(&mu_);
  // Refunds first: the refund count never covers a refund the snapshot's word does not show.
  const uint64_t refunds = slow_.refunds.load(std::memory_order_acquire);
  const WordSnapshot word = Snapshot();
  const uint64_t held = word.held;
  TenantStats stats;
  stats.successes = successes_.value.load(std::memory_order_relaxed);
  stats.requests = requests_.value.load(std::memory_order_relaxed);
  stats.retries_allowed = Sub(ledger_.Takes(word), refunds);
  stats.retries_denied = slow_.denied.load(std::memory_order_relaxed);
  stats.shadow_denied = slow_.shadow_denied.load(std::memory_order_relaxed);
  stats.tokens_spent = ledger_.ExactSpent(held);
  stats.fallback_allowed = ledger_.ExactFallbackSpent(held);
  stats.tokens_received = ledger_.received();
  stats.tokens_returned = ledger_.returned();
  stats.tokens_held = static_cast<int64_t>(held);
  stats.refunds = refunds;
  stats.successes_credited_locally = successes_credit_.credited();
  stats.requests_credited_locally = requests_credit_.credited();
  stats.shadow = shadow();
  stats.lease_active = mode_ == LeaseMode::kLeased && lease_.IsOpen();
  stats.mode = PublicMode(mode_);
  stats.error = error_;
  return stats;
}

LeaseMode TenantBudgetImpl::mode() const {
  MutexLock lock(&mu_);
  return mode_;
}

absl::Time TenantBudgetImpl::SyncDueAt(bool* first) const {
  MutexLock lock(&mu_);
  if (first != nullptr) *first = !synced_ && mode_ != LeaseMode::kShutdown;
  if (mode_ == LeaseMode::kShutdown) return absl::InfiniteFuture();
  if (sync_wanted_.value.load(std::memory_order_acquire)) {
    // A worker found the lease low or empty: sync now, unless the server told us the bucket is
    // dry (it granted less than we wanted), in which case asking again before its retry-after
    // would only load the server for nothing.
    return std::min(next_due_, dry_until_);
  }
  return next_due_;
}

absl::Time TenantBudgetImpl::LeaseEndsAt() const {
  MutexLock lock(&mu_);
  return mode_ == LeaseMode::kLeased ? expiry_ : absl::InfiniteFuture();
}

void TenantBudgetImpl::WithdrawAllLocked() {
  const uint64_t withdrawn = lease_.WithdrawAndClose();
  ledger_.Withdrew(withdrawn, lease_.Held());
  ledger_.SwitchTo(TenantLedger::Source::kLease);
  fallback_.reset();
}

absl::Time TenantBudgetImpl::EnterFallbackLocked(absl::Time now, bool start_full) {
  if (fallback_config_.mode == FallbackMode::kDeny) {
    WithdrawAllLocked();
    mode_ = LeaseMode::kDenyFallback;
    NoteAnsweredLocked();
    return absl::InfiniteFuture();
  }
  // The instance's share of the fleet's budget as the server last saw it (the smallest of the
  // minute before its last answer); a tenant the server never answered for gets the configured
  // (conservative) bucket.
  const std::optional<BucketShape> share =
      last_safe_share_at_ == absl::InfinitePast() ? std::nullopt
                                                  : safe_shares_.Get(last_safe_share_at_);
  fallback_.emplace(share.value_or(fallback_config_.never_reached), now, start_full);
  const uint64_t first = RefillLocked(now, 0);
  const uint64_t withdrawn = lease_.Replace(first, FallbackMarkLocked());
  ledger_.Withdrew(withdrawn, 0);  // leased tokens (or raced-in refunds): returned
  ledger_.SwitchTo(TenantLedger::Source::kFallback);
  ledger_.FallbackDeposited(Lease::Capped(first));
  mode_ = LeaseMode::kFallback;
  NoteAnsweredLocked();
  return RefillFallbackLocked(now);
}

uint64_t TenantBudgetImpl::FallbackMarkLocked() {
  // The bucket only learns of takes at refresher steps, and counts them as made just before the
  // step (so it never credits refill lost while full). A full bucket therefore asks to hear of
  // the very first take (mark = held - 1), clearing the wake flag so that take wakes the
  // refresher; the step that follows restarts the refill at once. Otherwise mark 0: an empty
  // word wakes the refresher only if no wake is pending (never a busy loop on an empty bucket:
  // the next token's time is scheduled anyway).
  if (!fallback_->Full() || fallback_->held() == 0) return 0;
  sync_wanted_.value.store(false, std::memory_order_release);
  return fallback_->held() - 1;
}

uint64_t TenantBudgetImpl::RefillLocked(absl::Time now, uint64_t held) {
  const FallbackBucket::Credits pending = {
      .successes =
          successes_credit_.Creditable(successes_.value.load(std::memory_order_relaxed)),
      .requests = requests_credit_.Creditable(requests_.value.load(std::memory_order_relaxed))};
  FallbackBucket::Credits credited;
  const uint64_t add = fallback_->Refill(now, held, pending, &credited);
  successes_credit_.Credited(credited.successes);
  requests_credit_.Credited(credited.requests);
  return add;
}

absl::Time TenantBudgetImpl::RefillFallbackLocked(absl::Time now) {
  const uint64_t add = RefillLocked(now, lease_.Held());
  // Deposit even 0 tokens: it sets the low-water mark for the new level.
  ledger_.FallbackDeposited(lease_.Deposit(add, FallbackMarkLocked()));
  return fallback_->NextTokenAt();
}

absl::Time TenantBudgetImpl::Step(absl::Time now, ServerState server) {
  MutexLock lock(&mu_);
  const bool unreachable = server == ServerState::kUnreachable || server == ServerState::kDown;
  if (mode_ == LeaseMode::kLeased) {
    if (now < expiry_) {
      if (server != ServerState::kDown || lease_.Held() > 0) return expiry_;
      // The lease is spent and the server has been unreachable for a while: fall back now
      // instead of denying every retry until the lease's expiry. Nothing is counted twice: the
      // lease holds no token, and the fallback bucket starts EMPTY (the instance spent its share
      // of the burst in the lease), gaining only its share of the refill and the credit of its
      // own successes while the server is down. A slow server (Syncs timing out) is "down" too,
      // so a full bucket here would let one instance spend its lease and its whole share again.
      // A blip (one failed Sync) is not "down", so lost responses do not open fallback buckets.
      return EnterFallbackLocked(now, /*start_full=*/false);
    }
    if (unreachable) {
      // The lease ran out while the server cannot be reached: fall back (the leased tokens left
      // are returned in the next Sync that gets through).
      return EnterFallbackLocked(now);
    }
    // The lease ends at send time + TTL: take every unspent token back (one exchange) and report
    // it as returned in the next Sync.
    WithdrawAllLocked();
    mode_ = LeaseMode::kExpired;
    return absl::InfiniteFuture();
  }
  if (mode_ == LeaseMode::kFallback) {
    if (server != ServerState::kRefusing) return RefillFallbackLocked(now);
    // The server answered and refuses this client (credentials): no fallback for that.
    WithdrawAllLocked();
    mode_ = LeaseMode::kExpired;
    return absl::InfiniteFuture();
  }
  if (mode_ == LeaseMode::kDenyFallback && server == ServerState::kRefusing) {
    mode_ = LeaseMode::kExpired;
  }
  if ((mode_ == LeaseMode::kAwaitingLease || mode_ == LeaseMode::kExpired) && unreachable) {
    return EnterFallbackLocked(now);
  }
  // The word is closed: tokens can only be here from a Refund() that raced with the withdrawal.
  // They cannot be spent; give them back too.
  if (lease_.Held() > 0) {
    const uint64_t withdrawn = lease_.WithdrawAndClose();
    ledger_.Withdrew(withdrawn, lease_.Held());
  }
  return absl::InfiniteFuture();
}

void TenantBudgetImpl::FillCounters(const WordSnapshot& word, v1::TenantSync* out) {
  out->set_tenant(tenant_);
  out->set_successes(successes_.value.load(std::memory_order_relaxed));
  out->set_requests(requests_.value.load(std::memory_order_relaxed));
  ledger_.Report(word);
  out->set_retries_spent(ledger_.reported_spent());
  out->set_retries_allowed(ledger_.reported_allowed());
  out->set_retries_refunded(ledger_.reported_refunded());
  out->set_retries_denied(slow_.denied.load(std::memory_order_relaxed));
  out->set_shadow_denied(slow_.shadow_denied.load(std::memory_order_relaxed));
  out->set_tokens_returned(ledger_.returned());
  out->set_tokens_received(ledger_.received());
  out->set_fallback_spent(ledger_.reported_fallback_spent());
  out->set_fallback_refunded(ledger_.reported_fallback_refunded());
  out->set_successes_credited_locally(successes_credit_.credited());
  out->set_requests_credited_locally(requests_credit_.credited());
  // From now on the server may credit every success and request this request carries.
  successes_credit_.Carried(out->successes());
  requests_credit_.Carried(out->requests());
}

void TenantBudgetImpl::FillSync(absl::Time now, const RefreshPolicy& policy,
                                v1::TenantSync* out) {
  MutexLock lock(&mu_);
  synced_ = true;
  const WordSnapshot word = Snapshot();
  FillCounters(word, out);
  // Demand is what workers asked for, allowed or not, in tokens: a starved tenant's denials (a
  // shadow tenant's would-be denials) count, so the server's proportional split sees how much
  // it really needs.
  demand_.Observe(now,
                  out->retries_spent() + slow_.denied_tokens.load(std::memory_order_relaxed));
  // Fallback tokens are withdrawn when a grant arrives: only leased tokens reduce the want.
  const uint64_t leased = ledger_.source() == TenantLedger::Source::kLease ? word.held : 0;
  out->set_want(WantFor(demand_.rate(), policy.refresh_period, policy.lease_burst, leased));
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
  uint64_t deposited = 0;
  if (ledger_.source() == TenantLedger::Source::kFallback) {
    // Back from fallback: swap the fallback tokens for the leased ones in one exchange. The
    // fallback tokens vanish (the server never granted them); what was spent of them is in the
    // ledger and goes out as fallback_spent with the next Sync.
    deposited = Lease::Capped(granted);
    const uint64_t withdrawn = lease_.Replace(granted, LowWaterMark(granted));
    ledger_.Withdrew(withdrawn, 0);
    ledger_.SwitchTo(TenantLedger::Source::kLease);
    fallback_.reset();
  } else {
    deposited = lease_.Deposit(granted, LowWaterMark(granted));
  }
  ledger_.Received(granted, deposited);
  shadow_.store(grant.mode() == v1::MODE_SHADOW, std::memory_order_relaxed);
  if (grant.has_safe_share()) {
    safe_shares_.Note({.capacity = grant.safe_share().capacity(),
                       .refill_per_second = grant.safe_share().refill_per_second(),
                       .success_credit = grant.safe_share().success_credit(),
                       .request_credit = grant.safe_share().request_credit()},
                      received);
    last_safe_share_at_ = received;
  }
  // The lease (everything held, old tokens included) now ends at the time the request was
  // first SENT plus the TTL: the client's clock can only end it earlier than the server's view.
  // A TTL <= 0 ends it at once (the safe reading of a missing value); one above the longest a
  // policy allows (600 s) is read as that: a server cannot hand out a lease for ever.
  expiry_ = sent + absl::Milliseconds(std::clamp<int64_t>(grant.lease_ttl_ms(), 0, kMaxLeaseTtlMs));
  mode_ = LeaseMode::kLeased;
  NoteAnsweredLocked();
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
  if (mode_ == LeaseMode::kLeased || mode_ == LeaseMode::kFallback || lease_.Held() > 0) {
    WithdrawAllLocked();
  }
  mode_ = LeaseMode::kRefused;
  NoteAnsweredLocked();
  const auto code = static_cast<absl::StatusCode>(error.code());
  error_ = absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                        absl::StrCat("budget server refused tenant \"", tenant_,
                                     "\": ", error.message()));
  next_due_ = received + policy.refresh_period;
  dry_until_ = next_due_;
}

void TenantBudgetImpl::SyncAgainAt(absl::Time due) {
  MutexLock lock(&mu_);
  if (mode_ == LeaseMode::kShutdown) return;
  next_due_ = due;
  dry_until_ = due;
}

void TenantBudgetImpl::FillFinal(v1::TenantSync* out) {
  MutexLock lock(&mu_);
  mode_ = LeaseMode::kShutdown;
  NoteAnsweredLocked();
  WithdrawAllLocked();
  FillCounters(Snapshot(), out);
  out->set_want(0);
}

}  // namespace retrybudget::client_internal
