// BudgetCore's side of cluster mode: the tenants' state as the owner of their shard writes it to
// etcd, taken over by the next owner, and dropped when a shard is lost (DESIGN.md "Many servers
// (etcd)"). The etcd side is cluster/cluster_router.cc.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/budget_core.h"
#include "server/tenant_state.h"

namespace retrybudget {

std::vector<v1::TenantState> BudgetCore::ExportTenants(
    const std::function<bool(absl::string_view)>& pick) {
  const absl::Time now = clock_->Now();
  std::vector<RefPtr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    for (const auto& t : tenants_) {
      if (pick(t->name)) tenants.push_back(t);
    }
  }
  std::vector<v1::TenantState> out;
  out.reserve(tenants.size());
  for (auto& t : tenants) {
    CompactMutexLock lock(&t->mu);
    if (t->deleted.load(std::memory_order_relaxed)) continue;
    t->Advance(absl::ToUnixNanos(now));
    v1::TenantState& ts = out.emplace_back();
    ts.set_tenant(t->name);
    *ts.mutable_policy() = t->policy->ToProto();
    ts.set_policy_source(t->source());
    ts.set_level(t->bucket.tokens());
    ts.set_level_at_unix_nanos(absl::ToUnixNanos(t->bucket.last_refill()));
    ts.set_granted_total(t->totals.granted);
    ts.set_grant_limit(std::max(t->grant_limit, t->totals.granted));
    t->totals.ToState(ts);
    t->ExportWindow(ts, absl::ToUnixNanos(now));
  }
  return out;
}

void BudgetCore::AdoptTenants(const std::vector<v1::TenantState>& states, absl::Time now) {
  std::vector<RefPtr<Tenant>> adopted;
  {
    MutexLock policy_lock(&policy_mu_);
    for (const v1::TenantState& ts : states) {
      v1::PolicySource source = v1::POLICY_SOURCE_DEFAULT;
      ResolvedPolicy policy = default_policy_;
      if (ts.policy_source() == v1::POLICY_SOURCE_ADMIN) {
        auto p = ResolvePolicy(ts.policy(), absl::StrCat("tenant ", ts.tenant()));
        if (p.ok()) {
          policy = *p;
          source = v1::POLICY_SOURCE_ADMIN;
        }
      }
      if (source != v1::POLICY_SOURCE_ADMIN) {
        for (const auto& t : policy_.tenants()) {
          if (t.tenant() == ts.tenant()) {
            policy = *ResolvePolicy(t.policy());  // validated by ReplacePolicy
            source = v1::POLICY_SOURCE_FILE;
            break;
          }
        }
      }
      auto t = MakeRef<Tenant>(ts.tenant(), Intern(policy), source, now);
      CompactMutexLock lock(&t->mu);
      // Every token up to the reserved limit may have been granted by the last owner, after
      // the level was written; refill starts now.
      const uint64_t limit = std::max(ts.grant_limit(), ts.granted_total());
      t->bucket.Restore(ts.level() - static_cast<double>(limit - ts.granted_total()),
                        t->policy->capacity, now);
      t->grant_limit = limit;
      t->totals = BudgetTotals::FromState(ts, limit);
      // A windowed policy: everything the last owner counted, and every reserved token, counted
      // as granted now (its clock is not compared with this one).
      t->RestoreWindow(ts, absl::ToUnixNanos(now), /*same_clock=*/false,
                       limit - ts.granted_total());
      adopted.push_back(std::move(t));
    }
  }
  std::vector<RefPtr<Tenant>> replaced;
  {
    MutexLock lock(&tenants_mu_);
    for (auto& t : adopted) {
      auto [it, inserted] = tenants_.insert(t);
      if (!inserted) {
        // A set's element is const: the old budget leaves and the new one goes in.
        replaced.push_back(*it);
        tenants_.erase(it);
        tenants_.insert(t);
      }
    }
  }
  for (auto& t : replaced) {
    CompactMutexLock lock(&t->mu);
    t->deleted.store(true, std::memory_order_release);
  }
}

void BudgetCore::DropTenants(const std::function<bool(absl::string_view)>& pick) {
  std::vector<RefPtr<Tenant>> dropped;
  {
    MutexLock lock(&tenants_mu_);
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      if (pick((*it)->name)) {
        dropped.push_back(*it);
        tenants_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : dropped) {
    CompactMutexLock lock(&t->mu);
    t->deleted.store(true, std::memory_order_release);
  }
}

}  // namespace retrybudget
