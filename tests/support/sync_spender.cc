#include "tests/support/sync_spender.h"

#include <utility>

#include "absl/time/clock.h"

namespace retrybudget::testing {

SyncSpender::SyncSpender(std::vector<std::string> tenants, SyncSpenderOptions options)
    : tenants_(std::move(tenants)), options_(std::move(options)) {
  for (const std::string& tenant : tenants_) received_[tenant] = 0;
}

SyncSpender::Answer SyncSpender::Sync(v1::RetryBudgetService::StubInterface& stub) {
  v1::SyncRequest request;
  request.set_instance_id(options_.instance_id);
  request.set_seq(++seq_);
  for (const std::string& tenant : tenants_) {
    v1::TenantSync* t = request.add_tenants();
    t->set_tenant(tenant);
    t->set_want(options_.want);
    t->set_tokens_received(received_[tenant]);
    t->set_retries_spent(received_[tenant]);
  }
  Answer answer;
  answer.tenants = request.tenants_size();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  answer.rpc = stub.Sync(&context, request, &answer.response);
  if (!answer.rpc.ok()) return answer;
  for (const v1::TenantGrant& g : answer.response.tenants()) {
    if (g.has_error() && g.error().code() != 0) continue;
    received_[g.tenant()] += g.granted();
    ++answer.granted_entries;
  }
  return answer;
}

uint64_t SyncSpender::received(const std::string& tenant) const {
  const auto it = received_.find(tenant);
  return it == received_.end() ? 0 : it->second;
}

uint64_t SyncSpender::received_total() const {
  uint64_t total = 0;
  for (const auto& [tenant, n] : received_) total += n;
  return total;
}

}  // namespace retrybudget::testing
