#include "tools/fleet/worker_loop.h"

#include <stop_token>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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
  }
  return "unknown";
}

absl::StatusOr<RetryStrategy> ParseRetryStrategy(absl::string_view name) {
  for (RetryStrategy s : {RetryStrategy::kBudget, RetryStrategy::kUnbudgeted}) {
    if (name == RetryStrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--strategy: unknown value '", name, "' (expected budget or unbudgeted)"));
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
  return *this;
}

void RunLogicalCall(RetryStrategy strategy, const CallOptions& options, Backend& backend,
                    TenantBudget* budget, const std::atomic<bool>& stop, CallCounts& counts) {
  int max_attempts = options.max_attempts;
  if (strategy == RetryStrategy::kUnbudgeted && max_attempts <= 0) {
    max_attempts = kUnbudgetedDefaultAttempts;
  }
  ++counts.calls;
  for (int attempt = 1;; ++attempt) {
    ++counts.attempts;
    if (backend.Call()) {
      ++counts.successes;
      if (strategy == RetryStrategy::kBudget) budget->RecordSuccess();
      return;
    }
    // The attempt failed: may we retry?
    if ((max_attempts > 0 && attempt >= max_attempts) ||
        stop.load(std::memory_order_relaxed)) {
      ++counts.failures;
      return;
    }
    switch (strategy) {
      case RetryStrategy::kBudget:
        if (!budget->TryAcquire()) {
          // A denied retry is a real outcome: the call fails now.
          ++counts.retries_denied;
          ++counts.failures;
          return;
        }
        break;
      case RetryStrategy::kUnbudgeted:
        break;
    }
    ++counts.retries_allowed;
  }
}

}  // namespace retrybudget::fleet
