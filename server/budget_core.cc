#include "server/budget_core.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "retrybudget/names.h"
#include "retrybudget/recent_extreme.h"
#include "server/token_bucket.h"

namespace retrybudget {

// How long a tenant's largest fleet is remembered for sizing the fallback shares. Longer than
// any lease TTL: after a server hang or outage the instances rejoin one by one, each seeing
// a swept active set, and must not be told that the budget is theirs alone (DESIGN.md, "When
// the server is unreachable").
constexpr int64_t kFleetSizeWindowMillis = 60'000;

struct MaxCount {
  uint64_t operator()(uint64_t a, uint64_t b) const { return std::max(a, b); }
};

// Where a tenant's policy came from: a reload keeps admin-set policies and re-applies the others.
enum class PolicySource { kDefault, kFile, kAdmin };

struct BudgetCore::Tenant {
  Tenant(std::string n, const ResolvedPolicy& p, PolicySource s, absl::Time now)
      : name(std::move(n)),
        policy(p),
        source(s),
        bucket(p.capacity, p.refill_per_second, p.initial_tokens, now),
        last_sweep(now) {}

  struct Active {
    uint64_t want = 0;
    // Tokens the instance may still spend from its leases, as far as the server knows: granted
    // minus spent from leases minus returned, at its last report, plus what was granted then.
    uint64_t held = 0;
    absl::Time last_seen;
  };

  const std::string name;
  Mutex mu;
  ResolvedPolicy policy ABSL_GUARDED_BY(mu);
  PolicySource source ABSL_GUARDED_BY(mu);
  TokenBucket bucket ABSL_GUARDED_BY(mu);
  // Instances that synced within the last lease TTL, with the want they last sent and the tokens
  // they hold. `want_sum` and `held_sum` are the sums, kept incrementally; stale entries are
  // swept at most every 100 ms. An instance silent for a lease TTL holds nothing any more: its
  // client stops spending a lease at send time + TTL.
  // Keyed by the Instance's address, never dereferenced: a pointer hashes and compares without
  // touching the id's characters (this map is probed on every Sync of every tenant entry). An
  // instance forgotten by eviction whose address is reused by a new one only hands its entry
  // over early; the entry would have expired within the TTL anyway.
  absl::flat_hash_map<const Instance*, Active> active ABSL_GUARDED_BY(mu);
  uint64_t want_sum ABSL_GUARDED_BY(mu) = 0;
  uint64_t held_sum ABSL_GUARDED_BY(mu) = 0;  // also the bucket's `leased`
  absl::Time last_sweep ABSL_GUARDED_BY(mu);
  // The most instances active at once lately: the SafeShare divides the budget among them.
  RecentExtreme<uint64_t, MaxCount, kFleetSizeWindowMillis> fleet_size ABSL_GUARDED_BY(mu);
  BudgetTotals totals ABSL_GUARDED_BY(mu);
  // With a durable store: grants may reach this cumulative total (totals.granted) without
  // another reservation on disk.
  uint64_t grant_limit ABSL_GUARDED_BY(mu) = 0;
  // Set (under `mu`) when DeleteBudget removed it from the map; a request holding it looks it up
  // again. Atomic so that a cached pointer can be checked before taking `mu`.
  std::atomic<bool> deleted{false};

  // Records an instance's report: its want and the tokens it still holds. Returns its entry.
  Active& SetActive(const Instance* instance, uint64_t want, uint64_t held, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Active& a = active[instance];
    want_sum = want_sum - a.want + want;
    a.want = want;
    SetHeld(a, held);
    a.last_seen = now;
    return a;
  }

  void SetHeld(Active& a, uint64_t held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    held_sum = held_sum - a.held + held;
    a.held = held;
    bucket.set_leased(static_cast<double>(held_sum));
  }

  void RemoveActive(const Instance* instance) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = active.find(instance);
    if (it == active.end()) return;
    want_sum -= it->second.want;
    SetHeld(it->second, 0);
    active.erase(it);
  }

  void SweepActive(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (now - last_sweep < absl::Milliseconds(100)) return;
    last_sweep = now;
    const absl::Time cutoff = now - policy.lease_ttl;
    for (auto it = active.begin(); it != active.end();) {
      if (it->second.last_seen < cutoff) {
        want_sum -= it->second.want;
        SetHeld(it->second, 0);
        active.erase(it++);
      } else {
        ++it;
      }
    }
  }

  // Brings the bucket up to `now`: forgets the leases that expired (at most 100 ms late), then
  // refills. Every read or change of the level starts here.
  void Advance(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    SweepActive(now);
    bucket.Refill(now);
  }

  // Success credit per second, smoothed over windows of about a second.
  double credit_rate ABSL_GUARDED_BY(mu) = 0;
  double window_credit ABSL_GUARDED_BY(mu) = 0;
  absl::Time window_start ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  void NoteCredit(double credit, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (window_start == absl::InfinitePast()) window_start = now;
    window_credit += credit;
    const absl::Duration window = now - window_start;
    if (window >= absl::Seconds(1)) {
      credit_rate = 0.5 * credit_rate + 0.5 * window_credit / absl::ToDoubleSeconds(window);
      window_credit = 0;
      window_start = now;
    }
  }

  double CreditRate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return credit_rate; }

  uint32_t ActiveCount(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const absl::Time cutoff = now - policy.lease_ttl;
    uint32_t n = 0;
    for (const auto& [id, a] : active) n += a.last_seen >= cutoff ? 1 : 0;
    return n;
  }
};

// What the server last applied for one instance and tenant: the client's cumulative counters,
// and how many tokens the server granted it in all.
struct BudgetCore::InstanceTenant {
  uint64_t successes = 0;
  uint64_t retries_spent = 0;
  uint64_t retries_denied = 0;
  uint64_t tokens_returned = 0;
  uint64_t tokens_received = 0;
  uint64_t fallback_spent = 0;
  uint64_t granted_total = 0;
  // The budget this instance used for the tenant last time, so the next Sync neither looks the
  // name up nor takes the lock of the tenant map. Dropped when that budget was deleted.
  std::shared_ptr<Tenant> tenant;
};

// One entry of the response last sent to an instance, kept so that a retried request gets the
// very same answer. Plain fields rather than a copy of the proto: the records of a steady
// instance are overwritten in place, so keeping them allocates nothing.
struct BudgetCore::GrantRecord {
  std::string tenant;
  uint64_t granted = 0;
  int64_t lease_ttl_ms = 0;
  int64_t next_sync_ms = 0;
  double safe_capacity = 0;
  double safe_refill_per_second = 0;
  double bucket_tokens = 0;
  double capacity = 0;
  uint32_t active_instances = 0;
  // Non-zero when the entry was refused on its own (google.rpc.Code), with its message.
  int32_t error_code = 0;
  std::string error_message;
};

struct BudgetCore::Instance {
  Mutex mu;
  // Last time a request of this instance arrived, for eviction (read without `mu`).
  std::atomic<int64_t> last_seen_ns{0};
  // True when the server has seen this instance since its first request (seq 1): then a tenant
  // it reports for the first time has a known, all-zero history. Otherwise (the server forgot
  // the instance, or restarted) a first report is taken as a baseline and credits nothing.
  bool complete_history ABSL_GUARDED_BY(mu) = false;
  uint64_t last_seq ABSL_GUARDED_BY(mu) = 0;
  size_t last_fingerprint ABSL_GUARDED_BY(mu) = 0;
  // The response to last_seq, one record per tenant entry.
  std::vector<GrantRecord> last_grants ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, InstanceTenant> tenants ABSL_GUARDED_BY(mu);
};

namespace {

// Identifies a request's content, to tell a retry (same seq, same content) from a client bug
// (same seq, different content).
size_t Fingerprint(const v1::SyncRequest& r) {
  size_t h = absl::HashOf(r.seq(), r.final());
  for (const auto& t : r.tenants()) {
    h = absl::HashOf(h, t.tenant(), t.successes(), t.retries_spent(), t.retries_denied(),
                     t.tokens_returned(), t.tokens_received(), t.want(), t.fallback_spent());
  }
  return h;
}

absl::Status Backwards(int index, absl::string_view tenant, absl::string_view counter,
                       uint64_t sent, uint64_t applied) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "tenants[%d].%s = %d for tenant %s is lower than %d already applied; counters are "
      "cumulative and never go backwards",
      index, counter, sent, QuoteForError(tenant), applied));
}

// Whole tokens to grant one instance that wants `want` when the active instances want `want_sum`
// in all (this one included) and the bucket holds `level`. When demand exceeds supply each gets
// its proportional share, at least one token while any is left, so nothing strands.
uint64_t GrantFor(uint64_t want, uint64_t want_sum, double level) {
  const double whole = std::floor(level + 1e-9);
  if (want == 0 || whole < 1) return 0;
  const uint64_t available = static_cast<uint64_t>(whole);
  if (want_sum <= available) return std::min(want, available);
  // Rounded to nearest, not down: flooring leaves up to one token per active instance sitting
  // in the bucket while every instance is denied.
  const double share = std::round(whole * static_cast<double>(want) /
                                  static_cast<double>(std::max(want_sum, want)));
  const uint64_t cap = std::min(want, available);
  return std::clamp<uint64_t>(static_cast<uint64_t>(share), 1, cap);
}

constexpr char kDeletedMeanwhile[] = "tenant was deleted while this request ran";

// Whether the strings in `tenants` are pairwise distinct; -1 if so, else the index of the first
// repeated one. A scan for the few entries of a typical request, a set beyond.
template <typename Entries>
int FirstRepeatedTenant(const Entries& tenants) {
  constexpr int kScanUpTo = 16;
  const int n = tenants.size();
  if (n <= kScanUpTo) {
    for (int i = 1; i < n; ++i) {
      for (int j = 0; j < i; ++j) {
        if (tenants[i].tenant() == tenants[j].tenant()) return i;
      }
    }
    return -1;
  }
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(n);
  for (int i = 0; i < n; ++i) {
    if (!seen.insert(tenants[i].tenant()).second) return i;
  }
  return -1;
}

}  // namespace

absl::Status BudgetCore::CheckAgainstApplied(int index, const v1::TenantSync& sent,
                                             const InstanceTenant* rec) {
  if (rec == nullptr) return absl::OkStatus();
  const std::string& t = sent.tenant();
  if (sent.successes() < rec->successes)
    return Backwards(index, t, "successes", sent.successes(), rec->successes);
  if (sent.retries_spent() < rec->retries_spent)
    return Backwards(index, t, "retries_spent", sent.retries_spent(), rec->retries_spent);
  if (sent.retries_denied() < rec->retries_denied)
    return Backwards(index, t, "retries_denied", sent.retries_denied(), rec->retries_denied);
  if (sent.tokens_returned() < rec->tokens_returned)
    return Backwards(index, t, "tokens_returned", sent.tokens_returned(), rec->tokens_returned);
  if (sent.tokens_received() < rec->tokens_received)
    return Backwards(index, t, "tokens_received", sent.tokens_received(), rec->tokens_received);
  if (sent.fallback_spent() < rec->fallback_spent)
    return Backwards(index, t, "fallback_spent", sent.fallback_spent(), rec->fallback_spent);
  if (sent.tokens_received() > rec->granted_total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tenants[%d].tokens_received = %d for tenant %s exceeds the %d tokens granted to this "
        "instance",
        index, sent.tokens_received(), QuoteForError(t), rec->granted_total));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BudgetCore>> BudgetCore::Create(CoreOptions options) {
  if (auto p = ResolvePolicy(options.policy.default_policy(), "default_policy"); !p.ok()) {
    return p.status();
  }
  std::unique_ptr<BudgetCore> core(new BudgetCore(std::move(options)));
  if (auto s = core->ReplacePolicy(core->options_.policy); !s.ok()) return s;
  return core;
}

BudgetCore::BudgetCore(CoreOptions options)
    : options_(std::move(options)), clock_(options_.clock ? options_.clock : Clock::Real()) {}

BudgetCore::~BudgetCore() {
  // The store thread's callbacks (ReserveDurably) use this core.
  if (options_.store != nullptr) options_.store->WaitIdle();
}

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
  for (auto& [name, tenant] : tenants_) {
    MutexLock lock(&tenant->mu);
    if (tenant->source == PolicySource::kAdmin) continue;
    auto it = listed.find(name);
    const ResolvedPolicy& p = it != listed.end() ? it->second : default_policy_;
    tenant->Advance(now);
    tenant->bucket.Reconfigure(p.capacity, p.refill_per_second);
    tenant->policy = p;
    tenant->source = it != listed.end() ? PolicySource::kFile : PolicySource::kDefault;
  }
  return absl::OkStatus();
}

absl::Status BudgetCore::ValidateRequest(const v1::SyncRequest& request) const {
  if (auto s = ValidateInstanceId(request.instance_id()); !s.ok()) return s;
  if (request.seq() == 0) {
    return absl::InvalidArgumentError("seq = 0 is invalid: seq starts at 1 and increases");
  }
  if (static_cast<size_t>(request.tenants_size()) > options_.max_tenants_per_request) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tenants has %d entries; at most %d are allowed in one request", request.tenants_size(),
        options_.max_tenants_per_request));
  }
  for (int i = 0; i < request.tenants_size(); ++i) {
    const v1::TenantSync& t = request.tenants(i);
    // The field name is only formatted for the error.
    if (!IsValidTenantName(t.tenant())) {
      return ValidateTenantName(t.tenant(), absl::StrCat("tenants[", i, "].tenant"));
    }
    if (t.want() > options_.max_want) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d].want = %d for tenant %s is over the limit of %d tokens", i, t.want(),
          QuoteForError(t.tenant()), options_.max_want));
    }
    if (t.fallback_spent() > t.retries_spent()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d].fallback_spent = %d exceeds retries_spent = %d for tenant %s", i,
          t.fallback_spent(), t.retries_spent(), QuoteForError(t.tenant())));
    }
    // Tokens spent from leases plus tokens given back can never exceed tokens received: a
    // client returning what it never had would create tokens.
    const uint64_t lease_spent = t.retries_spent() - t.fallback_spent();
    if (lease_spent > t.tokens_received() ||
        t.tokens_returned() > t.tokens_received() - lease_spent) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d] for tenant %s: retries spent from leases (%d) + tokens_returned (%d) "
          "exceed tokens_received (%d)",
          i, QuoteForError(t.tenant()), lease_spent, t.tokens_returned(), t.tokens_received()));
    }
  }
  if (const int i = FirstRepeatedTenant(request.tenants()); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tenants[%d].tenant %s appears more than once in the request", i,
                        QuoteForError(request.tenants(i).tenant())));
  }
  return absl::OkStatus();
}

std::shared_ptr<BudgetCore::Tenant> BudgetCore::FindTenant(absl::string_view name) {
  ReaderMutexLock lock(&tenants_mu_);
  auto it = tenants_.find(name);
  return it == tenants_.end() ? nullptr : it->second;
}

std::shared_ptr<BudgetCore::Tenant> BudgetCore::FindOrCreateTenant(absl::string_view name,
                                                                   v1::TenantError* error) {
  if (auto t = FindTenant(name)) return t;
  const absl::Time now = clock_->Now();
  MutexLock policy_lock(&policy_mu_);
  ResolvedPolicy policy = default_policy_;
  PolicySource source = PolicySource::kDefault;
  bool listed = false;
  for (const auto& t : policy_.tenants()) {
    if (t.tenant() == name) {
      // Validated by ReplacePolicy.
      policy = *ResolvePolicy(t.policy());
      source = PolicySource::kFile;
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
  if (it != tenants_.end()) return it->second;
  if (tenants_.size() >= options_.max_tenants) {
    error->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
    error->set_message(absl::StrFormat("tenant %s cannot be created: the server holds %d "
                                       "tenants, its limit",
                                       QuoteForError(name), tenants_.size()));
    return nullptr;
  }
  auto tenant = std::make_shared<Tenant>(std::string(name), policy, source, now);
  tenants_.emplace(tenant->name, tenant);
  return tenant;
}

std::shared_ptr<BudgetCore::Instance> BudgetCore::FindOrCreateInstance(absl::string_view id,
                                                                       bool* created) {
  {
    ReaderMutexLock lock(&instances_mu_);
    auto it = instances_.find(id);
    if (it != instances_.end()) {
      *created = false;
      return it->second;
    }
  }
  MutexLock lock(&instances_mu_);
  auto [it, inserted] = instances_.try_emplace(id, nullptr);
  *created = inserted;
  if (!inserted) return it->second;
  auto instance = std::make_shared<Instance>();
  // Seen now, so the eviction below takes older instances, never this one.
  instance->last_seen_ns.store(absl::ToUnixNanos(clock_->Now()), std::memory_order_relaxed);
  it->second = instance;
  EvictInstancesIfFull();
  return instance;
}

void BudgetCore::EvictInstancesIfFull() {
  if (instances_.size() <= options_.max_instances) return;
  // Forget the least recently seen ~1% (at least one) in one pass, so eviction is amortised.
  // A forgotten instance that comes back is taken as a baseline: forgetting never credits.
  const size_t excess = instances_.size() - options_.max_instances;
  const size_t evict = std::min(instances_.size() - 1,
                                std::max(excess, options_.max_instances / 100));
  std::vector<std::pair<int64_t, std::string>> by_age;
  by_age.reserve(instances_.size());
  for (const auto& [id, inst] : instances_) {
    by_age.emplace_back(inst->last_seen_ns.load(std::memory_order_relaxed), id);
  }
  std::nth_element(by_age.begin(), by_age.begin() + evict, by_age.end());
  for (size_t i = 0; i < evict; ++i) instances_.erase(by_age[i].second);
}

void BudgetCore::ForgetInstance(absl::string_view id) {
  MutexLock lock(&instances_mu_);
  instances_.erase(id);
}

absl::StatusOr<v1::SyncResponse> BudgetCore::Sync(const v1::SyncRequest& request) {
  v1::SyncResponse response;
  if (absl::Status s = Sync(request, &response); !s.ok()) return s;
  return response;
}

void BudgetCore::WriteResponse(absl::Span<const GrantRecord> records,
                               v1::SyncResponse* response) {
  response->mutable_tenants()->Reserve(static_cast<int>(records.size()));
  for (const GrantRecord& r : records) {
    v1::TenantGrant* out = response->add_tenants();
    out->set_tenant(r.tenant);
    if (r.error_code != 0) {
      out->mutable_error()->set_code(r.error_code);
      out->mutable_error()->set_message(r.error_message);
      continue;
    }
    out->set_granted(r.granted);
    out->set_lease_ttl_ms(r.lease_ttl_ms);
    out->set_next_sync_ms(r.next_sync_ms);
    out->mutable_safe_share()->set_capacity(r.safe_capacity);
    out->mutable_safe_share()->set_refill_per_second(r.safe_refill_per_second);
    out->set_bucket_tokens(r.bucket_tokens);
    out->set_capacity(r.capacity);
    out->set_active_instances(r.active_instances);
  }
}

void BudgetCore::ReadResponse(const v1::SyncResponse& response, std::vector<GrantRecord>* records) {
  records->clear();
  for (const v1::TenantGrant& g : response.tenants()) {
    GrantRecord& r = records->emplace_back();
    r.tenant = g.tenant();
    r.granted = g.granted();
    r.lease_ttl_ms = g.lease_ttl_ms();
    r.next_sync_ms = g.next_sync_ms();
    r.safe_capacity = g.safe_share().capacity();
    r.safe_refill_per_second = g.safe_share().refill_per_second();
    r.bucket_tokens = g.bucket_tokens();
    r.capacity = g.capacity();
    r.active_instances = g.active_instances();
    r.error_code = g.error().code();
    r.error_message = g.error().message();
  }
}

absl::Status BudgetCore::Sync(const v1::SyncRequest& request, v1::SyncResponse* response) {
  if (auto s = ValidateRequest(request); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  const size_t fingerprint = Fingerprint(request);

  bool created = false;
  std::shared_ptr<Instance> instance = FindOrCreateInstance(request.instance_id(), &created);
  MutexLock instance_lock(&instance->mu);
  instance->last_seen_ns.store(absl::ToUnixNanos(now), std::memory_order_relaxed);

  if (instance->last_seq != 0) {
    if (request.seq() < instance->last_seq) {
      response->set_stale(true);
      return absl::OkStatus();
    }
    if (request.seq() == instance->last_seq) {
      if (fingerprint == instance->last_fingerprint) {
        WriteResponse(instance->last_grants, response);
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq = %d was already used by instance %s for a different request; a retry must "
          "repeat the request unchanged and a new request must use a higher seq",
          request.seq(), QuoteForError(request.instance_id())));
    }
  } else {
    instance->complete_history = request.seq() == 1;
  }

  // Phase 1: check the counters against what was applied. Nothing changes before all pass.
  // `known[i]` is false for a baseline: history the server does not know credits nothing.
  const InstanceTenant zero;
  absl::InlinedVector<bool, 16> known(request.tenants_size(), false);
  for (int i = 0; i < request.tenants_size(); ++i) {
    const v1::TenantSync& t = request.tenants(i);
    const InstanceTenant* applied = nullptr;
    auto it = instance->tenants.find(t.tenant());
    if (it != instance->tenants.end()) {
      applied = &it->second;
    } else if (instance->complete_history) {
      applied = &zero;
    }
    known[i] = applied != nullptr;
    if (auto s = CheckAgainstApplied(i, t, applied); !s.ok()) {
      if (created) ForgetInstance(request.instance_id());
      return s;
    }
  }

  // Phase 2: apply each tenant under its own lock, and grant. The outcome is recorded in place
  // of the previous response (nothing fails from here on).
  std::vector<GrantRecord>& records = instance->last_grants;
  records.resize(request.tenants_size());
  std::vector<std::string> fallback_reports;  // logged once no tenant lock is held
  for (int i = 0; i < request.tenants_size(); ++i) {
    const v1::TenantSync& sent = request.tenants(i);
    GrantRecord& out = records[i];
    out.tenant = sent.tenant();
    out.error_code = 0;
    out.error_message.clear();

    // The budget: the one this instance used last time unless it was deleted since, else found
    // (or created) by name. A record exists only for a tenant applied before, so a
    // refused tenant never gains a history.
    auto rec_it = instance->tenants.find(sent.tenant());
    Tenant* tenant = nullptr;
    if (rec_it != instance->tenants.end() && rec_it->second.tenant != nullptr &&
        !rec_it->second.tenant->deleted.load(std::memory_order_acquire)) {
      tenant = rec_it->second.tenant.get();
    }
    std::shared_ptr<Tenant> found;
    if (tenant == nullptr) {
      v1::TenantError refusal;
      for (int attempt = 0; attempt < 3 && found == nullptr; ++attempt) {
        found = FindOrCreateTenant(sent.tenant(), &refusal);
        if (found == nullptr) break;
        if (found->deleted.load(std::memory_order_acquire)) found = nullptr;  // look up again
      }
      if (found == nullptr) {
        if (refusal.code() == 0) {
          refusal.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
          refusal.set_message(kDeletedMeanwhile);
        }
        out.error_code = refusal.code();
        out.error_message = refusal.message();
        continue;
      }
      tenant = found.get();
    }

    const bool new_record = rec_it == instance->tenants.end();
    if (new_record) rec_it = instance->tenants.try_emplace(sent.tenant()).first;
    InstanceTenant& rec = rec_it->second;
    if (found != nullptr) rec.tenant = std::move(found);  // keeps `tenant` alive
    std::shared_ptr<Tenant> keep_alive;  // outlives `lock` when the record lets go below
    MutexLock lock(&tenant->mu);
    Tenant& tb = *tenant;
    if (tb.deleted.load(std::memory_order_relaxed)) {
      // Deleted between the check above and the lock: nothing applied, nothing granted, and no
      // new record (an empty one would later pass for a known, all-zero history).
      out.error_code = static_cast<int>(absl::StatusCode::kUnavailable);
      out.error_message = kDeletedMeanwhile;
      keep_alive = std::move(rec.tenant);
      if (new_record) instance->tenants.erase(rec_it);
      continue;
    }
    tb.Advance(now);  // up to now, with what the fleet held until this report
    // What the instance still holds after this report (validated: never negative), recorded
    // before the deposit below so that tokens it returns or never received make room for
    // themselves under the capacity.
    const uint64_t held = sent.tokens_received() - (sent.retries_spent() - sent.fallback_spent()) -
                          sent.tokens_returned();
    // What it spent since its previous report (0 for a baseline): an instance that spends at
    // least what it holds per report interval passes its tokens through rather than keeping
    // them, and its reported holdings are stale by the time the server could count them.
    const uint64_t spent_since = known[i] ? sent.retries_spent() - rec.retries_spent : 0;
    Tenant::Active* entry = nullptr;
    if (request.final()) {
      tb.RemoveActive(instance.get());
    } else {
      entry = &tb.SetActive(instance.get(), sent.want(), spent_since < held ? held : 0, now);
      tb.fleet_size.Note(tb.active.size(), now);
    }
    if (known[i]) {
      // Known history: apply only the difference. `rec` may be a fresh zero record here.
      const uint64_t d_success = sent.successes() - rec.successes;
      const uint64_t d_spent = sent.retries_spent() - rec.retries_spent;
      const uint64_t d_denied = sent.retries_denied() - rec.retries_denied;
      const uint64_t d_returned = sent.tokens_returned() - rec.tokens_returned;
      // Granted but never received: the response was lost, so those tokens were never spent.
      const uint64_t reclaimed = rec.granted_total - sent.tokens_received();
      const double credit = tb.policy.success_credit * static_cast<double>(d_success);
      tb.bucket.Deposit(credit + static_cast<double>(d_returned + reclaimed));
      tb.NoteCredit(credit, now);
      tb.totals.successes += d_success;
      tb.totals.retries += d_spent;
      tb.totals.retries_denied += d_denied;
      tb.totals.returned += d_returned;
      tb.totals.reclaimed += reclaimed;
      // Fallback spending took no token from this bucket; it is counted, not debited (the
      // fallback allowance is the documented exception to the bound, DESIGN.md).
      const uint64_t d_fallback = sent.fallback_spent() - rec.fallback_spent;
      tb.totals.fallback_retries += d_fallback;
      if (d_fallback > 0 && options_.log) {
        fallback_reports.push_back(absl::StrFormat(
            "tenant %s: instance %s reports %d retries allowed by its local fallback bucket "
            "while it could not reach a server",
            QuoteForError(sent.tenant()), QuoteForError(request.instance_id()), d_fallback));
      }
    }
    // Baseline or not, the record now holds the client's totals.
    rec.successes = sent.successes();
    rec.retries_spent = sent.retries_spent();
    rec.retries_denied = sent.retries_denied();
    rec.tokens_returned = sent.tokens_returned();
    rec.tokens_received = sent.tokens_received();
    rec.fallback_spent = sent.fallback_spent();
    rec.granted_total = sent.tokens_received();

    uint64_t granted = 0;
    const absl::Duration ttl = tb.policy.lease_ttl;
    absl::Duration next_sync = std::min(options_.max_next_sync, ttl / 2);
    if (entry != nullptr) {
      granted = GrantFor(sent.want(), tb.want_sum, tb.bucket.tokens());
      if (options_.store != nullptr) granted = ReserveDurably(tb, granted);
      granted = tb.bucket.Take(granted);
      // Only the holdings of an instance that keeps tokens count against the capacity: it got
      // what it wanted, and it spent less than it now holds since its last report. One that got
      // less than it wants, or spends faster than it holds, is about to spend all it has: its
      // reported holdings are stale at once, and counting them would hold the refill back from
      // the instances waiting for it (the level then sits idle while retries are denied).
      const bool keeps = granted >= sent.want() && spent_since < held + granted;
      tb.SetHeld(*entry, keeps ? held + granted : 0);
      rec.granted_total += granted;
      tb.totals.granted += granted;
      tb.totals.wanted += sent.want();
      if (granted < sent.want()) {
        // The bucket is dry: come back when refill has made about one token of this instance's
        // share, not before (an empty lease must not turn into a hot loop of Syncs).
        // The inflow is refill plus success credit: counting refill alone makes instances come
        // back too rarely, and tokens pile up in the bucket while retries are denied.
        const double inflow = tb.policy.refill_per_second + tb.CreditRate();
        const double share_rate = inflow * static_cast<double>(sent.want()) /
                                  static_cast<double>(std::max(tb.want_sum, sent.want()));
        const absl::Duration dry_cap = std::min(next_sync, absl::Milliseconds(250));
        next_sync = share_rate > 0 ? absl::Seconds(1.0 / share_rate) : dry_cap;
        next_sync = std::clamp(next_sync, options_.min_next_sync, dry_cap);
      }
    }
    // The swept set, not an exact scan: entries older than the TTL linger at most 100 ms (the
    // sweep period), and a scan per entry of every Sync would cost O(instances of the tenant).
    const uint32_t active = std::max<uint32_t>(1, static_cast<uint32_t>(tb.active.size()));
    // Fallback shares divide among the largest fleet of the last minute, not the active set of
    // this moment: every instance that may be in fallback at once gets a share of one budget.
    const double fleet = static_cast<double>(
        std::max<uint64_t>(active, tb.fleet_size.Get(now).value_or(0)));
    out.granted = granted;
    out.lease_ttl_ms = absl::ToInt64Milliseconds(ttl);
    out.next_sync_ms = absl::ToInt64Milliseconds(next_sync);
    out.safe_capacity = tb.policy.capacity / fleet;
    out.safe_refill_per_second = tb.policy.refill_per_second / fleet;
    out.bucket_tokens = tb.bucket.tokens();
    out.capacity = tb.policy.capacity;
    out.active_instances = active;
  }

  instance->last_seq = request.seq();
  instance->last_fingerprint = fingerprint;
  WriteResponse(records, response);
  if (request.final()) ForgetInstance(request.instance_id());
  for (const std::string& line : fallback_reports) options_.log(line);
  return absl::OkStatus();
}

v1::BudgetStatus BudgetCore::StatusOf(Tenant& tenant, absl::Time now) {
  MutexLock lock(&tenant.mu);
  tenant.Advance(now);
  v1::BudgetStatus s;
  s.set_tenant(tenant.name);
  *s.mutable_policy() = tenant.policy.ToProto();
  s.set_tokens(tenant.bucket.tokens());
  s.set_leased_tokens(static_cast<double>(tenant.held_sum));
  s.set_active_instances(tenant.ActiveCount(now));
  s.set_granted_total(tenant.totals.granted);
  s.set_successes_total(tenant.totals.successes);
  s.set_retries_total(tenant.totals.retries);
  s.set_retries_denied_total(tenant.totals.retries_denied);
  s.set_returned_total(tenant.totals.returned);
  s.set_reclaimed_total(tenant.totals.reclaimed);
  s.set_wanted_total(tenant.totals.wanted);
  s.set_explicit_policy(tenant.source != PolicySource::kDefault);
  s.set_fallback_retries_total(tenant.totals.fallback_retries);
  return s;
}

absl::StatusOr<v1::BudgetStatus> BudgetCore::GetBudget(absl::string_view tenant) {
  if (auto s = ValidateTenantName(tenant); !s.ok()) return s;
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
  std::vector<std::shared_ptr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    for (const auto& [name, t] : tenants_) {
      if (request.page_token().empty() || name > request.page_token()) tenants.push_back(t);
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

absl::StatusOr<v1::BudgetStatus> BudgetCore::PutPolicy(absl::string_view tenant,
                                                       const v1::BudgetPolicy& policy) {
  if (auto s = ValidateTenantName(tenant); !s.ok()) return s;
  auto resolved = ResolvePolicy(policy, "policy");
  if (!resolved.ok()) return resolved.status();
  const absl::Time now = clock_->Now();
  std::shared_ptr<Tenant> t;
  {
    MutexLock lock(&tenants_mu_);
    auto it = tenants_.find(tenant);
    if (it != tenants_.end()) {
      t = it->second;
    } else {
      if (tenants_.size() >= options_.max_tenants) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "tenant %s cannot be created: the server holds %d tenants, its limit",
            QuoteForError(tenant), tenants_.size()));
      }
      t = std::make_shared<Tenant>(std::string(tenant), *resolved, PolicySource::kAdmin, now);
      tenants_.emplace(t->name, t);
      return StatusOf(*t, now);
    }
  }
  {
    MutexLock lock(&t->mu);
    t->Advance(now);  // time so far counts at the old rate
    t->bucket.Reconfigure(resolved->capacity, resolved->refill_per_second);
    t->policy = *resolved;
    t->source = PolicySource::kAdmin;
  }
  return StatusOf(*t, now);
}

absl::Status BudgetCore::DeleteBudget(absl::string_view tenant) {
  if (auto s = ValidateTenantName(tenant); !s.ok()) return s;
  std::shared_ptr<Tenant> t;
  {
    MutexLock lock(&tenants_mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) {
      return absl::NotFoundError(absl::StrCat("tenant ", QuoteForError(tenant), " has no budget"));
    }
    t = it->second;
    tenants_.erase(it);
  }
  MutexLock lock(&t->mu);
  t->deleted.store(true, std::memory_order_release);
  return absl::OkStatus();
}

std::vector<v1::BudgetStatus> BudgetCore::Snapshot() {
  std::vector<v1::BudgetStatus> out;
  std::vector<std::shared_ptr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    for (const auto& [name, t] : tenants_) tenants.push_back(t);
  }
  std::sort(tenants.begin(), tenants.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  const absl::Time now = clock_->Now();
  out.reserve(tenants.size());
  for (auto& t : tenants) out.push_back(StatusOf(*t, now));
  return out;
}

uint64_t BudgetCore::ReserveDurably(Tenant& t, uint64_t granted) {
  // A grant never exceeds the limit already on disk: it is cut, never made early. The store
  // thread raises the limit ahead of need (one fdatasync per block of grants, not per grant, and
  // never on this thread or under this lock): when what is left after this grant would not cover
  // another grant as large plus half a block, the limit for this grant, one more as large and a
  // block is asked for. A crash forfeits at most that reservation ahead per tenant: the safe
  // direction.
  const uint64_t block =
      std::clamp<uint64_t>(static_cast<uint64_t>(t.policy.capacity / 8), 8, 1'000'000);
  const uint64_t durable_left =
      t.grant_limit > t.totals.granted ? t.grant_limit - t.totals.granted : 0;
  const uint64_t allowed = std::min(granted, durable_left);
  if (durable_left - allowed < granted + block / 2) {
    options_.store->ReserveAhead(
        t.name, t.totals.granted + allowed + granted + block,
        [this](const std::string& name, uint64_t limit, const absl::Status& status) {
          if (!status.ok()) {
            store_errors_.fetch_add(1, std::memory_order_relaxed);
            return;
          }
          // Looked up by name: the journal is keyed by name, so a limit on disk for this name
          // covers whichever tenant of that name holds it now.
          std::shared_ptr<Tenant> tenant;
          {
            ReaderMutexLock lock(&tenants_mu_);
            auto it = tenants_.find(name);
            if (it == tenants_.end()) return;
            tenant = it->second;
          }
          MutexLock lock(&tenant->mu);
          tenant->grant_limit = std::max(tenant->grant_limit, limit);
        });
  }
  return allowed;
}

namespace {

int32_t SourceToProto(PolicySource s) { return static_cast<int32_t>(s); }

PolicySource SourceFromProto(int32_t v) {
  switch (v) {
    case 1:
      return PolicySource::kFile;
    case 2:
      return PolicySource::kAdmin;
    default:
      return PolicySource::kDefault;
  }
}

}  // namespace

v1::ServerState BudgetCore::ExportState(bool clean) {
  const absl::Time now = clock_->Now();
  v1::ServerState state;
  state.set_clean(clean);
  state.set_written_at_unix_nanos(absl::ToUnixNanos(now));
  std::vector<std::shared_ptr<Tenant>> tenants;
  {
    ReaderMutexLock lock(&tenants_mu_);
    for (const auto& [name, t] : tenants_) tenants.push_back(t);
  }
  for (auto& t : tenants) {
    MutexLock lock(&t->mu);
    t->Advance(now);
    if (clean) t->grant_limit = std::min(t->grant_limit, t->totals.granted);
    v1::TenantState* ts = state.add_tenants();
    ts->set_tenant(t->name);
    *ts->mutable_policy() = t->policy.ToProto();
    ts->set_policy_source(SourceToProto(t->source));
    ts->set_level(t->bucket.tokens());
    ts->set_level_at_unix_nanos(absl::ToUnixNanos(t->bucket.last_refill()));
    ts->set_granted_total(t->totals.granted);
    ts->set_grant_limit(std::max(t->grant_limit, t->totals.granted));
    ts->set_wanted_total(t->totals.wanted);
    ts->set_successes_total(t->totals.successes);
    ts->set_retries_total(t->totals.retries);
    ts->set_retries_denied_total(t->totals.retries_denied);
    ts->set_returned_total(t->totals.returned);
    ts->set_reclaimed_total(t->totals.reclaimed);
    ts->set_fallback_retries_total(t->totals.fallback_retries);
  }
  std::vector<std::pair<std::string, std::shared_ptr<Instance>>> instances;
  {
    ReaderMutexLock lock(&instances_mu_);
    for (const auto& [id, inst] : instances_) instances.emplace_back(id, inst);
  }
  for (auto& [id, inst] : instances) {
    MutexLock lock(&inst->mu);
    v1::InstanceState* is = state.add_instances();
    is->set_instance_id(id);
    is->set_complete_history(inst->complete_history);
    is->set_last_seq(inst->last_seq);
    is->set_last_fingerprint(inst->last_fingerprint);
    WriteResponse(inst->last_grants, is->mutable_last_response());
    is->set_last_seen_unix_nanos(inst->last_seen_ns.load(std::memory_order_relaxed));
    for (const auto& [tenant, rec] : inst->tenants) {
      v1::InstanceTenantState* r = is->add_tenants();
      r->set_tenant(tenant);
      r->set_successes(rec.successes);
      r->set_retries_spent(rec.retries_spent);
      r->set_retries_denied(rec.retries_denied);
      r->set_tokens_returned(rec.tokens_returned);
      r->set_tokens_received(rec.tokens_received);
      r->set_fallback_spent(rec.fallback_spent);
      r->set_granted_total(rec.granted_total);
    }
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
  auto current_policy = [&](const std::string& name, PolicySource* source) {
    auto it = listed.find(name);
    *source = it != listed.end() ? PolicySource::kFile : PolicySource::kDefault;
    return it != listed.end() ? it->second : default_policy_;
  };

  absl::flat_hash_map<std::string, std::shared_ptr<Tenant>> restored;
  if (recovered.snapshot.has_value()) {
    for (const v1::TenantState& ts : recovered.snapshot->tenants()) {
      if (auto s = ValidateTenantName(ts.tenant(), "snapshot tenant"); !s.ok()) return s;
      PolicySource source = SourceFromProto(ts.policy_source());
      ResolvedPolicy policy;
      if (source == PolicySource::kAdmin) {
        auto p = ResolvePolicy(ts.policy(), absl::StrCat("snapshot tenant ", ts.tenant()));
        if (!p.ok()) return p.status();
        policy = *p;
      } else {
        policy = current_policy(ts.tenant(), &source);
      }
      const absl::Time at = absl::FromUnixNanos(ts.level_at_unix_nanos());
      auto t = std::make_shared<Tenant>(ts.tenant(), policy, source, at);
      MutexLock lock(&t->mu);
      uint64_t limit = std::max(ts.grant_limit(), ts.granted_total());
      if (auto it = recovered.reservations.find(ts.tenant()); it != recovered.reservations.end()) {
        limit = std::max(limit, it->second);
      }
      // After a crash, every token up to the durable limit may have been granted.
      const uint64_t granted = clean ? ts.granted_total() : limit;
      t->bucket.Restore(ts.level() - static_cast<double>(granted - ts.granted_total()), at);
      t->grant_limit = limit;
      t->totals = BudgetTotals{.granted = granted,
                               .wanted = ts.wanted_total(),
                               .successes = ts.successes_total(),
                               .retries = ts.retries_total(),
                               .retries_denied = ts.retries_denied_total(),
                               .returned = ts.returned_total(),
                               .reclaimed = ts.reclaimed_total(),
                               .fallback_retries = ts.fallback_retries_total()};
      restored.emplace(ts.tenant(), std::move(t));
    }
  }
  // Tenants created after the last snapshot that had reserved grants: recreated now, in debt by
  // everything they may have granted.
  for (const auto& [name, limit] : recovered.reservations) {
    if (restored.contains(name)) continue;
    if (auto s = ValidateTenantName(name, "journal tenant"); !s.ok()) return s;
    PolicySource source;
    const ResolvedPolicy policy = current_policy(name, &source);
    auto t = std::make_shared<Tenant>(name, policy, source, now);
    MutexLock lock(&t->mu);
    t->bucket.Restore(policy.initial_tokens - static_cast<double>(limit), now);
    t->grant_limit = limit;
    t->totals.granted = limit;
    restored.emplace(name, std::move(t));
  }

  absl::flat_hash_map<std::string, std::shared_ptr<Instance>> instances;
  if (clean) {
    for (const v1::InstanceState& is : recovered.snapshot->instances()) {
      auto inst = std::make_shared<Instance>();
      MutexLock lock(&inst->mu);
      inst->complete_history = is.complete_history();
      inst->last_seq = is.last_seq();
      inst->last_fingerprint = is.last_fingerprint();
      ReadResponse(is.last_response(), &inst->last_grants);
      inst->last_seen_ns.store(is.last_seen_unix_nanos(), std::memory_order_relaxed);
      for (const v1::InstanceTenantState& r : is.tenants()) {
        inst->tenants[r.tenant()] = InstanceTenant{.successes = r.successes(),
                                                   .retries_spent = r.retries_spent(),
                                                   .retries_denied = r.retries_denied(),
                                                   .tokens_returned = r.tokens_returned(),
                                                   .tokens_received = r.tokens_received(),
                                                   .fallback_spent = r.fallback_spent(),
                                                   .granted_total = r.granted_total(),
                                                   .tenant = nullptr};
      }
      instances.emplace(is.instance_id(), std::move(inst));
    }
  }
  {
    MutexLock lock(&tenants_mu_);
    tenants_ = std::move(restored);
  }
  MutexLock lock(&instances_mu_);
  instances_ = std::move(instances);
  return absl::OkStatus();
}

size_t BudgetCore::tenant_count() {
  ReaderMutexLock lock(&tenants_mu_);
  return tenants_.size();
}

size_t BudgetCore::instance_count() {
  ReaderMutexLock lock(&instances_mu_);
  return instances_.size();
}

}  // namespace retrybudget
