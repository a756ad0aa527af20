#include "bench/amplification_strategies.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace retrybudget::bench {

void ProcessThrottleGate::OnAttempt(bool succeeded) {
  absl::MutexLock lock(&mu_);
  tokens_ = succeeded ? std::min(max_tokens_, tokens_ + token_ratio_) : std::max(0.0, tokens_ - 1);
}

bool ProcessThrottleGate::AllowRetry() {
  absl::MutexLock lock(&mu_);
  return tokens_ > max_tokens_ / 2;
}

absl::StatusOr<Regime> ParseRegime(const std::string& name) {
  if (name == "healthy") return Regime::kHealthy;
  if (name == "degraded") return Regime::kDegraded;
  if (name == "outage") return Regime::kOutage;
  return absl::InvalidArgumentError(
      absl::StrCat("regime '", name, "' is not one of healthy, degraded, outage"));
}

const char* RegimeName(Regime regime) {
  switch (regime) {
    case Regime::kHealthy:
      return "healthy";
    case Regime::kDegraded:
      return "degraded";
    case Regime::kOutage:
      return "outage";
  }
  return "unknown";
}

double FailureProbability(Regime regime, absl::Duration since_start,
                          absl::Duration outage_start) {
  switch (regime) {
    case Regime::kHealthy:
      return 0.01;
    case Regime::kDegraded:
      return 0.30;
    case Regime::kOutage:
      return since_start < outage_start ? 0.01 : 1.0;
  }
  return 0;
}

CallResult RunLogicalCall(RetryGate& gate, int max_attempts, double failure_probability,
                          std::mt19937_64& rng) {
  std::bernoulli_distribution fails(failure_probability);
  CallResult r;
  while (true) {
    ++r.attempts;
    const bool ok = !fails(rng);
    gate.OnAttempt(ok);
    if (ok) {
      r.succeeded = true;
      gate.OnCallSucceeded();
      return r;
    }
    if (r.attempts >= max_attempts || !gate.AllowRetry()) return r;
  }
}

}  // namespace retrybudget::bench
