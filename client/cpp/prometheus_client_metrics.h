// The client's metrics in a prometheus::Registry the worker passes in (ClientOptions).
#ifndef RETRYBUDGET_CLIENT_PROMETHEUS_CLIENT_METRICS_H_
#define RETRYBUDGET_CLIENT_PROMETHEUS_CLIENT_METRICS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/cpp/client_metrics.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace retrybudget::client_internal {

// Registers into `registry` (not owned; must outlive the result):
//
//   retry_budget_client_retries_allowed_total{tenant}   counter  TryAcquire() true, net of refunds
//   retry_budget_client_retries_denied_total{tenant}    counter  TryAcquire() false
//   retry_budget_client_fallback_retries_total{tenant}  counter  of allowed, from the local bucket
//   retry_budget_client_successes_total{tenant}         counter  RecordSuccess()
//   retry_budget_client_tokens_held{tenant}             gauge    tokens in the lease word
//   retry_budget_client_mode{tenant,mode}               gauge    1 for the current BudgetMode
//                                                               (BudgetModeName), 0 for others
//   retry_budget_client_syncs_total{result="ok|error"}  counter  Sync attempts
//   retry_budget_client_sync_errors_total{code}         counter  failed Sync attempts
//   retry_budget_client_redirects_total                 counter  entries redirected to an owner
//
// Label cardinality is bounded by the client's 256 tenants. INVALID_ARGUMENT when the registry
// already holds one of these names with another type (prometheus-cpp throws; this does not).
absl::StatusOr<std::unique_ptr<ClientMetrics>> NewPrometheusClientMetrics(
    prometheus::Registry& registry);

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_PROMETHEUS_CLIENT_METRICS_H_
