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

  // tokens = min(capacity, tokens + refill_per_second * (now - last)). Time going backwards
  // adds nothing (and does not move `last` back).
  void Refill(absl::Time now);

  // Adds `tokens` (success credit, returned or reclaimed tokens), capped at capacity.
  void Deposit(double tokens);

  // Takes min(max_tokens, floor(level)) whole tokens and returns how many were taken.
  uint64_t Take(uint64_t max_tokens);

  // Changes capacity and refill; the level is kept, capped at the new capacity.
  void Reconfigure(double capacity, double refill_per_second);

  double tokens() const { return tokens_; }
  double capacity() const { return capacity_; }
  double refill_per_second() const { return refill_per_second_; }
  absl::Time last_refill() const { return last_; }

  // Restores a persisted level as of `at`, capped at capacity. A negative level is kept: it is a
  // debt (tokens that may have been granted before a crash) that refill pays off first.
  void Restore(double tokens, absl::Time at);

 private:
  double capacity_;
  double refill_per_second_;
  double tokens_;
  absl::Time last_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_TOKEN_BUCKET_H_
