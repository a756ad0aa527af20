// The pure arithmetic of the accounting: how many tokens one instance is granted, its share for
// fallback, how soon a dry instance comes back, and the per (instance, tenant) ledger that caps
// what a report may credit at what this server granted (DESIGN.md "Accounting"). No state, no
// locks, no time source: each function is a table test in tests/server/grant_math_test.cc.
#ifndef RETRYBUDGET_SERVER_GRANT_MATH_H_
#define RETRYBUDGET_SERVER_GRANT_MATH_H_

#include <cstdint>
#include <limits>

#include "absl/time/time.h"
#include "server/cumulative_counters.h"

namespace retrybudget {

// a + b, or UINT64_MAX when that overflows: totals saturate instead of wrapping.
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

// Whole tokens to grant one instance that wants `want` when the active instances want `want_sum`
// in all (this one included) and the bucket holds `level`. When demand exceeds supply each gets
// its proportional share, at least one token while any is left, so nothing strands.
uint64_t GrantFor(uint64_t want, uint64_t want_sum, double level);

// One instance's share of a tenant's capacity and refill for its fallback bucket, among `fleet`
// instances (at least 1).
struct SafeShareOf {
  double capacity = 0;
  double refill_per_second = 0;
};
SafeShareOf SafeShare(double capacity, double refill_per_second, uint64_t fleet);

// Tokens reserved on disk ahead of grants at a time, for a bucket of `capacity`: an eighth of
// it, within [8, 1e6]. A crash forfeits at most about one block per tenant.
uint64_t ReservationBlock(double capacity);

// Cluster mode, where each reservation is an etcd transaction (a Raft round): a block of about
// `ahead` of grants at `grant_rate` (tokens/s, observed), counted at most at the tenant's
// `inflow` (refill plus success credit, tokens/s: a burst out of a full bucket is not a rate it
// can keep up), and at least ReservationBlock(capacity). Within [8, 1e6]. A takeover forfeits at
// most about one block per tenant: at most `ahead` of inflow or an eighth of the capacity.
uint64_t ClusterReservationBlock(double capacity, double grant_rate, double inflow,
                                 absl::Duration ahead);

// When an instance that got less than it wants should sync next: when the inflow (refill plus
// success credit, tokens/s) has made about one token of its share (want / want_sum), within
// [min_next_sync, min(normal, 250 ms)].
absl::Duration DryNextSync(double inflow, uint64_t want, uint64_t want_sum,
                           absl::Duration normal, absl::Duration min_next_sync);

// What the server holds for one instance and tenant.
struct LedgerEntry {
  // The client's counters as last applied.
  CumulativeCounters applied;
  // What tokens_received will be once every grant made so far has arrived.
  uint64_t expected_received = 0;
  // Tokens this server granted the record and has not had back (spent from leases, returned or
  // reclaimed). Returns, reclaims and counted holdings are credited only up to it.
  uint64_t outstanding = 0;
  // Of the lease spending applied, the tokens charged against `outstanding` and not refunded
  // since. A refund gives them back to `outstanding` (the client holds the token again), never
  // more: outstanding + charged never exceeds what this server granted the record and was not
  // credited back.
  uint64_t charged = 0;
};

// A first report (of an unknown instance, or a tenant a known instance reports for the first
// time): its counters become the base, nothing is credited and nothing is outstanding.
LedgerEntry Baseline(const CumulativeCounters& sent);

// What one report of a known record changes. Requires a validated report: no counter below
// `applied`, tokens_received <= expected_received, lease spent + returned <= received.
struct ReportEffect {
  uint64_t d_successes = 0;
  // Of d_successes, those the server credits: not credited by the client's fallback bucket
  // (TenantSync.successes_credited_locally).
  uint64_t d_credited_successes = 0;
  // Retries spent and refunded since the previous report; of each, those of the fallback bucket.
  uint64_t d_retries = 0;
  uint64_t d_refunded = 0;
  uint64_t d_denied = 0;
  uint64_t d_fallback = 0;
  uint64_t d_fallback_refunded = 0;
  // Requests (first attempts), a shadow tenant's would-be denials and the retries allowed with
  // tokens since the previous report: counted in the totals.
  uint64_t d_requests = 0;
  uint64_t d_shadow_denied = 0;
  uint64_t d_retries_allowed = 0;
  uint64_t d_returned = 0;
  // Granted but never received (a lost response).
  uint64_t reclaimed = 0;
  // Of d_returned + reclaimed, the tokens that go back into the bucket, and the rest.
  uint64_t credited_back = 0;
  uint64_t uncredited = 0;
  // Retries spent since the previous report (any source), refunds deducted.
  uint64_t spent_since = 0;
};

// Applies `sent` to `entry`: spending from leases is attributed to the outstanding grants
// first (a refund gives back what it charged), then returns and reclaims are credited up to
// what is still outstanding. For a record
// whose whole history is with this server the caps never bind (see grant_math.cc).
ReportEffect ApplyReport(LedgerEntry& entry, const CumulativeCounters& sent);

// Tokens the client still holds by its own report, counted against the capacity only up to
// what this server granted and has not had back.
uint64_t CountedHoldings(const LedgerEntry& entry);

// A grant of `granted` tokens made to the record.
void RecordGrant(LedgerEntry& entry, uint64_t granted);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_GRANT_MATH_H_
