#include "server/token_bucket.h"

#include <algorithm>
#include <cmath>

namespace retrybudget {

TokenBucket::TokenBucket(double initial_tokens, double capacity, absl::Time now)
    : tokens_(std::clamp(initial_tokens, 0.0, capacity)), last_ns_(absl::ToUnixNanos(now)) {}

double TokenBucket::Grown(const BucketLimits& limits, double added) const {
  return std::max(tokens_, std::min(limits.capacity - limits.leased, tokens_ + added));
}

void TokenBucket::Refill(const BucketLimits& limits, int64_t now_ns) {
  if (now_ns <= last_ns_) return;
  const double dt = static_cast<double>(now_ns - last_ns_) * 1e-9;
  tokens_ = Grown(limits, limits.refill_per_second * dt);
  last_ns_ = now_ns;
}

void TokenBucket::Deposit(const BucketLimits& limits, double tokens) {
  if (tokens <= 0) return;
  tokens_ = Grown(limits, tokens);
}

uint64_t TokenBucket::Take(uint64_t max_tokens) {
  // Whole tokens only, and never below zero. A tiny epsilon absorbs floating error from sums
  // of credits like 0.1 * 10 (which is 0.9999999999999999).
  const double whole = std::floor(tokens_ + 1e-9);
  if (whole < 1) return 0;
  const uint64_t taken =
      whole >= static_cast<double>(max_tokens) ? max_tokens : static_cast<uint64_t>(whole);
  tokens_ = std::max(0.0, tokens_ - static_cast<double>(taken));
  return taken;
}

void TokenBucket::CapAt(double capacity) { tokens_ = std::min(tokens_, capacity); }

void TokenBucket::Restore(double tokens, double capacity, absl::Time at) {
  tokens_ = std::min(tokens, capacity);
  last_ns_ = absl::ToUnixNanos(at);
}

}  // namespace retrybudget
