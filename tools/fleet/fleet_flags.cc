#include "tools/fleet/fleet_flags.h"

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "budget server, host:port");
ABSL_FLAG(int32_t, workers, 8, "worker processes");
ABSL_FLAG(int32_t, threads, 2, "threads per worker");
ABSL_FLAG(double, duration, 5, "seconds each worker calls the backend");
ABSL_FLAG(double, failure_rate, 0.3, "probability that a backend attempt fails, [0, 1]");
ABSL_FLAG(std::string, tenant, "fleet", "the budget's tenant");
ABSL_FLAG(int32_t, tenants, 1, "tenants the fleet spreads over: <tenant>-0 .. <tenant>-(N-1)");
ABSL_FLAG(double, capacity, 100, "policy: bucket capacity, tokens");
ABSL_FLAG(double, refill, 1, "policy: refill, tokens per second");
ABSL_FLAG(double, credit, 0.1, "policy: success credit, tokens per success");
ABSL_FLAG(double, initial, 100, "policy: initial tokens of a new bucket");
ABSL_FLAG(int64_t, lease_ttl_ms, 5000, "policy: lease TTL, milliseconds");
ABSL_FLAG(std::string, mode, "enforce", "policy: enforce | shadow");
ABSL_FLAG(double, retry_ratio, 0.2, "windowed policy: tokens deposited per request");
ABSL_FLAG(double, min_retries_per_second, 10, "windowed policy: the floor, tokens per second");
ABSL_FLAG(int64_t, ttl_ms, 10000, "windowed policy: the window, milliseconds");
ABSL_FLAG(uint32_t, retry_cost, 1, "tokens each retry costs (TryAcquire(cost))");
ABSL_FLAG(absl::Duration, call_interval, absl::ZeroDuration(),
          "each thread starts a call every this long (paced load); 0: back to back");
ABSL_FLAG(absl::Duration, report_delay_slack, absl::ZeroDuration(),
          "the windowed bound's report delay D (0: 2 refresh periods + 1s + any outage)");
ABSL_FLAG(std::string, mode_switch, "",
          "MODE@SECONDS,...: switch every tenant's mode with budgetctl during the run");
ABSL_FLAG(std::string, budgetctl, "", "the budgetctl binary --mode-switch runs");
ABSL_FLAG(bool, reset_budget, false, "delete the tenant's budget before the run");
ABSL_FLAG(uint64_t, seed, 1, "seed of the simulated backends and of the fault injector");
ABSL_FLAG(absl::Duration, call_latency, absl::Milliseconds(1), "latency of one backend attempt");
ABSL_FLAG(std::string, strategy, "budget", "budget | unbudgeted | retry-helper");
ABSL_FLAG(int32_t, max_attempts, 0, "attempts per call; 0: no cap (budget), 4 (unbudgeted)");
ABSL_FLAG(double, fault_drop_response, 0, "probability of dropping a Sync response");
ABSL_FLAG(double, fault_duplicate_request, 0, "probability of sending a Sync twice");
ABSL_FLAG(double, fault_replay_old, 0, "probability of replaying an older Sync");
ABSL_FLAG(absl::Duration, fault_delay, absl::ZeroDuration(),
          "hold every Sync response this long (a slow server)");
ABSL_FLAG(absl::Duration, backoff_initial, absl::Milliseconds(1),
          "retry-helper: initial backoff (full jitter)");
ABSL_FLAG(absl::Duration, backoff_max, absl::Milliseconds(10), "retry-helper: largest backoff");
ABSL_FLAG(std::string, spawn_server, "", "start and supervise this retry-budget-server binary");
ABSL_FLAG(std::string, server_data_dir, "",
          "--data_dir of the spawned server (default: a temporary directory, removed after)");
ABSL_FLAG(std::string, server_arg, "", "one more argument for the spawned server (repeatable)");
ABSL_FLAG(double, kill_server_after, 0, "SIGKILL the spawned server this many seconds in");
ABSL_FLAG(double, restart_after, 0, "restart it this many seconds after the kill (same port)");
ABSL_FLAG(double, stop_server_after, 0, "SIGSTOP the spawned server this many seconds in");
ABSL_FLAG(double, resume_after, 0, "SIGCONT it this many seconds after the stop");
ABSL_FLAG(int32_t, cluster, 0,
          "start a cluster of this many --spawn-server servers on etcd (0: one plain server)");
ABSL_FLAG(int32_t, etcd_nodes, 3, "etcd members of the --cluster");
ABSL_FLAG(std::string, etcd_binary, "/usr/bin/etcd", "the etcd binary of the --cluster");
ABSL_FLAG(int32_t, cluster_shards, 0, "--shards of the cluster's servers (0: their default)");
ABSL_FLAG(absl::Duration, cluster_lease_ttl, absl::ZeroDuration(),
          "--etcd_lease_ttl of the cluster's servers (0: their default)");
ABSL_FLAG(std::string, cluster_chaos, "",
          "faults of the --cluster run: ACTION@SECONDS[+SECONDS],... (see --help)");
ABSL_FLAG(absl::Duration, refresh_period, absl::ZeroDuration(),
          "client refresh period; 0 keeps the library default");
ABSL_FLAG(uint64_t, lease_burst, 0, "client lease burst; 0 keeps the library default");
ABSL_FLAG(bool, fallback_deny, false,
          "the workers' clients deny every retry while the server is unreachable "
          "(ClientOptions::fallback = kDeny) instead of a local bucket of their safe share");
ABSL_FLAG(absl::Duration, sample_level, absl::Milliseconds(100),
          "how often to sample the bucket level during the run (diagnostic; 0: never)");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(10),
          "how long the calls before the run wait for the server");
ABSL_FLAG(absl::Duration, worker_grace, absl::Seconds(30),
          "how long past --duration a worker may take to report and exit");
ABSL_FLAG(std::string, worker_lines, "",
          "write every worker's JSON line (with its timelines) to this file");
ABSL_FLAG(std::string, foreign_workers, "",
          "LANGUAGE:COUNT:COMMAND: COUNT workers of another language (repeatable)");
// Hidden: the worker side of the tool.
ABSL_FLAG(bool, worker, false, "internal: run as one worker process");
ABSL_FLAG(int32_t, worker_index, 0, "internal: index of this worker");
ABSL_FLAG(absl::Duration, monitor_period, absl::Milliseconds(5),
          "how often each worker polls its client's mode (fallback or lease)");

namespace retrybudget::fleet {

absl::StatusOr<CommandLine> ParseFleetCommandLine(int argc, char** argv) {
  CommandLine out;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::StartsWith(arg, "-") || arg == "-" || arg == "--") {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (all options are --name=value)"));
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    const bool has_value = arg.find('=') != absl::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(arg.find('=') + 1)) : "";
    name = absl::StrReplaceAll(name, {{"-", "_"}});
    if (name == "help" || name == "h") {
      out.help = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      // --noflag for a boolean.
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
        value = "false";
      }
    } else if (flag != nullptr && !has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];  // --name value
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option '", argv[i], "' (see --help)"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}), ": bad value '", value,
                       "': ", error));
    }
    out.set.insert(name);
    if (name == "server_arg") out.server_args.push_back(value);
    if (name == "foreign_workers") out.foreign_workers.push_back(value);
  }
  out.worker_mode = absl::GetFlag(FLAGS_worker);
  return out;
}

std::string FleetUsage() {
  return R"(retry-budget-fleet: runs a fleet of real worker processes against one retry budget and
checks that the whole fleet's retries stayed within it.

Each of --workers processes runs --threads threads calling a simulated backend (each attempt
takes --call-latency and fails with probability --failure-rate). A failed attempt is retried
only when the budget's TryAcquire() allows; a denied retry ends the call as failed; a success is
reported with RecordSuccess(). After --duration seconds every worker shuts its client down (the
final Sync returns unspent tokens) and reports its own counts. The tool then prints ONE JSON
line and checks the invariant of DESIGN.md:

  tokens spent <= bound = initial + refill * elapsed + credit * successes
                         + fallback_allowance

where initial is the bucket level read (GetBudget) just before the workers start, elapsed
(steady clock) runs from that read until every worker has exited, and successes are counted by
the workers themselves. fallback_allowance is what the clients' local fallback buckets may
hand out while the server is unreachable: the sum over workers and fallback episodes of the
SafeShare each client last received (capacity, at least 1 token when it refills) plus its
refill times the seconds spent in fallback; 0 when no client fell back.

Usage: retry-budget-fleet [--option=value ...]   (options accept '-' or '_': --failure-rate)

Fleet:
  --server=TARGET           budget server(s), any gRPC target the client takes: HOST:PORT,
                            ipv4:127.0.0.1:7001,127.0.0.1:7002, dns:///host:port
                            (default 127.0.0.1:50051)
  --tenant=NAME             tenant whose budget is used (default fleet)
  --tenants=N               spread the fleet over N tenants, NAME-0 .. NAME-(N-1), each with
                            the policy below (default 1: NAME itself); thread k of worker w
                            uses tenant (w * threads + k) % N. Each tenant is judged on its
                            own; the run is within budget only if every tenant is, and the
                            report gains "tenants" (one object each)
  --workers=N               worker processes (default 8)
  --threads=T               threads per worker (default 2)
  --duration=SECONDS        how long each worker calls the backend (default 5)
  --failure-rate=F          probability that one attempt fails, [0, 1] (default 0.3)
  --call-latency=DURATION   time one attempt takes, e.g. 1ms, 500us, 0 (default 1ms)
  --seed=N                  seed of the backends and the fault injector (default 1)
  --strategy=NAME           budget: retry while TryAcquire() allows (default);
                            retry-helper: each call through retrybudget::Retry() (the budget
                            decides every retry; full-jitter backoff between attempts);
                            unbudgeted: no budget, --max-attempts per call (a baseline that
                            overspends: the run reports within_budget=false and exits 1)
  --max-attempts=N          most attempts per call; 0: no cap for budget and retry-helper, 4
                            for unbudgeted
  --backoff-initial=DURATION, --backoff-max=DURATION
                            retry-helper's backoff before retry k: uniform in
                            [0, min(max, initial * 2^(k-1))) (default 1ms, 10ms)

Policy (PutPolicy before the run when any is given; unset fields take the server's defaults:
capacity 100, refill 1, credit 0.1, initial = capacity, lease TTL 5000 ms. When none is given
the tenant keeps the server's policy):
  --capacity=TOKENS  --refill=TOKENS_PER_SECOND  --credit=TOKENS_PER_SUCCESS
  --initial=TOKENS   --lease-ttl-ms=MS
  --reset-budget            delete the tenant's budget first (start from a fresh bucket)
  --mode=enforce|shadow     enforce the budget (default), or a dry run: every retry allowed,
                            the would-be denials counted (report: shadow_denied)
  --retry-ratio=R --min-retries-per-second=F --ttl-ms=MS
                            the windowed ratio shape instead of capacity/refill/credit/initial
                            (server defaults 0.2, 10, 10000): the run is judged by the windowed
                            bound (report: "windowed"), see --report-delay-slack
  --report-delay-slack=DURATION
                            D of the windowed bound: every window of ttl ending at a spend,
                            tokens <= F * ttl + R * requests made in (end - ttl - D, end]
                            (+ the fallback allowance); a request is deposited when the server
                            RECEIVES its report (default 0: 2 refresh periods + 1s + the outage
                            of --kill-server-after/--stop-server-after)
  --mode-switch=MODE@SECONDS,...   run `budgetctl mode TENANT MODE` (the real binary,
                            --budgetctl=PATH) at those seconds from the start, for every tenant;
                            the report's "mode_switches" says when the last client saw each

Load shape:
  --retry-cost=N            tokens each retry takes (TryAcquire(N)), default 1; the bound
                            counts tokens (report: tokens_spent, spent)
  --call-interval=DURATION  each thread starts a call every DURATION (paced: the same calls
                            whatever the budget decides); default 0, back to back

Fault injection (a gRPC proxy on 127.0.0.1:0 between the workers and the server; per Sync
request, each with its own probability):
  --fault-drop-response=P      the server applies the request, the worker gets UNAVAILABLE
  --fault-duplicate-request=P  the request is sent to the server twice
  --fault-replay-old=P         an older request of the same instance is re-sent after newer ones
  --fault-delay=DURATION       every response is held this long (a slow server)

Chaos (the tool starts, kills, hangs and restarts the real server itself; --server is ignored):
  --spawn-server=PATH          start PATH (retry-budget-server) on 127.0.0.1, port picked once
                               (port 0), with --data_dir and, when policy options are given, a
                               --policy file holding them (so a restart keeps the policy)
  --server-data-dir=DIR        its --data_dir (default: a temporary directory, removed after)
  --server-arg=ARG             one more server argument, e.g. --server-arg=--snapshot_interval=1s
                               (repeatable)
  --kill-server-after=SECONDS  SIGKILL the server this long into the run
  --restart-after=SECONDS      restart it this long after the kill: same port, same data_dir
  --stop-server-after=SECONDS  SIGSTOP the server (a hung server: connections open, no answers)
  --resume-after=SECONDS       SIGCONT it this long after the stop
  While the server is unreachable each client spends its lease to its expiry, then its local
  fallback bucket; the bound then adds the fallback allowance (see below).

Cluster (the tool starts real etcd members and N servers of --spawn-server in cluster mode,
through the launcher of tests/support/test_launcher.h; --server is ignored, the workers get the
cluster's multi-address target):
  --cluster=N                  N servers (0: the single --spawn-server above)
  --etcd-nodes=M               etcd members (default 3)
  --etcd-binary=PATH           etcd (default /usr/bin/etcd)
  --cluster-shards=S           the servers' --shards (default: theirs)
  --cluster-lease-ttl=DURATION the servers' --etcd_lease_ttl (default: theirs)
  --cluster-chaos=ACTION@SECONDS[+SECONDS],...   faults, timed from the run's start:
      kill:S@T[+D]     kill -9 of server S (an index, or `owner`: the owner then of --tenant,
                       of tenant 0 (NAME-0) with --tenants);
                       with +D restarted D seconds later on the same port
      term:S@T[+D]     SIGTERM of server S, timed until it exited; with +D started again
      stop:S@T+D       SIGSTOP of server S for D seconds
      restart:S@T      start server S again
      kill-etcd-leader@T   kill -9 of the etcd leader
      stop-etcd@T[+D]  kill -9 of every etcd member; with +D all started again D seconds later
      restart-etcd:M@T kill -9 of etcd member M, started again at once with its data
      stop-etcd:M@T+D  kill -9 of etcd member M, started again with its data D seconds later
      lose-quorum@T+D  kill -9 of a majority of the etcd members, started again D seconds later
      rolling-restart@T[+GAP]  from T, each server in turn: SIGTERM (it hands its shards
                       over), started again on its port, joined; GAP seconds (default 2)
                       before the next
    e.g. --cluster-chaos=kill:owner@3+2,kill-etcd-leader@6,stop-etcd@8+3
  The report's "cluster" object lists what each action did, when.

Client tuning:
  --refresh-period=DURATION  --lease-burst=N   (0: library defaults)
  --fallback-deny            no local fallback bucket: every retry denied while the server is
                             unreachable (ClientOptions::fallback = kDeny; allowance 0)
  --monitor-period=DURATION  how often each worker polls its client's mode (default 5ms)
  --sample-level=DURATION    sample the bucket level this often during the run, for the
                             report's server.level_mean/level_max (default 100ms; 0: never)
  --connect-timeout=DURATION how long to wait for the server before the run (default 10s)
  --worker-grace=DURATION    time past --duration a worker may take to exit (default 30s)
  --worker-lines=FILE        also write each worker's own JSON line (one per tenant it used,
                             with tenant_index and its per-slice timelines) to FILE

Workers of other languages (the worker protocol of tools/fleet/README.md, on the same tenants,
under the same faults, counted in the same bound; budget strategy and default fallback only):
  --foreign-workers=LANGUAGE:COUNT:COMMAND   COUNT processes of COMMAND (split on spaces, its
                             program a path: no PATH search) with --threads loops each; foreign
                             worker k (over every kind, in order) uses tenant k % --tenants.
                             Repeatable, e.g.
                               --foreign-workers=go:4:build/client/go/bin/go_worker
                               --foreign-workers=js:4:/usr/bin/node tools/fleet/js_worker/worker.mjs
                               --foreign-workers=python:4:/usr/bin/python3 tools/fleet/mixed_fleet.py --worker
                             The report gains "languages" (each language's part).

Output: one JSON line on stdout:
  {"tenant","strategy","workers","threads","failure_rate","duration_seconds","call_latency_ms",
   "policy":{"capacity","refill_per_second","success_credit","initial_tokens","lease_ttl_ms"},
   "elapsed_seconds","calls","attempts","successes","failures","retries_allowed",
   "retries_denied","requests","retry_cost","tokens_spent","shadow_denied","spent",
   "lease_bound","fallback_allowance","bound","within_budget","utilisation",
   "max_try_acquire_ms","library":{...client library counters...},
   "fallback":{...time in fallback, allowance and its rule, spending in fallback...},
   "server":{...budget totals over the run...}, "faults":{...only with fault injection...},
   "chaos":{...only with --kill-server-after/--stop-server-after: fault times, outage counts...},
   "windowed":{...a windowed policy: its bound's check...},
   "mode_switches":[...with --mode-switch: each switch and when every client followed...]}
  (see tools/fleet/README.md for every field).

Exit codes:
  0  the run finished within the budget
  1  the run finished and the fleet spent more tokens than the bound (within_budget=false)
  2  bad command line
  3  no verdict: the server was unreachable or refused the policy, the fault proxy did not
     start, or a worker failed to start, crashed, hung or reported no counts
)";
}

absl::StatusOr<FleetOptions> FleetOptionsFromFlags(const CommandLine& command_line) {
  absl::StatusOr<RetryStrategy> strategy = ParseRetryStrategy(absl::GetFlag(FLAGS_strategy));
  if (!strategy.ok()) return strategy.status();
  FleetOptions o;
  o.strategy = *strategy;
  o.server = absl::GetFlag(FLAGS_server);
  o.tenant = absl::GetFlag(FLAGS_tenant);
  o.tenants = absl::GetFlag(FLAGS_tenants);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.duration_seconds = absl::GetFlag(FLAGS_duration);
  o.failure_rate = absl::GetFlag(FLAGS_failure_rate);
  o.call_latency = absl::GetFlag(FLAGS_call_latency);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.call.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  auto given = [&](absl::string_view name) { return command_line.set.contains(name); };
  if (given("capacity")) o.capacity = absl::GetFlag(FLAGS_capacity);
  if (given("refill")) o.refill_per_second = absl::GetFlag(FLAGS_refill);
  if (given("credit")) o.success_credit = absl::GetFlag(FLAGS_credit);
  if (given("initial")) o.initial_tokens = absl::GetFlag(FLAGS_initial);
  if (given("lease_ttl_ms")) o.lease_ttl_ms = absl::GetFlag(FLAGS_lease_ttl_ms);
  if (given("mode")) o.mode = absl::GetFlag(FLAGS_mode);
  if (given("retry_ratio")) o.retry_ratio = absl::GetFlag(FLAGS_retry_ratio);
  if (given("min_retries_per_second")) {
    o.min_retries_per_second = absl::GetFlag(FLAGS_min_retries_per_second);
  }
  if (given("ttl_ms")) o.ttl_ms = absl::GetFlag(FLAGS_ttl_ms);
  o.retry_cost = absl::GetFlag(FLAGS_retry_cost);
  o.call.retry_cost = o.retry_cost;
  o.call_interval = absl::GetFlag(FLAGS_call_interval);
  o.report_delay_slack = absl::GetFlag(FLAGS_report_delay_slack);
  absl::StatusOr<std::vector<ModeSwitchStep>> switches =
      ParseModeSwitches(absl::GetFlag(FLAGS_mode_switch));
  if (!switches.ok()) return switches.status();
  o.mode_switches = *std::move(switches);
  o.budgetctl = absl::GetFlag(FLAGS_budgetctl);
  o.reset_budget = absl::GetFlag(FLAGS_reset_budget);
  o.fault_drop_response = absl::GetFlag(FLAGS_fault_drop_response);
  o.fault_duplicate_request = absl::GetFlag(FLAGS_fault_duplicate_request);
  o.fault_replay_old = absl::GetFlag(FLAGS_fault_replay_old);
  o.fault_delay = absl::GetFlag(FLAGS_fault_delay);
  o.call.backoff_initial = absl::GetFlag(FLAGS_backoff_initial);
  o.call.backoff_max = absl::GetFlag(FLAGS_backoff_max);
  o.spawn_server = absl::GetFlag(FLAGS_spawn_server);
  o.server_data_dir = absl::GetFlag(FLAGS_server_data_dir);
  o.server_args = command_line.server_args;
  for (const std::string& spec : command_line.foreign_workers) {
    absl::StatusOr<ForeignWorkerKind> kind = ParseForeignWorkerKind(spec);
    if (!kind.ok()) return kind.status();
    o.foreign_workers.push_back(*std::move(kind));
  }
  if (given("kill_server_after")) o.chaos.kill_after = absl::GetFlag(FLAGS_kill_server_after);
  if (given("restart_after")) o.chaos.restart_after = absl::GetFlag(FLAGS_restart_after);
  if (given("stop_server_after")) o.chaos.stop_after = absl::GetFlag(FLAGS_stop_server_after);
  if (given("resume_after")) o.chaos.resume_after = absl::GetFlag(FLAGS_resume_after);
  o.cluster = absl::GetFlag(FLAGS_cluster);
  o.etcd_nodes = absl::GetFlag(FLAGS_etcd_nodes);
  o.etcd_binary = absl::GetFlag(FLAGS_etcd_binary);
  o.cluster_shards = absl::GetFlag(FLAGS_cluster_shards);
  o.cluster_lease_ttl = absl::GetFlag(FLAGS_cluster_lease_ttl);
  o.cluster_chaos = absl::GetFlag(FLAGS_cluster_chaos);
  o.monitor_period = absl::GetFlag(FLAGS_monitor_period);
  o.refresh_period = absl::GetFlag(FLAGS_refresh_period);
  o.lease_burst = absl::GetFlag(FLAGS_lease_burst);
  o.fallback_deny = absl::GetFlag(FLAGS_fallback_deny);
  o.worker_grace = absl::GetFlag(FLAGS_worker_grace);
  o.worker_lines = absl::GetFlag(FLAGS_worker_lines);
  o.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  o.sample_level = absl::GetFlag(FLAGS_sample_level);
  return o;
}

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags() {
  absl::StatusOr<RetryStrategy> strategy = ParseRetryStrategy(absl::GetFlag(FLAGS_strategy));
  if (!strategy.ok()) return strategy.status();
  WorkerOptions w;
  w.index = absl::GetFlag(FLAGS_worker_index);
  w.target = absl::GetFlag(FLAGS_server);
  w.tenant = absl::GetFlag(FLAGS_tenant);
  w.tenants = absl::GetFlag(FLAGS_tenants);
  w.threads = absl::GetFlag(FLAGS_threads);
  w.duration = absl::Seconds(absl::GetFlag(FLAGS_duration));
  w.failure_rate = absl::GetFlag(FLAGS_failure_rate);
  w.call_latency = absl::GetFlag(FLAGS_call_latency);
  w.seed = absl::GetFlag(FLAGS_seed);
  w.strategy = *strategy;
  w.call.retry_cost = absl::GetFlag(FLAGS_retry_cost);
  w.call_interval = absl::GetFlag(FLAGS_call_interval);
  w.call.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  w.call.backoff_initial = absl::GetFlag(FLAGS_backoff_initial);
  w.call.backoff_max = absl::GetFlag(FLAGS_backoff_max);
  w.monitor_period = absl::GetFlag(FLAGS_monitor_period);
  w.refresh_period = absl::GetFlag(FLAGS_refresh_period);
  w.lease_burst = absl::GetFlag(FLAGS_lease_burst);
  w.fallback_deny = absl::GetFlag(FLAGS_fallback_deny);
  return w;
}

}  // namespace retrybudget::fleet
