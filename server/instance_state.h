// One client instance inside the core: what was applied for it per tenant (its ledger), the
// response last sent (for an exact retry), the credential it belongs to; and the tombstones of
// instances that finished or were evicted. Internal to BudgetCore (budget_core.h).
#ifndef RETRYBUDGET_SERVER_INSTANCE_STATE_H_
#define RETRYBUDGET_SERVER_INSTANCE_STATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/compact_mutex.h"
#include "server/grant_math.h"
#include "server/keyed_set.h"
#include "server/ref_ptr.h"
#include "server/replay_cache.h"
#include "server/tenant_state.h"

namespace retrybudget::core_internal {

// What the server applied for one instance and tenant.
struct InstanceTenant {
  LedgerEntry ledger;
  // The budget the ledger's history belongs to (never null in a kept record): the one whose
  // grants it counts. Kept, deleted or not, until an entry applied to a new budget of the same
  // name replaces it; the next Sync uses it without looking the name up or taking the lock of
  // the tenant map, unless it was deleted.
  RefPtr<Tenant> tenant;
  // The instance's entry in that budget's active set (changed under the budget's lock).
  ActiveEntry active;
};

// An instance's records, one per tenant it synced, found by the tenant's name. Every record
// names its budget (InstanceTenant::tenant, never null). Most instances sync one tenant: the
// first record is kept inline (no allocation; a hash map's smallest table took 160 bytes per
// instance), any others in a hash set made for them, so lookups stay O(1) however many tenants
// one instance reports; every record is known by its budget's name (no copy of it). Adding may
// move the records of the set (as a flat_hash_set does): hold no record across an Add.
class InstanceTenants {
 public:
  // Null when `tenant` has no record.
  InstanceTenant* Find(absl::string_view tenant);
  // A new record for `budget` (not null), whose tenant has none yet.
  InstanceTenant* Add(RefPtr<Tenant> budget);
  // Drops the record of `tenant`, if any.
  void Erase(absl::string_view tenant);
  size_t size() const {
    return (first_.tenant != nullptr ? 1 : 0) + (rest_ == nullptr ? 0 : rest_->size());
  }

  // f(const std::string& tenant, const InstanceTenant& record), for each record.
  template <typename F>
  void ForEach(F f) const {
    if (first_.tenant != nullptr) f(first_.tenant->name, first_);
    if (rest_ != nullptr) {
      for (const Slot& slot : *rest_) f(slot.record.tenant->name, slot.record);
    }
  }

 private:
  // The records after the first, found by their budget's name too: a set of the records, not a
  // map from a copy of the name (32 bytes more a record, and a heap block of its own for a name
  // over 15 characters: one more cold line for each lookup). A record's budget is replaced only
  // by one of the same name (BudgetCore::ApplyEntry), so its hash and its place in the set
  // never change while the record does: it is changed in place (`mutable`).
  struct Slot {
    absl::string_view name() const { return record.tenant->name; }
    mutable InstanceTenant record;
  };
  using SlotName = NameOf<Slot, &Slot::name>;
  using Set = absl::flat_hash_set<Slot, SlotName::Hash, SlotName::Eq>;

  InstanceTenant first_;  // none while its tenant is null
  std::unique_ptr<Set> rest_;
};

// Shared through RefPtr, made by Create.
struct Instance final : RefCounted {
  // A new record, its id copied into the same allocation, after the record (a std::string took
  // 32 bytes here and, for ids longer than 15 characters such as the clients' 35, a heap block
  // of 48 more; a string_view to the copy 16, where its length takes 4 beside `forgotten`). The
  // id is at most 4 GiB (ids are at most kMaxInstanceIdLength, names.h).
  static RefPtr<Instance> Create(absl::string_view instance_id, uint64_t principal_hash);
  // Frees what Create allocated (RefPtr deletes the last reference's record with `delete`).
  static void operator delete(void* p) { ::operator delete(p); }

  // First, beside the 4-byte reference count: no padding.
  CompactMutex mu;
  // Set (under the core's instances_mu_) when the instance left the map (final, eviction, a
  // failed first request): a request that finds it so after taking `mu` looks the id up again.
  std::atomic<bool> forgotten{false};
  // last_fingerprint is of version 1 (FingerprintV1): read from a snapshot written before
  // version 2, until the next request is applied. In the padding beside `forgotten`.
  bool fingerprint_v1 ABSL_GUARDED_BY(mu) = false;

 private:
  const uint32_t id_size_;  // the id's length; its characters follow this record

 public:
  // The id, kept in the bytes after this record.
  absl::string_view id() const {
    return absl::string_view(reinterpret_cast<const char*>(this + 1), id_size_);
  }

  // Starts loading the whole record (a Sync reads all of it; with 100k instances it is not in
  // the cache), so that its lines arrive together rather than one after another. Reads nothing.
  void Prefetch() const {
    const char* p = reinterpret_cast<const char*>(this);
    for (size_t at = 0; at < sizeof(Instance) + id_size_; at += 64) __builtin_prefetch(p + at);
  }

  // StableHash of the credential that first used the id; fixed for the object's life.
  const uint64_t principal;
  // Last time a request of this instance arrived, for eviction (read without `mu`).
  std::atomic<int64_t> last_seen_ns{0};

  // The seq of the last request applied (0: none yet). Written under `mu`; readable without it
  // (the tombstone of an eviction, which holds the core's instances lock, taken after `mu`).
  uint64_t last_seq() const { return last_seq_.load(std::memory_order_acquire); }
  void set_last_seq(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    last_seq_.store(seq, std::memory_order_release);
  }
  uint64_t last_fingerprint ABSL_GUARDED_BY(mu) = 0;
  // The response to last_seq, one record per tenant entry (most instances sync one tenant: its
  // record is kept inline, without an allocation of its own).
  GrantRecords last_grants ABSL_GUARDED_BY(mu);
  InstanceTenants tenants ABSL_GUARDED_BY(mu);

 private:
  Instance(size_t id_size, uint64_t principal_hash)
      : id_size_(static_cast<uint32_t>(id_size)), principal(principal_hash) {}
  std::atomic<uint64_t> last_seq_{0};
};

// An instance that sent `final` or was evicted: a request with seq <= last_seq is stale, and
// only its credential may use the id again.
struct Tombstone {
  uint64_t last_seq = 0;
  uint64_t principal = 0;
  absl::Time at;
};

// The tombstones, kept for `ttl` but at most `max_entries` (oldest dropped first when more
// instances finish within the TTL). Memory: the age queue holds at most max_entries entries and
// the map at most as many, each the id plus ~30 bytes (about 250 bytes per tombstone with a
// 32-character id). Thread-compatible: the core guards it with its instances lock.
class Tombstones {
 public:
  Tombstones(size_t max_entries, absl::Duration ttl) : max_(max_entries), ttl_(ttl) {}

  void Put(absl::string_view id, const Tombstone& t);
  // Null if `id` has no live tombstone at `now`.
  const Tombstone* Find(absl::string_view id, absl::Time now);
  void Clear();
  size_t size() const { return by_id_.size(); }

  template <typename F>
  void ForEach(F f) const {
    for (const auto& [id, stored] : by_id_) f(id, stored.tombstone);
  }

 private:
  void DropExpired(absl::Time now);
  void Pop();  // drops the oldest entry of `order_`

  const size_t max_;
  const absl::Duration ttl_;
  struct Stored {
    Tombstone tombstone;
    uint64_t generation;  // of its entry in `order_`
  };
  absl::flat_hash_map<std::string, Stored> by_id_;
  struct Entry {
    std::string id;
    absl::Time at;
    uint64_t generation;
  };
  uint64_t next_generation_ = 0;
  std::deque<Entry> order_;  // oldest first
};

}  // namespace retrybudget::core_internal

#endif  // RETRYBUDGET_SERVER_INSTANCE_STATE_H_
