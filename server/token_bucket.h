// The bucket math of one tenant: the level, refill per second, credit per success, whole-token
// takes. A plain value type with no clock and no policy of its own: every call passes the time
// and the limits in force (the tenant's policy and the tokens its fleet holds), so a million
// tenants do not each keep a copy of what their shared policy already says.
#ifndef RETRYBUDGET_SERVER_TOKEN_BUCKET_H_
#define RETRYBUDGET_SERVER_TOKEN_BUCKET_H_

#include <cstdint>

#include "absl/time/time.h"

namespace retrybudget {

// What bounds a bucket at the moment of a call.
struct BucketLimits {
  double capacity = 0;
  double refill_per_second = 0;
  // Tokens of this bucket that are held outside it, leased to clients. They still count
  // against the capacity: the level grows (refill, deposits) only up to capacity - leased, so
  // the level plus what the fleet holds never passes the capacity, the burst the policy allows.
  double leased = 0;
};

// Not thread-safe: the owner (BudgetCore's tenant) guards it. 16 bytes.
class TokenBucket {
 public:
  // Starts at `initial_tokens`, capped to [0, capacity].
  TokenBucket(double initial_tokens, double capacity, absl::Time now);

  // tokens = min(capacity - leased, tokens + refill_per_second * (now - last)), never lowering
  // the level. Time going backwards adds nothing (and does not move `last` back).
  void Refill(const BucketLimits& limits, absl::Time now) {
    Refill(limits, absl::ToUnixNanos(now));
  }
  // The same with `now` in Unix nanoseconds.
  void Refill(const BucketLimits& limits, int64_t now_ns);

  // Adds `tokens` (success credit, returned or reclaimed tokens), capped the same way.
  void Deposit(const BucketLimits& limits, double tokens);

  // Takes min(max_tokens, floor(level)) whole tokens and returns how many were taken.
  uint64_t Take(uint64_t max_tokens);

  // After a change of policy: the level is kept, capped at the new capacity (refill first, at
  // the old rate, for the time that passed before the change).
  void CapAt(double capacity);

  double tokens() const { return tokens_; }
  absl::Time last_refill() const { return absl::FromUnixNanos(last_ns_); }

  // Restores a persisted level as of `at`, capped at capacity. A negative level is kept: it is a
  // debt (tokens that may have been granted before a crash) that refill pays off first.
  void Restore(double tokens, double capacity, absl::Time at);

 private:
  double tokens_;
  // The last refill, in Unix nanoseconds: 8 bytes where an absl::Time takes 16 (one bucket per
  // tenant, a million tenants).
  int64_t last_ns_;

  // `tokens_` + `added`, capped at capacity - leased, but never lower than now.
  double Grown(const BucketLimits& limits, double added) const;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_TOKEN_BUCKET_H_
