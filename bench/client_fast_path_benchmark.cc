// Client fast path: what one TenantBudget::TryAcquire() and RecordSuccess() cost, next to the
// floor they are built on (a bare relaxed std::atomic decrement / fetch_add) in the same binary.
//
// Why: DESIGN.md promises that a retry decision is "an atomic decrement"; the target is at
// most 2x the bare atomic, with 1 and 2 threads. The budget is a real TenantBudget of a real
// BudgetClient (CreateBudgetClientForTesting) whose lease holds ~2^31 tokens, granted by a stub in
// one RunOnce() before the timed loop, so every timed TryAcquire() takes the fast path.
//
// Baselines:
//   BM_BareAtomicDecrement  relaxed fetch_sub on one shared std::atomic<uint64_t>
//   BM_BareAtomicIncrement  relaxed fetch_add on one shared std::atomic<uint64_t>
//   BM_BareCasDecrement     the same decrement written as Lease::TryTake writes it (load + CAS
//                           loop, acq_rel): isolates the CAS-loop cost from the library's
// With 2 threads every variant hits ONE shared cache line, as the library does (one lease per
// tenant per process), so the baseline pays the same line bouncing.
//
// After the Google Benchmark table the binary prints one JSON line:
//   {"bench":"client_fast_path", "ns":{...}, "ratios":{...}, "targets":{...}}
// with ratio = library ns/op / bare ns/op for the same thread count.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmark/benchmark.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget_mock.grpc.pb.h"

namespace retrybudget {
namespace {

// Grants every tenant the most tokens a lease can hold, with a lease that never expires on the
// fake clock. Overrides the mock's Sync, so no expectation is needed.
class GenerousStub final : public v1::MockRetryBudgetServiceStub {
 public:
  grpc::Status Sync(grpc::ClientContext*, const v1::SyncRequest& request,
                    v1::SyncResponse* response) override {
    for (const auto& t : request.tenants()) {
      v1::TenantGrant* g = response->add_tenants();
      g->set_tenant(t.tenant());
      g->set_granted(request.final() ? 0 : (uint64_t{1} << 31) - 1);
      g->set_lease_ttl_ms(600'000);
      g->set_next_sync_ms(1000);
      g->set_capacity(1e12);
      g->set_active_instances(1);
    }
    return grpc::Status::OK;
  }
};

// One client with a full lease, rebuilt for every benchmark run (thread 0, before the timed loop;
// Google Benchmark starts the threads' loops together after that).
struct Fixture {
  FakeClock clock;
  std::unique_ptr<TestingBudgetClient> client;
  TenantBudget* budget = nullptr;
};
Fixture* g_fixture = nullptr;

void SetUpBudget(benchmark::State& state) {
  if (state.thread_index() != 0) return;
  delete g_fixture;
  g_fixture = new Fixture;
  ClientOptions options;
  options.clock = &g_fixture->clock;
  auto client = CreateBudgetClientForTesting(options, std::make_unique<GenerousStub>());
  if (!client.ok()) {
    state.SkipWithError(std::string(client.status().message()).c_str());
    return;
  }
  g_fixture->client = *std::move(client);
  auto budget = g_fixture->client->Tenant("bench-tenant");
  if (!budget.ok()) {
    state.SkipWithError(std::string(budget.status().message()).c_str());
    return;
  }
  g_fixture->budget = *budget;
  g_fixture->client->RunOnce();  // sends the first Sync: the lease now holds 2^31-1 tokens
  if (g_fixture->budget->Stats().tokens_held <= 0) state.SkipWithError("no lease granted");
}

void BM_TryAcquire(benchmark::State& state) {
  SetUpBudget(state);
  uint64_t denied = 0;
  for (auto _ : state) {
    const bool ok = g_fixture->budget->TryAcquire();
    denied += ok ? 0 : 1;
    benchmark::DoNotOptimize(ok);
  }
  // Every timed call must have been a fast-path take; a denial would measure the slow path.
  state.counters["denied"] = benchmark::Counter(static_cast<double>(denied),
                                                benchmark::Counter::kAvgThreads);
}

void BM_RecordSuccess(benchmark::State& state) {
  SetUpBudget(state);
  for (auto _ : state) g_fixture->budget->RecordSuccess();
}

// One cache line per variable, shared by all threads of a run, as the lease word is.
alignas(64) std::atomic<uint64_t> g_word{uint64_t{1} << 62};
alignas(64) std::atomic<uint64_t> g_count{0};

void BM_BareAtomicDecrement(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(g_word.fetch_sub(1, std::memory_order_relaxed));
  }
}

void BM_BareAtomicIncrement(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(g_count.fetch_add(1, std::memory_order_relaxed));
  }
}

// Lease::TryTake's shape without the library around it: load, check, CAS-weak loop.
void BM_BareCasDecrement(benchmark::State& state) {
  for (auto _ : state) {
    uint64_t w = g_word.load(std::memory_order_relaxed);
    while (w != 0 && !g_word.compare_exchange_weak(w, w - 1, std::memory_order_acq_rel,
                                                   std::memory_order_relaxed)) {
    }
    benchmark::DoNotOptimize(w);
  }
}

// Three repetitions each; the summary takes the fastest (see SummaryReporter).
BENCHMARK(BM_BareAtomicDecrement)->Threads(1)->Threads(2)->UseRealTime()->Repetitions(3);
BENCHMARK(BM_BareCasDecrement)->Threads(1)->Threads(2)->UseRealTime()->Repetitions(3);
BENCHMARK(BM_TryAcquire)->Threads(1)->Threads(2)->UseRealTime()->Repetitions(3);
BENCHMARK(BM_BareAtomicIncrement)->Threads(1)->Threads(2)->UseRealTime()->Repetitions(3);
BENCHMARK(BM_RecordSuccess)->Threads(1)->Threads(2)->UseRealTime()->Repetitions(3);

// Collects ns/op per benchmark and thread count (e.g. "BM_TryAcquire/2"), for the JSON line.
// With UseRealTime and N threads, Google Benchmark reports wall time per iteration of one
// thread; the per-operation cost of the whole process is that divided by N, which is the same
// for the baseline and the library, so ratios are unaffected.
class SummaryReporter final : public benchmark::ConsoleReporter {
 public:
  // No colour codes: the JSON line must start its line for scripts (grep '^{').
  SummaryReporter() : ConsoleReporter(OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      // The fastest of the repetitions: on a shared VM, noise only ever adds time.
      const double ns = run.GetAdjustedRealTime();  // ns (the default time unit)
      auto [it, inserted] =
          ns_.emplace(absl::StrCat(run.run_name.function_name, "/", run.threads), ns);
      if (!inserted) it->second = std::min(it->second, ns);
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void PrintSummary() const {
    auto get = [&](const std::string& bm, int threads) {
      auto it = ns_.find(absl::StrCat(bm, "/", threads));
      return it == ns_.end() ? -1.0 : it->second;
    };
    std::vector<std::string> ns_fields, ratio_fields, target_fields;
    for (int threads : {1, 2}) {
      const double dec = get("BM_BareAtomicDecrement", threads);
      const double cas = get("BM_BareCasDecrement", threads);
      const double inc = get("BM_BareAtomicIncrement", threads);
      const double acq = get("BM_TryAcquire", threads);
      const double suc = get("BM_RecordSuccess", threads);
      const std::string t = absl::StrCat("_", threads, "t");
      ns_fields.push_back(absl::StrCat("\"bare_decrement", t, "\":", dec));
      ns_fields.push_back(absl::StrCat("\"bare_cas_decrement", t, "\":", cas));
      ns_fields.push_back(absl::StrCat("\"bare_increment", t, "\":", inc));
      ns_fields.push_back(absl::StrCat("\"try_acquire", t, "\":", acq));
      ns_fields.push_back(absl::StrCat("\"record_success", t, "\":", suc));
      const double r_acq = dec > 0 ? acq / dec : -1;
      const double r_acq_cas = cas > 0 ? acq / cas : -1;
      const double r_suc = inc > 0 ? suc / inc : -1;
      ratio_fields.push_back(absl::StrCat("\"try_acquire_vs_bare_decrement", t, "\":", r_acq));
      ratio_fields.push_back(absl::StrCat("\"try_acquire_vs_bare_cas", t, "\":", r_acq_cas));
      ratio_fields.push_back(absl::StrCat("\"record_success_vs_bare_increment", t, "\":", r_suc));
      target_fields.push_back(absl::StrCat("\"try_acquire_at_most_2x", t, "\":",
                                           r_acq > 0 && r_acq <= 2 ? "true" : "false"));
      target_fields.push_back(absl::StrCat("\"record_success_at_most_2x", t, "\":",
                                           r_suc > 0 && r_suc <= 2 ? "true" : "false"));
    }
    std::printf(
        "{\"bench\":\"client_fast_path\",\"unit\":\"ns_per_op_per_thread\",\"ns\":{%s},"
        "\"ratios\":{%s},\"targets\":{%s}}\n",
        absl::StrJoin(ns_fields, ",").c_str(), absl::StrJoin(ratio_fields, ",").c_str(),
        absl::StrJoin(target_fields, ",").c_str());
    std::fflush(stdout);
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace
}  // namespace retrybudget

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  retrybudget::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  delete retrybudget::g_fixture;
  return 0;
}
