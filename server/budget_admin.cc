// BudgetCore's admin side: policy reloads, and reading, setting and deleting budgets
// (BudgetAdminService, metrics, snapshots' statuses). Sync is in budget_core.cc.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "retrybudget/names.h"
#include "retrybudget/owner_redirect.h"
#include "server/budget_core.h"
#include "server/grant_math.h"
#include "server/tenant_state.h"

namespace retrybudget {

absl::Status BudgetCore::ReplacePolicy(const v1::PolicyConfig& config) {
  // Validate everything first: an invalid config changes nothing.
  auto default_policy = ResolvePolicy(config.default_policy(), "default_policy");
  if (!default_policy.ok()) return default_policy.status();
  absl::flat_hash_map<std::string, ResolvedPolicy> listed;
  for (int i = 0; i < config.tenants_size(); ++i) {
    const auto& t = config.tenants(i);
    const std::string field = absl::StrCat("tenants[", i, "]");
    if (auto s = ValidateTenantName(t.tenant(), field + ".tenant"); !s.ok()) return s;
    auto p = ResolvePolicy(t.policy(), field + ".policy");
    if (!p.ok()) return p.status();
    if (!listed.emplace(t.tenant(), *p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".tenant ", QuoteForError(t.tenant()), " is listed twice"));
    }
  }
  if (auto s = ValidateCredentials(config); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  MutexLock policy_lock(&policy_mu_);
  policy_ = config;
  default_policy_ = *default_policy;
  MutexLock tenants_lock(&tenants_mu_);
  for (const auto& tenant : tenants_) {
    CompactMutexLock lock(&tenant->mu);
    if (tenant->source() == v1::POLICY_SOURCE_ADMIN) continue;
    auto it = listed.find(tenant->name);
    const ResolvedPolicy& p = it != listed.end() ? it->second : default_policy_;
    tenant->Advance(absl::ToUnixNanos(now));
    tenant->bucket.CapAt(p.capacity);
    const PolicyRef old = tenant->policy;
    tenant->policy = Intern(p);
    tenant->FollowPolicyShape(*old, absl::ToUnixNanos(now));
    tenant->set_source(it != listed.end() ? v1::POLICY_SOURCE_FILE : v1::POLICY_SOURCE_DEFAULT);
  }
  return absl::OkStatus();
}

v1::BudgetStatus BudgetCore::StatusOf(Tenant& tenant, absl::Time now) {
  CompactMutexLock lock(&tenant.mu);
  return StatusOfLocked(tenant, now);
}

v1::BudgetStatus BudgetCore::StatusOfLocked(Tenant& tenant, absl::Time now) {
  tenant.Advance(absl::ToUnixNanos(now));
  v1::BudgetStatus s;
  s.set_tenant(tenant.name);
  *s.mutable_policy() = tenant.policy->ToProto();
  const int64_t now_ns = absl::ToUnixNanos(now);
  // A windowed policy: what may be granted now, and the requests' deposits still live.
  s.set_tokens(tenant.GrantableLevel(now_ns));
  if (tenant.window != nullptr) {
    s.set_window_deposits(tenant.window->LiveDeposits(tenant.Shape(), now_ns));
  }
  s.set_leased_tokens(static_cast<double>(tenant.HeldSum()));
  s.set_active_instances(tenant.ActiveCount(absl::ToUnixNanos(now)));
  // Copied under the lock (clang's analysis cannot follow a reference to a guarded member).
  const BudgetTotals totals = tenant.totals;
  s.set_granted_total(totals.granted);
  s.set_successes_total(totals.successes);
  // Retries sent: the refunded ones were never sent. (The gross totals stay monotonic for the
  // metrics, which add the refunds back.)
  s.set_retries_total(totals.retries - std::min(totals.refunded, totals.retries));
  s.set_refunded_total(totals.refunded);
  s.set_fallback_refunded_total(totals.fallback_refunded);
  s.set_retries_denied_total(totals.retries_denied);
  s.set_shadow_denied_total(totals.shadow_denied);
  s.set_requests_total(totals.requests);
  s.set_retries_allowed_total(totals.retries_allowed);
  s.set_returned_total(totals.returned);
  s.set_reclaimed_total(totals.reclaimed);
  s.set_wanted_total(totals.wanted);
  s.set_explicit_policy(tenant.source() != v1::POLICY_SOURCE_DEFAULT);
  s.set_fallback_retries_total(totals.fallback_retries -
                               std::min(totals.fallback_refunded, totals.fallback_retries));
  s.set_uncredited_total(totals.uncredited);
  return s;
}

absl::Status BudgetCore::CheckOwned(absl::string_view tenant) {
  if (options_.router == nullptr) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  if (options_.router->MayServe(tenant, now)) return absl::OkStatus();
  TenantRefusal refusal = options_.router->Refusal(tenant, now);
  if (refusal.owner.empty()) return absl::UnavailableError(refusal.message);
  // The owner's address is the last word of the message (for people) and a payload the service
  // layer sends as the trailing metadata `retry-budget-owner` (for tools: owner_redirect.h).
  return WithOwnerAddress(absl::FailedPreconditionError(refusal.message), refusal.owner);
}

absl::StatusOr<v1::BudgetStatus> BudgetCore::GetBudget(absl::string_view tenant) {
  if (auto s = ValidateTenantName(tenant); !s.ok()) return s;
  if (auto s = CheckOwned(tenant); !s.ok()) return s;
  auto t = FindTenant(tenant);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("tenant ", QuoteForError(tenant), " has no budget"));
  }
  return StatusOf(*t, clock_->Now());
}

absl::StatusOr<v1::ListBudgetsResponse> BudgetCore::ListBudgets(
    const v1::ListBudgetsRequest& request) {
  constexpr uint32_t kMaxPage = 1000;
  const uint32_t page = request.page_size() == 0 ? kMaxPage : std::min(request.page_size(), kMaxPage);
  std::vector<RefPtr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    for (const auto& t : tenants_) {
      if (request.page_token().empty() || t->name > request.page_token()) tenants.push_back(t);
    }
  }
  std::sort(tenants.begin(), tenants.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  v1::ListBudgetsResponse response;
  const absl::Time now = clock_->Now();
  for (size_t i = 0; i < tenants.size() && i < page; ++i) {
    *response.add_budgets() = StatusOf(*tenants[i], now);
  }
  if (tenants.size() > page) response.set_next_page_token(tenants[page - 1]->name);
  return response;
}

absl::Status ValidatePolicyMask(const google::protobuf::FieldMask& mask) {
  const google::protobuf::Descriptor* d = v1::BudgetPolicy::descriptor();
  for (const std::string& path : mask.paths()) {
    if (d->FindFieldByName(path) != nullptr) continue;
    std::vector<std::string> names;
    for (int i = 0; i < d->field_count(); ++i) names.emplace_back(d->field(i)->name());
    return absl::InvalidArgumentError(absl::StrCat(
        "update_mask path ", QuoteForError(path), " is not a BudgetPolicy field (fields: ",
        absl::StrJoin(names, ", "), "); nothing changed"));
  }
  return absl::OkStatus();
}

v1::BudgetPolicy MergePolicy(const v1::BudgetPolicy& current, const v1::BudgetPolicy& update,
                             const google::protobuf::FieldMask& mask) {
  // What `update` gives: its fields the mask names, nothing else.
  v1::BudgetPolicy picked = update;
  v1::BudgetPolicy merged = current;
  const google::protobuf::Descriptor* d = v1::BudgetPolicy::descriptor();
  const google::protobuf::Reflection* r = v1::BudgetPolicy::GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const bool named = std::find(mask.paths().begin(), mask.paths().end(), f->name()) !=
                       mask.paths().end();
    r->ClearField(named ? &merged : &picked, f);
  }
  merged.MergeFrom(picked);
  return merged;
}

absl::StatusOr<ResolvedPolicy> ResolveMergedPolicy(const v1::BudgetPolicy& merged) {
  absl::StatusOr<ResolvedPolicy> resolved = ResolvePolicy(merged, "policy");
  if (resolved.ok()) return resolved;
  return absl::InvalidArgumentError(absl::StrCat("the policy merged by update_mask is invalid: ",
                                                 resolved.status().message(),
                                                 "; nothing changed"));
}

v1::BudgetPolicy PolicyBase(const ResolvedPolicy& policy) {
  v1::BudgetPolicy base = policy.ToProto();
  // A field equal to what it resolves to when unset is left unset (derived from the others).
  v1::BudgetPolicy without = base;
  without.clear_initial_tokens();
  if (absl::StatusOr<ResolvedPolicy> r = ResolvePolicy(without);
      r.ok() && r->initial_tokens == policy.initial_tokens) {
    base = without;
  }
  without = base;
  without.clear_lease_ttl_ms();
  if (absl::StatusOr<ResolvedPolicy> r = ResolvePolicy(without);
      r.ok() && r->lease_ttl == policy.lease_ttl) {
    base = without;
  }
  return base;
}

absl::StatusOr<v1::BudgetStatus> BudgetCore::PutPolicy(absl::string_view tenant,
                                                       const v1::BudgetPolicy& policy,
                                                       const google::protobuf::FieldMask& mask) {
  if (auto s = ValidateTenantName(tenant); !s.ok()) return s;
  if (mask.paths().empty()) {
    auto resolved = ResolvePolicy(policy, "policy");
    if (!resolved.ok()) return resolved.status();
    if (auto s = CheckOwned(tenant); !s.ok()) return s;
    return ApplyAdminPolicy(tenant, *resolved);
  }
  if (auto s = ValidatePolicyMask(mask); !s.ok()) return s;
  if (auto s = CheckOwned(tenant); !s.ok()) return s;
  return UpdateAdminPolicy(
      tenant,
      [&](absl::FunctionRef<v1::BudgetPolicy()> current) -> absl::StatusOr<ResolvedPolicy> {
        return ResolveMergedPolicy(MergePolicy(current(), policy, mask));
      });
}

absl::StatusOr<v1::BudgetStatus> BudgetCore::ApplyAdminPolicy(absl::string_view tenant,
                                                              const ResolvedPolicy& policy) {
  return UpdateAdminPolicy(
      tenant, [&](absl::FunctionRef<v1::BudgetPolicy()>) -> absl::StatusOr<ResolvedPolicy> {
        return policy;
      });
}

v1::BudgetPolicy BudgetCore::ConfiguredPolicy(absl::string_view tenant) {
  ReaderMutexLock lock(&policy_mu_);
  return ConfiguredPolicyLocked(tenant);
}

v1::BudgetPolicy BudgetCore::ConfiguredPolicyLocked(absl::string_view tenant) {
  for (const auto& t : policy_.tenants()) {
    if (t.tenant() == tenant) return t.policy();
  }
  return policy_.default_policy();
}

absl::StatusOr<v1::BudgetStatus> BudgetCore::UpdateAdminPolicy(absl::string_view tenant,
                                                               PolicyUpdate update) {
  const absl::Time now = clock_->Now();
  RefPtr<Tenant> t;
  std::optional<ResolvedPolicy> created;
  {
    ReaderMutexLock policy_lock(&policy_mu_);
    MutexLock lock(&tenants_mu_);
    auto it = tenants_.find(tenant);
    if (it != tenants_.end()) {
      t = *it;
    } else {
      if (tenants_.size() >= options_.max_tenants) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "tenant %s cannot be created: the server holds %d tenants, its limit",
            QuoteForError(tenant), tenants_.size()));
      }
      // Cluster mode: an admin policy in etcd wins over the file (as for a budget a Sync
      // creates).
      std::optional<v1::BudgetPolicy> current;
      if (options_.router != nullptr) current = options_.router->AdminPolicy(tenant);
      if (!current.has_value()) current = ConfiguredPolicyLocked(tenant);
      absl::StatusOr<ResolvedPolicy> p = update([&] { return *current; });
      if (!p.ok()) return p.status();
      created = *p;
      t = MakeRef<Tenant>(std::string(tenant), Intern(*p), v1::POLICY_SOURCE_ADMIN, now);
      tenants_.insert(t);
    }
  }
  if (created.has_value()) {
    // Its first block is reserved now, as for a budget a first Sync creates, so that its first
    // grant is not cut to nothing; not waited for (this may run on the writer's own thread).
    if (options_.store != nullptr || options_.router != nullptr) {
      ReserveAhead(t->name, ReservationBlock(created->capacity));
    }
    return StatusOf(*t, now);
  }
  {
    CompactMutexLock lock(&t->mu);
    const PolicyRef current = t->policy;
    absl::StatusOr<ResolvedPolicy> p = update([&] { return PolicyBase(*current); });
    if (!p.ok()) return p.status();
    t->Advance(absl::ToUnixNanos(now));  // time so far counts at the old rate
    t->bucket.CapAt(p->capacity);
    t->policy = Intern(*p);
    t->FollowPolicyShape(*current, absl::ToUnixNanos(now));
    t->set_source(v1::POLICY_SOURCE_ADMIN);
    // Under the same lock: the answer shows this put's policy, not a later put's.
    return StatusOfLocked(*t, now);
  }
}

absl::Status BudgetCore::DeleteBudget(absl::string_view tenant) {
  if (auto s = ValidateTenantName(tenant); !s.ok()) return s;
  if (auto s = CheckOwned(tenant); !s.ok()) return s;
  auto forget = [this, tenant]() -> absl::Status {
    RefPtr<Tenant> t;
    {
      MutexLock lock(&tenants_mu_);
      auto it = tenants_.find(tenant);
      if (it == tenants_.end()) {
        return absl::NotFoundError(
            absl::StrCat("tenant ", QuoteForError(tenant), " has no budget"));
      }
      t = *it;
      tenants_.erase(it);
    }
    CompactMutexLock lock(&t->mu);
    t->deleted.store(true, std::memory_order_release);
    return absl::OkStatus();
  };
  // Cluster mode: its state in etcd goes too, or a next owner would take the budget over.
  if (options_.router != nullptr) return options_.router->DeleteDurably(tenant, forget);
  return forget();
}

std::vector<v1::BudgetStatus> BudgetCore::Snapshot() {
  std::vector<v1::BudgetStatus> out;
  std::vector<RefPtr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    tenants.assign(tenants_.begin(), tenants_.end());
  }
  std::sort(tenants.begin(), tenants.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  const absl::Time now = clock_->Now();
  out.reserve(tenants.size());
  for (auto& t : tenants) out.push_back(StatusOf(*t, now));
  return out;
}

}  // namespace retrybudget
