#include "retrybudget/retry.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace retrybudget {
namespace {

absl::BitGen& ThreadBitGen() {
  thread_local absl::BitGen gen;
  return gen;
}

double DefaultRandom() { return absl::Uniform<double>(ThreadBitGen(), 0.0, 1.0); }

// Jitter values outside [0, 1) would make a backoff negative or above its ceiling.
double ClampUnit(double r) {
  if (!(r > 0.0)) return 0.0;  // also NaN
  constexpr double kBelowOne = 0.99999999999999989;  // nextafter(1.0, 0.0)
  return std::min(r, kBelowOne);
}

bool CodeListed(const RetryPolicy& policy, absl::StatusCode code) {
  return std::find(policy.retryable_codes.begin(), policy.retryable_codes.end(), code) !=
         policy.retryable_codes.end();
}

bool IsRetryable(const RetryPolicy& policy, const absl::Status& status, absl::Time now,
                 absl::Time deadline) {
  if (!CodeListed(policy, status.code())) return false;
  if (IsBudgetExhausted(status)) return false;
  // An attempt's own timeout is worth retrying; the overall deadline running out is not.
  if (status.code() == absl::StatusCode::kDeadlineExceeded && now >= deadline) return false;
  return !policy.is_retryable || policy.is_retryable(status);
}

std::string LastError(const absl::Status& last) {
  return last.ok() ? std::string() : absl::StrCat(" (last error: ", last.ToString(), ")");
}

// The cost of the retry after `last` (RetryPolicy::retry_cost), or INVALID_ARGUMENT.
absl::StatusOr<uint32_t> RetryCost(const RetryPolicy& policy, const absl::Status& last,
                                   int retry) {
  if (!policy.retry_cost) return 1;
  const uint32_t cost = policy.retry_cost(last);
  if (cost < 1 || cost > TenantBudget::kMaxCost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RetryPolicy.retry_cost returned ", cost, " for retry ", retry,
        "; a cost must be in [1, ", TenantBudget::kMaxCost, "]", LastError(last)));
  }
  return cost;
}

}  // namespace

absl::Status ValidateRetryPolicy(const RetryPolicy& policy) {
  if (policy.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RetryPolicy.max_attempts must be >= 1, got ", policy.max_attempts));
  }
  if (policy.initial_backoff < absl::ZeroDuration() ||
      policy.initial_backoff == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RetryPolicy.initial_backoff must be finite and >= 0, got ",
                     absl::FormatDuration(policy.initial_backoff)));
  }
  if (policy.max_backoff < policy.initial_backoff ||
      policy.max_backoff == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RetryPolicy.max_backoff must be finite and >= initial_backoff (",
        absl::FormatDuration(policy.initial_backoff), "), got ",
        absl::FormatDuration(policy.max_backoff)));
  }
  if (!(policy.multiplier >= 1.0) || !std::isfinite(policy.multiplier)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RetryPolicy.multiplier must be finite and >= 1, got %g", policy.multiplier));
  }
  if (policy.per_attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RetryPolicy.per_attempt_timeout must be > 0, got ",
                     absl::FormatDuration(policy.per_attempt_timeout)));
  }
  return absl::OkStatus();
}

uint32_t AwsRetryCost(const absl::Status& error) {
  return error.code() == absl::StatusCode::kDeadlineExceeded ? 10 : 5;
}

bool IsBudgetExhausted(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kBudgetExhaustedTypeUrl).has_value();
}

absl::Status MarkBudgetExhausted(absl::Status status, int attempts) {
  if (status.ok()) return status;
  status.SetPayload(kBudgetExhaustedTypeUrl, absl::Cord(absl::StrCat("attempts=", attempts)));
  return status;
}

std::string NewIdempotencyKey() {
  absl::BitGen& gen = ThreadBitGen();
  const uint64_t hi = absl::Uniform<uint64_t>(gen);
  const uint64_t lo = absl::Uniform<uint64_t>(gen);
  return absl::StrFormat("%016x%016x", hi, lo);
}

namespace {

// min(max_backoff, initial_backoff * multiplier^(retry-1)), computed in floating point first so
// a large exponent saturates at max_backoff instead of overflowing the Duration.
absl::Duration BackoffCeiling(const RetryPolicy& policy, int retry) {
  const double scale = std::pow(policy.multiplier, std::max(0, retry - 1));
  const double ceiling_s = absl::ToDoubleSeconds(policy.initial_backoff) * scale;
  return (!std::isfinite(ceiling_s) || ceiling_s >= absl::ToDoubleSeconds(policy.max_backoff))
             ? policy.max_backoff
             : policy.initial_backoff * scale;
}

}  // namespace

absl::Duration ComputeBackoff(const RetryPolicy& policy, int retry, double random) {
  const absl::Duration ceiling = BackoffCeiling(policy, retry);
  // Full jitter (uniform in [0, ceiling)): spreads a fleet's retries out instead of
  // synchronising them into waves.
  // Duration arithmetic rounds, so keep the upper bound strict by hand.
  const absl::Duration jittered = ceiling * ClampUnit(random);
  if (jittered >= ceiling && ceiling > absl::ZeroDuration()) return ceiling - absl::Nanoseconds(1);
  return jittered;
}

namespace retry_internal {

absl::Status RunRetryLoop(TenantBudget& budget, const RetryPolicy& policy,
                          const CallControl& control,
                          absl::FunctionRef<absl::Status(Attempt&)> attempt) {
  if (absl::Status valid = ValidateRetryPolicy(policy); !valid.ok()) return valid;
  Clock& clock = control.clock != nullptr ? *control.clock : *Clock::Real();
  const std::string key =
      control.idempotency_key.empty() ? NewIdempotencyKey() : control.idempotency_key;
  const absl::Time deadline = control.deadline;

  absl::Status last;
  // The tokens taken for the retry about to start (0: none); given back if it is never sent.
  uint32_t tokens_held = 0;
  for (int number = 1;; ++number) {
    if (control.stop.stop_requested()) {
      if (tokens_held > 0) budget.Refund(tokens_held);
      return absl::CancelledError(
          absl::StrCat("retry: cancelled before attempt ", number, LastError(last)));
    }
    const absl::Time start = clock.Now();
    if (start >= deadline) {
      if (tokens_held > 0) budget.Refund(tokens_held);
      return absl::DeadlineExceededError(absl::StrCat(
          "retry: overall deadline passed before attempt ", number, LastError(last)));
    }
    tokens_held = 0;  // the retry is sent now: its tokens are spent
    if (number == 1) budget.RecordRequest();

    Attempt a;
    a.number = number;
    a.idempotency_key = key;
    a.stop = control.stop;
    a.deadline = deadline;
    a.attempt_deadline = std::min(deadline, start + policy.per_attempt_timeout);
    a.clock = &clock;
    absl::Status status = attempt(a);
    if (status.ok()) {
      budget.RecordSuccess();
      return status;
    }
    last = std::move(status);

    if (control.stop.stop_requested()) {
      return absl::CancelledError(
          absl::StrCat("retry: cancelled during attempt ", number, LastError(last)));
    }
    const absl::Time now = clock.Now();
    if (!IsRetryable(policy, last, now, deadline)) return last;
    if (a.pushback.has_value() && *a.pushback < absl::ZeroDuration()) return last;
    if (number >= policy.max_attempts) return last;

    // Decide the wait before asking for a token: a retry that cannot start before the deadline
    // must not spend one.
    const absl::Duration backoff =
        a.pushback.has_value()
            ? *a.pushback
            : ComputeBackoff(policy, number, control.random ? control.random() : DefaultRandom());
    if (now + backoff >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "retry: a backoff of ", absl::FormatDuration(backoff), " after attempt ", number,
          " would end at or after the overall deadline (",
          absl::FormatDuration(deadline - now), " left)", LastError(last)));
    }
    // Before the tenant's first answer every TryAcquire() is denied (no lease yet): wait for it
    // first, for at most kFirstAnswerWait or this retry's backoff ceiling (or the backoff, when
    // a pushback is longer), never past the deadline, cancelled by the stop. A ready budget
    // returns at once.
    const absl::Time wait_until = std::min(
        deadline, now + std::max({kFirstAnswerWait, backoff, BackoffCeiling(policy, number)}));
    if (absl::Status ready = budget.WaitReady(wait_until, control.stop); !ready.ok()) {
      if (control.stop.stop_requested()) {
        return absl::CancelledError(absl::StrCat(
            "retry: cancelled during the backoff before attempt ", number + 1, LastError(last)));
      }
      if (clock.Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "retry: the overall deadline passed while waiting for the budget's first answer, "
            "before attempt ", number + 1, LastError(last)));
      }
      // No answer within the wait: TryAcquire() decides (and denies).
    }
    absl::StatusOr<uint32_t> cost = RetryCost(policy, last, number);
    if (!cost.ok()) return cost.status();
    if (!budget.TryAcquire(*cost)) return MarkBudgetExhausted(std::move(last), number);
    tokens_held = *cost;
    if (!clock.SleepUntil(now + backoff, control.stop)) {
      budget.Refund(tokens_held);
      return absl::CancelledError(absl::StrCat("retry: cancelled during the backoff before attempt ",
                                               number + 1, LastError(last)));
    }
  }
}

}  // namespace retry_internal
}  // namespace retrybudget
