// Totals of one budget since it was created (for GetBudget, metrics and snapshots). Every total
// saturates at UINT64_MAX instead of wrapping (SaturatingAdd, grant_math.h).
#ifndef RETRYBUDGET_SERVER_BUDGET_TOTALS_H_
#define RETRYBUDGET_SERVER_BUDGET_TOTALS_H_

#include <cstdint>

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
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_BUDGET_TOTALS_H_
