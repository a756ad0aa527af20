// One tenant's budget inside the core: its token bucket, policy, totals, and the active set
// (the instances that synced within a lease TTL, with what they want and hold). Internal to
// BudgetCore (budget_core.h); every member is guarded by the tenant's own `mu`.
#ifndef RETRYBUDGET_SERVER_TENANT_STATE_H_
#define RETRYBUDGET_SERVER_TENANT_STATE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
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

struct Instance;

struct Tenant {
  Tenant(std::string n, const ResolvedPolicy& p, v1::PolicySource s, absl::Time now)
      : name(std::move(n)),
        policy(p),
        source(s),
        bucket(p.capacity, p.refill_per_second, p.initial_tokens, now),
        last_sweep_ns(absl::ToUnixNanos(now)) {}

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

  const std::string name;
  CompactMutex mu;
  ResolvedPolicy policy ABSL_GUARDED_BY(mu);
  v1::PolicySource source ABSL_GUARDED_BY(mu);
  TokenBucket bucket ABSL_GUARDED_BY(mu);
  // Instances that synced within the last lease TTL, with the want they last sent and the tokens
  // they hold. `want_sum` and `held_sum` are the sums, kept incrementally in 128 bits (no sum of
  // 64-bit entries can overflow them); stale entries are swept at most every 100 ms. An
  // instance silent for a lease TTL holds nothing any more: its client stops spending a lease
  // at send time + TTL.
  // Keyed by the Instance's address, never dereferenced: a pointer hashes and compares without
  // touching the id's characters (this map is probed on every Sync of every tenant entry). An
  // instance forgotten by eviction whose address is reused by a new one only hands its entry
  // over early; the entry would have expired within the TTL anyway.
  absl::flat_hash_map<const Instance*, Active> active ABSL_GUARDED_BY(mu);
  absl::uint128 want_sum ABSL_GUARDED_BY(mu) = 0;
  absl::uint128 held_sum ABSL_GUARDED_BY(mu) = 0;  // also the bucket's `leased`
  int64_t last_sweep_ns ABSL_GUARDED_BY(mu);
  // The most instances active at once lately: the SafeShare divides the budget among them.
  RecentExtreme<uint64_t, MaxCount, kFleetSizeWindowMillis> fleet_size ABSL_GUARDED_BY(mu);
  BudgetTotals totals ABSL_GUARDED_BY(mu);
  // With a durable store: grants may reach this cumulative total (totals.granted) without
  // another reservation on disk.
  uint64_t grant_limit ABSL_GUARDED_BY(mu) = 0;
  // Tokens deposited by success credit and returns since the bucket was created (before the
  // cap): journaled with each reservation, so a crash loses only what came after the last one
  // (v1::TenantState.credited_total).
  double credited_total ABSL_GUARDED_BY(mu) = 0;
  // Cluster mode: the reservation block in force (0: none sized yet), and the grants total and
  // time when the block was last sized, for the observed grant rate.
  uint64_t reservation_block ABSL_GUARDED_BY(mu) = 0;
  uint64_t granted_when_sized ABSL_GUARDED_BY(mu) = 0;
  int64_t block_sized_at_ns ABSL_GUARDED_BY(mu) = kNever;
  // Set (under `mu`) when DeleteBudget removed it from the map; a request holding it looks it up
  // again. Atomic so that a cached pointer can be checked before taking `mu`.
  std::atomic<bool> deleted{false};

  // want_sum, capped to 64 bits for the grant arithmetic.
  uint64_t WantSum() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return want_sum > absl::uint128(UINT64_MAX) ? UINT64_MAX : absl::Uint128Low64(want_sum);
  }

  // Records an instance's report: its want and the tokens it still holds. Returns its entry.
  Active& SetActive(const Instance* instance, uint64_t want, uint64_t held, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Active& a = active[instance];
    want_sum = want_sum - a.want + want;
    a.want = want;
    SetHeld(a, held);
    a.last_seen_ns = absl::ToUnixNanos(now);
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
    const int64_t now_ns = absl::ToUnixNanos(now);
    if (now_ns - last_sweep_ns < 100'000'000) return;
    last_sweep_ns = now_ns;
    const int64_t cutoff = absl::ToUnixNanos(now - policy.lease_ttl);
    for (auto it = active.begin(); it != active.end();) {
      if (it->second.last_seen_ns < cutoff) {
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
  int64_t window_start_ns ABSL_GUARDED_BY(mu) = kNever;

  void NoteCredit(double credit, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t now_ns = absl::ToUnixNanos(now);
    if (window_start_ns == kNever) window_start_ns = now_ns;
    window_credit += credit;
    const int64_t window_ns = now_ns - window_start_ns;
    if (window_ns >= 1'000'000'000) {
      credit_rate = 0.5 * credit_rate + 0.5 * window_credit / (static_cast<double>(window_ns) * 1e-9);
      window_credit = 0;
      window_start_ns = now_ns;
    }
  }

  double CreditRate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return credit_rate; }

  uint32_t ActiveCount(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t cutoff = absl::ToUnixNanos(now - policy.lease_ttl);
    uint32_t n = 0;
    for (const auto& [id, a] : active) n += a.last_seen_ns >= cutoff ? 1 : 0;
    return n;
  }
};

}  // namespace retrybudget::core_internal

#endif  // RETRYBUDGET_SERVER_TENANT_STATE_H_
