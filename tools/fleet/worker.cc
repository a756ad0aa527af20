#include "tools/fleet/worker.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"

namespace retrybudget::fleet {
namespace {

// Distinct, reproducible seeds per worker and thread (splitmix64 of the triple).
uint64_t ThreadSeed(uint64_t seed, int worker, int thread) {
  uint64_t z = seed ^ (uint64_t(worker) << 32) ^ uint64_t(thread) ^ 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<WorkerCounts> RunWorker(const WorkerOptions& options) {
  std::unique_ptr<BudgetClient> client;
  TenantBudget* budget = nullptr;
  if (options.strategy == RetryStrategy::kBudget) {
    ClientOptions client_options;
    client_options.target = options.target;
    client_options.instance_id = absl::StrCat("fleet-w", options.index, "-", getpid(), "-",
                                              ThreadSeed(options.seed, options.index, -1));
    if (options.refresh_period > absl::ZeroDuration()) {
      client_options.refresh_period = options.refresh_period;
    }
    if (options.lease_burst > 0) client_options.lease_burst = options.lease_burst;
    absl::StatusOr<std::unique_ptr<BudgetClient>> created =
        BudgetClient::Create(std::move(client_options));
    if (!created.ok()) return created.status();
    client = *std::move(created);
    absl::StatusOr<TenantBudget*> tenant = client->Tenant(options.tenant);
    if (!tenant.ok()) return tenant.status();
    budget = *tenant;
  }

  std::atomic<bool> stop{false};
  std::vector<CallCounts> per_thread(static_cast<size_t>(options.threads));
  std::vector<std::thread> threads;
  threads.reserve(per_thread.size());
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&, t] {
      SimulatedBackend backend({.failure_rate = options.failure_rate,
                                .latency = options.call_latency,
                                .seed = ThreadSeed(options.seed, options.index, t)});
      CallCounts& counts = per_thread[static_cast<size_t>(t)];
      while (!stop.load(std::memory_order_relaxed)) {
        RunLogicalCall(options.strategy, options.call, backend, budget, stop, counts);
      }
    });
  }
  Clock::Real()->SleepUntil(absl::Now() + options.duration, std::stop_token());
  stop.store(true, std::memory_order_relaxed);
  for (std::thread& th : threads) th.join();
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  CallCounts total;
  for (const CallCounts& c : per_thread) total += c;
  WorkerCounts out;
  out.worker = options.index;
  out.calls = total.calls;
  out.attempts = total.attempts;
  out.successes = total.successes;
  out.failures = total.failures;
  out.retries_allowed = total.retries_allowed;
  out.retries_denied = total.retries_denied;
  out.run_seconds = run_seconds;
  out.shutdown_status = "OK";
  if (client != nullptr) {
    absl::Status shutdown = client->Shutdown();
    if (!shutdown.ok()) out.shutdown_status = shutdown.ToString();
    TenantStats stats = budget->Stats();
    out.lib_successes = stats.successes;
    out.lib_retries_allowed = stats.retries_allowed;
    out.lib_retries_denied = stats.retries_denied;
    out.lib_fallback_allowed = stats.fallback_allowed;
    out.lib_tokens_received = stats.tokens_received;
    out.lib_tokens_returned = stats.tokens_returned;
    out.lib_tokens_held = stats.tokens_held;
  }
  return out;
}

}  // namespace retrybudget::fleet
