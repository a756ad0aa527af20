#include "server/replay_cache.h"

#include <bit>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "server/cumulative_counters.h"
#include "server/grant_math.h"

namespace retrybudget {

void StableHasher::Byte(uint8_t b) {
  h_ ^= b;
  h_ *= 0x100000001b3ULL;  // FNV-1a prime
}

void StableHasher::Add(uint64_t v) {
  for (int i = 0; i < 8; ++i) Byte(static_cast<uint8_t>(v >> (8 * i)));
}

void StableHasher::Add(absl::string_view s) {
  Add(static_cast<uint64_t>(s.size()));
  for (char c : s) Byte(static_cast<uint8_t>(c));
}

uint64_t StableHasher::Mix(uint64_t z) {
  // The splitmix64 finaliser: spreads FNV's weak high bits.
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t StableHasher::Finish() const { return Mix(h_); }

uint64_t StableHash(absl::string_view s) {
  StableHasher h;
  h.Add(s);
  return h.Finish();
}

void WordHasher::Add(absl::string_view s) {
  Add(static_cast<uint64_t>(s.size()));
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    Add(w);
  }
  if (i < s.size()) {
    uint64_t w = 0;
    for (size_t k = 0; i + k < s.size(); ++k) {
      w |= static_cast<uint64_t>(static_cast<uint8_t>(s[i + k])) << (8 * k);
    }
    Add(w);
  }
}

uint64_t WordHasher::Finish() const { return StableHasher::Mix(h_); }

namespace {

// The canonical walk of a request, the same for every version: only the hasher differs.
template <typename Hasher>
uint64_t Walk(const v1::SyncRequest& r) {
  Hasher h;
  h.Add(r.instance_id());
  h.Add(r.seq());
  h.Add(r.final() ? 1 : 0);
  h.Add(static_cast<uint64_t>(r.tenants_size()));
  for (const v1::TenantSync& t : r.tenants()) {
    h.Add(t.tenant());
    h.Add(t.want());
    const CumulativeCounters counters = CountersOf(t);
    ForEachCounter([&](const CounterField& f) {
      const uint64_t v = counters.*f.value;
      if (v != 0 || !f.fingerprint_only_when_set) h.Add(v);
    });
  }
  return h.Finish();
}

}  // namespace

uint64_t Fingerprint(const v1::SyncRequest& r) { return Walk<WordHasher>(r); }

uint64_t FingerprintV1(const v1::SyncRequest& r) { return Walk<StableHasher>(r); }

namespace {

std::vector<std::unique_ptr<v1::SafeShare>>& KeptSafeShares() {
  static thread_local std::vector<std::unique_ptr<v1::SafeShare>> kept;
  return kept;
}

// A cleared SafeShare for `out`'s safe_share: one this thread kept, else a new one.
v1::SafeShare* SafeShareFor(v1::TenantGrant* out) {
  auto& kept = KeptSafeShares();
  if (kept.empty() || out->GetArena() != nullptr) return out->mutable_safe_share();
  out->set_allocated_safe_share(kept.back().release());
  kept.pop_back();
  return out->mutable_safe_share();
}

}  // namespace

void ClearForReuse(v1::SyncResponse* response) {
  auto& kept = KeptSafeShares();
  if (response->GetArena() == nullptr) {
    for (v1::TenantGrant& g : *response->mutable_tenants()) {
      if (kept.size() >= kKeptSafeShares) break;
      if (!g.has_safe_share()) continue;
      kept.emplace_back(g.release_safe_share())->Clear();
    }
  }
  response->Clear();
}

size_t KeptSafeSharesOnThisThread() { return KeptSafeShares().size(); }

// An instance keeps one per tenant entry it synced: its memory (docs/BENCHMARKS.md 4a) counts on
// this size.
static_assert(sizeof(GrantRecord) <= 40);

GrantRecord::GrantRecord(GrantRecord&& other) noexcept
    : bucket_tokens(other.bucket_tokens),
      granted(other.granted),
      next_sync_ms(other.next_sync_ms),
      lease_ends_now(other.lease_ends_now),
      fleet(other.fleet),
      active_instances(other.active_instances),
      budget_(std::move(other.budget_)) {
  // `other` is left a cold record (its budget moved out), holding nothing.
  if (budget_ != nullptr) {
    new (&policy_) PolicyRef(std::move(other.policy_));
    other.policy_.~PolicyRef();
    new (&other.cold_) std::unique_ptr<Cold>();
  } else {
    new (&cold_) std::unique_ptr<Cold>(std::move(other.cold_));
  }
}

GrantRecord& GrantRecord::operator=(GrantRecord&& other) noexcept {
  if (this != &other) {
    this->~GrantRecord();
    new (this) GrantRecord(std::move(other));
  }
  return *this;
}

void GrantRecord::DestroyRest() {
  if (budget_ != nullptr) {
    policy_.~PolicyRef();
  } else {
    cold_.~unique_ptr<Cold>();
  }
}

absl::string_view GrantRecord::tenant() const {
  if (budget_ != nullptr) return budget_->name;
  return cold_ != nullptr ? absl::string_view(cold_->tenant) : absl::string_view();
}

void GrantRecord::SetGrantedBy(const RefPtr<core_internal::Tenant>& by, const PolicyRef& under) {
  if (budget_ == nullptr) {
    cold_.~unique_ptr<Cold>();
    new (&policy_) PolicyRef(under);
    budget_ = by;
    return;
  }
  if (budget_ != by) budget_ = by;
  if (policy_ != under) policy_ = under;
}

void GrantRecord::SetCold(std::unique_ptr<Cold> cold) {
  DestroyRest();
  budget_.reset();
  new (&cold_) std::unique_ptr<Cold>(std::move(cold));
}

void GrantRecord::Refuse(absl::string_view tenant, int32_t code, std::string message,
                         std::string owner) {
  auto cold = std::make_unique<Cold>();
  cold->tenant = std::string(tenant);
  cold->code = code;
  cold->message = std::move(message);
  cold->owner = std::move(owner);
  SetCold(std::move(cold));
}

void WriteResponse(absl::Span<const GrantRecord> records, v1::SyncResponse* response) {
  response->mutable_tenants()->Reserve(static_cast<int>(records.size()));
  for (const GrantRecord& r : records) {
    v1::TenantGrant* out = response->add_tenants();
    const absl::string_view tenant = r.tenant();
    // Assigned in place: set_tenant(data, size) would build a new std::string and move it in,
    // dropping the capacity a reused response (reused_messages.h) keeps for the name.
    out->mutable_tenant()->assign(tenant.data(), tenant.size());
    const GrantRecord::Cold* cold = r.cold();
    if (cold != nullptr && cold->code != 0) {
      out->mutable_error()->set_code(cold->code);
      out->mutable_error()->set_message(cold->message);
      if (!cold->owner.empty()) out->mutable_error()->set_owner(cold->owner);
      continue;
    }
    out->set_bucket_tokens(r.bucket_tokens);
    out->set_active_instances(r.active_instances);
    v1::SafeShare* safe = SafeShareFor(out);
    if (cold != nullptr) {  // read back from a snapshot: as it was sent
      out->set_granted(cold->granted);
      out->set_lease_ttl_ms(cold->lease_ttl_ms);
      out->set_next_sync_ms(cold->next_sync_ms);
      safe->set_capacity(cold->safe_capacity);
      safe->set_refill_per_second(cold->safe_refill_per_second);
      safe->set_success_credit(cold->safe_success_credit);
      safe->set_request_credit(cold->safe_request_credit);
      out->set_capacity(cold->capacity);
      out->set_mode(cold->mode);
      continue;
    }
    if (r.policy() == nullptr) {  // never set: not a response any request was sent
      out->mutable_error()->set_code(static_cast<int32_t>(absl::StatusCode::kInternal));
      out->mutable_error()->set_message("no outcome was recorded for this entry");
      continue;
    }
    // The values the grant sent, computed again from what it was computed from.
    out->set_granted(r.granted);
    const InternedPolicy& p = *r.policy();
    const SafeShareOf share = SafeShare(p.capacity, p.refill_per_second, r.fleet);
    out->set_lease_ttl_ms(r.lease_ends_now ? 0 : p.lease_ttl_ns / 1'000'000);
    out->set_next_sync_ms(r.next_sync_ms);
    safe->set_capacity(share.capacity);
    safe->set_refill_per_second(share.refill_per_second);
    // Credit is not divided: each success is seen by exactly one instance.
    safe->set_success_credit(p.success_credit);
    // Nor is a request's deposit: each request is recorded by exactly one instance.
    safe->set_request_credit(p.windowed ? p.retry_ratio : 0);
    out->set_capacity(p.capacity);
    out->set_mode(p.shadow ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
  }
}

void ReadResponse(const v1::SyncResponse& response, GrantRecords* records) {
  records->clear();
  for (const v1::TenantGrant& g : response.tenants()) {
    GrantRecord& r = records->emplace_back();
    if (g.error().code() != 0) {
      r.Refuse(g.tenant(), g.error().code(), g.error().message(), g.error().owner());
      continue;
    }
    r.bucket_tokens = g.bucket_tokens();
    r.active_instances = g.active_instances();
    auto cold = std::make_unique<GrantRecord::Cold>();
    cold->tenant = g.tenant();
    cold->granted = g.granted();
    cold->lease_ttl_ms = g.lease_ttl_ms();
    cold->next_sync_ms = g.next_sync_ms();
    cold->safe_capacity = g.safe_share().capacity();
    cold->safe_refill_per_second = g.safe_share().refill_per_second();
    cold->safe_success_credit = g.safe_share().success_credit();
    cold->safe_request_credit = g.safe_share().request_credit();
    cold->capacity = g.capacity();
    cold->mode = g.mode();
    r.SetCold(std::move(cold));
  }
}

}  // namespace retrybudget
