#include "client/cpp/prometheus_client_metrics.h"

#include <algorithm>
#include <array>
#include <exception>
#include <string>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace retrybudget::client_internal {
namespace {

constexpr std::array<BudgetMode, 4> kModes = {BudgetMode::kNoLease, BudgetMode::kLease,
                                              BudgetMode::kFallback, BudgetMode::kDenyFallback};

// A prometheus counter fed from a cumulative count: adds only what is new, so a count that
// dips (a Refund() after an update) never makes the counter go back.
class CumulativeCounter {
 public:
  explicit CumulativeCounter(prometheus::Counter* counter) : counter_(counter) {}
  void Update(uint64_t total) {
    if (total <= published_) return;
    counter_->Increment(static_cast<double>(total - published_));
    published_ = total;
  }

 private:
  prometheus::Counter* counter_;
  uint64_t published_ = 0;
};

class PrometheusClientMetrics final : public ClientMetrics {
 public:
  explicit PrometheusClientMetrics(prometheus::Registry& registry)
      : allowed_(Counters(registry, "retry_budget_client_retries_allowed_total",
                          "Retries this process allowed with tokens (TryAcquire() true, net of "
                          "refunds; a count of retries, whatever their cost), from leases and "
                          "from the local fallback bucket.")),
        denied_(Counters(registry, "retry_budget_client_retries_denied_total",
                         "Retries this process denied for lack of a token.")),
        shadow_denied_(Counters(registry, "retry_budget_client_shadow_denied_total",
                                "Retries a shadow-mode tenant let through that enforcement "
                                "would have denied (would-be denials).")),
        requests_(Counters(registry, "retry_budget_client_requests_total",
                           "Logical calls (first attempts) recorded by this process "
                           "(RecordRequest()).")),
        fallback_(Counters(registry, "retry_budget_client_fallback_retries_total",
                           "Tokens this process spent from the local fallback bucket while "
                           "the budget server was unreachable (a retry of cost c counts c), "
                           "net of refunds.")),
        successes_(Counters(registry, "retry_budget_client_successes_total",
                            "Successful calls recorded by this process.")),
        held_(prometheus::BuildGauge()
                  .Name("retry_budget_client_tokens_held")
                  .Help("Retry tokens this process holds right now (lease or fallback).")
                  .Register(registry)),
        mode_(prometheus::BuildGauge()
                  .Name("retry_budget_client_mode")
                  .Help("1 for the mode the tenant's budget is in (no_lease, lease, fallback, "
                        "deny_fallback), 0 for the others.")
                  .Register(registry)),
        syncs_(Counters(registry, "retry_budget_client_syncs_total",
                        "Sync attempts to the budget server, by result (ok: a response; "
                        "error: the RPC failed).")),
        syncs_ok_(&syncs_.Add({{"result", "ok"}})),
        syncs_error_(&syncs_.Add({{"result", "error"}})),
        sync_errors_(Counters(registry, "retry_budget_client_sync_errors_total",
                              "Failed Sync attempts, by gRPC status code (UNAVAILABLE, "
                              "DEADLINE_EXCEEDED: unreachable; INVALID_ARGUMENT, "
                              "RESOURCE_EXHAUSTED, ...: refused by a server that answers).")),
        redirects_(&Counters(registry, "retry_budget_client_redirects_total",
                             "Tenant entries a server answered with the address of the "
                             "tenant's owner (cluster mode).")
                        .Add({})) {}

  void Redirected() override { redirects_->Increment(); }

  void SyncAttempted(bool ok) override { (ok ? syncs_ok_ : syncs_error_)->Increment(); }

  void SyncFailed(absl::StatusCode code) override {
    auto it = sync_errors_by_code_.find(code);
    if (it == sync_errors_by_code_.end()) {
      it = sync_errors_by_code_
               .emplace(code, &sync_errors_.Add({{"code", absl::StatusCodeToString(code)}}))
               .first;
    }
    it->second->Increment();
  }

  void TenantUpdated(const std::string& tenant, const TenantStats& stats) override {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) it = tenants_.emplace(tenant, NewTenant(tenant)).first;
    PerTenant& t = it->second;
    t.allowed.Update(stats.retries_allowed);
    t.denied.Update(stats.retries_denied);
    t.shadow_denied.Update(stats.shadow_denied);
    t.requests.Update(stats.requests);
    t.fallback.Update(stats.fallback_allowed);
    t.successes.Update(stats.successes);
    t.held->Set(static_cast<double>(std::max<int64_t>(0, stats.tokens_held)));
    for (size_t i = 0; i < kModes.size(); ++i) t.mode[i]->Set(kModes[i] == stats.mode ? 1 : 0);
  }

 private:
  struct PerTenant {
    CumulativeCounter allowed;
    CumulativeCounter denied;
    CumulativeCounter shadow_denied;
    CumulativeCounter requests;
    CumulativeCounter fallback;
    CumulativeCounter successes;
    prometheus::Gauge* held;
    std::array<prometheus::Gauge*, kModes.size()> mode;
  };

  static prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& registry,
                                                           const std::string& name,
                                                           const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  }

  PerTenant NewTenant(const std::string& tenant) {
    const prometheus::Labels labels = {{"tenant", tenant}};
    PerTenant t{CumulativeCounter(&allowed_.Add(labels)),
                CumulativeCounter(&denied_.Add(labels)),
                CumulativeCounter(&shadow_denied_.Add(labels)),
                CumulativeCounter(&requests_.Add(labels)),
                CumulativeCounter(&fallback_.Add(labels)),
                CumulativeCounter(&successes_.Add(labels)), &held_.Add(labels), {}};
    for (size_t i = 0; i < kModes.size(); ++i) {
      t.mode[i] = &mode_.Add({{"tenant", tenant}, {"mode", std::string(BudgetModeName(kModes[i]))}});
    }
    return t;
  }

  prometheus::Family<prometheus::Counter>& allowed_;
  prometheus::Family<prometheus::Counter>& denied_;
  prometheus::Family<prometheus::Counter>& shadow_denied_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& fallback_;
  prometheus::Family<prometheus::Counter>& successes_;
  prometheus::Family<prometheus::Gauge>& held_;
  prometheus::Family<prometheus::Gauge>& mode_;
  prometheus::Family<prometheus::Counter>& syncs_;
  prometheus::Counter* const syncs_ok_;
  prometheus::Counter* const syncs_error_;
  prometheus::Family<prometheus::Counter>& sync_errors_;
  absl::flat_hash_map<absl::StatusCode, prometheus::Counter*> sync_errors_by_code_;
  prometheus::Counter* const redirects_;
  absl::flat_hash_map<std::string, PerTenant> tenants_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClientMetrics>> NewPrometheusClientMetrics(
    prometheus::Registry& registry) {
  // prometheus-cpp reports a clash (a name registered with another type) by throwing.
  try {
    return std::make_unique<PrometheusClientMetrics>(registry);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.metrics_registry: cannot register the client metrics: ", e.what()));
  }
}

}  // namespace retrybudget::client_internal
