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
  // Retries spent as reported, refunded ones included (the retries sent are retries -
  // refunded), and of them those from fallback buckets.
  uint64_t retries = 0;
  uint64_t refunded = 0;
  uint64_t retries_denied = 0;
  // A shadow tenant's would-be denials, requests (first attempts) and retries allowed with
  // tokens (counts; `retries` is in tokens).
  uint64_t shadow_denied = 0;
  uint64_t requests = 0;
  uint64_t retries_allowed = 0;
  uint64_t returned = 0;
  uint64_t reclaimed = 0;
  uint64_t fallback_retries = 0;
  uint64_t fallback_refunded = 0;
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
                        .refunded = ts.refunded_total(),
                        .retries_denied = ts.retries_denied_total(),
                        .shadow_denied = ts.shadow_denied_total(),
                        .requests = ts.requests_total(),
                        .retries_allowed = ts.retries_allowed_total(),
                        .returned = ts.returned_total(),
                        .reclaimed = ts.reclaimed_total(),
                        .fallback_retries = ts.fallback_retries_total(),
                        .fallback_refunded = ts.fallback_refunded_total(),
                        .uncredited = ts.uncredited_total()};
  }

  // Writes every total but `granted` (whose durable form the writer decides) into `ts`.
  void ToState(v1::TenantState& ts) const {
    ts.set_wanted_total(wanted);
    ts.set_successes_total(successes);
    ts.set_retries_total(retries);
    ts.set_refunded_total(refunded);
    ts.set_retries_denied_total(retries_denied);
    ts.set_shadow_denied_total(shadow_denied);
    ts.set_requests_total(requests);
    ts.set_retries_allowed_total(retries_allowed);
    ts.set_returned_total(returned);
    ts.set_reclaimed_total(reclaimed);
    ts.set_fallback_retries_total(fallback_retries);
    ts.set_fallback_refunded_total(fallback_refunded);
    ts.set_uncredited_total(uncredited);
  }
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_BUDGET_TOTALS_H_
