// BudgetCore's state export (for snapshots) and restore (from a data directory): DESIGN.md
// "Persistence". Every counter of an instance's ledger goes through kCumulativeCounters.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "retrybudget/names.h"
#include "server/budget_core.h"

#include "server/cumulative_counters.h"
#include "server/grant_math.h"
#include "server/instance_state.h"
#include "server/replay_cache.h"
#include "server/tenant_state.h"

namespace retrybudget {

v1::ServerState BudgetCore::ExportState(bool clean) {
  const absl::Time now = clock_->Now();
  v1::ServerState state;
  state.set_clean(clean);
  state.set_written_at_unix_nanos(absl::ToUnixNanos(now));
  std::vector<RefPtr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    tenants.assign(tenants_.begin(), tenants_.end());
  }
  for (auto& t : tenants) {
    CompactMutexLock lock(&t->mu);
    t->Advance(absl::ToUnixNanos(now));
    if (clean) t->grant_limit = std::min(t->grant_limit, t->totals.granted);
    v1::TenantState* ts = state.add_tenants();
    ts->set_tenant(t->name);
    *ts->mutable_policy() = t->policy->ToProto();
    ts->set_policy_source(t->source());
    ts->set_level(t->bucket.tokens());
    ts->set_level_at_unix_nanos(absl::ToUnixNanos(t->bucket.last_refill()));
    ts->set_granted_total(t->totals.granted);
    ts->set_grant_limit(std::max(t->grant_limit, t->totals.granted));
    ts->set_credited_total(t->credited_total);
    t->totals.ToState(*ts);
    t->ExportWindow(*ts, absl::ToUnixNanos(now));
  }
  std::vector<RefPtr<Instance>> instances;
  {
    ReaderMutexLock lock(&instances_mu_);
    instances.assign(instances_.begin(), instances_.end());
    // Tombstones matter only to a clean restart: after a crash every instance is a baseline.
    if (clean) {
      tombstones_->ForEach([&](absl::string_view id, const core_internal::Tombstone& t) {
        v1::InstanceTombstone* out = state.add_tombstones();
        out->set_instance_id(std::string(id));
        out->set_last_seq(t.last_seq);
        out->set_principal_hash(t.principal);
        out->set_at_unix_nanos(absl::ToUnixNanos(t.at));
      });
    }
  }
  for (auto& inst : instances) {
    CompactMutexLock lock(&inst->mu);
    v1::InstanceState* is = state.add_instances();
    is->set_instance_id(std::string(inst->id()));
    is->set_principal_hash(inst->principal);
    is->set_last_seq(inst->last_seq());
    is->set_last_fingerprint(inst->last_fingerprint);
    is->set_fingerprint_version(inst->fingerprint_v1 ? 1 : kFingerprintVersion);
    WriteResponse(inst->last_grants, is->mutable_last_response());
    is->set_last_seen_unix_nanos(inst->last_seen_ns.load(std::memory_order_relaxed));
    inst->tenants.ForEach([is](const std::string& tenant,
                               const core_internal::InstanceTenant& rec) {
      // A record kept for a deleted budget is not written: its next report is a baseline
      // (ApplyEntry), and after a restart a budget of the same name must not take it for its
      // own history.
      if (rec.tenant->deleted.load(std::memory_order_acquire)) return;
      v1::InstanceTenantState* r = is->add_tenants();
      r->set_tenant(tenant);
      SaveCounters(rec.ledger.applied, r);
      r->set_granted_total(rec.ledger.expected_received);
      r->set_outstanding(rec.ledger.outstanding);
      r->set_charged(rec.ledger.charged);
    });
  }
  return state;
}

absl::Status BudgetCore::Restore(const RecoveredState& recovered) {
  const absl::Time now = clock_->Now();
  const bool clean =
      recovered.snapshot.has_value() && recovered.snapshot->clean() && recovered.reservations.empty();
  MutexLock policy_lock(&policy_mu_);
  absl::flat_hash_map<std::string, ResolvedPolicy> listed;
  for (const auto& t : policy_.tenants()) listed.emplace(t.tenant(), *ResolvePolicy(t.policy()));
  // The current configuration decides the policy of every tenant an admin did not set.
  auto current_policy = [&](const std::string& name, v1::PolicySource* source) {
    auto it = listed.find(name);
    *source = it != listed.end() ? v1::POLICY_SOURCE_FILE : v1::POLICY_SOURCE_DEFAULT;
    return it != listed.end() ? it->second : default_policy_;
  };

  TenantTable restored;
  if (recovered.snapshot.has_value()) {
    for (const v1::TenantState& ts : recovered.snapshot->tenants()) {
      if (auto s = ValidateTenantName(ts.tenant(), "snapshot tenant"); !s.ok()) return s;
      v1::PolicySource source = ts.policy_source();
      ResolvedPolicy policy;
      if (source == v1::POLICY_SOURCE_ADMIN) {
        auto p = ResolvePolicy(ts.policy(), absl::StrCat("snapshot tenant ", ts.tenant()));
        if (!p.ok()) return p.status();
        policy = *p;
      } else {
        policy = current_policy(ts.tenant(), &source);
      }
      const absl::Time at = absl::FromUnixNanos(ts.level_at_unix_nanos());
      auto t = MakeRef<Tenant>(ts.tenant(), Intern(policy), source, at);
      CompactMutexLock lock(&t->mu);
      uint64_t limit = std::max(ts.grant_limit(), ts.granted_total());
      if (auto it = recovered.reservations.find(ts.tenant()); it != recovered.reservations.end()) {
        limit = std::max(limit, it->second);
      }
      // After a crash, every token up to the durable limit may have been granted, and every
      // deposit journaled since the snapshot was made (before the record that carries it).
      const uint64_t granted = clean ? ts.granted_total() : limit;
      double credited = ts.credited_total();
      if (auto it = recovered.credited.find(ts.tenant()); !clean && it != recovered.credited.end()) {
        credited = std::max(credited, it->second);
      }
      t->bucket.Restore(ts.level() - static_cast<double>(granted - ts.granted_total()) +
                            (credited - ts.credited_total()),
                        t->policy->capacity, at);
      t->credited_total = credited;
      t->grant_limit = limit;
      t->totals = BudgetTotals::FromState(ts, granted);
      // A windowed policy: its slots as written, and what a crash may have granted since
      // counted as granted now.
      t->RestoreWindow(ts, absl::ToUnixNanos(now), /*same_clock=*/true,
                       granted - ts.granted_total());
      restored.insert(std::move(t));
    }
  }
  // Tenants created after the last snapshot that had reserved grants: recreated now, in debt by
  // everything they may have granted.
  for (const auto& [name, limit] : recovered.reservations) {
    if (restored.contains(absl::string_view(name))) continue;
    if (auto s = ValidateTenantName(name, "journal tenant"); !s.ok()) return s;
    v1::PolicySource source;
    const ResolvedPolicy policy = current_policy(name, &source);
    auto t = MakeRef<Tenant>(name, Intern(policy), source, now);
    CompactMutexLock lock(&t->mu);
    const auto credited = recovered.credited.find(name);
    t->credited_total = credited == recovered.credited.end() ? 0 : credited->second;
    t->bucket.Restore(policy.initial_tokens - static_cast<double>(limit) + t->credited_total,
                      policy.capacity, now);
    t->grant_limit = limit;
    t->totals.granted = limit;
    t->RestoreWindow(v1::TenantState(), absl::ToUnixNanos(now), /*same_clock=*/true, limit);
    restored.insert(std::move(t));
  }

  InstanceTable instances;
  if (clean) {
    for (const v1::InstanceState& is : recovered.snapshot->instances()) {
      auto inst = Instance::Create(is.instance_id(), is.principal_hash());
      CompactMutexLock lock(&inst->mu);
      inst->set_last_seq(is.last_seq());
      inst->last_fingerprint = is.last_fingerprint();
      // Version 0 (absent) or 1: written before version 2. A version this build does not know
      // (a newer build's) cannot be recomputed: read as the current one, an exact retry of the
      // last request across the restart then gets the same-seq error, nothing is applied.
      inst->fingerprint_v1 = is.fingerprint_version() < 2;
      ReadResponse(is.last_response(), &inst->last_grants);
      inst->last_seen_ns.store(is.last_seen_unix_nanos(), std::memory_order_relaxed);
      for (const v1::InstanceTenantState& r : is.tenants()) {
        // Each record names the restored budget its history belongs to. A record of a tenant
        // the snapshot does not hold is not read: the tenant's next report is a baseline. (Only
        // an older version wrote such records, for deleted budgets; one of those whose budget
        // was created again before its snapshot cannot be told apart, and is read as its.)
        auto budget = restored.find(absl::string_view(r.tenant()));
        if (budget == restored.end()) continue;
        core_internal::InstanceTenant* rec = inst->tenants.Find(r.tenant());
        if (rec == nullptr) rec = inst->tenants.Add(*budget);
        rec->ledger = LedgerEntry{.applied = CountersOf(r),
                                 .expected_received = r.granted_total(),
                                 .outstanding = r.outstanding(),
                                 .charged = r.charged()};
      }
      instances.insert(std::move(inst));
    }
  }
  std::vector<std::pair<std::string, uint64_t>> ahead;  // a block past each durable limit
  std::vector<double> credited_ahead;                     // with each tenant's credited_total
  if (options_.store != nullptr) {
    for (const auto& t : restored) {
      CompactMutexLock lock(&t->mu);
      ahead.emplace_back(t->name, std::max(t->grant_limit, t->totals.granted) +
                                   ReservationBlock(t->policy->capacity));
      credited_ahead.push_back(t->credited_total);
    }
  }
  {
    MutexLock lock(&tenants_mu_);
    tenants_ = std::move(restored);
  }
  // Every budget gets a block on disk ahead of its grants before serving (one group commit), so
  // the first grants after a start are not cut while the store thread writes.
  for (size_t i = 0; i < ahead.size(); ++i) {
    ReserveAhead(ahead[i].first, ahead[i].second, credited_ahead[i]);
  }
  if (!ahead.empty()) options_.store->WaitIdle();
  MutexLock lock(&instances_mu_);
  instances_ = std::move(instances);
  tombstones_->Clear();
  if (clean) {
    for (const v1::InstanceTombstone& t : recovered.snapshot->tombstones()) {
      tombstones_->Put(t.instance_id(), {.last_seq = t.last_seq(),
                                         .principal = t.principal_hash(),
                                         .at = absl::FromUnixNanos(t.at_unix_nanos())});
    }
  }
  return absl::OkStatus();
}

}  // namespace retrybudget
