#include "tools/fleet/worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <stop_token>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tools/fleet/fallback_monitor.h"
#include "tools/fleet/measured_budget.h"
#include "tools/fleet/observing_stub.h"
#include "tools/fleet/start_signal.h"

namespace retrybudget::fleet {
namespace {

// Distinct, reproducible seeds per worker and thread (splitmix64 of the triple).
uint64_t ThreadSeed(uint64_t seed, int worker, int thread) {
  uint64_t z = seed ^ (uint64_t(worker) << 32) ^ uint64_t(thread) ^ 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}


// What one thread counted beyond CallCounts.
struct ThreadExtras {
  uint64_t calls_in_fallback = 0;
  std::vector<uint64_t> calls_timeline;
  std::vector<uint64_t> retries_timeline;
  std::vector<uint64_t> denied_timeline;
  std::vector<uint64_t> successes_timeline;
  std::vector<uint64_t> requests_timeline;  // at RecordRequest() (MeasuredBudget)
  std::vector<uint64_t> tokens_timeline;    // at TryAcquire() (MeasuredBudget)
  std::chrono::steady_clock::duration max_try_acquire{0};
  uint64_t retries_allowed_in_fallback = 0;
  uint64_t retries_allowed_after_fallback = 0;

  void GrowTimelines(size_t slices) {
    calls_timeline.resize(slices, 0);
    retries_timeline.resize(slices, 0);
    denied_timeline.resize(slices, 0);
    successes_timeline.resize(slices, 0);
  }
};

void AddTimeline(std::vector<uint64_t>& sum, const std::vector<uint64_t>& add) {
  if (sum.size() < add.size()) sum.resize(add.size(), 0);
  for (size_t i = 0; i < add.size(); ++i) sum[i] += add[i];
}

// Drops the empty tail (the slices past the last event).
void TrimTimeline(std::vector<uint64_t>& timeline) {
  while (!timeline.empty() && timeline.back() == 0) timeline.pop_back();
}

}  // namespace

absl::Duration WorkerTimelineSlice(absl::Duration duration, absl::Duration base) {
  return std::max(base, duration / 2000);
}

absl::StatusOr<std::vector<WorkerCounts>> RunWorker(const WorkerOptions& options) {
  // The tenants this worker's threads use, each once, in increasing index.
  std::vector<int> thread_tenant(static_cast<size_t>(options.threads));
  std::vector<int> used;
  for (int t = 0; t < options.threads; ++t) {
    thread_tenant[t] = FleetTenantOfThread(options.index, options.threads, t, options.tenants);
    used.push_back(thread_tenant[t]);
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  // Position of each used tenant in `used`.
  auto slot_of = [&used](int tenant_index) {
    return static_cast<size_t>(std::lower_bound(used.begin(), used.end(), tenant_index) -
                               used.begin());
  };
  std::vector<std::string> names;
  for (int i : used) names.push_back(FleetTenantName(options.tenant, options.tenants, i));

  std::unique_ptr<BudgetClient> client;
  SyncObservingStub* observer = nullptr;  // owned by the client
  std::vector<TenantBudget*> budgets(used.size(), nullptr);
  if (options.strategy != RetryStrategy::kUnbudgeted) {
    ClientOptions client_options;
    client_options.target = options.target;
    client_options.instance_id = absl::StrCat("fleet-w", options.index, "-", getpid(), "-",
                                              ThreadSeed(options.seed, options.index, -1));
    if (options.refresh_period > absl::ZeroDuration()) {
      client_options.refresh_period = options.refresh_period;
    }
    if (options.lease_burst > 0) client_options.lease_burst = options.lease_burst;
    if (options.fallback_deny) client_options.fallback = FallbackMode::kDeny;
    // The channel BudgetClient::Create() makes (insecure: the fleet runs on loopback), so the
    // worker reconnects after a server restart exactly as a library user's client does.
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateBudgetChannel(client_options);
    if (!channel.ok()) return channel.status();
    auto observing = std::make_unique<SyncObservingStub>(
        v1::RetryBudgetService::NewStub(*std::move(channel)));
    observer = observing.get();
    // In cluster mode a tenant is synced with its owner (a redirect names it) over a channel of
    // its own, made as Create() makes it, observed like the main one.
    OwnerStubFactory owner_stubs =
        [observer, client_options](
            const std::string& address) -> std::unique_ptr<v1::RetryBudgetService::StubInterface> {
      ClientOptions owner_options = client_options;
      owner_options.target = address;
      absl::StatusOr<std::shared_ptr<grpc::Channel>> owner_channel =
          CreateBudgetChannel(owner_options);
      if (!owner_channel.ok()) return nullptr;
      return observer->Sibling(v1::RetryBudgetService::NewStub(*std::move(owner_channel)));
    };
    absl::StatusOr<std::unique_ptr<TestingBudgetClient>> created =
        CreateBudgetClientForTesting(std::move(client_options), std::move(observing),
                                     std::move(owner_stubs), /*start_refresher_thread=*/true);
    if (!created.ok()) return created.status();
    client = *std::move(created);
    for (size_t i = 0; i < used.size(); ++i) {
      absl::StatusOr<TenantBudget*> tenant = client->Tenant(names[i]);
      if (!tenant.ok()) return tenant.status();
      budgets[i] = *tenant;
    }
    // A tenant's first answer is the server's baseline for this instance: what is counted
    // before it reaches the server is not credited (docs/DESIGN.md "Accounting"). Calls start
    // once every tenant was answered by its owner, so the server's totals match the workers'
    // counts; bounded, so a server that is down does not hold the run.
    const absl::Time first_sync_by = absl::Now() + absl::Seconds(3);
    auto all_answered = [&] {
      for (const std::string& name : names) {
        if (!observer->LongestGrantGap(name, absl::Now()).has_value()) return false;
      }
      return true;
    };
    while (!all_answered() && absl::Now() < first_sync_by) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  std::vector<std::unique_ptr<FallbackMonitor>> monitors(used.size());
  for (size_t i = 0; i < used.size(); ++i) {
    if (budgets[i] == nullptr) continue;
    const ClientOptions defaults;
    monitors[i] = std::make_unique<FallbackMonitor>(
        *budgets[i],
        FallbackSources{
            .safe_share = [observer, name = names[i]] { return observer->FallbackShare(name); },
            .never_reached = {.capacity = defaults.fallback_capacity,
                              .refill_per_second = defaults.fallback_refill_per_second}});
    monitors[i]->Start(options.monitor_period);
  }

  const auto slice = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(WorkerTimelineSlice(options.duration, options.timeline_slice)));
  // The timelines count from the fleet's start (the start signal's origin), which may be well
  // before this worker's first call: the client's creation and first Sync come in between.
  const auto now = std::chrono::steady_clock::now();
  const auto start = std::min(now, options.timeline_origin.value_or(now));
  const absl::Time start_time = absl::Now() - absl::FromChrono(now - start);
  const size_t slices = TimelineSliceOf(start, now + absl::ToChronoNanoseconds(options.duration),
                                        slice) + 2;

  std::stop_source stop;
  std::vector<CallCounts> per_thread(static_cast<size_t>(options.threads));
  std::vector<ThreadExtras> extras(per_thread.size());
  std::vector<std::thread> threads;
  threads.reserve(per_thread.size());
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&, t] {
      SimulatedBackend backend({.failure_rate = options.failure_rate,
                                .latency = options.call_latency,
                                .seed = ThreadSeed(options.seed, options.index, t)});
      CallCounts& counts = per_thread[static_cast<size_t>(t)];
      ThreadExtras& x = extras[static_cast<size_t>(t)];
      x.GrowTimelines(slices);
      const size_t slot = slot_of(thread_tenant[static_cast<size_t>(t)]);
      std::optional<MeasuredBudget> measured;
      if (budgets[slot] != nullptr) {
        measured.emplace(*budgets[slot], monitors[slot].get(),
                         MeasuredBudget::Timeline{.origin = start, .slice = slice});
      }
      TenantBudget* b = measured.has_value() ? &*measured : nullptr;
      const std::stop_token token = stop.get_token();
      const absl::Time first_call = absl::Now();
      for (int64_t k = 0; !token.stop_requested(); ++k) {
        if (options.call_interval > absl::ZeroDuration()) {
          Clock::Real()->SleepUntil(first_call + k * options.call_interval, token);
          if (token.stop_requested()) break;
        }
        const size_t i = TimelineSliceOf(start, std::chrono::steady_clock::now(), slice);
        if (i >= x.calls_timeline.size()) x.GrowTimelines(i + 1);  // a late call: never clamped
        if (measured.has_value() && measured->Phase() == FallbackPhase::kInFallback) {
          ++x.calls_in_fallback;
        }
        const CallCounts before = counts;
        RunLogicalCall(options.strategy, options.call, backend, b, token, counts);
        ++x.calls_timeline[i];
        x.retries_timeline[i] += counts.retries_allowed - before.retries_allowed;
        x.denied_timeline[i] += counts.retries_denied - before.retries_denied;
        x.successes_timeline[i] += counts.successes - before.successes;
      }
      if (measured.has_value()) {
        x.max_try_acquire = measured->max_try_acquire();
        x.retries_allowed_in_fallback = measured->retries_allowed_in_fallback();
        x.retries_allowed_after_fallback = measured->retries_allowed_after_fallback();
        x.requests_timeline = measured->requests_timeline();
        x.tokens_timeline = measured->tokens_timeline();
      }
    });
  }
  Clock::Real()->SleepUntil(absl::Now() + options.duration, std::stop_token());
  stop.request_stop();
  for (std::thread& th : threads) th.join();
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<WorkerCounts> outs(used.size());
  for (size_t k = 0; k < used.size(); ++k) {
    WorkerCounts& out = outs[k];
    CallCounts total;
    std::chrono::steady_clock::duration max_try_acquire{0};
    for (int t = 0; t < options.threads; ++t) {
      if (slot_of(thread_tenant[static_cast<size_t>(t)]) != k) continue;
      total += per_thread[static_cast<size_t>(t)];
      const ThreadExtras& x = extras[static_cast<size_t>(t)];
      out.calls_in_fallback += x.calls_in_fallback;
      out.retries_allowed_in_fallback += x.retries_allowed_in_fallback;
      out.retries_allowed_after_fallback += x.retries_allowed_after_fallback;
      max_try_acquire = std::max(max_try_acquire, x.max_try_acquire);
      if (out.calls_timeline.size() < x.calls_timeline.size()) {
        out.calls_timeline.resize(x.calls_timeline.size(), 0);
        out.retries_timeline.resize(x.calls_timeline.size(), 0);
        out.denied_timeline.resize(x.calls_timeline.size(), 0);
        out.successes_timeline.resize(x.calls_timeline.size(), 0);
      }
      for (size_t i = 0; i < x.calls_timeline.size(); ++i) {
        out.calls_timeline[i] += x.calls_timeline[i];
        out.retries_timeline[i] += x.retries_timeline[i];
        out.denied_timeline[i] += x.denied_timeline[i];
        out.successes_timeline[i] += x.successes_timeline[i];
      }
      AddTimeline(out.requests_timeline, x.requests_timeline);
      AddTimeline(out.tokens_timeline, x.tokens_timeline);
    }
    out.worker = options.index;
    out.tenant_index = used[k];
    out.calls = total.calls;
    out.attempts = total.attempts;
    out.successes = total.successes;
    out.failures = total.failures;
    out.retries_allowed = total.retries_allowed;
    out.retries_denied = total.retries_denied;
    out.requests = total.requests;
    out.tokens_spent = total.tokens_spent;
    out.run_seconds = run_seconds;
    out.timeline_slice_seconds = std::chrono::duration<double>(slice).count();
    // Drop the empty tail (the slices past the end of the run).
    while (!out.calls_timeline.empty() && out.calls_timeline.back() == 0) {
      out.calls_timeline.pop_back();
      out.retries_timeline.pop_back();
      out.denied_timeline.pop_back();
      out.successes_timeline.pop_back();
    }
    TrimTimeline(out.requests_timeline);
    TrimTimeline(out.tokens_timeline);
    out.max_try_acquire_ms = std::chrono::duration<double, std::milli>(max_try_acquire).count();
    out.shutdown_status = "OK";
  }
  if (client != nullptr) {
    const absl::Time run_end = absl::Now();
    for (size_t k = 0; k < used.size(); ++k) {
      WorkerCounts& out = outs[k];
      // The monitors stop before the final Sync: the run is over.
      const FallbackReport fallback = monitors[k]->Finish();
      out.fallback_seconds = fallback.fallback_seconds;
      out.fallback_entries = fallback.fallback_entries;
      out.fallback_allowance = fallback.fallback_allowance;
      out.safe_share_capacity = fallback.safe_share_capacity;
      out.safe_share_refill = fallback.safe_share_refill;
      out.lease_after_fallback = fallback.lease_after_fallback ? 1 : 0;
      if (std::optional<SyncObservingStub::GrantGap> gap =
              observer->LongestGrantGap(names[k], run_end);
          gap.has_value()) {
        out.ungranted_gap_max_seconds = absl::ToDoubleSeconds(gap->longest);
        out.granted_again_at_seconds = absl::ToDoubleSeconds(gap->ended_at - start_time);
      }
      for (absl::Time change : observer->ModeChanges(names[k])) {
        out.mode_changes_ms.push_back(static_cast<uint64_t>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(change - start_time))));
      }
    }
    absl::Status shutdown = client->Shutdown();
    for (size_t k = 0; k < used.size(); ++k) {
      WorkerCounts& out = outs[k];
      if (!shutdown.ok()) out.shutdown_status = shutdown.ToString();
      TenantStats stats = budgets[k]->Stats();
      out.lib_successes = stats.successes;
      out.lib_retries_allowed = stats.retries_allowed;
      out.lib_retries_denied = stats.retries_denied;
      out.lib_fallback_allowed = stats.fallback_allowed;
      out.lib_tokens_received = stats.tokens_received;
      out.lib_tokens_returned = stats.tokens_returned;
      out.lib_tokens_held = stats.tokens_held;
      out.lib_successes_credited_locally = stats.successes_credited_locally;
      out.lib_requests = stats.requests;
      out.lib_shadow_denied = stats.shadow_denied;
    }
    outs[0].syncs_ok = observer->syncs_ok();
    outs[0].syncs_failed = observer->syncs_failed();
  }
  return outs;
}

}  // namespace retrybudget::fleet
