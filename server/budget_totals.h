// Totals of one budget since it was created (for GetBudget, metrics and snapshots). Every total
// saturates at UINT64_MAX instead of wrapping (SaturatingAdd, grant_math.h).
#ifndef RETRYBUDGET_SERVER_BUDGET_TOTALS_H_
#define RETRYBUDGET_SERVER_BUDGET_TOTALS_H_

#include <cstdint>

#include "retrybudget/v1/state.pb.h"

namespace retrybudget {

struct BudgetTotals {
  uint64_t granted = 0;
  uint64_t wanted = 0;
  uint64_t successes = 0;
  uint64_t retries = 0;
  uint64_t retries_denied = 0;
  uint64_t returned = 0;
  uint64_t reclaimed = 0;
  uint64_t fallback_retries = 0;
  // Of returned + reclaimed, the tokens beyond what this server had outstanding for the
  // instance: recorded, credited nothing.
  uint64_t uncredited = 0;

  // The totals a snapshot or a shard's state in etcd recorded, with `granted` as the reader
  // counts it (after a crash or a takeover: everything up to the reserved limit).
  static BudgetTotals FromState(const v1::TenantState& ts, uint64_t granted) {
    return BudgetTotals{.granted = granted,
                        .wanted = ts.wanted_total(),
                        .successes = ts.successes_total(),
                        .retries = ts.retries_total(),
                        .retries_denied = ts.retries_denied_total(),
                        .returned = ts.returned_total(),
                        .reclaimed = ts.reclaimed_total(),
                        .fallback_retries = ts.fallback_retries_total(),
                        .uncredited = ts.uncredited_total()};
  }
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_BUDGET_TOTALS_H_
