// The three retry strategies and three failure regimes of the amplification experiment
// (amplification_bench.cc), kept apart from the process plumbing so each is a few lines to read.
#ifndef RETRYBUDGET_BENCH_AMPLIFICATION_STRATEGIES_H_
#define RETRYBUDGET_BENCH_AMPLIFICATION_STRATEGIES_H_

#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "retrybudget/client.h"

namespace retrybudget::bench {

// Decides whether a failed attempt may be retried. Thread-safe: the call sites (threads) of one
// worker process share one gate.
class RetryGate {
 public:
  virtual ~RetryGate() = default;
  // Called after every attempt with its outcome.
  virtual void OnAttempt(bool succeeded) = 0;
  // Called once per logical call that succeeded (at whatever attempt).
  virtual void OnCallSucceeded() = 0;
  // A failed attempt may be retried (the per-call attempt cap is checked by the caller).
  virtual bool AllowRetry() = 0;
};

// Per-call caps and nothing else: every failed attempt is retried while attempts remain. No
// state shared between calls, call sites or processes.
class PerCallCapGate final : public RetryGate {
 public:
  void OnAttempt(bool) override {}
  void OnCallSucceeded() override {}
  bool AllowRetry() override { return true; }
};

// gRPC's retryThrottling, per process (gRPC keeps one per channel; here one per worker process,
// shared by its call sites): token_count starts at max_tokens; each failed attempt takes 1
// (floor 0), each success adds token_ratio (cap max_tokens); retries are allowed only while
// token_count > max_tokens / 2. Defaults max_tokens 100, token_ratio 0.1 as in gRPC's examples.
// When the backend goes down, each process keeps retrying until ~max_tokens / 2 failed attempts
// have drained it (about 37 retries with 4 attempts per call), so a fleet of N processes sends
// ~N times that burst: the throttle bounds a process, not the fleet.
class ProcessThrottleGate final : public RetryGate {
 public:
  explicit ProcessThrottleGate(double max_tokens = 100, double token_ratio = 0.1)
      : max_tokens_(max_tokens), token_ratio_(token_ratio), tokens_(max_tokens) {}
  void OnAttempt(bool succeeded) override;
  void OnCallSucceeded() override {}
  bool AllowRetry() override;

 private:
  const double max_tokens_;
  const double token_ratio_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
};

// This project's fleet-wide budget: one TryAcquire() per retry, one RecordSuccess() per
// successful logical call, on a real TenantBudget leased from the real server.
class FleetBudgetGate final : public RetryGate {
 public:
  explicit FleetBudgetGate(TenantBudget* budget) : budget_(budget) {}
  void OnAttempt(bool) override {}
  void OnCallSucceeded() override { budget_->RecordSuccess(); }
  bool AllowRetry() override { return budget_->TryAcquire(); }

 private:
  TenantBudget* const budget_;
};

// How the simulated backend fails over the run.
enum class Regime {
  kHealthy,      // 1% of attempts fail, the whole run
  kDegraded,     // 30% of attempts fail, the whole run
  kOutage,       // 1% until outage_start, then every attempt fails
};

absl::StatusOr<Regime> ParseRegime(const std::string& name);
const char* RegimeName(Regime regime);

// The probability that an attempt fails at `since_start` into the run.
double FailureProbability(Regime regime, absl::Duration since_start, absl::Duration outage_start);

struct CallResult {
  int attempts = 0;
  bool succeeded = false;
};

// One logical call: the first attempt, then retries while attempts fail, fewer than
// `max_attempts` were made and the gate allows. Each attempt fails with probability
// `failure_probability` (the simulated backend: no I/O). No backoff: the experiment counts
// attempts, and backoff only spreads them in time.
CallResult RunLogicalCall(RetryGate& gate, int max_attempts, double failure_probability,
                          std::mt19937_64& rng);

}  // namespace retrybudget::bench

#endif  // RETRYBUDGET_BENCH_AMPLIFICATION_STRATEGIES_H_
