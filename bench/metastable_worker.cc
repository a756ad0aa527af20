// A worker process of the metastable-failure experiment's open-loop fleet (bench/metastable.py;
// docs/BENCHMARKS.md 13). From --epoch_unix_ms + --start for --duration it starts logical calls
// to the backend (bench/metastable_backend.cc) at a fixed --rate, one every 1 / rate seconds
// shifted by --phase of an interval, whatever happened to earlier calls (open loop). Each attempt
// has a deadline of --timeout_ms; a failed attempt is resent while the call has made fewer than
// --max_attempts and the strategy allows, at once (--backoff=immediate, as in the OSDI'22
// artifact) or after the project's full-jitter backoff (--backoff=jitter: retrybudget::
// ComputeBackoff with the default RetryPolicy, 50 ms doubling up to 5 s).
//
// Strategies (bench/amplification_strategies.h, the same gates as the amplification bench):
//   none     one attempt per call (no resend): the floor
//   caps     every failed attempt resent while attempts remain (PerCallCapGate)
//   process  gRPC retryThrottling in this process, max_tokens 100, token_ratio 0.1
//            (ProcessThrottleGate; --max_tokens, --token_ratio)
//   fleet    this project's budget: TryAcquire() per resend and RecordSuccess() per succeeded
//            call on a TenantBudget of the real client library leased from --budget_target
//            (FleetBudgetGate); the worker waits for the tenant's first answer (WaitReady)
//            before it says it is ready.
//
// Output (stdout): `{"ready":true}` once ready, then one JSON line per second of the run
// (`{"t":T,...}` for [epoch + T, epoch + T + 1), printed once the second is 2 s old): offered
// (calls started), ok (calls that succeeded, counted when they did), failed (calls given up:
// attempts exhausted or a resend refused), attempts and retries (sent), denied (resends the
// strategy refused); and last `{"totals":{...}}` once every call has ended. Closing stdin
// stops the calls early.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/amplification_strategies.h"
#include "bench/metastable.grpc.pb.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"

ABSL_FLAG(std::string, target, "", "the backend's address");
ABSL_FLAG(double, rate, 10, "logical calls per second this process starts");
ABSL_FLAG(double, phase, 0, "shift of this process's call times, in [0, 1) of an interval");
ABSL_FLAG(int64_t, epoch_unix_ms, 0, "time 0 of the run (0: now)");
ABSL_FLAG(absl::Duration, start, absl::ZeroDuration(), "calls start at epoch + start");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10), "how long calls are started");
ABSL_FLAG(int, timeout_ms, 1000, "deadline of one attempt");
ABSL_FLAG(int, max_attempts, 5, "attempts per call, the first included (5 = up to 4 resends)");
ABSL_FLAG(std::string, strategy, "caps", "none, caps, process or fleet");
ABSL_FLAG(std::string, backoff, "immediate", "immediate or jitter");
ABSL_FLAG(double, max_tokens, 100, "process: retryThrottling max_tokens");
ABSL_FLAG(double, token_ratio, 0.1, "process: retryThrottling token_ratio");
ABSL_FLAG(std::string, budget_target, "", "fleet: the retry-budget-server's address");
ABSL_FLAG(std::string, tenant, "metastable", "fleet: the tenant");
ABSL_FLAG(uint64_t, seed, 1, "seed of the backoff's jitter");

namespace retrybudget::bench {
namespace {

struct Row {
  uint64_t offered = 0, ok = 0, failed = 0, attempts = 0, retries = 0, denied = 0;
};

// Per-second rows keyed by seconds since the epoch. Thread-safe.
class Rows {
 public:
  explicit Rows(absl::Time epoch) : epoch_(epoch) {}
  template <typename F>
  void Add(F&& f) {
    const int64_t t = absl::ToInt64Seconds(absl::Now() - epoch_);
    absl::MutexLock lock(&mu_);
    f(rows_[t]);
    f(totals_);
  }
  // Prints and forgets every row older than `before` seconds since the epoch.
  void PrintBefore(int64_t before) {
    absl::MutexLock lock(&mu_);
    while (!rows_.empty() && rows_.begin()->first < before) {
      std::printf("{\"t\":%lld,%s}\n", static_cast<long long>(rows_.begin()->first),
                  Fields(rows_.begin()->second).c_str());
      rows_.erase(rows_.begin());
    }
    std::fflush(stdout);
  }
  void PrintTotals() {
    absl::MutexLock lock(&mu_);
    std::printf("{\"totals\":{%s}}\n", Fields(totals_).c_str());
    std::fflush(stdout);
  }

 private:
  static std::string Fields(const Row& r) {
    return absl::StrCat("\"offered\":", r.offered, ",\"ok\":", r.ok, ",\"failed\":", r.failed,
                        ",\"attempts\":", r.attempts, ",\"retries\":", r.retries,
                        ",\"denied\":", r.denied);
  }

  const absl::Time epoch_;
  absl::Mutex mu_;
  std::map<int64_t, Row> rows_ ABSL_GUARDED_BY(mu_);
  Row totals_ ABSL_GUARDED_BY(mu_);
};

struct Options {
  absl::Duration timeout;
  int max_attempts;
  bool jitter;
};

// The open-loop caller: one Call object per logical call, alive until the call ends.
class Caller {
 public:
  Caller(MetastableBackend::Stub* stub, RetryGate* gate, Rows* rows, Options options,
         uint64_t seed)
      : stub_(stub), gate_(gate), rows_(rows), options_(options), rng_(seed) {}

  void StartCall() {
    in_flight_.fetch_add(1);
    rows_->Add([](Row& r) { ++r.offered; });
    Send(new Call);
  }
  // Waits until every call has ended.
  void Drain() {
    while (in_flight_.load() > 0) absl::SleepFor(absl::Milliseconds(20));
  }

 private:
  struct Call {
    int attempts = 0;
    WorkRequest request;
    WorkResponse response;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::Alarm> alarm;
  };

  void Send(Call* call) {
    ++call->attempts;
    const bool resend = call->attempts > 1;
    rows_->Add([resend](Row& r) {
      ++r.attempts;
      if (resend) ++r.retries;
    });
    call->request.set_attempt(call->attempts);
    call->ctx = std::make_unique<grpc::ClientContext>();
    call->ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    stub_->async()->Work(call->ctx.get(), &call->request, &call->response,
                         [this, call](grpc::Status status) { OnDone(call, status); });
  }

  void OnDone(Call* call, const grpc::Status& status) {
    gate_->OnAttempt(status.ok());
    if (status.ok()) {
      gate_->OnCallSucceeded();
      rows_->Add([](Row& r) { ++r.ok; });
      End(call);
      return;
    }
    if (call->attempts >= options_.max_attempts) {
      rows_->Add([](Row& r) { ++r.failed; });
      End(call);
      return;
    }
    if (!gate_->AllowRetry()) {
      rows_->Add([](Row& r) {
        ++r.denied;
        ++r.failed;
      });
      End(call);
      return;
    }
    if (!options_.jitter) {
      Send(call);
      return;
    }
    const absl::Duration backoff = ComputeBackoff(RetryPolicy{}, call->attempts, Uniform());
    call->alarm = std::make_unique<grpc::Alarm>();
    call->alarm->Set(absl::ToChronoTime(absl::Now() + backoff),
                     [this, call](bool) { Send(call); });
  }

  void End(Call* call) {
    delete call;
    in_flight_.fetch_sub(1);
  }

  double Uniform() {
    absl::MutexLock lock(&rng_mu_);
    return std::uniform_real_distribution<double>(0, 1)(rng_);
  }

  MetastableBackend::Stub* const stub_;
  RetryGate* const gate_;
  Rows* const rows_;
  const Options options_;
  std::atomic<int64_t> in_flight_{0};
  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);
};

absl::Status CheckFlags() {
  const std::string strategy = absl::GetFlag(FLAGS_strategy);
  if (strategy != "none" && strategy != "caps" && strategy != "process" && strategy != "fleet") {
    return absl::InvalidArgumentError(
        absl::StrCat("--strategy='", strategy, "' is not one of none, caps, process, fleet"));
  }
  const std::string backoff = absl::GetFlag(FLAGS_backoff);
  if (backoff != "immediate" && backoff != "jitter") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backoff='", backoff, "' is not one of immediate, jitter"));
  }
  if (absl::GetFlag(FLAGS_target).empty()) return absl::InvalidArgumentError("--target is empty");
  if (!(absl::GetFlag(FLAGS_rate) > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--rate=", absl::GetFlag(FLAGS_rate), " is not > 0"));
  }
  if (absl::GetFlag(FLAGS_max_attempts) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_attempts=", absl::GetFlag(FLAGS_max_attempts), " is not >= 1"));
  }
  if (absl::GetFlag(FLAGS_timeout_ms) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout_ms=", absl::GetFlag(FLAGS_timeout_ms), " is not >= 1"));
  }
  if (strategy == "fleet" && absl::GetFlag(FLAGS_budget_target).empty()) {
    return absl::InvalidArgumentError("--strategy=fleet needs --budget_target");
  }
  return absl::OkStatus();
}

// The fleet strategy's client and tenant, ready (the tenant's first answer in).
struct FleetBudget {
  std::unique_ptr<BudgetClient> client;
  TenantBudget* tenant = nullptr;
};
absl::StatusOr<FleetBudget> ConnectFleetBudget() {
  FleetBudget fb;
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_budget_target);
  absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
  if (!client.ok()) return client.status();
  fb.client = *std::move(client);
  absl::StatusOr<TenantBudget*> tenant = fb.client->Tenant(absl::GetFlag(FLAGS_tenant));
  if (!tenant.ok()) return tenant.status();
  fb.tenant = *tenant;
  if (absl::Status s = fb.tenant->WaitReady(absl::Now() + absl::Seconds(10), {}); !s.ok()) {
    return s;
  }
  if (!fb.tenant->Stats().error.ok()) return fb.tenant->Stats().error;
  return fb;
}

// Starts calls on schedule until the run's end or stdin closes.
void Pace(Caller& caller, absl::Time epoch, const std::atomic<bool>& stop) {
  const absl::Duration interval = absl::Seconds(1) / absl::GetFlag(FLAGS_rate);
  const absl::Time first = epoch + absl::GetFlag(FLAGS_start) + interval * absl::GetFlag(FLAGS_phase);
  const absl::Time end = epoch + absl::GetFlag(FLAGS_start) + absl::GetFlag(FLAGS_duration);
  for (int64_t i = 0;; ++i) {
    const absl::Time at = first + interval * i;
    if (at >= end || stop.load()) return;
    absl::SleepFor(at - absl::Now());
    caller.StartCall();
  }
}

int Run() {
  if (absl::Status s = CheckFlags(); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  const std::string strategy = absl::GetFlag(FLAGS_strategy);
  std::unique_ptr<RetryGate> gate;
  FleetBudget fleet;
  if (strategy == "process") {
    gate = std::make_unique<ProcessThrottleGate>(absl::GetFlag(FLAGS_max_tokens),
                                                 absl::GetFlag(FLAGS_token_ratio));
  } else if (strategy == "fleet") {
    absl::StatusOr<FleetBudget> fb = ConnectFleetBudget();
    if (!fb.ok()) {
      std::cerr << "fleet budget at " << absl::GetFlag(FLAGS_budget_target) << ": "
                << fb.status() << "\n";
      return 1;
    }
    fleet = *std::move(fb);
    gate = std::make_unique<FleetBudgetGate>(fleet.tenant);
  } else {
    gate = std::make_unique<PerCallCapGate>();
  }
  const int max_attempts = strategy == "none" ? 1 : absl::GetFlag(FLAGS_max_attempts);

  const int64_t epoch_ms = absl::GetFlag(FLAGS_epoch_unix_ms);
  const absl::Time epoch = epoch_ms > 0 ? absl::FromUnixMillis(epoch_ms) : absl::Now();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials());
  // Connected before it says it is ready: no first call waits for the connection.
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
    std::cerr << "cannot connect to --target=" << absl::GetFlag(FLAGS_target) << "\n";
    return 1;
  }
  auto stub = MetastableBackend::NewStub(channel);
  Rows rows(epoch);
  Options options;
  options.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.max_attempts = max_attempts;
  options.jitter = absl::GetFlag(FLAGS_backoff) == "jitter";
  Caller caller(stub.get(), gate.get(), &rows, options, absl::GetFlag(FLAGS_seed));
  std::printf("{\"ready\":true}\n");
  std::fflush(stdout);

  std::atomic<bool> stop{false};
  std::thread stdin_watch([&stop] {
    char buf[256];
    while (read(0, buf, sizeof buf) > 0) {
    }
    stop = true;
  });
  stdin_watch.detach();
  std::atomic<bool> done{false};
  std::thread printer([&] {
    while (!done.load()) {
      absl::SleepFor(absl::Milliseconds(250));
      rows.PrintBefore(absl::ToInt64Seconds(absl::Now() - epoch) - 2);
    }
  });
  Pace(caller, epoch, stop);
  caller.Drain();
  done = true;
  printer.join();
  rows.PrintBefore(INT64_MAX);
  rows.PrintTotals();
  if (fleet.client != nullptr) (void)fleet.client->Shutdown();
  std::_Exit(0);  // the stdin watcher may still be blocked in read()
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return retrybudget::bench::Run();
}
