// When the refresher syncs and how much it keeps in reserve: the tunable numbers in one place.
#ifndef RETRYBUDGET_CLIENT_REFRESH_POLICY_H_
#define RETRYBUDGET_CLIENT_REFRESH_POLICY_H_

#include <cstdint>

#include "absl/time/time.h"

namespace retrybudget::client_internal {

// The client options that shape the refresh schedule. A plain value.
struct RefreshPolicy {
  absl::Duration refresh_period = absl::Milliseconds(200);
  absl::Duration min_sync_interval = absl::Milliseconds(5);
  uint64_t lease_burst = 2;
};

// Fraction of the last grant at which the lease counts as low and the refresher is woken.
inline constexpr double kLowWaterFraction = 0.2;

// First and largest wait before resending a Sync that failed.
inline constexpr absl::Duration kFirstRetryBackoff = absl::Milliseconds(20);
inline constexpr absl::Duration kMaxRetryBackoff = absl::Seconds(1);

// A Sync is cut short for a fallback step due sooner than this (never for a lease expiry): a
// fast-refilling bucket must not leave the Sync too little time to ever complete.
inline constexpr absl::Duration kMinFallbackStepWindow = absl::Milliseconds(20);

// Attempts of the final Sync sent by Shutdown(), each bounded by sync_timeout.
inline constexpr int kFinalSyncAttempts = 3;

// The low-water mark for a grant of `granted` tokens: ceil(20%), so any grant of one token or
// more has a mark of at least 1 (0 means "wake when the lease is empty").
uint64_t LowWaterMark(uint64_t granted);

// How long after a response the tenant wants its next sync: the server's `next_sync_ms`, at
// most `refresh_period` (the client's own ceiling) and at least `min_sync_interval`; a missing
// (<= 0) hint means `refresh_period`.
absl::Duration NextSyncDelay(int64_t next_sync_ms, const RefreshPolicy& policy);

// Wait before resending a Sync after `failures` consecutive failures (>= 1): 20 ms doubling up
// to 1 s, never below `min_sync_interval`.
absl::Duration RetryBackoff(int failures, const RefreshPolicy& policy);

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_REFRESH_POLICY_H_
