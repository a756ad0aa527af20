// One tenant's budget inside the core: its token bucket, policy, totals, and the active set
// (the instances that synced within a lease TTL, with what they want and hold). Internal to
// BudgetCore (budget_core.h); every member is guarded by the tenant's own `mu`.
#ifndef RETRYBUDGET_SERVER_TENANT_STATE_H_
#define RETRYBUDGET_SERVER_TENANT_STATE_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/numeric/int128.h"
#include "absl/time/time.h"
#include "retrybudget/recent_extreme.h"
#include "retrybudget/v1/state.pb.h"
#include "server/budget_totals.h"
#include "server/compact_mutex.h"
#include "server/policy.h"
#include "server/ref_ptr.h"
#include "server/token_bucket.h"
#include "server/window_ledger.h"

namespace retrybudget::core_internal {

// How long a tenant's largest fleet is remembered for sizing the fallback shares. Longer than
// any lease TTL: after a server hang or outage the instances rejoin one by one, each seeing
// a swept active set, and must not be told that the budget is theirs alone (DESIGN.md, "When
// the server is unreachable").
inline constexpr int64_t kFleetSizeWindowMillis = 60'000;

struct MaxCount {
  uint64_t operator()(uint64_t a, uint64_t b) const { return std::max(a, b); }
};

// An instance's entry in one tenant's active set: the want it last sent, the tokens it holds,
// and the slice of the set (Tenant::ActiveSet::Slice) it was last seen in. Kept in the
// instance's own record for the tenant (InstanceTenant), not in the tenant: the tenant keeps
// only sums per slice, so a Sync finds its entry in the record it has already loaded (no probe
// of a table of every instance) and no walk over the entries ever forgets the silent ones.
// An entry whose slice is not in the tenant's set now (expired, of a set let go since, of
// another budget of the same name) is not in the set; slice ids are never reused in a process.
// Changed only under the tenant's lock (and its instance's).
struct ActiveEntry {
  uint64_t slice = 0;  // the slice's id (0: none)
  uint64_t held = 0;
  uint32_t want = 0;  // at most max_want <= UINT32_MAX (SyncLimits)
  // Where the slice is in its set: its position counted from the set's first slice ever, modulo
  // 2^32 (ActiveSet::dropped), so that it is found without a search (in the padding).
  uint32_t position = 0;
};

// Shared through RefPtr (MakeRef<Tenant>).
struct Tenant final : RefCounted {
  // `p` is shared (PolicyTable::Intern), never null.
  Tenant(std::string n, PolicyRef p, v1::PolicySource s, absl::Time now)
      : source_(static_cast<uint8_t>(s)),
        name(std::move(n)),
        policy(std::move(p)),
        bucket(policy->initial_tokens, policy->capacity, now),
        window(policy->windowed ? std::make_unique<WindowLedger>() : nullptr) {}

  // Times kept per tenant and per active instance are Unix nanoseconds (8 bytes, where an
  // absl::Time takes 16); kNever is "not yet".
  static constexpr int64_t kNever = INT64_MIN;

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
  // A windowed policy's books (window_ledger.h), in place of the bucket for grants; null for a
  // token bucket policy (its ~1 KB is allocated only for windowed tenants).
  std::unique_ptr<WindowLedger> window ABSL_GUARDED_BY(mu);
  // Instances that synced within the last lease TTL (ActiveEntry), counted by when they were
  // last seen: each slice sums the entries last seen within its span (SliceSpanNanos after its
  // start), oldest first, and `count`, `want_sum` and `held_sum` are the sums of all (kept in
  // 128 bits: no sum of 64-bit entries can overflow them). A slice expires whole once the
  // latest of its entries is older than the lease TTL: an instance silent for a TTL holds
  // nothing any more (its client stops spending a lease at send time + TTL), and is forgotten
  // at most one span late (its holdings count that much longer: the safe direction). An
  // evicted instance's record is freed, but what it held stays in its slice until then: its
  // lease still runs on its client.
  // With the largest recent fleet (the SafeShare divides the budget among it), the recent
  // success credit rate and, in cluster mode, the sizing of its reservations, this is the state
  // of a tenant in use: allocated when an instance first syncs, and let go by the sweep once no
  // instance is active and no fleet is remembered (kFleetSizeWindowMillis), so that a million
  // idle tenants do not each carry it. Empty is the same as absent.
  struct ActiveSet {
    struct Slice {
      uint64_t id = 0;  // NextSliceId: unique in the process
      int64_t start_ns = 0;
      int64_t last_ns = 0;  // the latest of its entries' last reports
      uint64_t count = 0;
      absl::uint128 want_sum = 0;
      absl::uint128 held_sum = 0;
    };
    std::vector<Slice> slices;  // by start and by id, oldest first
    uint64_t dropped = 0;  // slices dropped from the front since the set was made
    uint64_t count = 0;
    absl::uint128 want_sum = 0;
    absl::uint128 held_sum = 0;  // also the bucket's `leased` (Limits)
    RecentExtreme<uint64_t, MaxCount, kFleetSizeWindowMillis> fleet_size;
    // The success credit rate (NoteCredit).
    double credit_rate = 0;
    double window_credit = 0;
    int64_t window_start_ns = kNever;
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

  // The window's shape under the policy in force (a windowed policy only).
  const WindowShape& Shape() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return policy->window_shape;
  }

  // What may be granted now: the bucket's level, or what the window allows.
  double GrantableLevel(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (window == nullptr) return bucket.tokens();
    return static_cast<double>(window->Grantable(Shape(), now_ns));
  }

  // Takes a grant of at most `tokens` (sized from GrantableLevel): whole tokens out of the
  // bucket, or counted in the window now. Returns the tokens granted.
  uint64_t TakeGrant(uint64_t tokens, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (window == nullptr) return bucket.Take(tokens);
    window->Add(Shape(), now_ns, tokens);
    return tokens;
  }

  // What one report of an instance changes in the window (DESIGN.md "The windowed ratio
  // policy"): the requests' deposit, the tokens credited back (taken out of the oldest live
  // grants, only when the instance's previous Sync was within the ttl: its tokens then still
  // count in a live slot), and the tokens it still holds carried into the lease this answer
  // starts.
  // False when they cannot be carried (the window would not allow them past their lease): the
  // answer must then end the lease at once and grant nothing.
  struct WindowReport {
    double deposit = 0;
    uint64_t credited_back = 0;
    bool was_active = false;
    uint64_t holdings = 0;
    bool final = false;
  };
  bool ApplyWindowReport(const WindowReport& r, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const WindowShape& shape = Shape();
    window->Deposit(shape, now_ns, r.deposit);
    if (r.was_active) window->ReleaseOldest(shape, now_ns, r.credited_back);
    return r.final || window->Carry(shape, now_ns, r.holdings);
  }

  // After `policy` changed from `old`: the window follows the new shape. The same window (ttl
  // and lease TTL) keeps its books (a new floor applies at once). Otherwise a new ledger counts
  // as granted now what the old books counted (the old window's live grants, or what the fleet
  // holds of the bucket's leases) and drops the deposits (the safe direction); leaving the
  // window, the bucket starts at what the window allowed, capped at the capacity.
  void FollowPolicyShape(const InternedPolicy& old, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!policy->windowed) {
      if (window != nullptr) {
        bucket.Restore(static_cast<double>(window->Grantable(old.window_shape, now_ns)),
                       policy->capacity, absl::FromUnixNanos(now_ns));
        window.reset();
      }
      return;
    }
    if (window != nullptr && old.windowed && old.ttl_ns == policy->ttl_ns &&
        old.lease_ttl_ns == policy->lease_ttl_ns) {
      return;
    }
    double counted = static_cast<double>(HeldSum());
    if (window != nullptr) {
      counted = window->LiveGrants(old.window_shape, now_ns);
    }
    window = std::make_unique<WindowLedger>();
    window->Add(Shape(), now_ns, static_cast<uint64_t>(std::ceil(std::max(0.0, counted))));
  }

  // The window's live slots, into a state (a snapshot, or the tenant's state in etcd).
  void ExportWindow(v1::TenantState& ts, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (window == nullptr) return;
    const WindowShape& shape = Shape();
    ts.set_window_slot_nanos(shape.slot_ns);
    window->ForEachLive(shape, now_ns, [&ts](int64_t slot, double deposits, double grants) {
      v1::WindowSlot* w = ts.add_window_slots();
      w->set_slot(slot);
      w->set_deposits(deposits);
      w->set_grants(grants);
    });
  }

  // Restores the window from a state. `same_clock`: written by this server's clock (a
  // restart), so its slots are restored where they were when counted in slots of the same
  // width; otherwise (a takeover: no clock is compared between servers, or another width) every
  // grant it counts is counted as granted now and its deposits are dropped. `granted_since`:
  // tokens that may have been granted after the state was written (up to the durable limit),
  // counted as granted now. All of it errs late: the safe direction.
  void RestoreWindow(const v1::TenantState& ts, int64_t now_ns, bool same_clock,
                     uint64_t granted_since) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (window == nullptr) return;
    const WindowShape& shape = Shape();
    const bool in_place = same_clock && ts.window_slot_nanos() == shape.slot_ns;
    double moved = 0;
    for (const v1::WindowSlot& w : ts.window_slots()) {
      if (in_place) {
        window->RestoreSlot(shape, now_ns, w.slot(), w.deposits(), w.grants());
      } else {
        moved += std::max(0.0, w.grants());
      }
    }
    const double now_counted = std::ceil(moved) + static_cast<double>(granted_since);
    window->Add(shape, now_ns, static_cast<uint64_t>(std::min(now_counted, 1e18)));
  }

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

  // Instances in the set as last swept (Advance): those silent for a lease TTL linger at most
  // one slice's span.
  size_t ActiveSize() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active == nullptr ? 0 : active->count;
  }

  // The largest active set noted within the last kFleetSizeWindowMillis, or 0.
  uint64_t RecentFleetSize(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active == nullptr ? 0 : active->fleet_size.Get(now_ns).value_or(0);
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

  // The active set, made on first use.
  ActiveSet& ActiveSetFrom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) active = std::make_unique<ActiveSet>();
    return *active;
  }

  // How long a slice takes in new entries: 100 ms, or a 128th of the lease TTL when that is
  // longer (at most ~130 slices per tenant however long the TTL: 600 s gives 4.7 s). In integer
  // nanoseconds: an absl::Duration's division takes 128-bit arithmetic, on every Sync.
  int64_t SliceSpanNanos() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return std::max<int64_t>(100'000'000, policy->lease_ttl_ns / 128);
  }

  // The oldest last report still within the lease TTL at `now_ns`.
  int64_t LeaseCutoffNanos(int64_t now_ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return now_ns - policy->lease_ttl_ns;
  }

  // Records an instance's report in its entry `e`: its want and the tokens it still holds, and
  // the size of the active set it makes. Whatever `e` counted before is taken out first.
  void SetActive(ActiveEntry& e, uint32_t want, uint64_t held, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ActiveSet& set = ActiveSetFrom();
    // The newest slice takes entries until its span is over (and any from a clock that went
    // back: slices stay in order of their start).
    if (set.slices.empty() ||
        now_ns - set.slices.back().start_ns >= SliceSpanNanos()) {
      set.slices.push_back(ActiveSet::Slice{.id = NextSliceId(), .start_ns = now_ns,
                                            .last_ns = now_ns, .count = 0, .want_sum = 0,
                                            .held_sum = 0});
    }
    ActiveSet::Slice& to = set.slices.back();
    to.last_ns = std::max(to.last_ns, now_ns);
    // Moved from the slice it was counted in (none: it joins the set) to the newest; the set's
    // sums change by the differences alone.
    ActiveSet::Slice* from = SliceOf(e);  // after the push, which may have moved the slices
    if (from != &to) {
      if (from != nullptr) {
        from->count -= 1;
        from->want_sum -= e.want;
        from->held_sum -= e.held;
      }
      to.count += 1;
      to.want_sum += want;
      to.held_sum += held;
    } else {
      to.want_sum = to.want_sum - e.want + want;
      to.held_sum = to.held_sum - e.held + held;
    }
    if (from != nullptr) {
      set.want_sum = set.want_sum - e.want + want;
      set.held_sum = set.held_sum - e.held + held;
    } else {
      set.count += 1;
      set.want_sum += want;
      set.held_sum += held;
    }
    e = ActiveEntry{.slice = to.id,
                    .held = held,
                    .want = want,
                    .position = static_cast<uint32_t>(set.dropped + set.slices.size() - 1)};
    set.fleet_size.Note(set.count, now_ns);
  }

  // `e` must be in the set (SetActive just put it there).
  void SetHeld(ActiveEntry& e, uint64_t held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ActiveSet::Slice* slice = SliceOf(e);
    if (slice == nullptr) return;
    slice->held_sum = slice->held_sum - e.held + held;
    active->held_sum = active->held_sum - e.held + held;
    e.held = held;
  }

  // Takes `e` out of the set, if it is in it, and clears it.
  void RemoveActive(ActiveEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ActiveSet::Slice* slice = SliceOf(e); slice != nullptr) {
      slice->count -= 1;
      slice->want_sum -= e.want;
      slice->held_sum -= e.held;
      active->count -= 1;
      active->want_sum -= e.want;
      active->held_sum -= e.held;
    }
    e = ActiveEntry{};
  }

  // Forgets the slices whose entries were all last seen more than a lease TTL ago, oldest first
  // (a few comparisons: nothing walks the entries).
  void SweepActive(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) return;
    const int64_t cutoff = LeaseCutoffNanos(now_ns);
    auto& slices = active->slices;
    if (!slices.empty() && slices.front().last_ns >= cutoff) return;  // the usual case
    size_t expired = 0;
    for (; expired < slices.size() && slices[expired].last_ns < cutoff; ++expired) {
      const ActiveSet::Slice& slice = slices[expired];
      active->count -= slice.count;
      active->want_sum -= slice.want_sum;
      active->held_sum -= slice.held_sum;
    }
    slices.erase(slices.begin(), slices.begin() + static_cast<std::ptrdiff_t>(expired));
    active->dropped += expired;
    // Nothing active and no fleet remembered: the same as no set at all.
    if (active->count == 0 && !active->fleet_size.Get(now_ns).has_value()) active.reset();
  }

  // Brings the bucket up to `now_ns`: forgets the leases that expired (at most one slice's span
  // late), then refills. Every read or change of the level starts here.
  void Advance(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    SweepActive(now_ns);
    bucket.Refill(Limits(), now_ns);
  }

  // Success credit per second, smoothed over windows of about a second; 0 once the tenant's
  // active set was let go (a minute or more with no instance active).
  void NoteCredit(double credit, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ActiveSet& a = ActiveSetFrom();  // made here for a final request's credit
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

  // Instances seen within the lease TTL, to a slice's span: the entries of the slices with one
  // seen since (ActiveSize without the sweep's lag).
  uint32_t ActiveCount(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr) return 0;
    const int64_t cutoff = LeaseCutoffNanos(now_ns);
    uint64_t n = 0;
    for (const ActiveSet::Slice& slice : active->slices) {
      if (slice.last_ns >= cutoff) n += slice.count;
    }
    return static_cast<uint32_t>(std::min<uint64_t>(n, UINT32_MAX));
  }

 private:
  // The slice `e` was counted in, or null when that is not in this set (any more).
  ActiveSet::Slice* SliceOf(const ActiveEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (active == nullptr || e.slice == 0) return nullptr;
    // Its index if it is in this set (one read: with a tenant's slices not in the cache, a
    // search took a miss per step); the id says whether it is.
    const uint32_t index = e.position - static_cast<uint32_t>(active->dropped);
    auto& slices = active->slices;
    return index < slices.size() && slices[index].id == e.slice ? &slices[index] : nullptr;
  }

  // Slice ids: from one counter for every tenant, so that an entry never matches a slice of
  // another set than the one it was counted in.
  static uint64_t NextSliceId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace retrybudget::core_internal

#endif  // RETRYBUDGET_SERVER_TENANT_STATE_H_
