#include "tools/fleet/worker_loop.h"

#include <algorithm>
#include <limits>
#include <stop_token>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "retrybudget/retry.h"

namespace retrybudget::fleet {
namespace {
constexpr int kUnbudgetedDefaultAttempts = 4;
}  // namespace

absl::string_view RetryStrategyName(RetryStrategy strategy) {
  switch (strategy) {
    case RetryStrategy::kBudget:
      return "budget";
    case RetryStrategy::kUnbudgeted:
      return "unbudgeted";
    case RetryStrategy::kRetryHelper:
      return "retry-helper";
  }
  return "unknown";
}

absl::StatusOr<RetryStrategy> ParseRetryStrategy(absl::string_view name) {
  for (RetryStrategy s :
       {RetryStrategy::kBudget, RetryStrategy::kUnbudgeted, RetryStrategy::kRetryHelper}) {
    if (name == RetryStrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--strategy: unknown value '", name, "' (expected budget, unbudgeted or retry-helper)"));
}

SimulatedBackend::SimulatedBackend(SimulatedBackendOptions options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      rng_(options.seed),
      fails_(options.failure_rate) {}

bool SimulatedBackend::Call() {
  if (options_.latency > absl::ZeroDuration()) {
    clock_->SleepUntil(clock_->Now() + options_.latency, std::stop_token());
  }
  return !fails_(rng_);
}

CallCounts& CallCounts::operator+=(const CallCounts& other) {
  calls += other.calls;
  attempts += other.attempts;
  successes += other.successes;
  failures += other.failures;
  retries_allowed += other.retries_allowed;
  retries_denied += other.retries_denied;
  requests += other.requests;
  tokens_spent += other.tokens_spent;
  return *this;
}

namespace {

// kRetryHelper: one logical call through retrybudget::Retry(). The helper owns the loop; the
// attempt only counts backend calls, so the counts mean what they mean for kBudget.
void RunHelperCall(const CallOptions& options, Backend& backend, TenantBudget& budget,
                   std::stop_token stop, CallCounts& counts) {
  RetryPolicy policy;
  policy.max_attempts =
      options.max_attempts > 0 ? options.max_attempts : std::numeric_limits<int>::max();
  policy.initial_backoff = options.backoff_initial;
  policy.max_backoff = std::max(options.backoff_max, options.backoff_initial);
  policy.multiplier = 2.0;
  if (options.retry_cost != 1) {
    policy.retry_cost = [cost = options.retry_cost](const absl::Status&) { return cost; };
  }
  CallControl control;
  control.stop = stop;
  // A fixed key: the simulated backend does not dedup, and a random key per call would cost an
  // allocation and 16 random bytes for nothing.
  control.idempotency_key = "fleet";
  ++counts.calls;
  uint64_t attempts = 0;
  absl::Status status = Retry(budget, policy, control, [&](const Attempt&) -> absl::Status {
    ++attempts;
    return backend.Call() ? absl::OkStatus()
                          : absl::UnavailableError("simulated backend failure");
  });
  ++counts.requests;  // Retry() recorded the request
  counts.attempts += attempts;
  if (attempts > 1) {
    counts.retries_allowed += attempts - 1;
    counts.tokens_spent += (attempts - 1) * options.retry_cost;
  }
  if (status.ok()) {
    ++counts.successes;  // Retry() called RecordSuccess() once
    return;
  }
  if (IsBudgetExhausted(status)) ++counts.retries_denied;
  ++counts.failures;
}

}  // namespace

void RunLogicalCall(RetryStrategy strategy, const CallOptions& options, Backend& backend,
                    TenantBudget* budget, std::stop_token stop, CallCounts& counts) {
  if (strategy == RetryStrategy::kRetryHelper) {
    RunHelperCall(options, backend, *budget, stop, counts);
    return;
  }
  int max_attempts = options.max_attempts;
  if (strategy == RetryStrategy::kUnbudgeted && max_attempts <= 0) {
    max_attempts = kUnbudgetedDefaultAttempts;
  }
  ++counts.calls;
  if (strategy == RetryStrategy::kBudget) {
    budget->RecordRequest();
    ++counts.requests;
  }
  for (int attempt = 1;; ++attempt) {
    ++counts.attempts;
    if (backend.Call()) {
      ++counts.successes;
      if (strategy == RetryStrategy::kBudget) budget->RecordSuccess();
      return;
    }
    // The attempt failed: may we retry?
    if ((max_attempts > 0 && attempt >= max_attempts) ||
        stop.stop_requested()) {
      ++counts.failures;
      return;
    }
    switch (strategy) {
      case RetryStrategy::kBudget:
        if (!budget->TryAcquire(options.retry_cost)) {
          // A denied retry is a real outcome: the call fails now.
          ++counts.retries_denied;
          ++counts.failures;
          return;
        }
        break;
      case RetryStrategy::kUnbudgeted:
      case RetryStrategy::kRetryHelper:
        break;
    }
    ++counts.retries_allowed;
    counts.tokens_spent += options.retry_cost;  // unbudgeted: what its retries would cost
  }
}

}  // namespace retrybudget::fleet
