#include "client/cpp/client_impl.h"

#include <cmath>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/prometheus_client_metrics.h"
#include "retrybudget/names.h"

namespace retrybudget::client_internal {
namespace {

std::string RandomInstanceId() {
  absl::BitGen gen;
  return absl::StrFormat("rb-%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

RefresherOptions ToRefresherOptions(const ClientOptions& options, StubFactory owner_stubs) {
  RefresherOptions out;
  out.owner_stubs = std::move(owner_stubs);
  out.instance_id = options.instance_id;
  out.bearer_token = options.bearer_token;
  out.policy.refresh_period = options.refresh_period;
  out.policy.min_sync_interval = options.min_sync_interval;
  out.policy.lease_burst = options.lease_burst;
  out.sync_timeout = options.sync_timeout;
  return out;
}

FallbackConfig ToFallbackConfig(const ClientOptions& options) {
  return FallbackConfig{.mode = options.fallback,
                        .never_reached = {.capacity = options.fallback_capacity,
                                          .refill_per_second = options.fallback_refill_per_second}};
}

// Largest fallback_capacity / fallback_refill_per_second accepted.
constexpr double kMaxFallbackValue = 1e9;
constexpr size_t kMaxBearerTokenLength = 4096;

absl::Status CheckFallbackValue(absl::string_view field, double value) {
  if (std::isfinite(value) && value >= 0 && value <= kMaxFallbackValue) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("options.", field, " is ", value, "; it must be in [0, 1e9]"));
}

absl::Status CheckBearerToken(const std::string& token) {
  if (token.empty()) return absl::OkStatus();
  if (token.size() > kMaxBearerTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("options.bearer_token has ", token.size(),
                                                   " characters; at most ",
                                                   kMaxBearerTokenLength, " are allowed"));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    // gRPC metadata values must be printable ASCII; a space would split "Bearer <token>".
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.bearer_token has character code ", static_cast<int>(c), " at position ", i,
          "; only printable ASCII without spaces is allowed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientOptions> ValidateAndDefault(ClientOptions options) {
  if (options.instance_id.empty()) {
    options.instance_id = RandomInstanceId();
  } else if (absl::Status valid = ValidateInstanceId(options.instance_id, "options.instance_id");
             !valid.ok()) {
    return valid;
  }
  if (options.refresh_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("options.refresh_period is ",
                                                   absl::FormatDuration(options.refresh_period),
                                                   "; it must be positive"));
  }
  if (options.min_sync_interval < absl::ZeroDuration() ||
      options.min_sync_interval > options.refresh_period) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.min_sync_interval is ", absl::FormatDuration(options.min_sync_interval),
        "; it must be in [0, refresh_period = ", absl::FormatDuration(options.refresh_period),
        "]"));
  }
  if (options.sync_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("options.sync_timeout is ",
                                                   absl::FormatDuration(options.sync_timeout),
                                                   "; it must be positive"));
  }
  if (options.max_reconnect_backoff < absl::Milliseconds(1) ||
      options.max_reconnect_backoff > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.max_reconnect_backoff is ", absl::FormatDuration(options.max_reconnect_backoff),
        "; it must be in [1ms, 1h]"));
  }
  if (options.lease_burst > kMaxWant) {
    return absl::InvalidArgumentError(absl::StrCat("options.lease_burst is ", options.lease_burst,
                                                   "; at most ", kMaxWant, " is allowed"));
  }
  if (options.fallback != FallbackMode::kLocalBucket && options.fallback != FallbackMode::kDeny) {
    return absl::InvalidArgumentError(absl::StrCat("options.fallback is ",
                                                   static_cast<int>(options.fallback),
                                                   "; expected kLocalBucket or kDeny"));
  }
  if (absl::Status s = CheckFallbackValue("fallback_capacity", options.fallback_capacity);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckFallbackValue("fallback_refill_per_second", options.fallback_refill_per_second);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckBearerToken(options.bearer_token); !s.ok()) return s;
  if (options.clock == nullptr) options.clock = Clock::Real();
  return options;
}

absl::StatusOr<std::unique_ptr<BudgetClientImpl>> NewBudgetClientImpl(
    const ClientOptions& options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    StubFactory owner_stubs) {
  std::unique_ptr<ClientMetrics> metrics;
  if (options.metrics_registry != nullptr) {
    absl::StatusOr<std::unique_ptr<ClientMetrics>> registered =
        NewPrometheusClientMetrics(*options.metrics_registry);
    if (!registered.ok()) return registered.status();
    metrics = *std::move(registered);
  }
  return std::make_unique<BudgetClientImpl>(options, std::move(stub), std::move(metrics),
                                            std::move(owner_stubs));
}

BudgetClientImpl::BudgetClientImpl(const ClientOptions& options,
                                   std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
                                   std::unique_ptr<ClientMetrics> metrics,
                                   StubFactory owner_stubs)
    : instance_id_(options.instance_id),
      tenants_(options.clock, &refresher_, ToFallbackConfig(options)),
      refresher_(ToRefresherOptions(options, std::move(owner_stubs)), std::move(stub),
                 options.clock, &tenants_, std::move(metrics)) {}

BudgetClientImpl::~BudgetClientImpl() { Shutdown().IgnoreError(); }

absl::StatusOr<TenantBudget*> BudgetClientImpl::Tenant(absl::string_view tenant) {
  absl::StatusOr<TenantBudgetImpl*> budget = tenants_.GetOrCreate(tenant);
  if (!budget.ok()) return budget.status();
  return *budget;
}

}  // namespace retrybudget::client_internal
