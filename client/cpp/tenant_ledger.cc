#include "client/cpp/tenant_ledger.h"

#include <algorithm>

namespace retrybudget::client_internal {
namespace {

uint64_t Sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

void TokenAccount::Withdrew(uint64_t withdrawn, uint64_t held_after) {
  // This source's tokens that are not out yet are either spent or in the word; `held_after` of
  // them are back in the word (raced-in refunds) and will be withdrawn later. At most the rest
  // can be this source's tokens among those withdrawn; any more were refunded into the word
  // after a change of source and stay spent in the other source's books.
  const uint64_t back = std::min(withdrawn, Sub(in_, out_ + held_after));
  out_ += back;
  absorbed_ += withdrawn - back;
}

void TokenAccount::Report(uint64_t held) {
  const uint64_t exact = ExactSpent(held);
  // A refund after the last report lowered `exact` below what was reported: report it as
  // refunded rather than lowering the spent count.
  refunded_ = std::max(refunded_, Sub(reported_spent_, exact));
  reported_spent_ = exact + refunded_;
}

uint64_t TokenAccount::ExactSpent(uint64_t held) const { return Sub(in_, out_ + held); }

void TenantLedger::Received(uint64_t granted, uint64_t deposited) {
  lease_.In(deposited);
  put_ += deposited;
  if (deposited < granted) lease_.InAndOut(granted - deposited);
}

void TenantLedger::Withdrew(uint64_t withdrawn, uint64_t held_after) {
  withdrawn_ += withdrawn;
  (source_ == Source::kLease ? lease_ : fallback_).Withdrew(withdrawn, held_after);
}

void TenantLedger::Report(uint64_t held) {
  lease_.Report(HeldBy(Source::kLease, held));
  fallback_.Report(HeldBy(Source::kFallback, held));
}

void TenantLedger::Report(const WordSnapshot& word) {
  Report(word.held);
  reported_allowed_ = std::max(reported_allowed_, std::min(Takes(word), reported_spent()));
}

uint64_t TenantLedger::Takes(const WordSnapshot& word) const {
  return Sub(Sub(put_ + word.refunded, withdrawn_ + word.held), word.extra);
}

uint64_t TenantLedger::ExactSpent(uint64_t held) const {
  return lease_.ExactSpent(HeldBy(Source::kLease, held)) + ExactFallbackSpent(held);
}

uint64_t TenantLedger::ExactFallbackSpent(uint64_t held) const {
  return fallback_.ExactSpent(HeldBy(Source::kFallback, held));
}

}  // namespace retrybudget::client_internal
