#include "client/cpp/refresh_policy.h"

#include <algorithm>
#include <cmath>

namespace retrybudget::client_internal {

uint64_t LowWaterMark(uint64_t granted) {
  return static_cast<uint64_t>(std::ceil(static_cast<double>(granted) * kLowWaterFraction));
}

absl::Duration NextSyncDelay(int64_t next_sync_ms, const RefreshPolicy& policy) {
  if (next_sync_ms <= 0) return policy.refresh_period;
  const absl::Duration hint = absl::Milliseconds(next_sync_ms);
  return std::max(policy.min_sync_interval, std::min(hint, policy.refresh_period));
}

absl::Duration RetryBackoff(int failures, const RefreshPolicy& policy) {
  absl::Duration backoff = kFirstRetryBackoff;
  for (int i = 1; i < failures && backoff < kMaxRetryBackoff; ++i) backoff *= 2;
  return std::max(policy.min_sync_interval, std::min(backoff, kMaxRetryBackoff));
}

}  // namespace retrybudget::client_internal
