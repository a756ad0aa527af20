// The server's Prometheus metrics (DESIGN.md "Metrics"), the only prometheus-cpp code of the
// server. Two collectables, both registered on the Exposer that main() starts:
//
//   auto rpc_metrics = std::make_shared<RpcMetrics>();
//   auto budget_metrics = std::make_shared<BudgetMetrics>(BudgetMetricsOptions{.core = core});
//   server_options.service.metrics = rpc_metrics.get();      // the per-RPC hook
//   exposer->RegisterCollectable(rpc_metrics);
//   exposer->RegisterCollectable(budget_metrics);
//
// Nothing here runs per TryAcquire() (that never reaches the server) nor per tenant per Sync:
//
//  * RpcMetrics counts each finished RPC with a few relaxed atomic increments (no lock, no
//    allocation); the MetricFamily objects are built only when Prometheus scrapes.
//  * BudgetMetrics reads BudgetCore::Snapshot() at scrape time, so per-tenant values cost the
//    hot path nothing at all.
//
// Exposed names (all counters are cumulative since the budget / the process started):
//
//   retry_budget_tokens{tenant}                        gauge    level of the bucket, tokens
//   retry_budget_capacity{tenant}                      gauge    capacity, tokens
//   retry_budget_active_instances{tenant}              gauge    instances synced within a TTL
//   retry_budget_granted_tokens_total{tenant}          counter  tokens granted in leases
//   retry_budget_wanted_tokens_total{tenant}           counter  tokens asked for
//   retry_budget_retries_total{tenant}                 counter  tokens clients' retries spent
//   retry_budget_retries_denied_total{tenant}          counter  retries clients denied
//   retry_budget_successes_total{tenant}               counter  successes clients reported
//   retry_budget_returned_tokens_total{tenant}         counter  leased tokens given back unspent
//   retry_budget_reclaimed_tokens_total{tenant}        counter  grants lost in transit, refunded
//   retry_budget_fallback_retries_total{tenant}        counter  of retries, from fallback buckets
//   retry_budget_uncredited_tokens_total{tenant}       counter  returns beyond grants, not credited
//   retry_budget_shadow{tenant}                        gauge    1 in shadow mode (a dry run), 0 enforced
//   retry_budget_shadow_denied_total{tenant}           counter  would-be denials of a shadow tenant
//   retry_budget_requests_total{tenant}                counter  requests (first attempts) reported
//   retry_budget_retries_allowed_total{tenant}         counter  retries allowed (retries_total: tokens)
//   retry_budget_window_deposits{tenant}               gauge    windowed: deposits within the last ttl
//   retry_budget_tenants                               gauge    budgets held by the server
//   retry_budget_store_errors_total                    counter  reservations not made durable
//   retry_budget_snapshots_total{result="ok|error"}    counter  snapshots written / failed
//   retry_budget_sync_requests_total{code}             counter  Sync RPCs by gRPC status code
//   retry_budget_sync_duration_seconds                 histogram  Sync handler time
//   retry_budget_admin_requests_total{rpc,code}        counter  admin RPCs by method and code
//
// Label cardinality is bounded: at most `max_tenants` tenant label values; the budgets past
// that share tenant="_other" (counters and gauges summed).
#ifndef RETRYBUDGET_SERVER_METRICS_H_
#define RETRYBUDGET_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "retrybudget/mutex.h"
#include "server/budget_core.h"
#include "server/service.h"
#include "server/snapshotter.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace retrybudget {

// The tenant label value shared by every budget past BudgetMetricsOptions::max_tenants.
inline constexpr char kOtherTenantLabel[] = "_other";

// Upper bounds of retry_budget_sync_duration_seconds, in seconds (+Inf is implied).
inline constexpr std::array<double, 14> kSyncDurationBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};

// Per-RPC counters and the Sync latency histogram: a ServiceMetrics for the services and a
// prometheus::Collectable for the Exposer. Thread-safe; RpcFinished() is lock-free.
class RpcMetrics final : public ServiceMetrics, public prometheus::Collectable {
 public:
  RpcMetrics() = default;
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;

  void RpcFinished(Rpc rpc, absl::StatusCode code, absl::Duration elapsed) override;
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  static constexpr size_t kRpcs = 6;    // enum Rpc
  static constexpr size_t kCodes = 17;  // google.rpc.Code 0..16

  std::array<std::array<std::atomic<uint64_t>, kCodes>, kRpcs> requests_{};
  // Sync only: per-bucket (non-cumulative) counts, the last one for +Inf, and the sum in ns.
  std::array<std::atomic<uint64_t>, kSyncDurationBuckets.size() + 1> sync_buckets_{};
  std::atomic<uint64_t> sync_duration_ns_{0};
};

struct BudgetMetricsOptions {
  // The budgets. Required; not owned; must outlive the metrics.
  BudgetCore* core = nullptr;
  // Snapshots written and failed; null when the server keeps no data directory (the counters
  // then stay 0). Not owned; must outlive the metrics.
  Snapshotter* snapshotter = nullptr;
  // Most distinct tenant label values; the rest are summed under tenant="_other". >= 1.
  size_t max_tenants = 1000;
};

// The per-tenant gauges and counters, read from BudgetCore::Snapshot() at scrape time, plus the
// store and snapshot error counters. Thread-safe.
class BudgetMetrics final : public prometheus::Collectable {
 public:
  explicit BudgetMetrics(BudgetMetricsOptions options);
  BudgetMetrics(const BudgetMetrics&) = delete;
  BudgetMetrics& operator=(const BudgetMetrics&) = delete;

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const BudgetMetricsOptions options_;
  mutable Mutex mu_;  // one scrape at a time
  // Tenants that have their own label value. Budgets deleted since are forgotten at the next
  // scrape, which frees their slot.
  mutable absl::flat_hash_set<std::string> labelled_ ABSL_GUARDED_BY(mu_);
};

// Starts the HTTP endpoint serving GET /metrics on `listen` ("127.0.0.1:9464"; port 0 picks a
// free port, see MetricsEndpointPort()). INVALID_ARGUMENT for a malformed address, UNAVAILABLE
// when it cannot be bound. To be called from main() only: the process has one Exposer.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsEndpoint(
    const std::string& listen,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);

// The port the endpoint is bound to (the chosen one for port 0); 0 if unknown.
int MetricsEndpointPort(const prometheus::Exposer& exposer);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_METRICS_H_
