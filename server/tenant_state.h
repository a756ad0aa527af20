// One tenant's budget inside the core: its token bucket, policy, totals, and the active set
// (the instances that synced within a lease TTL, with what they want and hold). Internal to
// BudgetCore (budget_core.h); every member is guarded by the tenant's own `mu`.
#ifndef RETRYBUDGET_SERVER_TENANT_STATE_H_
#define RETRYBUDGET_SERVER_TENANT_STATE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/time/time.h"
#include "retrybudget/recent_extreme.h"
#include "retrybudget/v1/state.pb.h"
#include "server/budget_totals.h"
#include "server/compact_mutex.h"
#include "server/policy.h"
#include "server/ref_ptr.h"
#include "server/token_bucket.h"

namespace retrybudget::core_internal {

// How long a tenant's largest fleet is remembered for sizing the fallback shares. Longer than
// any lease TTL: after a server hang or outage the instances rejoin one by one, each seeing
// a swept active set, and must not be told that the budget is theirs alone (DESIGN.md, "When
// the server is unreachable").
inline constexpr int64_t kFleetSizeWindowMillis = 60'000;

struct MaxCount {
  uint64_t operator()(uint64_t a, uint64_t b) const { return std::max(a, b); }
};

// Shared through RefPtr (MakeRef<Tenant>).
struct Tenant final : RefCounted {
  // `p` is shared (PolicyTable::Intern), never null.
  Tenant(std::string n, PolicyRef p, v1::PolicySource s, absl::Time now)
      : source_(static_cast<uint8_t>(s)),
        name(std::move(n)),
        policy(std::move(p)),
        bucket(policy->initial_tokens, policy->capacity, now) {}

  // Times kept per tenant and per active instance are Unix nanoseconds (8 bytes, where an
  // absl::Time takes 16); kNever is "not yet".
  static constexpr int64_t kNever = INT64_MIN;

  struct Active {
    uint64_t want = 0;
    // Tokens the instance may still spend from this server's grants, as far as the server
    // knows (its counted holdings, grant_math.h), plus what was granted at its last report.
    uint64_t held = 0;
    int64_t last_seen_ns = 0;
  };

  // First, beside the 4-byte reference count: no padding.
  CompactMutex mu;
  // Set (under `mu`) when DeleteBudget removed it from the map; a request holding it looks it up
  // again. Atomic so that a cached pointer can be checked before taking `mu`.
  std::atomic<bool> deleted{false};

 private:
  uint8_t source_ ABSL_GUARDED_BY(mu);  // a v1::PolicySource

 public:
  const std::string name;

  v1::PolicySource source() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return static_cast<v1::PolicySource>(source_);
  }
  void set_source(v1::PolicySource s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    source_ = static_cast<uint8_t>(s);
  }

  PolicyRef policy ABSL_GUARDED_BY(mu);
  // The level and last refill; its capacity and refill are the policy's (Limits).
  TokenBucket bucket ABSL_GUARDED_BY(mu);
  // Instances that synced within the last lease TTL, with the want they last sent and the tokens
  // they hold. `want_sum` and `held_sum` are the sums, kept incrementally in 128 bits (no sum of
  // 64-bit entries can overflow them); stale entries are swept at most every 100 ms. An
  // instance silent for a lease TTL holds nothing any more: its client stops spending a lease
  // at send time + TTL.
  // Keyed by the Instance's serial (Instance::serial), never reused in a process: an integer
  // hashes and compares without touching the id's characters (this map is probed on every Sync
  // of every tenant entry), and an evicted instance's entry, whose lease still runs on its
  // client, keeps counting until its TTL even when a new instance takes its record's place in
  // memory (keyed by address, it was handed over to that one and its holdings forgotten).
  // With the largest recent fleet (the SafeShare divides the budget among it), the recent
  // success credit rate and, in cluster mode, the sizing of its reservations, this is the state
  // of a tenant in use: allocated when an instance first syncs, and let go by the sweep once no
  // instance is active and no fleet is remembered (kFleetSizeWindowMillis), so that a million
  // idle tenants do not each carry ~190 bytes of it. Empty is the same as absent.
  struct ActiveSet {
    absl::flat_hash_map<uint64_t, Active> entries;
    absl::uint128 want_sum = 0;
    absl::uint128 held_sum = 0;  // also the bucket's `leased` (Limits)
    RecentExtreme<uint64_t, MaxCount, kFleetSizeWindowMillis> fleet_size;
    // The success credit rate (NoteCredit).
    double credit_rate = 0;
    double window_credit = 0;
    int64_t window_start_ns = kNever;
    // The last sweep of `entries` (SweepActive).
    int64_t last_sweep_ns = 0;
    // Cluster mode: the reservation block in force (0: none sized yet), and the grants total
    // and time when the block was last sized, for the observed grant rate (ReserveDurably).
    // Here, not in the tenant: only a tenant in use is sized, and the rate of one idle for a
    // minute says nothing; the next block after that starts from the default again.
    uint64_t reservation_block = 0;
    uint64_t granted_when_sized = 0;
    int64_t block_sized_at_ns = kNever;
  };
  std::unique_ptr<ActiveSet> active ABSL_GUARDED_BY(mu);
  BudgetTotals totals ABSL_GUARDED_BY(mu);
  // With a durable store: grants may reach this cumulative total (totals.granted) without
  // another reservation on disk.
  uint64_t grant_limit ABSL_GUARDED_BY(mu) = 0;
  // Tokens deposited by success credit and returns since the bucket was created (before the
  // cap): journaled with each reservation, so a crash loses only what came after the last one
  // (v1::TenantState.credited_total).
  double credited_total ABSL_GUARDED_BY(mu) = 0;

  // want_sum, capped to 64 bits for the grant arithmetic.
  uint64_t WantSum() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) return 0;
    return active->want_sum > absl::uint128(UINT64_MAX) ? UINT64_MAX
                                                         : absl::Uint128Low64(active->want_sum);
  }

  // Tokens the active instances hold, as far as the server counts them.
  absl::uint128 HeldSum() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active == nullptr ? 0 : active->held_sum;
  }

  // Instances in the swept set (entries older than the TTL linger at most 100 ms).
  size_t ActiveSize() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active == nullptr ? 0 : active->entries.size();
  }

  // The largest active set noted within the last kFleetSizeWindowMillis, or 0.
  uint64_t RecentFleetSize(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active == nullptr ? 0 : active->fleet_size.Get(now).value_or(0);
  }

  // What bounds the bucket now: the policy's capacity and refill, and the tokens the active
  // instances hold (they count against the capacity).
  BucketLimits Limits() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return BucketLimits{.capacity = policy->capacity,
                        .refill_per_second = policy->refill_per_second,
                        .leased = static_cast<double>(HeldSum())};
  }

  // Adds credited or returned tokens to the bucket, up to capacity - leased.
  void Deposit(double tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bucket.Deposit(Limits(), tokens);
  }

  // The active set, made on first use; a new one sweeps no sooner than 100 ms after `now_ns`.
  ActiveSet& ActiveSetFrom(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) {
      active = std::make_unique<ActiveSet>();
      active->last_sweep_ns = now_ns;
    }
    return *active;
  }

  // Starts loading the memory SetActive or RemoveActive of `instance_serial` will touch (the
  // probe of a set of 100k instances is a cache miss), so that it overlaps other work.
  void PrefetchActive(uint64_t instance_serial) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active != nullptr) active->entries.prefetch(instance_serial);
  }

  // Records an instance's report: its want and the tokens it still holds, and the size of the
  // active set it makes. Returns its entry, valid until the next sweep (Advance).
  Active& SetActive(uint64_t instance_serial, uint64_t want, uint64_t held, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t now_ns = absl::ToUnixNanos(now);
    ActiveSet& set = ActiveSetFrom(now_ns);
    Active& a = set.entries[instance_serial];
    set.want_sum = set.want_sum - a.want + want;
    a.want = want;
    SetHeld(a, held);
    a.last_seen_ns = now_ns;
    set.fleet_size.Note(set.entries.size(), now);
    return a;
  }

  // `a` must be an entry of the active set.
  void SetHeld(Active& a, uint64_t held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    active->held_sum = active->held_sum - a.held + held;
    a.held = held;
  }

  void RemoveActive(uint64_t instance_serial) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) return;
    auto it = active->entries.find(instance_serial);
    if (it == active->entries.end()) return;
    active->want_sum -= it->second.want;
    SetHeld(it->second, 0);
    active->entries.erase(it);
  }

  void SweepActive(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) return;
    const int64_t now_ns = absl::ToUnixNanos(now);
    if (now_ns - active->last_sweep_ns < 100'000'000) return;
    active->last_sweep_ns = now_ns;
    const int64_t cutoff = absl::ToUnixNanos(now - policy->lease_ttl);
    auto& entries = active->entries;
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second.last_seen_ns < cutoff) {
        active->want_sum -= it->second.want;
        SetHeld(it->second, 0);
        entries.erase(it++);
      } else {
        ++it;
      }
    }
    // Nothing active and no fleet remembered: the same as no set at all.
    if (entries.empty() && !active->fleet_size.Get(now).has_value()) active.reset();
  }

  // Brings the bucket up to `now`: forgets the leases that expired (at most 100 ms late), then
  // refills. Every read or change of the level starts here.
  void Advance(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    SweepActive(now);
    bucket.Refill(Limits(), now);
  }

  // Success credit per second, smoothed over windows of about a second; 0 once the tenant's
  // active set was let go (a minute or more with no instance active).
  void NoteCredit(double credit, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t now_ns = absl::ToUnixNanos(now);
    ActiveSet& a = ActiveSetFrom(now_ns);  // made here for a final request's credit
    if (a.window_start_ns == kNever) a.window_start_ns = now_ns;
    a.window_credit += credit;
    const int64_t window_ns = now_ns - a.window_start_ns;
    if (window_ns >= 1'000'000'000) {
      a.credit_rate =
          0.5 * a.credit_rate + 0.5 * a.window_credit / (static_cast<double>(window_ns) * 1e-9);
      a.window_credit = 0;
      a.window_start_ns = now_ns;
    }
  }

  double CreditRate() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active == nullptr ? 0 : active->credit_rate;
  }

  uint32_t ActiveCount(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) return 0;
    const int64_t cutoff = absl::ToUnixNanos(now - policy->lease_ttl);
    uint32_t n = 0;
    for (const auto& [id, a] : active->entries) n += a.last_seen_ns >= cutoff ? 1 : 0;
    return n;
  }
};

}  // namespace retrybudget::core_internal

#endif  // RETRYBUDGET_SERVER_TENANT_STATE_H_
