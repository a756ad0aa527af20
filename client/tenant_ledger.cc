#include "client/tenant_ledger.h"

#include <algorithm>

namespace retrybudget::client_internal {
namespace {

uint64_t Sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

void TokenAccount::Withdrew(uint64_t withdrawn, uint64_t held_after) {
  // Tokens of this source still unaccounted for: neither out nor reported spent. Of those,
  // `held_after` are back in the word (raced-in refunds) and will be withdrawn later. Only the
  // rest may count as out; any other withdrawn token was refunded after it had been reported
  // spent (or belongs to the other source): it stays spent, so no reported counter goes back.
  const uint64_t unaccounted = Sub(Sub(in_, out_), reported_spent_);
  const uint64_t back = std::min(withdrawn, Sub(unaccounted, held_after));
  out_ += back;
  absorbed_ += withdrawn - back;
}

uint64_t TokenAccount::ReportSpent(uint64_t held) {
  reported_spent_ = std::max(reported_spent_, Sub(in_, out_ + held));
  return reported_spent_;
}

uint64_t TokenAccount::ExactSpent(uint64_t held) const {
  return Sub(in_, out_ + absorbed_ + held);
}

void TenantLedger::Received(uint64_t granted, uint64_t deposited) {
  lease_.In(deposited);
  if (deposited < granted) lease_.InAndOut(granted - deposited);
}

void TenantLedger::Withdrew(uint64_t withdrawn, uint64_t held_after) {
  (source_ == Source::kLease ? lease_ : fallback_).Withdrew(withdrawn, held_after);
}

uint64_t TenantLedger::ReportSpent(uint64_t held) {
  return lease_.ReportSpent(HeldBy(Source::kLease, held)) +
         fallback_.ReportSpent(HeldBy(Source::kFallback, held));
}

uint64_t TenantLedger::ExactSpent(uint64_t held) const {
  return lease_.ExactSpent(HeldBy(Source::kLease, held)) + ExactFallbackSpent(held);
}

uint64_t TenantLedger::ExactFallbackSpent(uint64_t held) const {
  return fallback_.ExactSpent(HeldBy(Source::kFallback, held));
}

}  // namespace retrybudget::client_internal
