#include "client/client_impl.h"

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "retrybudget/names.h"

namespace retrybudget::client_internal {
namespace {

std::string RandomInstanceId() {
  absl::BitGen gen;
  return absl::StrFormat("rb-%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

RefresherOptions ToRefresherOptions(const ClientOptions& options) {
  RefresherOptions out;
  out.instance_id = options.instance_id;
  out.policy.refresh_period = options.refresh_period;
  out.policy.min_sync_interval = options.min_sync_interval;
  out.policy.lease_burst = options.lease_burst;
  out.sync_timeout = options.sync_timeout;
  return out;
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
  if (options.lease_burst > kMaxWant) {
    return absl::InvalidArgumentError(absl::StrCat("options.lease_burst is ", options.lease_burst,
                                                   "; at most ", kMaxWant, " is allowed"));
  }
  if (options.clock == nullptr) options.clock = Clock::Real();
  return options;
}

BudgetClientImpl::BudgetClientImpl(const ClientOptions& options,
                                   std::unique_ptr<v1::RetryBudgetService::StubInterface> stub)
    : instance_id_(options.instance_id),
      tenants_(options.clock, &refresher_),
      refresher_(ToRefresherOptions(options), std::move(stub), options.clock, &tenants_) {}

BudgetClientImpl::~BudgetClientImpl() { Shutdown().IgnoreError(); }

absl::StatusOr<TenantBudget*> BudgetClientImpl::Tenant(absl::string_view tenant) {
  absl::StatusOr<TenantBudgetImpl*> budget = tenants_.GetOrCreate(tenant);
  if (!budget.ok()) return budget.status();
  return *budget;
}

}  // namespace retrybudget::client_internal
