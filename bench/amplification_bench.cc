// The amplification experiment, the reason the project exists: how much load retries add to a
// failing backend under three strategies, in three regimes, with a fleet of real worker
// processes, and how that load grows with the size of the fleet.
//
//   strategies  per_call_cap      4 attempts per call, nothing shared
//               process_throttle  4 attempts per call + gRPC retryThrottling per process
//                                 (max_tokens 100, token_ratio 0.1)
//               fleet_budget      4 attempts per call + this project's budget: real
//                                 retry-budget-server (started here, default policy: capacity
//                                 100, refill 1/s, success credit 0.1), real client library
//   regimes     healthy (1% of attempts fail), degraded (30%), outage (1% for --outage_start,
//               then every attempt fails)
//
// Part 1, every strategy in every regime: each run starts --workers processes (this binary
// with --worker), each with --call_sites threads that each make --rate logical calls per second
// (open loop: calls arrive on schedule whatever happens to earlier ones) for --duration.
//
// Part 2, the fleet-size sweep: every strategy in each of --sweep_regimes with N worker
// processes for each N in --fleet_sizes. The fleet's total logical call rate is the same at
// every N (--sweep_calls_per_second, split over N x --sweep_call_sites threads): the same
// traffic served by more processes, so any growth with N is the strategy's, not the load's.
// A per-process throttle lets every process burst ~50 failures' worth of retries before it
// closes, so its burst into a dead backend grows with N; the fleet budget's does not.
//
// The backend is simulated in-process (an attempt fails with the regime's probability at that
// moment; no I/O, no backoff), so the numbers are the strategies' decisions, not the machine's
// speed. Every run of the fleet budget uses a fresh tenant, so each starts from a full bucket.
//
// Reported per run: amplification = backend attempts / logical calls (whole run, and during the
// outage only), retries (whole run; during the outage; in the outage's first second), retries
// per second, and the drain time: from the start of the outage until the retry rate stays at or
// below 10% of the logical call rate for the rest of the run (null: never). The baseline is
// per_call_cap (part 1) or fleet_budget (part 2) in the same regime, same run.
//
// Output: one JSON line per run, then {"bench":"amplification",...} with the ratios; with
// --out_dir, also amplification_timeseries.dat, amplification_table.dat and
// amplification_fleet_sweep.dat for gnuplot (bench/plots.gp).
//
// Processes: a worker that cannot be started, or exits before it is ready, stops the bench with
// an error naming it and its exit status (the worker's own stderr says why). Workers die with
// the driver (PR_SET_PDEATHSIG), and the driver kills every child it started (server and
// workers) on SIGINT, SIGTERM and SIGHUP, so an interrupted run leaves no process behind.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/amplification_strategies.h"
#include "bench/bench_util.h"
#include "retrybudget/client.h"

// Part 1.
ABSL_FLAG(int, workers, 4, "worker processes");
ABSL_FLAG(int, call_sites, 4, "call sites (threads) per worker");
ABSL_FLAG(double, rate, 100, "logical calls per second per call site");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(6), "length of each run");
ABSL_FLAG(absl::Duration, outage_start, absl::Seconds(2), "outage regime: when the outage starts");
// Part 2.
ABSL_FLAG(std::vector<std::string>, fleet_sizes, std::vector<std::string>({"2", "8", "32"}),
          "fleet-size sweep: numbers of worker processes (empty: no sweep)");
ABSL_FLAG(std::vector<std::string>, sweep_regimes, std::vector<std::string>({"outage", "degraded"}),
          "fleet-size sweep: regimes");
ABSL_FLAG(double, sweep_calls_per_second, 1600,
          "fleet-size sweep: logical calls per second of the whole fleet, at every N");
ABSL_FLAG(int, sweep_call_sites, 2, "fleet-size sweep: call sites (threads) per worker");
ABSL_FLAG(absl::Duration, sweep_duration, absl::Seconds(4), "fleet-size sweep: length of a run");
ABSL_FLAG(absl::Duration, sweep_outage_start, absl::Seconds(1),
          "fleet-size sweep: when the outage starts");
// Both.
ABSL_FLAG(absl::Duration, bucket, absl::Milliseconds(100), "time-series resolution");
ABSL_FLAG(int, max_attempts, 4, "attempts per logical call, first included (all strategies)");
ABSL_FLAG(absl::Duration, ready_timeout, absl::Seconds(30),
          "longest wait for a worker process to start and connect");
ABSL_FLAG(std::string, out_dir, "", "where to write the gnuplot data files (none if empty)");
ABSL_FLAG(std::string, server_bin, RETRYBUDGET_SERVER_BIN, "the retry-budget-server binary");
// Worker-only flags (set by the driver).
ABSL_FLAG(bool, worker, false, "internal: run as one worker process");
ABSL_FLAG(int, parent_pid, 0, "internal: the driver's pid (the worker exits if it is gone)");
ABSL_FLAG(std::string, strategy, "", "internal: per_call_cap | process_throttle | fleet_budget");
ABSL_FLAG(std::string, regime, "", "internal: healthy | degraded | outage");
ABSL_FLAG(std::string, server, "", "internal: budget server address");
ABSL_FLAG(std::string, tenant, "", "internal: the budget's tenant");
ABSL_FLAG(uint64_t, seed, 1, "internal: seed of this worker's backend");

namespace retrybudget::bench {
namespace {

const char* const kStrategies[] = {"per_call_cap", "process_throttle", "fleet_budget"};
const char* const kRegimes[] = {"healthy", "degraded", "outage"};

struct Bucket {
  uint64_t calls = 0, attempts = 0, retries = 0, failed_calls = 0;
};

// What one run does: the same for the driver (which passes it on as flags) and the worker.
struct RunConfig {
  std::string experiment;  // "regimes" (part 1) or "fleet_sweep" (part 2)
  std::string strategy, regime;
  int workers = 0;
  int call_sites = 0;
  double rate = 0;  // per call site
  absl::Duration duration, outage_start, bucket;
  int max_attempts = 0;

  int Buckets() const { return static_cast<int>(duration / bucket) + 1; }
  double FleetCallsPerSecond() const { return workers * call_sites * rate; }
};

// ---------------------------------------------------------------------------------------------
// Children the driver has started and not reaped yet, for the signal handler. Lock-free atomics
// only, so the handler may read them.

constexpr int kMaxTracked = 1024;
std::atomic<pid_t> g_tracked[kMaxTracked];

void Track(pid_t pid) {
  for (auto& slot : g_tracked) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
  // More children than slots: they still die with the driver (workers) or at the end of the
  // run; only an interrupt could leave one behind.
}

void Untrack(pid_t pid) {
  if (pid <= 0) return;
  for (auto& slot : g_tracked) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

extern "C" void KillChildrenAndDie(int signo) {
  for (auto& slot : g_tracked) {
    const pid_t pid = slot.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  signal(signo, SIG_DFL);
  raise(signo);
}

void InstallSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = KillChildrenAndDie;
  sigemptyset(&action.sa_mask);
  for (int signo : {SIGINT, SIGTERM, SIGHUP}) sigaction(signo, &action, nullptr);
}

// "exited with code 3", "was killed by signal 9" from a wait status.
std::string HowItEnded(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

// Child processes that the signal handler knows about; the ones still running when the group
// is destroyed are killed and reaped (so an early return never leaks a process).
// Thread-compatible.
class ChildGroup {
 public:
  ChildGroup() = default;
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    for (size_t i = 0; i < children_.size(); ++i) Stop(i, SIGKILL, absl::Seconds(2));
  }

  absl::Status Spawn(const std::vector<std::string>& argv) {
    absl::StatusOr<Child> child = Child::Spawn(argv);
    if (!child.ok()) return child.status();
    Adopt(*std::move(child));
    return absl::OkStatus();
  }
  void Adopt(Child child) {
    Track(child.pid());
    children_.push_back(std::move(child));
    stopped_.push_back(false);
  }
  Child& operator[](size_t i) { return children_[i]; }
  size_t size() const { return children_.size(); }
  // Child::Stop, and forgets the pid. Returns the wait status (0 if already stopped).
  int Stop(size_t i, int signo, absl::Duration timeout) {
    if (stopped_[i]) return 0;
    stopped_[i] = true;
    Untrack(children_[i].pid());
    return children_[i].Stop(signo, timeout);
  }

 private:
  std::vector<Child> children_;
  std::vector<bool> stopped_;
};

// ---------------------------------------------------------------------------------------------
// Worker process: prints "ready", waits for "go <unix_nanos>", runs, prints the series.

int WorkerError(const std::string& message) {
  std::fprintf(stderr, "bench_amplification worker (pid %d): %s\n", getpid(), message.c_str());
  return 3;
}

int RunWorker() {
  // Die with the driver, whatever kills it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int parent = absl::GetFlag(FLAGS_parent_pid);
  if (parent > 0 && getppid() != parent) return WorkerError("the driver is already gone");

  RunConfig config;
  config.strategy = absl::GetFlag(FLAGS_strategy);
  config.regime = absl::GetFlag(FLAGS_regime);
  config.call_sites = absl::GetFlag(FLAGS_call_sites);
  config.rate = absl::GetFlag(FLAGS_rate);
  config.duration = absl::GetFlag(FLAGS_duration);
  config.outage_start = absl::GetFlag(FLAGS_outage_start);
  config.bucket = absl::GetFlag(FLAGS_bucket);
  config.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  absl::StatusOr<Regime> regime = ParseRegime(config.regime);
  if (!regime.ok()) return WorkerError(std::string(regime.status().message()));
  if (config.call_sites < 1 || !(config.rate > 0) || config.bucket <= absl::ZeroDuration()) {
    return WorkerError(absl::StrFormat("bad load: call_sites %d, rate %g, bucket %s",
                                       config.call_sites, config.rate,
                                       absl::FormatDuration(config.bucket)));
  }

  std::unique_ptr<BudgetClient> client;
  TenantBudget* budget_handle = nullptr;  // fleet_budget only
  std::unique_ptr<RetryGate> gate;
  if (config.strategy == "per_call_cap") {
    gate = std::make_unique<PerCallCapGate>();
  } else if (config.strategy == "process_throttle") {
    gate = std::make_unique<ProcessThrottleGate>(100, 0.1);
  } else if (config.strategy == "fleet_budget") {
    ClientOptions options;
    options.target = absl::GetFlag(FLAGS_server);
    auto created = BudgetClient::Create(options);
    if (!created.ok()) {
      return WorkerError(absl::StrCat("BudgetClient::Create(", options.target,
                                      "): ", created.status().ToString()));
    }
    client = *std::move(created);
    auto budget = client->Tenant(absl::GetFlag(FLAGS_tenant));
    if (!budget.ok()) {
      return WorkerError(
          absl::StrCat("Tenant(", absl::GetFlag(FLAGS_tenant), "): ", budget.status().ToString()));
    }
    budget_handle = *budget;
    gate = std::make_unique<FleetBudgetGate>(budget_handle);
  } else {
    return WorkerError(absl::StrCat("strategy '", config.strategy,
                                    "' is not one of per_call_cap, process_throttle, "
                                    "fleet_budget"));
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  int64_t start_nanos = 0;
  if (!std::getline(std::cin, line) || !absl::StartsWith(line, "go ") ||
      !absl::SimpleAtoi(line.substr(3), &start_nanos)) {
    return WorkerError("no \"go <unix_nanos>\" line from the driver");
  }
  const absl::Time start = absl::FromUnixNanos(start_nanos);
  const absl::Time end = start + config.duration;
  const absl::Duration interval = absl::Seconds(1.0 / config.rate);
  const int sites = config.call_sites;
  const int buckets = config.Buckets();

  std::vector<std::vector<Bucket>> per_site(sites, std::vector<Bucket>(buckets));
  std::vector<std::thread> threads;
  for (int s = 0; s < sites; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 1000 + s);
      // Call sites start staggered within one interval, as independent callers would.
      absl::Time next = start + interval * (static_cast<double>(s) / sites);
      while (next < end) {
        absl::SleepFor(next - absl::Now());
        const absl::Duration since = next - start;
        const double p = FailureProbability(*regime, since, config.outage_start);
        const CallResult r = RunLogicalCall(*gate, config.max_attempts, p, rng);
        Bucket& b = per_site[s][static_cast<size_t>(since / config.bucket)];
        ++b.calls;
        b.attempts += r.attempts;
        b.retries += r.attempts - 1;
        b.failed_calls += r.succeeded ? 0 : 1;
        next += interval;
      }
    });
  }
  // The fleet budget's workers also say how many leased tokens they held just before the outage
  // (10 ms before: the healthy phase spends almost nothing): what the fleet can spend at once
  // beyond the server's bucket.
  int64_t held_before_outage = -1;
  if (budget_handle != nullptr && *regime == Regime::kOutage) {
    absl::SleepFor(start + config.outage_start - absl::Milliseconds(10) - absl::Now());
    held_before_outage = budget_handle->Stats().tokens_held;
  }
  for (auto& t : threads) t.join();
  if (client != nullptr) (void)client->Shutdown();
  std::printf("series %d %lld\n", buckets, static_cast<long long>(held_before_outage));
  for (int i = 0; i < buckets; ++i) {
    Bucket sum;
    for (const auto& site : per_site) {
      sum.calls += site[i].calls;
      sum.attempts += site[i].attempts;
      sum.retries += site[i].retries;
      sum.failed_calls += site[i].failed_calls;
    }
    std::printf("%llu %llu %llu %llu\n", (unsigned long long)sum.calls,
                (unsigned long long)sum.attempts, (unsigned long long)sum.retries,
                (unsigned long long)sum.failed_calls);
  }
  std::fflush(stdout);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Driver.

struct RunResult {
  RunConfig config;
  std::vector<Bucket> series;
  uint64_t calls = 0, attempts = 0, retries = 0, failed_calls = 0;
  double amplification = 0;
  double retries_per_second = 0;
  // Outage regime only (-1 otherwise).
  int64_t outage_retries = -1;
  int64_t outage_first_second_retries = -1;
  double outage_amplification = -1;
  double outage_retries_per_second = -1;
  double drain_seconds = -1;  // also -1 when it never drained
  // Fleet budget in the outage regime only: leased tokens the workers held 10 ms before the
  // outage, summed over the fleet.
  int64_t lease_tokens_before_outage = -1;
  double wall_seconds = 0;  // spawn to reaped, for the record
};

// "worker 3 of 32 (pid 123, fleet_budget/outage)".
std::string WorkerName(const RunConfig& config, size_t index, pid_t pid) {
  return absl::StrFormat("worker %d of %d (pid %d, %s/%s)", index + 1, config.workers, pid,
                         config.strategy, config.regime);
}

// The error for worker `index`, which failed to do `what`: stops it and says how it ended.
absl::Status WorkerFailed(const RunConfig& config, ChildGroup& workers, size_t index,
                          const std::string& what, const absl::Status& cause) {
  const pid_t pid = workers[index].pid();
  const int status = workers.Stop(index, SIGKILL, absl::Seconds(2));
  return absl::UnavailableError(absl::StrCat(
      WorkerName(config, index, pid), " ", what, ": ", cause.message(), "; it ", HowItEnded(status),
      " (SIGKILL is this bench stopping it; the worker's own error, if any, "
      "is on stderr above)"));
}

absl::StatusOr<RunResult> RunOne(const RunConfig& config, const std::string& server,
                                 int run_index) {
  const absl::Time began = absl::Now();
  const std::string tenant =
      absl::StrFormat("amp-%s-%s-%s-n%d-%d-%d", config.experiment, config.regime, config.strategy,
                      config.workers, getpid(), run_index);
  ChildGroup workers;  // kills and reaps whatever is left on every return
  for (int w = 0; w < config.workers; ++w) {
    absl::Status spawned = workers.Spawn(
        {SelfExe(), "--worker", absl::StrCat("--parent_pid=", getpid()),
         absl::StrCat("--strategy=", config.strategy), absl::StrCat("--regime=", config.regime),
         absl::StrCat("--server=", server), absl::StrCat("--tenant=", tenant),
         absl::StrCat("--seed=", run_index * 1000 + w + 1),
         absl::StrCat("--call_sites=", config.call_sites),
         absl::StrFormat("--rate=%.17g", config.rate),
         absl::StrCat("--duration=", absl::FormatDuration(config.duration)),
         absl::StrCat("--outage_start=", absl::FormatDuration(config.outage_start)),
         absl::StrCat("--bucket=", absl::FormatDuration(config.bucket)),
         absl::StrCat("--max_attempts=", config.max_attempts)});
    if (!spawned.ok()) {
      return absl::UnavailableError(
          absl::StrFormat("worker %d of %d (%s/%s) could not be started: %s", w + 1, config.workers,
                          config.strategy, config.regime, spawned.message()));
    }
  }
  const absl::Duration ready_timeout = absl::GetFlag(FLAGS_ready_timeout);
  for (size_t w = 0; w < workers.size(); ++w) {
    absl::StatusOr<std::string> line = workers[w].ReadLine(ready_timeout);
    if (!line.ok()) {
      return WorkerFailed(
          config, workers, w,
          absl::StrCat("did not get ready within ", absl::FormatDuration(ready_timeout)),
          line.status());
    }
    if (*line != "ready") {
      return WorkerFailed(config, workers, w, "did not get ready",
                          absl::InternalError(absl::StrCat("it printed '", *line, "'")));
    }
  }
  // Everyone starts on the same wall-clock instant; the fleet budget's clients are connected
  // (their first lease may still be on its way, as in a real start).
  const absl::Time start =
      absl::Now() + absl::Milliseconds(300) + absl::Milliseconds(5) * config.workers;
  for (size_t w = 0; w < workers.size(); ++w) {
    if (absl::Status s = workers[w].WriteLine(absl::StrCat("go ", absl::ToUnixNanos(start)));
        !s.ok()) {
      return WorkerFailed(config, workers, w, "could not be told to start", s);
    }
  }
  RunResult r;
  r.config = config;
  const int buckets = config.Buckets();
  r.series.assign(buckets, Bucket{});
  const absl::Time series_deadline = start + config.duration + absl::Seconds(20);
  for (size_t w = 0; w < workers.size(); ++w) {
    absl::StatusOr<std::string> header = workers[w].ReadLine(series_deadline - absl::Now());
    if (!header.ok()) return WorkerFailed(config, workers, w, "sent no series", header.status());
    std::istringstream header_in(*header);
    std::string word;
    int header_buckets = 0;
    int64_t held = -1;
    if (!(header_in >> word >> header_buckets >> held) || word != "series" ||
        header_buckets != buckets) {
      return WorkerFailed(config, workers, w, "sent no series",
                          absl::InternalError(absl::StrCat("it printed '", *header, "'")));
    }
    if (held >= 0) {
      r.lease_tokens_before_outage = std::max<int64_t>(0, r.lease_tokens_before_outage) + held;
    }
    for (int i = 0; i < buckets; ++i) {
      absl::StatusOr<std::string> row = workers[w].ReadLine(absl::Seconds(5));
      if (!row.ok()) return WorkerFailed(config, workers, w, "cut its series short", row.status());
      std::istringstream in(*row);
      Bucket b;
      if (!(in >> b.calls >> b.attempts >> b.retries >> b.failed_calls)) {
        return WorkerFailed(config, workers, w, "sent a bad series row",
                            absl::InternalError(absl::StrCat("'", *row, "'")));
      }
      r.series[i].calls += b.calls;
      r.series[i].attempts += b.attempts;
      r.series[i].retries += b.retries;
      r.series[i].failed_calls += b.failed_calls;
    }
    // It exits on its own after the series: signal 0 sends nothing, so this only waits (5 s,
    // then SIGKILL if it hangs, e.g. in BudgetClient::Shutdown()).
    const pid_t pid = workers[w].pid();
    const int status = workers.Stop(w, 0, absl::Seconds(5));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "bench_amplification: note: %s %s after sending its series\n",
                   WorkerName(config, w, pid).c_str(), HowItEnded(status).c_str());
    }
  }

  const double bucket_s = absl::ToDoubleSeconds(config.bucket);
  const double duration_s = absl::ToDoubleSeconds(config.duration);
  const int outage_bucket = static_cast<int>(config.outage_start / config.bucket);
  const int first_second_end =
      outage_bucket + std::max(1, static_cast<int>(std::lround(1.0 / bucket_s)));
  uint64_t o_calls = 0, o_attempts = 0, o_retries = 0, o_first_second = 0;
  for (int i = 0; i < buckets; ++i) {
    const Bucket& b = r.series[i];
    r.calls += b.calls;
    r.attempts += b.attempts;
    r.retries += b.retries;
    r.failed_calls += b.failed_calls;
    if (i >= outage_bucket) {
      o_calls += b.calls;
      o_attempts += b.attempts;
      o_retries += b.retries;
      if (i < first_second_end) o_first_second += b.retries;
    }
  }
  r.amplification = r.calls ? double(r.attempts) / double(r.calls) : 0;
  r.retries_per_second = double(r.retries) / duration_s;
  if (config.regime == "outage") {
    r.outage_retries = static_cast<int64_t>(o_retries);
    r.outage_first_second_retries = static_cast<int64_t>(o_first_second);
    r.outage_amplification = o_calls ? double(o_attempts) / double(o_calls) : 0;
    r.outage_retries_per_second =
        double(o_retries) / (duration_s - absl::ToDoubleSeconds(config.outage_start));
    // Drained at the first bucket from which retries stay <= 10% of calls to the end (the last
    // bucket is partial and skipped).
    int drained = -1;
    for (int i = buckets - 2; i >= outage_bucket; --i) {
      const Bucket& b = r.series[i];
      if (double(b.retries) > 0.1 * double(b.calls)) break;
      drained = i;
    }
    if (drained >= 0) r.drain_seconds = (drained - outage_bucket) * bucket_s;
  }
  r.wall_seconds = absl::ToDoubleSeconds(absl::Now() - began);
  return r;
}

std::string Num(double v) { return v < 0 ? "null" : absl::StrFormat("%.3f", v); }
std::string Int(int64_t v) { return v < 0 ? "null" : absl::StrCat(v); }
std::string Ratio(double a, double b) { return b > 0 && a >= 0 ? Num(a / b) : "null"; }

std::string ToJson(const RunResult& r) {
  std::vector<std::string> retries_per_s;
  const double bucket_s = absl::ToDoubleSeconds(r.config.bucket);
  for (const Bucket& b : r.series) {
    retries_per_s.push_back(absl::StrFormat("%.0f", b.retries / bucket_s));
  }
  return absl::StrFormat(
      "{\"bench\":\"amplification_run\",\"experiment\":\"%s\",\"strategy\":\"%s\","
      "\"regime\":\"%s\",\"workers\":%d,\"call_sites\":%d,\"fleet_calls_per_second\":%.0f,"
      "\"duration_s\":%.1f,\"calls\":%d,\"attempts\":%d,\"retries\":%d,\"failed_calls\":%d,"
      "\"amplification\":%s,\"retries_per_second\":%s,\"outage_retries\":%s,"
      "\"outage_first_second_retries\":%s,\"outage_amplification\":%s,"
      "\"outage_retries_per_second\":%s,\"drain_seconds\":%s,"
      "\"lease_tokens_before_outage\":%s,\"wall_seconds\":%.1f,"
      "\"retries_per_second_series\":[%s]}",
      r.config.experiment, r.config.strategy, r.config.regime, r.config.workers,
      r.config.call_sites, r.config.FleetCallsPerSecond(), absl::ToDoubleSeconds(r.config.duration),
      r.calls, r.attempts, r.retries, r.failed_calls, Num(r.amplification),
      Num(r.retries_per_second), Int(r.outage_retries), Int(r.outage_first_second_retries),
      Num(r.outage_amplification), Num(r.outage_retries_per_second), Num(r.drain_seconds),
      Int(r.lease_tokens_before_outage), r.wall_seconds, absl::StrJoin(retries_per_s, ","));
}

std::string SweepKey(const std::string& regime, int n, const std::string& strategy) {
  return absl::StrCat(regime, "/", n, "/", strategy);
}

// The retries a sweep run is judged by: into the dead backend during the outage, or during the
// whole run when degraded.
double SweepRetries(const RunResult& r) {
  return r.config.regime == "outage" ? double(r.outage_retries) : double(r.retries);
}

void WriteDataFiles(const std::string& dir, const std::map<std::string, RunResult>& runs,
                    const std::vector<int>& sizes, const std::map<std::string, RunResult>& sweep) {
  // Retries/s over time in the outage regime, one column per strategy (time relative to the
  // outage start); the last, partial bucket is left out.
  {
    const RunResult& any = runs.at("per_call_cap/outage");
    const double bucket_s = absl::ToDoubleSeconds(any.config.bucket);
    const double outage_s = absl::ToDoubleSeconds(any.config.outage_start);
    std::ofstream ts(dir + "/amplification_timeseries.dat");
    ts << "# t_since_outage_s per_call_cap process_throttle fleet_budget (retries/s, outage)\n";
    for (int i = 0; i + 1 < any.config.Buckets(); ++i) {
      ts << absl::StrFormat("%.2f", i * bucket_s - outage_s);
      for (const char* s : kStrategies) {
        ts << ' ' << runs.at(absl::StrCat(s, "/outage")).series[i].retries / bucket_s;
      }
      ts << '\n';
    }
  }
  // Amplification per regime (rows) and strategy (columns); outage = during the outage only.
  {
    std::ofstream table(dir + "/amplification_table.dat");
    table << "# regime per_call_cap process_throttle fleet_budget (attempts per logical call)\n";
    for (const char* g : kRegimes) {
      table << g;
      for (const char* s : kStrategies) {
        const RunResult& r = runs.at(absl::StrCat(s, "/", g));
        table << ' ' << (std::string(g) == "outage" ? r.outage_amplification : r.amplification);
      }
      table << '\n';
    }
  }
  // The fleet-size sweep: one row per N. Outage columns: retries during the outage, then in its
  // first second; degraded columns: retries during the run (-1 when the regime was not swept).
  // Only when the outage was swept (plots.gp plots the file whenever it exists).
  const std::string sweep_file = dir + "/amplification_fleet_sweep.dat";
  std::remove(sweep_file.c_str());
  if (sizes.empty() || sweep.find(SweepKey("outage", sizes[0], "fleet_budget")) == sweep.end()) {
    return;
  }
  std::ofstream sw(sweep_file);
  sw << "# N, outage retries (per_call_cap process_throttle fleet_budget), outage first-second "
        "retries (same order), degraded retries (same order); -1 = not run\n";
  for (int n : sizes) {
    sw << n;
    auto column = [&](const std::string& regime, const char* strategy, bool first_second) {
      auto it = sweep.find(SweepKey(regime, n, strategy));
      if (it == sweep.end()) return -1.0;
      return first_second ? double(it->second.outage_first_second_retries)
                          : SweepRetries(it->second);
    };
    for (const char* s : kStrategies) sw << ' ' << column("outage", s, false);
    for (const char* s : kStrategies) sw << ' ' << column("outage", s, true);
    for (const char* s : kStrategies) sw << ' ' << column("degraded", s, false);
    sw << '\n';
  }
}

absl::StatusOr<std::vector<int>> ParseFleetSizes() {
  std::vector<int> sizes;
  for (const std::string& s : absl::GetFlag(FLAGS_fleet_sizes)) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1 || n > kMaxTracked / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--fleet_sizes: '", s, "' is not a number of worker processes in [1, ",
                       kMaxTracked / 2, "]"));
    }
    sizes.push_back(n);
  }
  return sizes;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "bench_amplification: %s\n", message.c_str());
  return 1;
}

int RunDriverIn(const std::string& dir) {
  absl::StatusOr<std::vector<int>> sizes = ParseFleetSizes();
  if (!sizes.ok()) return Fail(std::string(sizes.status().message()));
  const std::vector<std::string> sweep_regimes = absl::GetFlag(FLAGS_sweep_regimes);
  for (const std::string& g : sweep_regimes) {
    if (!ParseRegime(g).ok()) return Fail(absl::StrCat("--sweep_regimes: '", g, "' is unknown"));
  }
  const int sweep_sites = absl::GetFlag(FLAGS_sweep_call_sites);
  const double sweep_cps = absl::GetFlag(FLAGS_sweep_calls_per_second);
  if (!sizes->empty() && (sweep_sites < 1 || !(sweep_cps > 0))) {
    return Fail(
        absl::StrFormat("fleet-size sweep: --sweep_call_sites %d and "
                        "--sweep_calls_per_second %g must be positive",
                        sweep_sites, sweep_cps));
  }

  absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> server =
      StartBudgetServer(absl::GetFlag(FLAGS_server_bin), dir, /*policy=*/"");
  if (!server.ok()) return Fail(std::string(server.status().message()));
  // The signal handler kills it too; the launcher kills it on every return.
  const pid_t server_pid = (*server)->pid();
  Track(server_pid);
  const std::string address = (*server)->address();
  int index = 0;
  auto run = [&](const RunConfig& config, std::map<std::string, RunResult>& into,
                 const std::string& key) -> bool {
    absl::StatusOr<RunResult> r = RunOne(config, address, ++index);
    if (!r.ok()) {
      std::fprintf(stderr, "bench_amplification: %s run %s/%s with %d workers failed: %s\n",
                   config.experiment.c_str(), config.strategy.c_str(), config.regime.c_str(),
                   config.workers, std::string(r.status().message()).c_str());
      return false;
    }
    std::printf("%s\n", ToJson(*r).c_str());
    std::fflush(stdout);
    into[key] = *std::move(r);
    return true;
  };

  // Part 1: every strategy in every regime, one fleet.
  std::map<std::string, RunResult> runs;
  for (const char* regime : kRegimes) {
    for (const char* strategy : kStrategies) {
      RunConfig c;
      c.experiment = "regimes";
      c.strategy = strategy;
      c.regime = regime;
      c.workers = absl::GetFlag(FLAGS_workers);
      c.call_sites = absl::GetFlag(FLAGS_call_sites);
      c.rate = absl::GetFlag(FLAGS_rate);
      c.duration = absl::GetFlag(FLAGS_duration);
      c.outage_start = absl::GetFlag(FLAGS_outage_start);
      c.bucket = absl::GetFlag(FLAGS_bucket);
      c.max_attempts = absl::GetFlag(FLAGS_max_attempts);
      if (!run(c, runs, absl::StrCat(strategy, "/", regime))) return 1;
    }
  }
  // Part 2: the fleet-size sweep, same fleet-wide call rate at every N.
  std::map<std::string, RunResult> sweep;
  for (const std::string& regime : sweep_regimes) {
    for (int n : *sizes) {
      for (const char* strategy : kStrategies) {
        RunConfig c;
        c.experiment = "fleet_sweep";
        c.strategy = strategy;
        c.regime = regime;
        c.workers = n;
        c.call_sites = sweep_sites;
        c.rate = sweep_cps / (n * sweep_sites);
        c.duration = absl::GetFlag(FLAGS_sweep_duration);
        c.outage_start = absl::GetFlag(FLAGS_sweep_outage_start);
        c.bucket = absl::GetFlag(FLAGS_bucket);
        c.max_attempts = absl::GetFlag(FLAGS_max_attempts);
        if (!run(c, sweep, SweepKey(regime, n, strategy))) return 1;
      }
    }
  }
  Untrack(server_pid);
  (void)(*server)->Stop(SIGTERM, absl::Seconds(5));

  // Summary, part 1: each strategy against per_call_cap in the same regime.
  std::vector<std::string> fields;
  std::vector<std::string> ratios;
  for (const char* regime : kRegimes) {
    const bool outage = std::string(regime) == "outage";
    const RunResult& base = runs.at(absl::StrCat("per_call_cap/", regime));
    for (const char* strategy : kStrategies) {
      const RunResult& r = runs.at(absl::StrCat(strategy, "/", regime));
      const double amp = outage ? r.outage_amplification : r.amplification;
      const double rps = outage ? r.outage_retries_per_second : r.retries_per_second;
      const double base_rps = outage ? base.outage_retries_per_second : base.retries_per_second;
      fields.push_back(
          absl::StrFormat("\"%s/%s\":{\"amplification\":%s,\"retries_per_second\":%s,"
                          "\"retries_vs_per_call_cap\":%s%s}",
                          strategy, regime, Num(amp), Num(rps), Ratio(rps, base_rps),
                          outage ? absl::StrCat(",\"drain_seconds\":", Num(r.drain_seconds)) : ""));
      if (outage && std::string(strategy) != "per_call_cap") {
        ratios.push_back(absl::StrFormat("\"%s_outage_retries_vs_per_call_cap\":%s", strategy,
                                         Ratio(rps, base_rps)));
      }
    }
  }
  // Summary, part 2: per (regime, N, strategy), and the ratios: throttle and caps against the
  // fleet budget at each N, and each strategy's growth from the smallest to the largest N.
  std::vector<std::string> sweep_fields;
  for (const std::string& regime : sweep_regimes) {
    const bool outage = regime == "outage";
    for (int n : *sizes) {
      const RunResult& fleet = sweep.at(SweepKey(regime, n, "fleet_budget"));
      for (const char* strategy : kStrategies) {
        const RunResult& r = sweep.at(SweepKey(regime, n, strategy));
        if (outage) {
          sweep_fields.push_back(absl::StrFormat(
              "\"%s\":{\"outage_retries\":%d,\"outage_first_second_retries\":%d,"
              "\"outage_amplification\":%s,\"drain_seconds\":%s,\"failed_calls\":%d,"
              "\"lease_tokens_before_outage\":%s}",
              SweepKey(regime, n, strategy), r.outage_retries, r.outage_first_second_retries,
              Num(r.outage_amplification), Num(r.drain_seconds), r.failed_calls,
              Int(r.lease_tokens_before_outage)));
        } else {
          sweep_fields.push_back(absl::StrFormat(
              "\"%s\":{\"retries\":%d,\"retries_per_second\":%s,\"amplification\":%s,"
              "\"failed_calls\":%d}",
              SweepKey(regime, n, strategy), r.retries, Num(r.retries_per_second),
              Num(r.amplification), r.failed_calls));
        }
        if (std::string(strategy) == "fleet_budget") continue;
        ratios.push_back(absl::StrFormat("\"%s_%s_retries_vs_fleet_budget_at_%d\":%s", strategy,
                                         regime, n, Ratio(SweepRetries(r), SweepRetries(fleet))));
        if (outage) {
          ratios.push_back(absl::StrFormat(
              "\"%s_outage_first_second_retries_vs_fleet_budget_at_%d\":%s", strategy, n,
              Ratio(double(r.outage_first_second_retries),
                    double(fleet.outage_first_second_retries))));
        }
      }
    }
    if (sizes->size() >= 2) {
      const int lo = *std::min_element(sizes->begin(), sizes->end());
      const int hi = *std::max_element(sizes->begin(), sizes->end());
      for (const char* strategy : kStrategies) {
        ratios.push_back(
            absl::StrFormat("\"%s_%s_retries_at_%d_vs_at_%d\":%s", strategy, regime, hi, lo,
                            Ratio(SweepRetries(sweep.at(SweepKey(regime, hi, strategy))),
                                  SweepRetries(sweep.at(SweepKey(regime, lo, strategy))))));
      }
    }
  }
  absl::PrintF(
      "{\"bench\":\"amplification\",\"workers\":%d,\"call_sites\":%d,"
      "\"calls_per_second_per_site\":%.0f,\"results\":{%s},"
      "\"fleet_sweep\":{\"fleet_sizes\":[%s],\"fleet_calls_per_second\":%.0f,"
      "\"call_sites_per_worker\":%d,\"duration_s\":%.1f,\"outage_start_s\":%.1f,"
      "\"results\":{%s}},\"ratios\":{%s}}\n",
      absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_call_sites), absl::GetFlag(FLAGS_rate),
      absl::StrJoin(fields, ","), absl::StrJoin(*sizes, ","), sweep_cps, sweep_sites,
      absl::ToDoubleSeconds(absl::GetFlag(FLAGS_sweep_duration)),
      absl::ToDoubleSeconds(absl::GetFlag(FLAGS_sweep_outage_start)),
      absl::StrJoin(sweep_fields, ","), absl::StrJoin(ratios, ","));
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_out_dir).empty()) {
    WriteDataFiles(absl::GetFlag(FLAGS_out_dir), runs, *sizes, sweep);
  }
  return 0;
}

int RunDriver() {
  InstallSignalHandlers();
  const std::string dir = absl::StrCat("/tmp/retrybudget-bench-amp-", getpid());
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return Fail(absl::StrCat("cannot create ", dir));
  const int rc = RunDriverIn(dir);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return rc;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_worker)) return retrybudget::bench::RunWorker();
  return retrybudget::bench::RunDriver();
}
