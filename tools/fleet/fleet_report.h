// What a fleet run measured and the verdict on it: the budget bound of DESIGN.md ("The
// invariant"), whether the fleet's own retry count stayed under it, and the JSON lines the tool
// prints (one per worker on the worker's stdout, one for the whole run on the tool's stdout).
// No gRPC and no processes here, so the verdict is unit-tested directly.
//
//   FleetRun run = ...;                        // filled from the workers' lines
//   Verdict verdict = Judge(run);
//   std::cout << FleetReportToJson(run, verdict) << "\n";
//   return ExitCodeFor(verdict);
#ifndef RETRYBUDGET_TOOLS_FLEET_FLEET_REPORT_H_
#define RETRYBUDGET_TOOLS_FLEET_FLEET_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace retrybudget::fleet {

// Exit codes of retry-budget-fleet (also listed in its --help).
inline constexpr int kExitWithinBudget = 0;    // the run finished and stayed within the bound
inline constexpr int kExitBudgetExceeded = 1;  // the run finished and the fleet overspent
inline constexpr int kExitUsage = 2;           // bad command line
inline constexpr int kExitRunFailed = 3;       // no verdict: server, proxy or a worker failed

// What one worker process counted. The first block is counted by the worker's own code (the
// harness does not trust the library it is testing); the `lib_` block is the client library's
// TenantStats after Shutdown(), reported for cross-checking and diagnosis.
struct WorkerCounts {
  int worker = 0;                // index of the worker, 0-based
  uint64_t calls = 0;            // logical calls started
  uint64_t attempts = 0;         // backend calls: first attempts plus retries
  uint64_t successes = 0;        // logical calls that succeeded (RecordSuccess() was called)
  uint64_t failures = 0;         // logical calls that ended failed (denied, capped or stopped)
  uint64_t retries_allowed = 0;  // retries sent
  uint64_t retries_denied = 0;   // retries refused by TryAcquire(): each ended a call as failed
  double run_seconds = 0;        // from the start signal until the worker stopped calling

  uint64_t lib_successes = 0;
  uint64_t lib_retries_allowed = 0;
  uint64_t lib_retries_denied = 0;
  uint64_t lib_fallback_allowed = 0;  // of lib_retries_allowed, from the fallback bucket
  uint64_t lib_tokens_received = 0;
  uint64_t lib_tokens_returned = 0;
  int64_t lib_tokens_held = 0;    // after Shutdown(): should be 0
  std::string shutdown_status = {};  // "OK" or the final Sync's error
};

// The field-by-field sum of `workers` (worker = count of workers; shutdown_status = "OK" when
// every worker's is "OK", else the first error).
WorkerCounts SumWorkers(const std::vector<WorkerCounts>& workers);

// One JSON object on one line (no newline), and back. The parser accepts exactly what the
// writer produces; INVALID_ARGUMENT naming the field for anything else.
std::string WorkerCountsToJson(const WorkerCounts& counts);
absl::StatusOr<WorkerCounts> WorkerCountsFromJson(absl::string_view line);

// The tenant's policy as the run used it. `initial_tokens` is the bucket level the tool read at
// the start of the run (not the policy field of that name).
struct PolicyView {
  double capacity = 0;
  double refill_per_second = 0;
  double success_credit = 0;
  double initial_tokens = 0;
  int64_t lease_ttl_ms = 0;
};

// Faults the injecting proxy applied (see fault_proxy.h).
struct FaultCounters {
  uint64_t proxied_requests = 0;     // Sync requests received from workers
  uint64_t dropped_responses = 0;    // applied by the server, answered UNAVAILABLE
  uint64_t duplicated_requests = 0;  // sent to the server twice
  uint64_t replayed_requests = 0;    // an older request of the instance re-sent after newer ones
  uint64_t replays_stale = 0;        // of those, answered `stale` by the server
  uint64_t replay_granted_tokens = 0;  // tokens the server granted to replays (lost, must be 0)
  uint64_t upstream_errors = 0;      // forwarded requests that failed at the server
};

// The budget as the server saw it over the run (GetBudget at start and end). Diagnostic only:
// the verdict never uses it.
struct ServerView {
  double tokens_start = 0;
  double tokens_end = 0;
  uint64_t granted = 0;    // deltas of the BudgetStatus totals over the run
  uint64_t returned = 0;
  uint64_t reclaimed = 0;
  uint64_t retries = 0;
  uint64_t retries_denied = 0;
  uint64_t successes = 0;
  uint32_t active_instances_end = 0;
  // The level sampled during the run (--sample-level): a high mean while retries are denied
  // means tokens sit in the bucket instead of being leased.
  uint64_t level_samples = 0;
  double level_mean = 0;
  double level_max = 0;
};

struct FleetRun {
  std::string tenant = {};
  std::string strategy = {};
  int workers = 0;
  int threads = 0;
  double failure_rate = 0;
  double duration_seconds = 0;   // asked for, per worker
  double call_latency_ms = 0;
  PolicyView policy = {};
  // Steady-clock seconds from the level read until every worker had exited.
  double elapsed_seconds = 0;
  WorkerCounts totals = {};  // SumWorkers() of the workers' lines
  std::optional<FaultCounters> faults = {};
  std::optional<ServerView> server = {};
};

// The invariant's right-hand side: initial + refill * elapsed + credit * successes.
double BudgetBound(const PolicyView& policy, double elapsed_seconds, uint64_t successes);

struct Verdict {
  double bound = 0;
  bool within_budget = false;  // retries_allowed <= bound
  // retries_allowed / bound: 1 means every token the budget could have produced was spent.
  // +inf when the bound is 0 and a retry was spent (printed as null).
  double utilisation = 0;
};

// Judges `run` by the workers' own counts (totals.retries_allowed and totals.successes).
Verdict Judge(const FleetRun& run);

// kExitWithinBudget or kExitBudgetExceeded.
int ExitCodeFor(const Verdict& verdict);

// The tool's one-line JSON report (no newline). Schema in tools/fleet/README.md.
std::string FleetReportToJson(const FleetRun& run, const Verdict& verdict);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FLEET_REPORT_H_
