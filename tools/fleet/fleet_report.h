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
#include <vector>

#include "absl/strings/string_view.h"

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
  // The tenant these counts are for (FleetTenantName's index; 0 with one tenant). A worker
  // prints one line per tenant its threads use.
  int tenant_index = 0;
  uint64_t calls = 0;            // logical calls started
  uint64_t attempts = 0;         // backend calls: first attempts plus retries
  uint64_t successes = 0;        // logical calls that succeeded (RecordSuccess() was called)
  uint64_t failures = 0;         // logical calls that ended failed (denied, capped or stopped)
  uint64_t retries_allowed = 0;  // retries sent
  uint64_t retries_denied = 0;   // retries refused by TryAcquire(): each ended a call as failed
  // Requests (first attempts) recorded with RecordRequest(): one per logical call under a
  // budgeted strategy (0 for unbudgeted).
  uint64_t requests = 0;
  // Tokens the allowed retries took: each retry's cost (--retry-cost) summed, refunds deducted.
  // In shadow mode it includes the cost of retries that took no token (lib_shadow_denied).
  uint64_t tokens_spent = 0;
  double run_seconds = 0;        // from the start signal until the worker stopped calling

  uint64_t lib_successes = 0;
  uint64_t lib_retries_allowed = 0;
  uint64_t lib_retries_denied = 0;
  uint64_t lib_fallback_allowed = 0;  // of lib_retries_allowed, from the fallback bucket
  uint64_t lib_tokens_received = 0;
  uint64_t lib_tokens_returned = 0;
  int64_t lib_tokens_held = 0;    // after Shutdown(): should be 0
  // Of lib_successes, those whose credit the client's fallback buckets deposited locally
  // (success-funded fallback): the fallback spending beyond fallback_allowance they fund is
  // already in the bound's credit * successes.
  uint64_t lib_successes_credited_locally = 0;
  // TenantStats::requests and ::shadow_denied: requests recorded, and the retries a shadow
  // tenant let through that enforcement would have denied (would-be denials).
  uint64_t lib_requests = 0;
  uint64_t lib_shadow_denied = 0;
  std::string shutdown_status = {};  // "OK" or the final Sync's error

  // While the server was unreachable (FallbackMonitor, observing_stub.h), seen by the worker.
  uint64_t calls_in_fallback = 0;               // calls started while the client was in fallback
  uint64_t retries_allowed_in_fallback = 0;     // retries allowed while in fallback
  uint64_t retries_allowed_after_fallback = 0;  // retries allowed after leaving fallback
  uint64_t fallback_entries = 0;                // fallback episodes
  uint64_t lease_after_fallback = 0;            // 1 when a lease was seen after fallback
  double fallback_seconds = 0;                  // time in fallback
  // What this worker's local bucket may have handed out (FallbackMonitor): per episode, the
  // SafeShare's capacity (>= 1 when it refills) + its refill * the episode's seconds.
  double fallback_allowance = 0;
  double safe_share_capacity = 0;  // the SafeShare of the last episode (0: never in fallback)
  double safe_share_refill = 0;
  uint64_t syncs_ok = 0;           // Sync attempts of this worker's client that got a response
  uint64_t syncs_failed = 0;       // ... that failed (server down, hung, slow)
  double max_try_acquire_ms = 0;   // the longest TryAcquire() of any thread (sum: the max)
  // The longest time between two answers of the tenant's owner to this client (a tenant entry
  // without error: on the lease protocol), from its first answer to the end of the run, and
  // when (seconds from the worker's start) that gap ended: the client was granted again (the
  // end of the run when it never was). Sum: the max of each (the last client back).
  double ungranted_gap_max_seconds = 0;
  double granted_again_at_seconds = 0;

  // The run in slices of `timeline_slice_seconds` from the origin the start signal carried
  // (the fleet's start, start_signal.h; the same for every worker): calls started,
  // retries sent, retries denied and successes in each (sum: element-wise), counted by the
  // call's start. Lets the tool count what happened between a server kill and its restart, and
  // replay the run's demand and deposits through an ideal bucket (IdealAllowed()).
  double timeline_slice_seconds = 0;
  std::vector<uint64_t> calls_timeline = {};
  std::vector<uint64_t> retries_timeline = {};
  std::vector<uint64_t> denied_timeline = {};
  std::vector<uint64_t> successes_timeline = {};
  // The same slices, counted at the instant of the event rather than the call's start: requests
  // recorded (RecordRequest()) and tokens taken by allowed retries (the retry's cost, at its
  // TryAcquire; a refund deducted from the slice of its TryAcquire). What the windowed bound
  // (CheckWindowedBound) is checked on.
  std::vector<uint64_t> requests_timeline = {};
  std::vector<uint64_t> tokens_timeline = {};
  // When this client saw the tenant's mode change, in milliseconds from the origin: the first
  // response entry whose TenantGrant.mode differed from the mode before (a client starts in
  // enforce), alternately to shadow and back. Sum: the element-wise largest (the last client to
  // see each change).
  std::vector<uint64_t> mode_changes_ms = {};
};

// How the fleet's total of one WorkerCounts field combines the workers' values.
enum class Combine {
  kSum,        // added up
  kMax,        // the largest (the run's length, the slowest TryAcquire, the timeline's slice)
  kCount,      // `worker`: the total holds the number of workers
  kFirstError, // `shutdown_status`: "OK", or the first worker's error
  // A list: the element-wise largest (`mode_changes_ms`: when the last client saw each change).
  kMaxEach,
};

// Every field of WorkerCounts, defined once, in the order of the worker's JSON line: calls
// `v(name, combine, a.field, b.field)` for each, with `name` the field's JSON key. The sum
// (SumWorkers), the JSON writer and the JSON parser all walk it, so a field added here is
// summed, written and read, and one missing from a step cannot happen. `a` and `b` may be the
// same object (the writer and the parser visit one).
template <typename A, typename B, typename V>
void ForEachWorkerField(A& a, B& b, V&& v) {
  v("worker", Combine::kCount, a.worker, b.worker);
  v("tenant_index", Combine::kMax, a.tenant_index, b.tenant_index);
  v("calls", Combine::kSum, a.calls, b.calls);
  v("attempts", Combine::kSum, a.attempts, b.attempts);
  v("successes", Combine::kSum, a.successes, b.successes);
  v("failures", Combine::kSum, a.failures, b.failures);
  v("retries_allowed", Combine::kSum, a.retries_allowed, b.retries_allowed);
  v("retries_denied", Combine::kSum, a.retries_denied, b.retries_denied);
  v("requests", Combine::kSum, a.requests, b.requests);
  v("tokens_spent", Combine::kSum, a.tokens_spent, b.tokens_spent);
  v("run_seconds", Combine::kMax, a.run_seconds, b.run_seconds);
  v("lib_successes", Combine::kSum, a.lib_successes, b.lib_successes);
  v("lib_retries_allowed", Combine::kSum, a.lib_retries_allowed, b.lib_retries_allowed);
  v("lib_retries_denied", Combine::kSum, a.lib_retries_denied, b.lib_retries_denied);
  v("lib_fallback_allowed", Combine::kSum, a.lib_fallback_allowed, b.lib_fallback_allowed);
  v("lib_tokens_received", Combine::kSum, a.lib_tokens_received, b.lib_tokens_received);
  v("lib_tokens_returned", Combine::kSum, a.lib_tokens_returned, b.lib_tokens_returned);
  v("lib_tokens_held", Combine::kSum, a.lib_tokens_held, b.lib_tokens_held);
  v("lib_successes_credited_locally", Combine::kSum, a.lib_successes_credited_locally,
    b.lib_successes_credited_locally);
  v("lib_requests", Combine::kSum, a.lib_requests, b.lib_requests);
  v("lib_shadow_denied", Combine::kSum, a.lib_shadow_denied, b.lib_shadow_denied);
  v("shutdown_status", Combine::kFirstError, a.shutdown_status, b.shutdown_status);
  v("calls_in_fallback", Combine::kSum, a.calls_in_fallback, b.calls_in_fallback);
  v("retries_allowed_in_fallback", Combine::kSum, a.retries_allowed_in_fallback,
    b.retries_allowed_in_fallback);
  v("retries_allowed_after_fallback", Combine::kSum, a.retries_allowed_after_fallback,
    b.retries_allowed_after_fallback);
  v("fallback_entries", Combine::kSum, a.fallback_entries, b.fallback_entries);
  v("lease_after_fallback", Combine::kSum, a.lease_after_fallback, b.lease_after_fallback);
  v("fallback_seconds", Combine::kSum, a.fallback_seconds, b.fallback_seconds);
  v("fallback_allowance", Combine::kSum, a.fallback_allowance, b.fallback_allowance);
  v("safe_share_capacity", Combine::kSum, a.safe_share_capacity, b.safe_share_capacity);
  v("safe_share_refill", Combine::kSum, a.safe_share_refill, b.safe_share_refill);
  v("syncs_ok", Combine::kSum, a.syncs_ok, b.syncs_ok);
  v("syncs_failed", Combine::kSum, a.syncs_failed, b.syncs_failed);
  v("max_try_acquire_ms", Combine::kMax, a.max_try_acquire_ms, b.max_try_acquire_ms);
  v("ungranted_gap_max_seconds", Combine::kMax, a.ungranted_gap_max_seconds,
    b.ungranted_gap_max_seconds);
  v("granted_again_at_seconds", Combine::kMax, a.granted_again_at_seconds,
    b.granted_again_at_seconds);
  v("timeline_slice_seconds", Combine::kMax, a.timeline_slice_seconds, b.timeline_slice_seconds);
  v("calls_timeline", Combine::kSum, a.calls_timeline, b.calls_timeline);
  v("retries_timeline", Combine::kSum, a.retries_timeline, b.retries_timeline);
  v("denied_timeline", Combine::kSum, a.denied_timeline, b.denied_timeline);
  v("successes_timeline", Combine::kSum, a.successes_timeline, b.successes_timeline);
  v("requests_timeline", Combine::kSum, a.requests_timeline, b.requests_timeline);
  v("tokens_timeline", Combine::kSum, a.tokens_timeline, b.tokens_timeline);
  v("mode_changes_ms", Combine::kMaxEach, a.mode_changes_ms, b.mode_changes_ms);
}

// The field-by-field sum of `workers` (worker = count of workers; shutdown_status = "OK" when
// every worker's is "OK", else the first error).
WorkerCounts SumWorkers(const std::vector<WorkerCounts>& workers);

// One JSON object on one line (no newline), and back. The parser accepts exactly what the
// writer produces; INVALID_ARGUMENT naming the field for anything else.
std::string WorkerCountsToJson(const WorkerCounts& counts);
absl::StatusOr<WorkerCounts> WorkerCountsFromJson(absl::string_view line);

// The one JSON line of a worker of another language (the worker protocol of
// tools/fleet/README.md, "The worker protocol") as the WorkerCounts of worker `worker` on tenant
// `tenant_index`: calls, attempts, successes, failures, retries_allowed, retries_denied, the
// lib_* counts it has, fallback_allowance, lease_after_fallback (a boolean: 1 or 0),
// shutdown_status, max_try_acquire_ms and its timelines (timeline_slice_seconds, calls_timeline,
// retries_timeline, denied_timeline, successes_timeline). What the protocol does not report
// (time in fallback and its episodes, Syncs, the grant gap) stays 0. Other fields are ignored.
// INVALID_ARGUMENT naming the field for a missing or malformed one, for a timeline slice
// other than `slice_seconds` (the fleet's timelines add up slice by slice) and, when
// `origin_micros` is given, for a `timeline_origin_us` other than it: the origin of the start
// signal the tool sent (start_signal.h), so every worker's slices are the same instants.
absl::StatusOr<WorkerCounts> ForeignWorkerCountsFromJson(
    absl::string_view line, int worker, int tenant_index, double slice_seconds,
    std::optional<int64_t> origin_micros = std::nullopt);

// The tenant's policy as the run used it. `initial_tokens` is the bucket level the tool read at
// the start of the run (not the policy field of that name).
struct PolicyView {
  double capacity = 0;
  double refill_per_second = 0;
  double success_credit = 0;
  double initial_tokens = 0;
  int64_t lease_ttl_ms = 0;
  // "enforce" or "shadow" (BudgetPolicy.mode).
  std::string mode = "enforce";
  // The windowed ratio shape (BudgetPolicy.retry_ratio, min_retries_per_second, ttl_ms): its
  // bound is CheckWindowedBound's, not BudgetBound's.
  bool windowed = false;
  double retry_ratio = 0;
  double min_retries_per_second = 0;
  int64_t ttl_ms = 0;
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
  uint64_t delayed_responses = 0;    // responses held back by the response delay
};

// The server faults the tool injected itself (--spawn-server with --kill-server-after or
// --stop-server-after). Times in seconds from the run's start (the level read).
struct ChaosView {
  int port = 0;                     // the spawned server's port, the same across restarts
  bool persistent = false;          // it had --data_dir (a restart restores its state)
  std::optional<double> kill_at;    // SIGKILL sent
  std::optional<double> restart_at; // the restarted server serving again (port file written)
  double downtime_seconds = 0;      // restart_at - kill_at
  std::optional<double> stop_at;    // SIGSTOP sent
  std::optional<double> resume_at;  // SIGCONT sent
  double hung_seconds = 0;          // resume_at - stop_at
  std::string restart_error = {};   // empty, or why the restart failed
  // From the workers' timelines: calls and retries in the slices wholly inside the outage
  // [kill_at, restart_at] (or [stop_at, resume_at]), and retries after it.
  uint64_t calls_during_outage = 0;
  uint64_t retries_during_outage = 0;
  uint64_t retries_after_outage = 0;
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
  // Issue 36's totals: would-be denials of a shadow tenant, requests reported, retries allowed
  // with tokens (`retries` is in tokens).
  uint64_t shadow_denied = 0;
  uint64_t requests = 0;
  uint64_t retries_allowed = 0;
  uint32_t active_instances_end = 0;
  // The level sampled during the run (--sample-level): a high mean while retries are denied
  // means tokens sit in the bucket instead of being leased.
  uint64_t level_samples = 0;
  double level_mean = 0;
  double level_max = 0;
};

// A server fault of a cluster run and how the tenants it owned came back (cluster_chaos.h,
// owner_watch.h). Seconds from the run's start.
struct OwnerLoss {
  double at = 0;                 // the kill -9, SIGSTOP or SIGTERM of the server
  int server = 0;
  std::string what = {};         // as in `events`
  int tenants = 0;               // tenants the server owned then
  // The longest of those tenants' waits for an owner other than `server` (null: one never got
  // one while watched).
  std::optional<double> new_owner_after_seconds = {};
  // The longest, over those tenants, from its new owner to its last client granted again
  // (granted_again_at_seconds); null without a new owner or without clients.
  std::optional<double> leases_back_after_owner_seconds = {};
};

// A SIGTERM of a cluster run's server (cluster_chaos.h): sent `at` (seconds from the run's
// start), the server gone `seconds` later; `exit` as DescribeWaitStatus() says it, or why the
// stop failed.
struct ServerStop {
  double at = 0;
  int server = 0;
  double seconds = 0;
  std::string exit = {};
};

// A start of a cluster run's server (after kill -9 +D, term +D, restart:S, rolling-restart):
// begun `at`, its health (grpc.health.v1) answered SERVING `serving_after` seconds later, as
// polled every 50 ms (null: not while watched, or the start failed: `error`).
struct ServerRestart {
  double at = 0;
  int server = 0;
  std::optional<double> serving_after = {};
  std::string error = {};
};

// The cluster of a --cluster run and what its chaos actions did (cluster_chaos.h).
struct ClusterView {
  int servers = 0;
  int etcd_nodes = 0;
  std::string target = {};               // the workers' multi-address target
  std::vector<std::string> events = {};  // "<seconds> <what>", in order
  std::vector<OwnerLoss> owner_losses = {};
  // The longest any tenant had no owner key in etcd, as polled (owner_watch.h).
  double max_seconds_without_owner_key = 0;
  std::vector<ServerStop> stops = {};
  std::vector<ServerRestart> restarts = {};
};

// One tenant of a run with --tenants > 1.
struct TenantRun {
  std::string tenant = {};
  PolicyView policy = {};   // initial_tokens: its level read at the start
  WorkerCounts totals = {}; // the workers' lines for this tenant, summed
};

// The workers of one language in a run with workers of other languages (--foreign-workers):
// "cpp" (the tool's own) or the kind's language, its workers' lines summed.
struct LanguageRun {
  std::string language = {};
  int workers = 0;
  WorkerCounts totals = {};
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
  std::optional<ChaosView> chaos = {};
  std::optional<ClusterView> cluster = {};
  double fault_delay_ms = 0;  // --fault-delay (0: none)
  // The cost of every retry (--retry-cost): the would-be denials of a shadow run cost this much
  // each in `tokens_spent` without taking a token.
  uint32_t retry_cost = 1;
  // D of CheckWindowedBound (--report-delay-slack).
  double report_delay_seconds = 0;
  // Each mode switch played during the run (--mode-switch): when budgetctl was started and had
  // returned (seconds from the run's start), the mode asked, and budgetctl's exit ("OK" or its
  // error). Compared with totals.mode_changes_ms: when the last client saw each change.
  struct ModeSwitch {
    double started_at = 0;
    double done_at = 0;
    std::string mode = {};
    std::string result = {};
  };
  std::vector<ModeSwitch> mode_switches = {};
  // With --tenants > 1: each tenant (then `tenant` and `policy` are tenant 0's, and `totals`
  // the sum over every tenant). Empty with one tenant.
  std::vector<TenantRun> tenants = {};
  // With --foreign-workers: each language's part (`totals` holds every language's lines; the
  // tenants' totals too). Empty without.
  std::vector<LanguageRun> languages = {};
};

// The name of tenant `index` of `count`: `base` itself for one tenant, else "<base>-<index>".
std::string FleetTenantName(absl::string_view base, int count, int index);

// The tenant index thread `thread` of worker `worker` uses: (worker * threads + thread) % count,
// so consecutive threads spread over every tenant.
int FleetTenantOfThread(int worker, int threads, int thread, int count);

// The invariant's lease part: initial + refill * elapsed + credit * successes.
double BudgetBound(const PolicyView& policy, double elapsed_seconds, uint64_t successes);

// The windowed bound (a windowed policy), checked on the fleet's timelines: for every window of
// `ttl` ending at the end of a timeline slice in which tokens were spent,
//
//     tokens spent in the window  <=  min_retries_per_second * ttl
//                                     + retry_ratio * requests made in (end - ttl - D, end]
//                                     + fallback_allowance
//
// D (`report_delay_seconds`) is the report delay slack: a request deposits at the server when
// the server RECEIVES the Sync that reports it, up to a refresh period (more while the server is
// unreachable) after the request was made, so the requests that funded a window were made up to
// D before it. The window holds the floor(ttl / slice) slices ending at that slice (at most
// ttl); the requests are counted by whole slices from the one holding end - ttl - D (generous
// by at most one slice of requests). The fallback allowance is the whole run's (generous: it is
// not placed in time). Not checked for a shadow tenant (its allowed retries include would-be
// denials that took no token: `tokens_timeline` cannot tell them apart).
struct WindowedCheck {
  bool checked = false;
  std::string not_checked_because = {};
  double ttl_seconds = 0;
  double report_delay_seconds = 0;
  double slice_seconds = 0;
  double floor_tokens = 0;  // min_retries_per_second * ttl
  int64_t windows = 0;      // windows checked
  // The window with the highest spent / bound: its end (seconds from the run's start), what was
  // spent in it, the requests counted and its bound.
  double worst_end_seconds = 0;
  uint64_t worst_spent = 0;
  uint64_t worst_requests = 0;
  double worst_bound = 0;
  double max_utilisation = 0;
  int64_t windows_over = 0;  // windows whose spending exceeded their bound
  bool within = true;
};

// The windowed bound above over `totals`' requests_timeline and tokens_timeline.
WindowedCheck CheckWindowedBound(const PolicyView& policy, const WorkerCounts& totals,
                                 double report_delay_seconds, double fallback_allowance);

struct Verdict {
  // The tokens judged: the workers' tokens_spent, minus (shadow) the would-be denials' cost
  // (retry_cost * lib_shadow_denied), which took no token.
  double spent = 0;
  // A windowed policy: its bound. Then `within_budget` is windowed.within, `bound` and
  // `utilisation` are its fullest window's (worst_bound, max_utilisation) and `lease_bound` that
  // bound less the fallback allowance; the ideal bucket is the one the policy resolves to
  // (capacity = floor * ttl, refill = floor), for reference.
  WindowedCheck windowed = {};
  double lease_bound = 0;         // BudgetBound()
  double fallback_allowance = 0;  // totals.fallback_allowance: sum over workers
  // lease_bound + fallback_allowance: DESIGN.md's invariant, "plus, while the server is
  // unreachable, only the fallback allowance".
  double bound = 0;
  bool within_budget = false;  // spent <= bound (classic), windowed.within (windowed)
  // spent / bound: 1 means every token the budget could have produced was spent.
  // +inf when the bound is 0 and a retry was spent (printed as null).
  double utilisation = 0;
  // What one ideal central bucket with the same policy would have allowed the same demand
  // (IdealAllowed(), in tokens), and spent / that: the physical limit is 1 (no network, no
  // leases, no fallback split), so this is what a distributed design loses against it.
  double ideal_allowed = 0;
  double utilisation_vs_ideal = 0;
  // With several tenants: each tenant's own verdict, in the order of FleetRun::tenants. The
  // fleet's bound is then their sum, and it is within budget only when every tenant is.
  std::vector<Verdict> tenants = {};
};

// The most retries one ideal central bucket could have allowed the run's own demand: `initial`
// tokens at the start, capped at `capacity`; per timeline slice (in order) it allows
// min(retries sent + retries denied in the slice, whole tokens of level + the slice's refill +
// `success_credit` per success counted in it), and keeps what is left, capped at `capacity`.
// The timeline says how much happened in a slice, not in which order, so the slice is replayed
// in the order that allows most: each deposit arrives just before a demand that takes it, and
// only the surplus meets the cap. (Depositing the whole slice first and capping it, then taking,
// loses every deposit beyond the capacity within one slice: with a small capacity and a busy
// tenant that ideal allowed less than a real central bucket, and the fleet read above 1.) No
// network and no split: no distributed design can allow more of the same demand, except by the
// tokens clients hold in leases that the server does not count against the capacity
// (docs/DESIGN.md), a few per instance. Every worker's timeline counts from the run's start
// (start_signal.h), so slice i is [i, i + 1) slices of `elapsed_seconds`: a last slice that
// ends after the run refills only for its part inside the run, and the refill of
// `elapsed_seconds` after the timeline (no demand there) is given at the start.
//
// With every retry costing `retry_cost` tokens, each slice's demand is that many tokens per retry
// and a retry is taken whole or not at all; the result is in tokens.
double IdealAllowed(const PolicyView& policy, double elapsed_seconds,
                    const WorkerCounts& totals, uint32_t retry_cost = 1);

// Judges `run` by the workers' own counts (totals.retries_allowed and totals.successes), per
// tenant when there are several.
Verdict Judge(const FleetRun& run);

// kExitWithinBudget or kExitBudgetExceeded.
int ExitCodeFor(const Verdict& verdict);

// The tool's one-line JSON report (no newline). Schema in tools/fleet/README.md.
std::string FleetReportToJson(const FleetRun& run, const Verdict& verdict);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FLEET_REPORT_H_
