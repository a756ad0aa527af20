// The amplification experiment, the reason the project exists: how much load retries add to a
// failing backend under three strategies, in three regimes, with a fleet of real worker
// processes.
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
// Each run starts --workers processes (this binary with --worker), each with --call_sites
// threads that each make --rate logical calls per second (open loop: calls arrive on schedule
// whatever happens to earlier ones) for --duration. The backend is simulated in-process (an
// attempt fails with the regime's probability at that moment; no I/O, no backoff), so the
// numbers are the strategies' decisions, not the machine's speed. Every run of the fleet budget
// uses a fresh tenant, so each starts from a full bucket.
//
// Reported per run: amplification = backend attempts / logical calls (whole run, and during the
// outage only), retries per second (whole run, outage only), and the drain time: from the start
// of the outage until the retry rate stays at or below 10% of the logical call rate for the rest
// of the run (null: never). The baseline is per_call_cap in the same regime, same run.
//
// Output: one JSON line per run, then {"bench":"amplification",...}; with --out_dir, also
// amplification_timeseries.dat and amplification_table.dat for gnuplot (bench/plots.gp).
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/amplification_strategies.h"
#include "bench/bench_util.h"
#include "retrybudget/client.h"

ABSL_FLAG(int, workers, 4, "worker processes");
ABSL_FLAG(int, call_sites, 4, "call sites (threads) per worker");
ABSL_FLAG(double, rate, 100, "logical calls per second per call site");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(6), "length of each run");
ABSL_FLAG(absl::Duration, outage_start, absl::Seconds(2), "outage regime: when the outage starts");
ABSL_FLAG(absl::Duration, bucket, absl::Milliseconds(100), "time-series resolution");
ABSL_FLAG(int, max_attempts, 4, "attempts per logical call, first included (all strategies)");
ABSL_FLAG(std::string, out_dir, "", "where to write the gnuplot data files (none if empty)");
ABSL_FLAG(std::string, server_bin, RETRYBUDGET_SERVER_BIN, "the retry-budget-server binary");
// Worker-only flags (set by the driver).
ABSL_FLAG(bool, worker, false, "internal: run as one worker process");
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

int Buckets() {
  return static_cast<int>(absl::GetFlag(FLAGS_duration) / absl::GetFlag(FLAGS_bucket)) + 1;
}

// ---------------------------------------------------------------------------------------------
// Worker process: prints "ready", waits for "go <unix_nanos>", runs, prints the series.

int RunWorker() {
  absl::StatusOr<Regime> regime = ParseRegime(absl::GetFlag(FLAGS_regime));
  if (!regime.ok()) return 2;
  const std::string strategy = absl::GetFlag(FLAGS_strategy);
  std::unique_ptr<BudgetClient> client;
  std::unique_ptr<RetryGate> gate;
  if (strategy == "per_call_cap") {
    gate = std::make_unique<PerCallCapGate>();
  } else if (strategy == "process_throttle") {
    gate = std::make_unique<ProcessThrottleGate>(100, 0.1);
  } else if (strategy == "fleet_budget") {
    ClientOptions options;
    options.target = absl::GetFlag(FLAGS_server);
    auto created = BudgetClient::Create(options);
    if (!created.ok()) {
      std::fprintf(stderr, "worker: %s\n", std::string(created.status().message()).c_str());
      return 3;
    }
    client = *std::move(created);
    auto budget = client->Tenant(absl::GetFlag(FLAGS_tenant));
    if (!budget.ok()) return 3;
    gate = std::make_unique<FleetBudgetGate>(*budget);
  } else {
    return 2;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line) || !absl::StartsWith(line, "go ")) return 3;
  const absl::Time start = absl::FromUnixNanos(std::stoll(line.substr(3)));
  const absl::Time end = start + absl::GetFlag(FLAGS_duration);
  const absl::Duration bucket = absl::GetFlag(FLAGS_bucket);
  const absl::Duration outage_start = absl::GetFlag(FLAGS_outage_start);
  const absl::Duration interval = absl::Seconds(1.0 / absl::GetFlag(FLAGS_rate));
  const int sites = absl::GetFlag(FLAGS_call_sites);
  const int max_attempts = absl::GetFlag(FLAGS_max_attempts);

  std::vector<std::vector<Bucket>> per_site(sites, std::vector<Bucket>(Buckets()));
  std::vector<std::thread> threads;
  for (int s = 0; s < sites; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 1000 + s);
      // Call sites start staggered within one interval, as independent callers would.
      absl::Time next = start + interval * (static_cast<double>(s) / sites);
      while (next < end) {
        absl::SleepFor(next - absl::Now());
        const absl::Duration since = next - start;
        const double p = FailureProbability(*regime, since, outage_start);
        const CallResult r = RunLogicalCall(*gate, max_attempts, p, rng);
        Bucket& b = per_site[s][static_cast<size_t>(since / bucket)];
        ++b.calls;
        b.attempts += r.attempts;
        b.retries += r.attempts - 1;
        b.failed_calls += r.succeeded ? 0 : 1;
        next += interval;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (client != nullptr) (void)client->Shutdown();
  std::printf("series %d\n", Buckets());
  for (int i = 0; i < Buckets(); ++i) {
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
  std::string strategy, regime;
  std::vector<Bucket> series;
  uint64_t calls = 0, attempts = 0, retries = 0, failed_calls = 0;
  double amplification = 0;
  double retries_per_second = 0;
  double outage_amplification = -1;     // outage regime only
  double outage_retries_per_second = -1;
  double drain_seconds = -1;            // outage regime only; -1: never drained
};

absl::StatusOr<RunResult> RunOne(const std::string& strategy, const std::string& regime,
                                 const std::string& server, int run_index) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const std::string tenant = absl::StrFormat("amp-%s-%s-%d", regime, strategy, getpid());
  std::vector<Child> children;
  for (int w = 0; w < workers; ++w) {
    absl::StatusOr<Child> c = Child::Spawn(
        {SelfExe(), "--worker", absl::StrCat("--strategy=", strategy),
         absl::StrCat("--regime=", regime), absl::StrCat("--server=", server),
         absl::StrCat("--tenant=", tenant), absl::StrCat("--seed=", run_index * 100 + w + 1),
         absl::StrCat("--call_sites=", absl::GetFlag(FLAGS_call_sites)),
         absl::StrCat("--rate=", absl::GetFlag(FLAGS_rate)),
         absl::StrCat("--duration=", absl::FormatDuration(absl::GetFlag(FLAGS_duration))),
         absl::StrCat("--outage_start=", absl::FormatDuration(absl::GetFlag(FLAGS_outage_start))),
         absl::StrCat("--bucket=", absl::FormatDuration(absl::GetFlag(FLAGS_bucket))),
         absl::StrCat("--max_attempts=", absl::GetFlag(FLAGS_max_attempts))});
    if (!c.ok()) return c.status();
    children.push_back(*std::move(c));
  }
  for (auto& c : children) {
    absl::StatusOr<std::string> line = c.ReadLine(absl::Seconds(20));
    if (!line.ok() || *line != "ready") {
      return absl::UnavailableError(absl::StrCat("worker ", c.pid(), " did not get ready"));
    }
  }
  // Everyone starts on the same wall-clock instant; the fleet budget's clients are connected
  // (their first lease may still be on its way, as in a real start).
  const absl::Time start = absl::Now() + absl::Milliseconds(300);
  for (auto& c : children) {
    if (auto s = c.WriteLine(absl::StrCat("go ", absl::ToUnixNanos(start))); !s.ok()) return s;
  }
  RunResult r;
  r.strategy = strategy;
  r.regime = regime;
  r.series.assign(Buckets(), Bucket{});
  const absl::Duration wait = absl::GetFlag(FLAGS_duration) + absl::Seconds(20);
  for (auto& c : children) {
    absl::StatusOr<std::string> header = c.ReadLine(wait);
    if (!header.ok() || !absl::StartsWith(*header, "series ")) {
      return absl::UnavailableError(absl::StrCat("worker ", c.pid(), " sent no series"));
    }
    for (int i = 0; i < Buckets(); ++i) {
      absl::StatusOr<std::string> row = c.ReadLine(absl::Seconds(5));
      if (!row.ok()) return row.status();
      std::istringstream in(*row);
      Bucket b;
      in >> b.calls >> b.attempts >> b.retries >> b.failed_calls;
      r.series[i].calls += b.calls;
      r.series[i].attempts += b.attempts;
      r.series[i].retries += b.retries;
      r.series[i].failed_calls += b.failed_calls;
    }
    c.Stop(SIGTERM, absl::Seconds(5));
  }

  const double bucket_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_bucket));
  const double duration_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_duration));
  const int outage_bucket =
      static_cast<int>(absl::GetFlag(FLAGS_outage_start) / absl::GetFlag(FLAGS_bucket));
  uint64_t o_calls = 0, o_attempts = 0, o_retries = 0;
  for (int i = 0; i < Buckets(); ++i) {
    const Bucket& b = r.series[i];
    r.calls += b.calls;
    r.attempts += b.attempts;
    r.retries += b.retries;
    r.failed_calls += b.failed_calls;
    if (i >= outage_bucket) {
      o_calls += b.calls;
      o_attempts += b.attempts;
      o_retries += b.retries;
    }
  }
  r.amplification = r.calls ? double(r.attempts) / double(r.calls) : 0;
  r.retries_per_second = double(r.retries) / duration_s;
  if (regime == "outage") {
    r.outage_amplification = o_calls ? double(o_attempts) / double(o_calls) : 0;
    r.outage_retries_per_second =
        double(o_retries) / (duration_s - absl::ToDoubleSeconds(absl::GetFlag(FLAGS_outage_start)));
    // Drained at the first bucket from which retries stay <= 10% of calls to the end (the last
    // bucket is partial and skipped).
    int drained = -1;
    for (int i = Buckets() - 2; i >= outage_bucket; --i) {
      const Bucket& b = r.series[i];
      if (double(b.retries) > 0.1 * double(b.calls)) break;
      drained = i;
    }
    if (drained >= 0) r.drain_seconds = (drained - outage_bucket) * bucket_s;
  }
  return r;
}

std::string Num(double v) { return v < 0 ? "null" : absl::StrFormat("%.3f", v); }

std::string ToJson(const RunResult& r) {
  std::vector<std::string> retries_per_s;
  const double bucket_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_bucket));
  for (const Bucket& b : r.series) retries_per_s.push_back(absl::StrFormat("%.0f", b.retries / bucket_s));
  return absl::StrFormat(
      "{\"bench\":\"amplification_run\",\"strategy\":\"%s\",\"regime\":\"%s\",\"calls\":%d,"
      "\"attempts\":%d,\"retries\":%d,\"failed_calls\":%d,\"amplification\":%s,"
      "\"retries_per_second\":%s,\"outage_amplification\":%s,\"outage_retries_per_second\":%s,"
      "\"drain_seconds\":%s,\"retries_per_second_series\":[%s]}",
      r.strategy, r.regime, r.calls, r.attempts, r.retries, r.failed_calls, Num(r.amplification),
      Num(r.retries_per_second), Num(r.outage_amplification), Num(r.outage_retries_per_second),
      Num(r.drain_seconds), absl::StrJoin(retries_per_s, ","));
}

void WriteDataFiles(const std::string& dir, const std::map<std::string, RunResult>& runs) {
  const double bucket_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_bucket));
  const double outage_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_outage_start));
  // Retries/s over time in the outage regime, one column per strategy (time relative to the
  // outage start); the last, partial bucket is left out.
  std::ofstream ts(dir + "/amplification_timeseries.dat");
  ts << "# t_since_outage_s per_call_cap process_throttle fleet_budget (retries/s, outage)\n";
  for (int i = 0; i + 1 < Buckets(); ++i) {
    ts << absl::StrFormat("%.2f", i * bucket_s - outage_s);
    for (const char* s : kStrategies) {
      auto it = runs.find(absl::StrCat(s, "/outage"));
      ts << ' ' << (it == runs.end() ? 0.0 : it->second.series[i].retries / bucket_s);
    }
    ts << '\n';
  }
  // Amplification per regime (rows) and strategy (columns); outage = during the outage only.
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

int RunDriver() {
  const std::string dir = absl::StrCat("/tmp/retrybudget-bench-amp-", getpid());
  mkdir(dir.c_str(), 0755);
  int port = 0;
  absl::StatusOr<Child> server = StartBudgetServer(absl::GetFlag(FLAGS_server_bin), dir,
                                                  /*policy=*/"", &port);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::map<std::string, RunResult> runs;
  int index = 0;
  for (const char* regime : kRegimes) {
    for (const char* strategy : kStrategies) {
      absl::StatusOr<RunResult> r = RunOne(strategy, regime, address, ++index);
      if (!r.ok()) {
        std::fprintf(stderr, "%s/%s: %s\n", strategy, regime,
                     std::string(r.status().message()).c_str());
        return 1;
      }
      std::printf("%s\n", ToJson(*r).c_str());
      std::fflush(stdout);
      runs[absl::StrCat(strategy, "/", regime)] = *std::move(r);
    }
  }
  server->Stop(SIGTERM, absl::Seconds(5));

  // Summary: each strategy against per_call_cap in the same regime.
  std::vector<std::string> fields;
  for (const char* regime : kRegimes) {
    const bool outage = std::string(regime) == "outage";
    const RunResult& base = runs.at(absl::StrCat("per_call_cap/", regime));
    for (const char* strategy : kStrategies) {
      const RunResult& r = runs.at(absl::StrCat(strategy, "/", regime));
      const double amp = outage ? r.outage_amplification : r.amplification;
      const double base_amp = outage ? base.outage_amplification : base.amplification;
      const double rps = outage ? r.outage_retries_per_second : r.retries_per_second;
      const double base_rps = outage ? base.outage_retries_per_second : base.retries_per_second;
      fields.push_back(absl::StrFormat(
          "\"%s/%s\":{\"amplification\":%s,\"retries_per_second\":%s,"
          "\"retries_vs_per_call_cap\":%s%s}",
          strategy, regime, Num(amp), Num(rps), Num(base_rps > 0 ? rps / base_rps : -1),
          outage ? absl::StrCat(",\"drain_seconds\":", Num(r.drain_seconds)) : ""));
      (void)base_amp;
    }
  }
  std::printf("{\"bench\":\"amplification\",\"workers\":%d,\"call_sites\":%d,"
              "\"calls_per_second_per_site\":%.0f,\"results\":{%s}}\n",
              absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_call_sites),
              absl::GetFlag(FLAGS_rate), absl::StrJoin(fields, ",").c_str());
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_out_dir).empty()) WriteDataFiles(absl::GetFlag(FLAGS_out_dir), runs);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_worker)) return retrybudget::bench::RunWorker();
  return retrybudget::bench::RunDriver();
}
