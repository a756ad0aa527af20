// The bucket math of one tenant: capacity, refill per second, credit per success, whole-token
// takes. A plain value type with no clock of its own: every call passes the time.
#ifndef RETRYBUDGET_SERVER_TOKEN_BUCKET_H_
#define RETRYBUDGET_SERVER_TOKEN_BUCKET_H_

#include <cstdint>

#include "absl/time/time.h"

namespace retrybudget {

// Not thread-safe: the owner (BudgetCore's tenant) guards it.
class TokenBucket {
 public:
  TokenBucket(double capacity, double refill_per_second, double initial_tokens, absl::Time now);

  // tokens = min(capacity - leased, tokens + refill_per_second * (now - last)), never lowering
  // the level. Time going backwards adds nothing (and does not move `last` back).
  void Refill(absl::Time now);

  // Adds `tokens` (success credit, returned or reclaimed tokens), capped the same way.
  void Deposit(double tokens);

  // Tokens of this bucket that are held outside it, leased to clients. They still count
  // against the capacity: the level grows (refill, deposits) only up to capacity - leased, so
  // the level plus what the fleet holds never passes the capacity, the burst the policy allows.
  void set_leased(double leased) { leased_ = leased; }
  double leased() const { return leased_; }

  // Takes min(max_tokens, floor(level)) whole tokens and returns how many were taken.
  uint64_t Take(uint64_t max_tokens);

  // Changes capacity and refill; the level is kept, capped at the new capacity.
  void Reconfigure(double capacity, double refill_per_second);

  double tokens() const { return tokens_; }
  double capacity() const { return capacity_; }
  double refill_per_second() const { return refill_per_second_; }
  absl::Time last_refill() const { return absl::FromUnixNanos(last_ns_); }

  // Restores a persisted level as of `at`, capped at capacity. A negative level is kept: it is a
  // debt (tokens that may have been granted before a crash) that refill pays off first.
  void Restore(double tokens, absl::Time at);

 private:
  double capacity_;
  double refill_per_second_;
  double tokens_;
  double leased_ = 0;
  // The last refill, in Unix nanoseconds: 8 bytes where an absl::Time takes 16 (one bucket per
  // tenant, a million tenants).
  int64_t last_ns_;

  // `tokens_` + `added`, capped at capacity - leased, but never lower than now.
  double Grown(double added) const;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_TOKEN_BUCKET_H_
