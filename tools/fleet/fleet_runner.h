// The parent side of retry-budget-fleet: configures the tenant's budget, starts the fault proxy
// when asked, starts the worker processes, times the run from the level read until every worker
// has exited, and gathers the workers' own counts into a FleetRun (judged by fleet_report.h).
//
//   absl::StatusOr<FleetRun> run = RunFleet(options);
//   if (!run.ok()) return kExitRunFailed;
//   Verdict verdict = Judge(*run);
#ifndef RETRYBUDGET_TOOLS_FLEET_FLEET_RUNNER_H_
#define RETRYBUDGET_TOOLS_FLEET_FLEET_RUNNER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/time/time.h"
#include "tools/fleet/chaos_schedule.h"
#include "tools/fleet/fleet_report.h"
#include "tools/fleet/foreign_worker.h"
#include "tools/fleet/mode_switcher.h"
#include "tools/fleet/worker_loop.h"

namespace retrybudget::fleet {

struct FleetOptions {
  std::string server = "127.0.0.1:50051";
  std::string tenant = "fleet";
  // Tenants the fleet spreads over (FleetTenantName): each prepared, judged and reported on its
  // own. 1: `tenant` itself, and the report is the single-tenant one.
  int tenants = 1;
  int workers = 8;
  int threads = 2;
  double duration_seconds = 5;
  double failure_rate = 0.3;
  absl::Duration call_latency = absl::Milliseconds(1);
  uint64_t seed = 1;
  RetryStrategy strategy = RetryStrategy::kBudget;
  CallOptions call = {};
  // Tokens each retry costs (TryAcquire(cost)), [1, 1000000].
  uint32_t retry_cost = 1;
  // Each worker thread starts a call every `call_interval` (a paced, open-loop load: the same
  // calls whatever the budget decides, e.g. to compare a shadow run with an enforced one); zero:
  // the next call starts when the last one ended.
  absl::Duration call_interval = absl::ZeroDuration();
  // D of the windowed bound (CheckWindowedBound): how long after a request was made the server
  // may receive its report. Zero: 2 refresh periods + 1 s, plus the outage of a
  // --kill-server-after/--stop-server-after.
  absl::Duration report_delay_slack = absl::ZeroDuration();

  // Mode switches played during the run with the real budgetctl (`budgetctl` binary):
  // `budgetctl --server=<the servers> mode <tenant> <mode>` at `at_seconds` from the run's start,
  // for every tenant of the run.
  std::vector<ModeSwitchStep> mode_switches = {};
  std::string budgetctl = {};

  // The tenant's policy. When any is set the tool PutPolicy()s the tenant with the set fields
  // (the others take the proto defaults); when none is set it keeps the server's policy.
  std::optional<double> capacity = {};
  std::optional<double> refill_per_second = {};
  std::optional<double> success_credit = {};
  std::optional<double> initial_tokens = {};
  std::optional<int64_t> lease_ttl_ms = {};
  // "enforce" or "shadow" (BudgetPolicy.mode): a policy field like those above.
  std::optional<std::string> mode = {};
  // The windowed ratio shape (BudgetPolicy.retry_ratio, min_retries_per_second, ttl_ms): policy
  // fields like those above; with any of them the policy is windowed (then capacity, refill,
  // credit and initial must be unset: the server refuses both shapes at once).
  std::optional<double> retry_ratio = {};
  std::optional<double> min_retries_per_second = {};
  std::optional<int64_t> ttl_ms = {};
  // Delete the tenant's budget first, so the run starts from a fresh bucket.
  bool reset_budget = false;

  // Fault injection (a proxy between workers and server is started when any is > 0).
  double fault_drop_response = 0;
  double fault_duplicate_request = 0;
  double fault_replay_old = 0;
  absl::Duration fault_delay = absl::ZeroDuration();  // every Sync response held this long

  // Chaos: the tool starts and supervises the server itself (server_supervisor.h). `server` is
  // then ignored. The data directory is a temporary one the tool owns (and removes) unless
  // `server_data_dir` is given (kept).
  std::string spawn_server = {};
  std::string server_data_dir = {};
  std::vector<std::string> server_args = {};  // appended to the server's command line
  ChaosPlan chaos = {};                       // needs spawn_server

  // Cluster: with `cluster` > 0 the tool starts a cluster under test (tests/support/
  // test_launcher.h) instead: `etcd_nodes` etcd members and `cluster` servers of the
  // `spawn_server` binary in cluster mode, and the workers use its multi-address target.
  // `cluster_chaos` (cluster_chaos.h) is played against it.
  int cluster = 0;
  int etcd_nodes = 3;
  std::string etcd_binary = "/usr/bin/etcd";
  int cluster_shards = 0;                                // 0: the server's default
  absl::Duration cluster_lease_ttl = absl::ZeroDuration();  // 0: the server's default
  std::string cluster_chaos = {};

  // Client tuning passed to every worker (zero: library default).
  absl::Duration refresh_period = absl::ZeroDuration();
  uint64_t lease_burst = 0;
  // How often each worker polls its client's mode (FallbackMonitor).
  absl::Duration monitor_period = absl::Milliseconds(5);

  // How often to sample the bucket level during the run (diagnostic; zero: never).
  absl::Duration sample_level = absl::Milliseconds(100);
  // How long the admin calls before the run wait for the server (it may still be starting).
  absl::Duration connect_timeout = absl::Seconds(10);
  // How long past `duration_seconds` a worker may take to report and exit before the run fails.
  absl::Duration worker_grace = absl::Seconds(30);
  // The workers' clients deny retries while the server is unreachable (FallbackMode::kDeny).
  bool fallback_deny = false;
  // When not empty: every worker's JSON line is also written to this file, one a line.
  std::string worker_lines = {};
  // The binary started for each worker (with --worker).
  std::string worker_binary = "/proc/self/exe";
  // Workers of other languages beside the `workers` C++ ones (foreign_worker.h), each with
  // `threads` loops, on the same tenants, judged in the same bound.
  std::vector<ForeignWorkerKind> foreign_workers = {};
};

// Parses --mode-switch: MODE@SECONDS,... (MODE enforce or shadow, SECONDS ascending).
// INVALID_ARGUMENT naming --mode-switch and the bad part.
absl::StatusOr<std::vector<ModeSwitchStep>> ParseModeSwitches(
    absl::string_view spec);

// INVALID_ARGUMENT naming the option and value when `options` cannot run.
absl::Status ValidateFleetOptions(const FleetOptions& options);

// Runs the whole fleet and returns what it measured. Blocks for about `duration_seconds`.
// Errors (each naming what failed): the server unreachable or refusing the policy, the proxy not
// starting, a worker failing to start, crashing, hanging or printing no valid counts. Worker
// processes are killed on every error path.
absl::StatusOr<FleetRun> RunFleet(const FleetOptions& options);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FLEET_RUNNER_H_
