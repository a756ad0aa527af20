#include "client/tenant_ledger.h"

#include <algorithm>

namespace retrybudget::client_internal {

void TenantLedger::Received(uint64_t granted, uint64_t deposited) {
  received_ += granted;
  if (deposited < granted) returned_ += granted - deposited;
}

void TenantLedger::Withdrew(uint64_t withdrawn, uint64_t held_after) {
  // Were every withdrawn token returned, the wire's spent count would be `candidate`; if that is
  // below what was already reported, the difference are tokens refunded after they were reported
  // spent: they stay spent (absorbed) so the reported counter need not go backwards.
  const uint64_t total_out = returned_ + withdrawn + held_after;
  const uint64_t candidate = received_ > total_out ? received_ - total_out : 0;
  const uint64_t excess = reported_spent_ > candidate ? reported_spent_ - candidate : 0;
  const uint64_t absorbed = std::min(withdrawn, excess);
  absorbed_ += absorbed;
  returned_ += withdrawn - absorbed;
}

uint64_t TenantLedger::WireSpent(uint64_t held) const {
  const uint64_t out = returned_ + held;
  return received_ > out ? received_ - out : 0;
}

uint64_t TenantLedger::ReportSpent(uint64_t held) {
  reported_spent_ = std::max(reported_spent_, WireSpent(held));
  return reported_spent_;
}

uint64_t TenantLedger::ExactSpent(uint64_t held) const {
  const uint64_t out = returned_ + absorbed_ + held;
  return received_ > out ? received_ - out : 0;
}

}  // namespace retrybudget::client_internal
