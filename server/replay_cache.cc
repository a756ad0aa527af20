#include "server/replay_cache.h"

#include "server/cumulative_counters.h"

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

uint64_t StableHasher::Finish() const {
  // The splitmix64 finaliser: spreads FNV's weak high bits.
  uint64_t z = h_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t StableHash(absl::string_view s) {
  StableHasher h;
  h.Add(s);
  return h.Finish();
}

uint64_t Fingerprint(const v1::SyncRequest& r) {
  StableHasher h;
  h.Add(r.instance_id());
  h.Add(r.seq());
  h.Add(r.final() ? 1 : 0);
  h.Add(static_cast<uint64_t>(r.tenants_size()));
  for (const v1::TenantSync& t : r.tenants()) {
    h.Add(t.tenant());
    h.Add(t.want());
    for (const CounterField& f : kCumulativeCounters) {
      const uint64_t v = (t.*f.sent)();
      if (v != 0 || !f.fingerprint_only_when_set) h.Add(v);
    }
  }
  return h.Finish();
}

void WriteResponse(absl::Span<const GrantRecord> records, v1::SyncResponse* response) {
  response->mutable_tenants()->Reserve(static_cast<int>(records.size()));
  for (const GrantRecord& r : records) {
    v1::TenantGrant* out = response->add_tenants();
    out->set_tenant(r.tenant);
    if (r.error != nullptr) {
      out->mutable_error()->set_code(r.error->code);
      out->mutable_error()->set_message(r.error->message);
      if (!r.error->owner.empty()) out->mutable_error()->set_owner(r.error->owner);
      continue;
    }
    out->set_granted(r.granted);
    out->set_lease_ttl_ms(r.lease_ttl_ms);
    out->set_next_sync_ms(r.next_sync_ms);
    out->mutable_safe_share()->set_capacity(r.safe_capacity);
    out->mutable_safe_share()->set_refill_per_second(r.safe_refill_per_second);
    out->mutable_safe_share()->set_success_credit(r.safe_success_credit);
    out->set_bucket_tokens(r.bucket_tokens);
    out->set_capacity(r.capacity);
    out->set_active_instances(r.active_instances);
  }
}

void ReadResponse(const v1::SyncResponse& response, GrantRecords* records) {
  records->clear();
  for (const v1::TenantGrant& g : response.tenants()) {
    GrantRecord& r = records->emplace_back();
    r.tenant = g.tenant();
    r.granted = g.granted();
    r.lease_ttl_ms = g.lease_ttl_ms();
    r.next_sync_ms = g.next_sync_ms();
    r.safe_capacity = g.safe_share().capacity();
    r.safe_refill_per_second = g.safe_share().refill_per_second();
    r.safe_success_credit = g.safe_share().success_credit();
    r.bucket_tokens = g.bucket_tokens();
    r.capacity = g.capacity();
    r.active_instances = g.active_instances();
    if (g.error().code() != 0) r.Refuse(g.error().code(), g.error().message(), g.error().owner());
  }
}

}  // namespace retrybudget
