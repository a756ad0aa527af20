// The local token bucket a tenant falls back to while the budget server is unreachable.
#ifndef RETRYBUDGET_CLIENT_FALLBACK_BUCKET_H_
#define RETRYBUDGET_CLIENT_FALLBACK_BUCKET_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace retrybudget::client_internal {

// Size of a local bucket: the SafeShare the server sent for the tenant (see kSafeShareMemory in
// retrybudget/client.h), or the configured bucket of a client that never reached the server.
struct BucketShape {
  double capacity = 0;           // tokens
  double refill_per_second = 0;  // tokens per second
  double success_credit = 0;     // tokens per success recorded in fallback (not divided)
  double request_credit = 0;     // tokens per request recorded in fallback (not divided)
};

// The smaller of two shapes in each dimension.
struct SmallerShape {
  BucketShape operator()(const BucketShape& a, const BucketShape& b) const {
    return {.capacity = std::min(a.capacity, b.capacity),
            .refill_per_second = std::min(a.refill_per_second, b.refill_per_second),
            .success_credit = std::min(a.success_credit, b.success_credit),
            .request_credit = std::min(a.request_credit, b.request_credit)};
  }
};

// Events that may earn a fallback bucket credit at a step, or that did.
struct FallbackCredits {
  uint64_t successes = 0;
  uint64_t requests = 0;
};

// The bucket math of fallback mode, for a bucket whose whole tokens sit in the lease word where
// workers take them without telling anyone. The refresher calls Refill() on each of its steps
// with what the word holds; it returns how many whole tokens to add. Fractions stay here.
//
// The level starts at `capacity` (the instance's share of the burst) and grows by
// `refill_per_second` up to `capacity`; a share below one token is allowed to grow to one whole
// token when it refills at all (otherwise a large fleet in fallback could never retry; that costs
// at most one token per instance). Tokens taken between two steps are assumed taken just before
// the later step, so refill lost while the bucket sat full is never credited: over any run,
// tokens handed out <= capacity + refill_per_second * elapsed (+ at most one token for a share
// below one) + success_credit * (successes credited).
//
// Success- and request-funded fallback: Refill() also takes the successes and the requests
// recorded since the last step that may be credited here (none the server may already have
// credited: the caller passes only those it has put in no request). Each success deposits
// `success_credit`, then each request `request_credit` (the same code), up to the cap; one whose
// credit does not fit is not credited here, and the caller reports it to the server as an
// ordinary success or request (credited there). So each is credited once, locally or centrally,
// and the fleet's fallback buckets together earn exactly the credit the central bucket would.
//
// Not thread-safe: the owner serialises calls.
class FallbackBucket {
 public:
  using Credits = FallbackCredits;

  // A bucket of `shape` at `now`, full or (`start_full` false: a spent lease falling back
  // early, whose share of the burst was already spent in the lease) empty. Negative or
  // non-finite values count as 0.
  FallbackBucket(BucketShape shape, absl::Time now, bool start_full = true);

  // Whole tokens to put into the word at `now`, which holds `held` tokens right now (taken
  // tokens lower it, refunds raise it). The caller deposits exactly the returned count.
  // `pending` may be credited (see above); *credited (if not null) is set to how many were.
  uint64_t Refill(absl::Time now, uint64_t held, Credits pending = {},
                  Credits* credited = nullptr);

  // When the next step is due if nobody takes any: the next whole token of refill, or, for a
  // bucket funded by success or request credit and not full, at most kCreditStepInterval away
  // (successes and requests are only seen at steps, and credit that waits while workers run dry
  // is retries denied).
  // InfiniteFuture when the bucket is full or gains nothing. Valid after Refill().
  absl::Time NextTokenAt() const;

  static constexpr absl::Duration kCreditStepInterval = absl::Milliseconds(50);

  // True when no further whole token fits (the bucket is full): refill is being lost until a
  // token is taken. Valid after Refill().
  bool Full() const;

  // Whole tokens in the word after the last Refill() (as far as this bucket knows).
  uint64_t held() const { return held_; }

  const BucketShape& shape() const { return shape_; }

 private:
  // Adds the credit of as many of `count` events of `credit` tokens each as fit under the cap to
  // `*level`; returns how many were credited.
  uint64_t CreditFitting(uint64_t count, double credit, double* level) const;

  BucketShape shape_;
  double cap_ = 0;       // most the level reaches (capacity, or 1 for a refilling share below 1)
  double level_ = 0;     // modelled level after the last Refill(): held_ + a fraction
  uint64_t held_ = 0;    // whole tokens in the word after the last Refill()
  absl::Time last_;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_FALLBACK_BUCKET_H_
