#include "server/budget_core.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "retrybudget/names.h"
#include "server/cumulative_counters.h"
#include "server/grant_math.h"
#include "server/instance_state.h"
#include "server/replay_cache.h"
#include "server/sync_validation.h"
#include "server/tenant_state.h"
#include "server/token_bucket.h"

namespace retrybudget {
namespace {

constexpr char kDeletedMeanwhile[] = "tenant was deleted while this request ran";

// Tokens a client still holds of its leases by its own report (the window carries them into
// the lease its answer starts; what it claims beyond what it holds only counts against itself).
uint64_t ReportedHoldings(const CumulativeCounters& c) {
  const uint64_t used = SaturatingAdd(c.lease_spent(), c.tokens_returned);
  return c.tokens_received > used ? c.tokens_received - used : 0;
}

// The part of a windowed report read before the ledger applies it: the requests newly reported
// and not credited by the client's fallback bucket (a baseline deposits nothing), and whether
// the tokens it gives back still count in a live slot: they were carried (or granted) at its
// previous Sync, or held under a lease that started less than a lease TTL before it, so they
// count until at least that Sync + ttl (Tenant::WindowReport).
core_internal::Tenant::WindowReport WindowReportBefore(const core_internal::Tenant& t,
                                                       const core_internal::InstanceTenant& rec,
                                                       const CumulativeCounters& sent,
                                                       bool baseline, int64_t since_seen_ns)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  core_internal::Tenant::WindowReport r;
  if (baseline) return r;
  const uint64_t now = sent.centrally_deposited_requests();
  const uint64_t before = rec.ledger.applied.centrally_deposited_requests();
  r.deposit = now > before ? t.policy->retry_ratio * static_cast<double>(now - before) : 0;
  r.was_active = since_seen_ns <= t.policy->ttl_ns;
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BudgetCore>> BudgetCore::Create(CoreOptions options) {
  if (auto p = ResolvePolicy(options.policy.default_policy(), "default_policy"); !p.ok()) {
    return p.status();
  }
  std::unique_ptr<BudgetCore> core(new BudgetCore(std::move(options)));
  if (auto s = core->ReplacePolicy(core->options_.policy); !s.ok()) return s;
  return core;
}

BudgetCore::BudgetCore(CoreOptions options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      tombstones_(std::make_unique<core_internal::Tombstones>(options_.max_instances,
                                                              options_.tombstone_ttl)) {}

BudgetCore::~BudgetCore() {
  // The store thread's callbacks (ReserveDurably) use this core.
  if (options_.store != nullptr) options_.store->WaitIdle();
  if (options_.router != nullptr) options_.router->WaitIdle();
}

RefPtr<BudgetCore::Tenant> BudgetCore::FindTenant(absl::string_view name) {
  ReaderMutexLock lock(&tenants_mu_);
  auto it = tenants_.find(name);
  return it == tenants_.end() ? nullptr : *it;
}

RefPtr<BudgetCore::Tenant> BudgetCore::FindOrCreateTenant(absl::string_view name,
                                                                   v1::TenantError* error) {
  if (auto t = FindTenant(name)) return t;
  bool created = false;
  RefPtr<Tenant> tenant = CreateTenant(name, error, &created);
  if (created && (options_.store != nullptr || options_.router != nullptr)) {
    uint64_t block = 0;
    {
      CompactMutexLock lock(&tenant->mu);
      block = ReservationBlock(tenant->policy->capacity);
    }
    PrimeReservation(tenant->name, block);
  }
  return tenant;
}

RefPtr<BudgetCore::Tenant> BudgetCore::CreateTenant(absl::string_view name,
                                                             v1::TenantError* error,
                                                             bool* created) {
  const absl::Time now = clock_->Now();
  MutexLock policy_lock(&policy_mu_);
  ResolvedPolicy policy = default_policy_;
  v1::PolicySource source = v1::POLICY_SOURCE_DEFAULT;
  bool listed = false;
  // Cluster mode: an admin policy in etcd wins over the file.
  if (options_.router != nullptr) {
    if (std::optional<v1::BudgetPolicy> admin = options_.router->AdminPolicy(name)) {
      if (absl::StatusOr<ResolvedPolicy> p = ResolvePolicy(*admin); p.ok()) {
        policy = *p;
        source = v1::POLICY_SOURCE_ADMIN;
        listed = true;
      }
    }
  }
  for (const auto& t : policy_.tenants()) {
    if (listed) break;
    if (t.tenant() == name) {
      // Validated by ReplacePolicy.
      policy = *ResolvePolicy(t.policy());
      source = v1::POLICY_SOURCE_FILE;
      listed = true;
      break;
    }
  }
  if (!listed && policy_.strict()) {
    error->set_code(static_cast<int>(absl::StatusCode::kNotFound));
    error->set_message(absl::StrCat("tenant ", QuoteForError(name),
                                    " has no budget and the server is strict"));
    return nullptr;
  }
  MutexLock lock(&tenants_mu_);
  auto it = tenants_.find(name);
  if (it != tenants_.end()) return *it;
  if (tenants_.size() >= options_.max_tenants) {
    error->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
    error->set_message(absl::StrFormat("tenant %s cannot be created: the server holds %d "
                                       "tenants, its limit",
                                       QuoteForError(name), tenants_.size()));
    return nullptr;
  }
  auto tenant = MakeRef<Tenant>(std::string(name), Intern(policy), source, now);
  tenants_.insert(tenant);
  *created = true;
  return tenant;
}

void BudgetCore::PrimeReservation(const std::string& tenant, uint64_t limit) {
  auto landed = std::make_shared<absl::Notification>();
  ReserveAhead(tenant, limit, /*credited_total=*/0, [landed] { landed->Notify(); });
  landed->WaitForNotificationWithTimeout(options_.first_reservation_wait);
}

absl::Status BudgetCore::FindOrCreateInstance(absl::string_view id, uint64_t seq,
                                              uint64_t principal,
                                              RefPtr<Instance>* instance,
                                              bool* created) {
  *created = false;
  {
    ReaderMutexLock lock(&instances_mu_);
    auto it = instances_.find(id);
    if (it != instances_.end()) {
      (*it)->Prefetch();  // before the reference count's atomic, which waits for its line
      *instance = *it;
      return absl::OkStatus();
    }
  }
  const absl::Time now = clock_->Now();
  MutexLock lock(&instances_mu_);
  auto it = instances_.find(id);
  if (it != instances_.end()) {
    *instance = *it;
    return absl::OkStatus();
  }
  // A tombstone keeps the id's owner and last seq: a delayed duplicate of a request of a
  // finished or evicted instance is stale, never a new baseline with a fresh grant. The
  // tombstone stays until it expires (a live instance shadows it), so a first request that
  // fails below still leaves it in force.
  if (const core_internal::Tombstone* t = tombstones_->Find(id, now); t != nullptr) {
    if (t->principal != principal) {
      return absl::PermissionDeniedError(absl::StrCat(
          "instance_id ", QuoteForError(id),
          " belongs to another credential; nothing in the request was applied"));
    }
    if (seq <= t->last_seq) {
      instance->reset();
      return absl::OkStatus();
    }
  }
  auto fresh = Instance::Create(id, principal);
  // Seen now, so the eviction below takes older instances, never this one.
  fresh->last_seen_ns.store(absl::ToUnixNanos(now), std::memory_order_relaxed);
  instances_.insert(fresh);
  *created = true;
  *instance = std::move(fresh);
  EvictInstancesIfFull();
  return absl::OkStatus();
}

void BudgetCore::EvictInstancesIfFull() {
  if (instances_.size() <= options_.max_instances) return;
  // Forget the least recently seen ~1% (at least one) in one pass, so eviction is amortised.
  // A forgotten instance that comes back is taken as a baseline: forgetting never credits; its
  // tombstone makes its older requests stale.
  const size_t excess = instances_.size() - options_.max_instances;
  const size_t evict = std::min(instances_.size() - 1,
                                std::max(excess, options_.max_instances / 100));
  std::vector<std::pair<int64_t, Instance*>> by_age;
  by_age.reserve(instances_.size());
  for (const auto& inst : instances_) {
    by_age.emplace_back(inst->last_seen_ns.load(std::memory_order_relaxed), inst.get());
  }
  std::nth_element(by_age.begin(), by_age.begin() + evict, by_age.end());
  const absl::Time now = clock_->Now();
  for (size_t i = 0; i < evict; ++i) {
    auto it = instances_.find(absl::string_view(by_age[i].second->id()));
    Instance& inst = **it;
    inst.forgotten.store(true, std::memory_order_release);
    const uint64_t last_seq = inst.last_seq();
    if (last_seq != 0) {
      tombstones_->Put(inst.id(), {.last_seq = last_seq, .principal = inst.principal, .at = now});
    }
    instances_.erase(it);
  }
}

void BudgetCore::ForgetInstance(absl::string_view id, const Instance* instance,
                                uint64_t last_seq) {
  MutexLock lock(&instances_mu_);
  auto it = instances_.find(id);
  if (it == instances_.end() || it->get() != instance) return;
  (*it)->forgotten.store(true, std::memory_order_release);
  if (last_seq != 0) {
    tombstones_->Put(id, {.last_seq = last_seq, .principal = instance->principal,
                          .at = clock_->Now()});
  }
  instances_.erase(it);
}

absl::StatusOr<v1::SyncResponse> BudgetCore::Sync(const v1::SyncRequest& request,
                                                  absl::string_view principal) {
  v1::SyncResponse response;
  if (absl::Status s = Sync(request, &response, principal); !s.ok()) return s;
  return response;
}

absl::Status BudgetCore::Sync(const v1::SyncRequest& request, v1::SyncResponse* response,
                              absl::string_view principal_name) {
  const SyncLimits limits{.max_tenants_per_request = options_.max_tenants_per_request,
                          .max_want = std::min<uint64_t>(options_.max_want, UINT32_MAX)};
  if (auto s = ValidateRequest(request, limits); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  const uint64_t principal = StableHash(principal_name);
  // An instance forgotten (final, eviction, a failed first request) between the lookup and its
  // lock is looked up again. After a few tries the request runs on the forgotten object: what
  // it applies is then lost with it, which credits nothing (the safe direction).
  for (int attempt = 0;; ++attempt) {
    RefPtr<Instance> instance;
    bool created = false;
    if (auto s = FindOrCreateInstance(request.instance_id(), request.seq(), principal, &instance,
                                      &created);
        !s.ok()) {
      return s;
    }
    if (instance == nullptr) {  // a tombstone's seq covers this one
      response->set_stale(true);
      return absl::OkStatus();
    }
    CompactMutexLock instance_lock(&instance->mu);
    if (instance->forgotten.load(std::memory_order_acquire) && attempt < 2) continue;
    return SyncLocked(request, principal, now, *instance, created, response);
  }
}

absl::Status BudgetCore::SyncLocked(const v1::SyncRequest& request, uint64_t principal,
                                    absl::Time now, Instance& instance, bool created,
                                    v1::SyncResponse* response) {
  if (instance.principal != principal) {
    return absl::PermissionDeniedError(
        absl::StrCat("instance_id ", QuoteForError(request.instance_id()),
                     " belongs to another credential; nothing in the request was applied"));
  }
  // Only its owner's requests keep an instance from eviction.
  const int64_t now_ns = absl::ToUnixNanos(now);
  const int64_t previous_seen_ns = instance.last_seen_ns.load(std::memory_order_relaxed);
  instance.last_seen_ns.store(now_ns, std::memory_order_relaxed);
  const uint64_t fingerprint = Fingerprint(request);
  if (const uint64_t last_seq = instance.last_seq(); last_seq != 0) {
    if (request.seq() < last_seq) {
      response->set_stale(true);
      return absl::OkStatus();
    }
    if (request.seq() == last_seq) {
      const uint64_t same = instance.fingerprint_v1 ? FingerprintV1(request) : fingerprint;
      if (same == instance.last_fingerprint) {
        WriteResponse(instance.last_grants, response);
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq = %d was already used by instance %s for a different request; a retry must "
          "repeat the request unchanged and a new request must use a higher seq",
          request.seq(), QuoteForError(request.instance_id())));
    }
    if (request.seq() - last_seq > kMaxSeqJump) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq = %d of instance %s is more than 2^32 past its last applied seq %d",
          request.seq(), QuoteForError(request.instance_id()), last_seq));
    }
  }

  // Phase 1: check the counters against what was applied. Nothing changes before all pass.
  // A tenant without a record is a baseline: nothing to check, nothing credited. So is one whose
  // record was kept for a budget deleted since (a deleted budget, or a shard this server lost in
  // cluster mode, whose next owner granted more than this record knows): the entry is refused
  // or applied as a baseline below, never checked against that stale history.
  // The records found here serve phase 2 too, until it adds one (a map's rehash moves them).
  absl::InlinedVector<core_internal::InstanceTenant*, 16> known(request.tenants_size());
  for (int i = 0; i < request.tenants_size(); ++i) {
    const v1::TenantSync& t = request.tenants(i);
    const core_internal::InstanceTenant* rec = known[i] = instance.tenants.Find(t.tenant());
    if (rec == nullptr || rec->tenant->deleted.load(std::memory_order_acquire)) continue;
    if (auto s = CheckAgainstApplied(i, t, rec->ledger); !s.ok()) {
      if (created) ForgetInstance(request.instance_id(), &instance, 0);
      return s;
    }
  }

  // Phase 2: apply each tenant under its own lock, and grant. The outcome is recorded in place
  // of the previous response (nothing fails from here on).
  GrantRecords& records = instance.last_grants;
  records.resize(request.tenants_size());
  std::vector<std::string> fallback_reports;  // logged once no tenant lock is held
  bool records_moved = false;
  for (int i = 0; i < request.tenants_size(); ++i) {
    core_internal::InstanceTenant* existing =
        records_moved ? instance.tenants.Find(request.tenants(i).tenant()) : known[i];
    records_moved |=
        ApplyEntry(request, i, now_ns, previous_seen_ns, instance, existing, records[i],
                   &fallback_reports);
  }

  instance.set_last_seq(request.seq());
  instance.last_fingerprint = fingerprint;
  instance.fingerprint_v1 = false;
  WriteResponse(records, response);
  if (request.final()) ForgetInstance(request.instance_id(), &instance, request.seq());
  for (const std::string& line : fallback_reports) options_.log(line);
  return absl::OkStatus();
}

BudgetCore::Tenant* BudgetCore::BudgetOf(const core_internal::InstanceTenant* rec,
                                         const v1::TenantSync& sent, RefPtr<Tenant>* found,
                                         GrantRecord& out) {
  if (rec != nullptr && !rec->tenant->deleted.load(std::memory_order_acquire)) {
    return rec->tenant.get();
  }
  v1::TenantError refusal;
  for (int attempt = 0; attempt < 3 && *found == nullptr; ++attempt) {
    *found = FindOrCreateTenant(sent.tenant(), &refusal);
    if (*found == nullptr) break;
    if ((*found)->deleted.load(std::memory_order_acquire)) found->reset();  // look up again
  }
  if (*found == nullptr) {
    if (refusal.code() == 0) {
      refusal.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      refusal.set_message(kDeletedMeanwhile);
    }
    out.Refuse(sent.tenant(), refusal.code(), refusal.message());
    return nullptr;
  }
  return found->get();
}

bool BudgetCore::ApplyEntry(const v1::SyncRequest& request, int index, int64_t now_ns,
                            int64_t previous_seen_ns, Instance& instance,
                            core_internal::InstanceTenant* existing, GrantRecord& out,
                            std::vector<std::string>* fallback_reports) {
  const v1::TenantSync& sent = request.tenants(index);
  const absl::Time now = absl::FromUnixNanos(now_ns);  // inline: for the cluster's calls
  // Cluster mode: only the owner of the tenant's shard, surely alive, applies and grants.
  if (options_.router != nullptr && !options_.router->MayServe(sent.tenant(), now)) {
    Refuse(sent.tenant(), now, out);
    return false;
  }
  RefPtr<Tenant> found;
  Tenant* tenant = BudgetOf(existing, sent, &found, out);
  if (tenant == nullptr) return false;  // refused: `out` says why, and no record is made

  // A record exists only for a tenant applied before, so a refused tenant never gains a
  // history. With no record, BudgetOf looked the budget up: `found` is it.
  const bool new_record = existing == nullptr;
  core_internal::InstanceTenant& rec = new_record ? *instance.tenants.Add(found) : *existing;
  // A baseline also when the budget the record was kept for is not this one (it was deleted, or
  // its shard lost, and this is a new one): the record's grants came from the old budget, and
  // returning them must not fill the new one. A record always names its budget (Restore links
  // the ones it reads).
  const bool baseline = new_record || (found != nullptr && rec.tenant != found);
  // `tenant` is kept alive by `found` (declared before `lock`, so released after it) or, when
  // found is null, by the record, which is left alone until the entry is applied.
  Tenant& tb = *tenant;
  CompactMutexLock lock(&tb.mu);
  if (tb.deleted.load(std::memory_order_relaxed)) {
    // Deleted between the check above and the lock: nothing applied, nothing granted, no new
    // record (an empty one would later pass for a known history), and a kept record still
    // names the budget its history belongs to.
    out.Refuse(sent.tenant(), static_cast<int>(absl::StatusCode::kUnavailable),
               kDeletedMeanwhile);
    if (new_record) instance.tenants.Erase(sent.tenant());
    return new_record;
  }
  // Again under the lock: a shard lost (its budgets dropped) or not loaded yet since the check
  // above leaves no budget here to grant from.
  if (options_.router != nullptr && !options_.router->MayServe(sent.tenant(), now)) {
    Refuse(sent.tenant(), now, out);
    if (new_record) instance.tenants.Erase(sent.tenant());
    return new_record;
  }
  // Applied from here on: the record's history is this budget's.
  if (found != nullptr) rec.tenant = found;
  out.SetGrantedBy(rec.tenant, tb.policy);
  tb.Advance(now_ns);  // up to now, with what the fleet held until this report

  // The report: a baseline records the counters and credits nothing; a known record credits
  // its differences, capped by what this server granted and has not had back (grant_math.h).
  const CumulativeCounters counters = CountersOf(sent);
  Tenant::WindowReport window_report;
  if (tb.window != nullptr) {
    window_report = WindowReportBefore(tb, rec, counters, baseline, now_ns - previous_seen_ns);
  }
  ReportEffect effect;
  if (baseline) {
    rec.ledger = Baseline(counters);
  } else {
    effect = ApplyReport(rec.ledger, counters);
  }
  // What the instance still holds of this server's grants, counted before the deposit below
  // so that tokens it returns make room for themselves under the capacity.
  const uint64_t held = CountedHoldings(rec.ledger);
  // An instance that spent at least what it holds since its previous report (0 for a
  // baseline) passes its tokens through rather than keeping them, and its reported holdings
  // are stale by the time the server could count them.
  // The record's entry counts for this budget (a baseline of a new budget of the same name
  // finds its old slice in no set here, and starts it again).
  core_internal::ActiveEntry* entry = nullptr;
  if (request.final()) {
    tb.RemoveActive(rec.active);
  } else {
    tb.SetActive(rec.active, static_cast<uint32_t>(sent.want()),
                 effect.spent_since < held ? held : 0, now_ns);
    entry = &rec.active;
  }
  if (!baseline) {
    Credit(tb, effect, now_ns, sent.tenant(), request.instance_id(), fallback_reports);
  }
  // A windowed policy: deposits, credit back, and the held tokens carried into the new lease;
  // tokens that cannot be carried end the lease at once, with no grant.
  bool carried = true;
  if (tb.window != nullptr) {
    window_report.credited_back = effect.credited_back;
    window_report.holdings = ReportedHoldings(counters);
    window_report.final = request.final();
    carried = tb.ApplyWindowReport(window_report, now_ns);
  }
  Grant(tb, carried ? entry : nullptr, rec.ledger, sent.want(), held, effect.spent_since, now_ns,
        out);
  out.lease_ends_now = !carried;
  if (!carried) {  // its tokens come back in its next Sync, which can then be granted
    out.next_sync_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.min_next_sync));
  }
  return new_record;
}

void BudgetCore::Credit(Tenant& tb, const ReportEffect& effect, int64_t now_ns,
                        absl::string_view tenant, absl::string_view instance_id,
                        std::vector<std::string>* fallback_reports) {
  const double credit =
      tb.policy->success_credit * static_cast<double>(effect.d_credited_successes);
  tb.Deposit(credit + static_cast<double>(effect.credited_back));
  tb.credited_total += credit + static_cast<double>(effect.credited_back);
  tb.NoteCredit(credit, now_ns);
  BudgetTotals& totals = tb.totals;
  totals.successes = SaturatingAdd(totals.successes, effect.d_successes);
  totals.retries = SaturatingAdd(totals.retries, effect.d_retries);
  totals.refunded = SaturatingAdd(totals.refunded, effect.d_refunded);
  totals.fallback_refunded = SaturatingAdd(totals.fallback_refunded, effect.d_fallback_refunded);
  totals.retries_denied = SaturatingAdd(totals.retries_denied, effect.d_denied);
  totals.shadow_denied = SaturatingAdd(totals.shadow_denied, effect.d_shadow_denied);
  totals.requests = SaturatingAdd(totals.requests, effect.d_requests);
  totals.retries_allowed = SaturatingAdd(totals.retries_allowed, effect.d_retries_allowed);
  totals.returned = SaturatingAdd(totals.returned, effect.d_returned);
  totals.reclaimed = SaturatingAdd(totals.reclaimed, effect.reclaimed);
  totals.uncredited = SaturatingAdd(totals.uncredited, effect.uncredited);
  // Fallback spending took no token from this bucket; it is counted, not debited (the
  // fallback allowance is the documented exception to the bound, DESIGN.md).
  totals.fallback_retries = SaturatingAdd(totals.fallback_retries, effect.d_fallback);
  if (effect.d_fallback > 0 && options_.log) {
    fallback_reports->push_back(absl::StrFormat(
        "tenant %s: instance %s reports %d retries allowed by its local fallback bucket "
        "while it could not reach a server",
        QuoteForError(tenant), QuoteForError(instance_id), effect.d_fallback));
  }
}

void BudgetCore::Grant(Tenant& tb, core_internal::ActiveEntry* entry, LedgerEntry& ledger,
                       uint64_t want, uint64_t held, uint64_t spent_since, int64_t now_ns,
                       GrantRecord& out) {
  uint64_t granted = 0;
  absl::Duration next_sync =
      std::min(options_.max_next_sync, absl::Nanoseconds(tb.policy->lease_ttl_ns / 2));
  double level = 0;
  if (entry != nullptr) {  // null for a final request: nothing is granted
    level = tb.GrantableLevel(now_ns);
    const uint64_t sized = GrantFor(want, tb.WantSum(), level);
    granted = options_.store != nullptr || options_.router != nullptr
                  ? ReserveDurably(tb, sized, level, absl::FromUnixNanos(now_ns))
                  : sized;
    // Cut by a reservation still on its way to disk, not by a dry bucket: it lands within a
    // few milliseconds, so the instance comes back soon rather than at the dry-bucket pace.
    const bool waiting_for_disk = granted < sized;
    granted = tb.TakeGrant(granted, now_ns);
    // Only the holdings of an instance that keeps tokens count against the capacity: it got
    // what it wanted, and it spent less than it now holds since its last report. One that got
    // less than it wants, or spends faster than it holds, is about to spend all it has: its
    // reported holdings are stale at once, and counting them would hold the refill back from
    // the instances waiting for it (the level then sits idle while retries are denied).
    const bool keeps = granted >= want && spent_since < held + granted;
    tb.SetHeld(*entry, keeps ? held + granted : 0);
    RecordGrant(ledger, granted);
    tb.totals.granted = SaturatingAdd(tb.totals.granted, granted);
    tb.totals.wanted = SaturatingAdd(tb.totals.wanted, want);
    if (granted < want) {
      // The bucket is dry: come back when refill has made about one token of this instance's
      // share, not before (an empty lease must not turn into a hot loop of Syncs).
      // The inflow is refill plus success credit: counting refill alone makes instances come
      // back too rarely, and tokens pile up in the bucket while retries are denied.
      next_sync = waiting_for_disk
                      ? options_.min_next_sync
                      : DryNextSync(tb.policy->refill_per_second + tb.CreditRate(), want,
                                    tb.WantSum(), next_sync, options_.min_next_sync);
    }
  }
  // The swept set: entries older than the TTL linger at most a slice's span (SliceSpanNanos).
  const uint32_t active = std::max<uint32_t>(1, static_cast<uint32_t>(tb.ActiveSize()));
  // Fallback shares divide among the largest fleet of the last minute, not the active set of
  // this moment: every instance that may be in fallback at once gets a share of one budget.
  // (WriteResponse computes the share from it and the policy the record keeps.)
  out.granted = static_cast<uint32_t>(granted);  // at most want <= max_want <= UINT32_MAX
  out.next_sync_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(next_sync));
  out.fleet = static_cast<uint32_t>(
      std::min<uint64_t>(std::max<uint64_t>(active, tb.RecentFleetSize(now_ns)), UINT32_MAX));
  // A window's level after the grant (what it allowed less what it granted), or now.
  out.bucket_tokens = tb.window == nullptr ? tb.bucket.tokens()
                      : entry != nullptr   ? level - static_cast<double>(granted)
                                           : tb.GrantableLevel(now_ns);
  out.active_instances = active;
}

uint64_t BudgetCore::ReserveDurably(Tenant& t, uint64_t granted, double level, absl::Time now) {
  // A grant never exceeds the limit already durable: it is cut, never made early. The store
  // thread (or the cluster router's writer) raises the limit ahead of need, never on this thread
  // or under this lock: when what is left after this grant would not cover another grant as
  // large plus a margin, the limit for this grant, one more as large and a block is asked for.
  // "One more as large" is at most what the bucket holds after this grant: a burst out of a full
  // bucket must not reserve a second burst that the bucket cannot give (a new owner, or the
  // server after a crash, counts every reserved token as granted, so that would start the tenant
  // that much in debt). A crash forfeits at most that reservation ahead per tenant: the safe
  // direction.
  //
  // With the journal a block is an eighth of the capacity and the margin half a block (one
  // fdatasync per block of grants). In cluster mode each write is an etcd transaction (a Raft
  // round, counted against etcd's write rate): the block is sized from the tenant's observed
  // grant rate to about `cluster_reserve_ahead` of grants (1 s by default), and the margin is a
  // quarter of a block (250 ms of grants: still far more than one etcd round trip takes), so a
  // busy tenant costs about one write per 0.75 s. What a killed owner had reserved and not
  // granted, the new owner counts as spent: about one block, which is why the block is not
  // larger. The rate is measured between two sizings at least kMinSizingInterval apart: a
  // reservation on its way re-asks on every grant, and those few milliseconds say nothing.
  constexpr absl::Duration kMinSizingInterval = absl::Milliseconds(500);
  const bool cluster = options_.router != nullptr;
  const int64_t now_ns = absl::ToUnixNanos(now);
  uint64_t block = ReservationBlock(t.policy->capacity);
  Tenant::ActiveSet* sizing = cluster ? &t.ActiveSetFrom() : nullptr;
  if (sizing != nullptr) {
    if (sizing->reservation_block == 0) sizing->reservation_block = block;
    block = sizing->reservation_block;
  }
  const uint64_t margin = cluster ? block / 4 : block / 2;
  const uint64_t durable_left =
      t.grant_limit > t.totals.granted ? t.grant_limit - t.totals.granted : 0;
  const uint64_t allowed = std::min(granted, durable_left);
  const double left_after = level - static_cast<double>(allowed);
  const uint64_t another =
      left_after <= 0 ? 0 : std::min(granted, static_cast<uint64_t>(std::ceil(left_after)));
  if (durable_left - allowed < another + margin) {
    if (sizing != nullptr &&
        (sizing->block_sized_at_ns == Tenant::kNever ||
         now_ns - sizing->block_sized_at_ns >= absl::ToInt64Nanoseconds(kMinSizingInterval))) {
      if (sizing->block_sized_at_ns != Tenant::kNever) {
        const double rate =
            static_cast<double>(t.totals.granted - sizing->granted_when_sized) /
            (static_cast<double>(now_ns - sizing->block_sized_at_ns) * 1e-9);
        sizing->reservation_block =
            ClusterReservationBlock(t.policy->capacity, rate,
                                    t.policy->refill_per_second + t.CreditRate(),
                                    options_.cluster_reserve_ahead);
        block = sizing->reservation_block;
      }
      sizing->block_sized_at_ns = now_ns;
      sizing->granted_when_sized = t.totals.granted;
    }
    ReserveAhead(t.name, t.totals.granted + allowed + another + block, t.credited_total);
  }
  return allowed;
}

void BudgetCore::ReserveAhead(const std::string& tenant, uint64_t limit, double credited_total,
                              std::function<void()> done) {
  DurableStore::ReservedCallback callback =
      [this, done = std::move(done)](const std::string& name, uint64_t limit,
                                     const absl::Status& status) {
        if (!status.ok()) {
          store_errors_.fetch_add(1, std::memory_order_relaxed);
        } else {
          // Looked up by name: the journal is keyed by name, so a limit on disk for this name
          // covers whichever tenant of that name holds it now.
          RefPtr<Tenant> t = FindTenant(name);
          if (t != nullptr) {
            CompactMutexLock lock(&t->mu);
            t->grant_limit = std::max(t->grant_limit, limit);
          }
        }
        if (done) done();
      };
  // The journal on disk, or (cluster mode) the tenant's state in etcd.
  if (options_.store != nullptr) {
    options_.store->ReserveAhead(tenant, limit, credited_total, std::move(callback));
  } else {
    options_.router->ReserveAhead(tenant, limit, std::move(callback));
  }
}

void BudgetCore::Refuse(absl::string_view tenant, absl::Time now, GrantRecord& out) {
  TenantRefusal refusal = options_.router->Refusal(tenant, now);
  out.Refuse(tenant, refusal.code, std::move(refusal.message), std::move(refusal.owner));
}

size_t BudgetCore::tenant_count() {
  ReaderMutexLock lock(&tenants_mu_);
  return tenants_.size();
}

size_t BudgetCore::instance_count() {
  ReaderMutexLock lock(&instances_mu_);
  return instances_.size();
}

size_t BudgetCore::tombstone_count() {
  ReaderMutexLock lock(&instances_mu_);
  return tombstones_->size();
}

}  // namespace retrybudget
