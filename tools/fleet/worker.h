// One worker process of the fleet: T threads running logical calls against a simulated backend
// for a fixed duration, retrying through one BudgetClient, then a clean Shutdown() (the final
// Sync returns every unspent token) and the worker's own counts.
//
//   absl::StatusOr<WorkerCounts> counts = RunWorker(options);  // blocks ~options.duration
#ifndef RETRYBUDGET_TOOLS_FLEET_WORKER_H_
#define RETRYBUDGET_TOOLS_FLEET_WORKER_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/fleet/fleet_report.h"
#include "tools/fleet/worker_loop.h"

namespace retrybudget::fleet {

struct WorkerOptions {
  int index = 0;                // this worker's index in the fleet, 0-based
  std::string target = {};      // the budget server (or the fault proxy)
  std::string tenant = {};
  // How many tenants the fleet spreads over (FleetTenantName(tenant, tenants, i)); thread t of
  // this worker uses FleetTenantOfThread(index, threads, t, tenants).
  int tenants = 1;
  int threads = 2;
  absl::Duration duration = absl::Seconds(5);
  double failure_rate = 0.3;
  absl::Duration call_latency = absl::Milliseconds(1);
  uint64_t seed = 1;            // the fleet's seed; each thread derives its own
  RetryStrategy strategy = RetryStrategy::kBudget;
  CallOptions call = {};  // call.retry_cost: tokens per retry
  // Each thread starts call k at its start + k * call_interval (or at once when late): a paced
  // load whose calls do not depend on the budget's answers. Zero: back to back.
  absl::Duration call_interval = absl::ZeroDuration();
  // Client tuning passed through to ClientOptions (zero keeps the library default).
  absl::Duration refresh_period = absl::ZeroDuration();
  uint64_t lease_burst = 0;
  bool fallback_deny = false;  // ClientOptions::fallback = FallbackMode::kDeny
  // How often the FallbackMonitor polls the client's mode (budgeted strategies).
  absl::Duration monitor_period = absl::Milliseconds(5);
  // Width of one slice of the calls/retries timelines, widened by WorkerTimelineSlice().
  absl::Duration timeline_slice = absl::Milliseconds(100);
  // The origin of the timelines: the fleet's start the start signal carried (start_signal.h),
  // so that every worker's slices are the same instants; unset: when RunWorker starts calling.
  // Also the origin of `granted_again_at_seconds` and `run_seconds`.
  std::optional<std::chrono::steady_clock::time_point> timeline_origin = std::nullopt;
};

// The width of one slice of a worker's timelines for a run of `duration`: `base`, or wider so
// that the run has at most 2000 slices (the worker's line stays short). Every worker of a run
// uses the same, so the fleet's timelines add up slice by slice.
absl::Duration WorkerTimelineSlice(absl::Duration duration,
                                   absl::Duration base = absl::Milliseconds(100));

// Runs the load now and returns what this worker counted, one WorkerCounts per tenant its
// threads use, in increasing tenant_index (one with a single tenant); the client-wide counts
// (syncs_ok, syncs_failed) are in the first only. Creates its BudgetClient at the start
// (never earlier: no token is leased before the caller's start signal) unless the strategy uses
// no budget. Errors: the client could not be created or the tenant name is bad. A failed final
// Sync is not an error: it is reported in `shutdown_status`.
//
// The client is the library's own (CreateBudgetClientForTesting with its refresher thread, over
// a channel made exactly as BudgetClient::Create makes it) talking through a SyncObservingStub,
// so the worker knows the SafeShare its fallback bucket used; a FallbackMonitor watches the
// client's mode; each thread's budget is a MeasuredBudget (TryAcquire latency, retries in and
// after fallback).
absl::StatusOr<std::vector<WorkerCounts>> RunWorker(const WorkerOptions& options);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_WORKER_H_
