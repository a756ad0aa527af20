// The load one worker thread generates: logical calls to a simulated backend, retried according
// to a RetryStrategy. Consumes only the TenantBudget interface (client.h), never the client
// implementation, so it is unit-tested with a fake budget and a fake backend.
//
//   SimulatedBackend backend({.failure_rate = 0.3, .latency = absl::Milliseconds(1), .seed = 7});
//   CallCounts counts;
//   while (!stop) RunLogicalCall(RetryStrategy::kBudget, {}, backend, budget, stop, counts);
#ifndef RETRYBUDGET_TOOLS_FLEET_WORKER_LOOP_H_
#define RETRYBUDGET_TOOLS_FLEET_WORKER_LOOP_H_

#include <cstdint>
#include <random>
#include <stop_token>

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"

namespace retrybudget::fleet {

// How a worker decides whether to retry a failed attempt.
enum class RetryStrategy {
  // Retry while attempts fail and TenantBudget::TryAcquire() allows; a denied retry ends the
  // logical call as failed. The strategy under test.
  kBudget,
  // No budget: retry up to `max_attempts` attempts per call (4 when 0), the per-call cap that
  // DESIGN.md says multiplies load. A baseline, and the proof that the harness catches a fleet
  // that overspends.
  kUnbudgeted,
  // Each logical call runs through the library's retry helper, retrybudget::Retry(): the budget
  // decides every retry (TryAcquire() per retry, a denial ends the call with an error that
  // IsBudgetExhausted() recognises), with full-jitter backoff between attempts and at most
  // `max_attempts` attempts (0: no cap). Counted exactly as kBudget counts.
  kRetryHelper,
};

// "budget" / "unbudgeted" / "retry-helper".
absl::string_view RetryStrategyName(RetryStrategy strategy);
// INVALID_ARGUMENT naming the value and the accepted names.
absl::StatusOr<RetryStrategy> ParseRetryStrategy(absl::string_view name);

// The dependency a worker calls. One per thread; need not be thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;
  // One attempt; true on success.
  virtual bool Call() = 0;
};

struct SimulatedBackendOptions {
  double failure_rate = 0;  // probability that an attempt fails, [0, 1]
  absl::Duration latency = absl::Milliseconds(1);  // each attempt takes this long
  uint64_t seed = 1;
  Clock* clock = nullptr;  // Clock::Real() if null. Not owned.
};

// Fails each attempt independently with probability `failure_rate`, after sleeping `latency`
// on the clock. Thread-compatible (one per thread).
class SimulatedBackend : public Backend {
 public:
  explicit SimulatedBackend(SimulatedBackendOptions options);
  bool Call() override;

 private:
  const SimulatedBackendOptions options_;
  Clock* const clock_;
  std::mt19937_64 rng_;
  std::bernoulli_distribution fails_;
};

// What a worker thread counted itself. Plain counters: one per thread, summed after join.
struct CallCounts {
  uint64_t calls = 0;
  uint64_t attempts = 0;
  uint64_t successes = 0;
  uint64_t failures = 0;
  uint64_t retries_allowed = 0;
  uint64_t retries_denied = 0;
  uint64_t requests = 0;      // RecordRequest() calls: one per logical call with a budget
  uint64_t tokens_spent = 0;  // the cost of every retry allowed (refunds deducted)
  CallCounts& operator+=(const CallCounts& other);
};

struct CallOptions {
  // Most attempts per logical call; 0 means no per-call cap (kBudget, kRetryHelper) or 4
  // (kUnbudgeted).
  int max_attempts = 0;
  // kRetryHelper only: the full-jitter backoff of RetryPolicy (before retry k, uniform in
  // [0, min(backoff_max, backoff_initial * 2^(k-1)))). Small by default: attempts take ~1 ms.
  absl::Duration backoff_initial = absl::Milliseconds(1);
  absl::Duration backoff_max = absl::Milliseconds(10);
  // Tokens every retry costs: TryAcquire(retry_cost) (kBudget) or the retry helper's cost
  // (kRetryHelper). [1, 1000000].
  uint32_t retry_cost = 1;
};

// Runs one logical call: the first attempt, then retries as `strategy` allows, and updates
// `counts`. Records the request (budget.RecordRequest(), once, before the first attempt) and on
// success calls budget.RecordSuccess() (kBudget; kRetryHelper: the helper does both). Once `stop` is
// requested no new retry is started (the call ends failed, counted neither allowed nor denied;
// kRetryHelper refunds a token it took for a retry it then did not send). `budget` may be null
// for kUnbudgeted.
//
// Counting, the same for every strategy: `attempts` counts backend calls; `retries_allowed`
// counts attempts after the first (each one a retry the strategy allowed and sent);
// `retries_denied` counts calls ended by a budget denial; `tokens_spent` adds `retry_cost` per
// retry allowed; `requests` counts the calls whose request was recorded (every call but
// kUnbudgeted's).
void RunLogicalCall(RetryStrategy strategy, const CallOptions& options, Backend& backend,
                    TenantBudget* budget, std::stop_token stop, CallCounts& counts);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_WORKER_LOOP_H_
