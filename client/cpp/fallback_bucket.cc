#include "client/cpp/fallback_bucket.h"

#include <algorithm>
#include <cmath>

#include "client/cpp/lease.h"

namespace retrybudget::client_internal {
namespace {

constexpr double kEpsilon = 1e-6;

double Sanitize(double value, double most) {
  if (!std::isfinite(value) || value < 0) return 0;
  return std::min(value, most);
}

}  // namespace

FallbackBucket::FallbackBucket(BucketShape shape, absl::Time now, bool start_full) : last_(now) {
  // The word holds at most Lease::kMaxTokens; nothing above it could ever be handed out.
  constexpr double kMost = static_cast<double>(Lease::kMaxTokens);
  shape_.capacity = Sanitize(shape.capacity, kMost);
  shape_.refill_per_second = Sanitize(shape.refill_per_second, kMost);
  shape_.success_credit = Sanitize(shape.success_credit, kMost);
  shape_.request_credit = Sanitize(shape.request_credit, kMost);
  cap_ = shape_.refill_per_second > 0 ? std::max(shape_.capacity, 1.0) : shape_.capacity;
  level_ = start_full ? shape_.capacity : 0;
  held_ = 0;  // nothing in the word yet: the first Refill() puts floor(capacity) in
}

uint64_t FallbackBucket::CreditFitting(uint64_t count, double credit, double* level) const {
  // Whole events only, up to the cap: those that do not fit stay the server's to credit.
  if (count == 0 || credit <= 0 || *level >= cap_) return 0;
  const double room = std::floor((cap_ - *level) / credit + kEpsilon);
  const uint64_t fit = room >= static_cast<double>(count) ? count : static_cast<uint64_t>(room);
  *level += static_cast<double>(fit) * credit;
  return fit;
}

uint64_t FallbackBucket::Refill(absl::Time now, uint64_t held, Credits pending,
                                Credits* credited) {
  const double dt = std::max(0.0, absl::ToDoubleSeconds(now - last_));
  last_ = std::max(last_, now);
  // Growth since the last step, as if every take since then happened just now.
  const double grown = std::max(level_, std::min(cap_, level_ + shape_.refill_per_second * dt));
  double level = grown - static_cast<double>(held_) + static_cast<double>(held);
  level = std::max(level, static_cast<double>(held));
  const Credits fit = {
      .successes = CreditFitting(pending.successes, shape_.success_credit, &level),
      .requests = CreditFitting(pending.requests, shape_.request_credit, &level)};
  if (credited != nullptr) *credited = fit;
  // The epsilon absorbs rounding in rate * time (a token due at t is there at t).
  const double whole = std::floor(level + kEpsilon);
  const uint64_t add = whole > static_cast<double>(held)
                           ? static_cast<uint64_t>(whole) - held
                           : 0;
  level_ = level;
  held_ = held + add;
  return add;
}

bool FallbackBucket::Full() const {
  return shape_.refill_per_second > 0 && std::floor(level_ + kEpsilon) + 1 > cap_ + kEpsilon;
}

absl::Time FallbackBucket::NextTokenAt() const {
  const bool credited = shape_.success_credit > 0 || shape_.request_credit > 0;
  const absl::Time credit_step = credited && level_ + kEpsilon < cap_
                                     ? last_ + kCreditStepInterval
                                     : absl::InfiniteFuture();
  if (shape_.refill_per_second <= 0 || Full()) return credit_step;
  const double next_whole = std::floor(level_ + kEpsilon) + 1;
  // Rounded up to the microsecond so that a step at that time sees the whole token (Refill()'s
  // epsilon covers the rounding of an exact microsecond count).
  const double micros = (next_whole - level_) / shape_.refill_per_second * 1e6;
  // At least 1 us, so a step never reschedules itself for the same instant.
  return std::min(credit_step,
                  last_ + absl::Microseconds(std::max(1.0, std::ceil(micros - 1e-3))));
}

}  // namespace retrybudget::client_internal
