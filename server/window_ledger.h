// The windowed ratio policy's books for one tenant (DESIGN.md "The windowed ratio policy"): the
// deposits of the last window (retry_ratio per request reported) and the tokens granted, in
// slots of ttl/32. A plain value type with no clock and no policy of its own (as TokenBucket):
// every call passes the time and the shape in force. Allocated only for windowed tenants.
//
// Lifetimes, in whole slots of width W = ttl/32 (slot s covers [s*W, (s+1)*W)):
//   - a deposit made in slot i counts at every time t < i*W + ttl: it expires at its slot's
//     start + ttl, up to one slot early (the safe direction);
//   - a grant made in slot j counts at every time t < (j+1)*W + ttl + lease_ttl (rounded up to a
//     slot): late, because its tokens may be spent up to lease_ttl after the grant.
// A grant of n at time g is allowed only if for every t in [g, g + lease_ttl] (the times its
// tokens can be spent)
//     floor + deposits live at t - grants live at t - n >= 0
// with no future deposit (floor = min_retries_per_second * ttl): Grantable(now) is the minimum
// of the left side over the slot boundaries of that span. Tokens credited back (returned,
// reclaimed) are taken out of the oldest live grant slots (ReleaseOldest; the core does it only
// for an instance seen within the ttl, whose tokens still count in a live slot, and the oldest
// slot expires no later than theirs); a client's held tokens carried into a new lease are moved
// to the current slot (Carry: a move later never lowers what any time counts).
//
// The bound (Finagle's, Linkerd's and tower's: checked at each retry, so it holds for every
// window ending at a retry). Claim: for every time x at which a token is spent, tokens spent in
// (x - ttl, x] <= floor + retry_ratio * requests reported in (x - ttl, x]. Proof sketch: a token
// spent at x' was, at x', counted in the slot j of its last grant or carry g' (x' <= g' +
// lease_ttl: a lease ends lease_ttl after the request that carried it was sent) and never
// released from it (only unspent tokens are released). For x' in (x - ttl, x],
// g' > x - ttl - lease_ttl, so (j+1)*W + ttl + lease_ttl > x: the slot is live at x, and
// spent(x - ttl, x] <= G(x), the grants live at x. Let g* be the last grant or carry at or
// before x; the token spent at x was granted at some g <= g* with x <= g + lease_ttl, so x is in
// [g*, g* + lease_ttl], the span g* was checked over: G(x) as counted then <= floor + D(x) as
// known then. Since g*, no grant was added, releases only removed and deposits only added, so
// G(x) <= floor + D(x), and a deposit live at x was received in (x - ttl, x]. A window that
// does not end at a retry may hold more (its last retries' deposits can have left it): that is
// the same in Finagle. Checking only the lease's span, not every later time, is what lets the
// deposits fund retries at all: every deposit expires before a grant made after it would.
// In steady state the grants reach (ttl - lease_ttl - W/2) / (ttl + W) of the nominal ratio
// (the last lease_ttl of a deposit's life cannot fund a lease). What is not in the claim: tokens
// a server restart or takeover cannot place (counted conservatively at the restore, DESIGN.md),
// and the fallback allowance (a client's share of the floor and its own requests' deposits).
#ifndef RETRYBUDGET_SERVER_WINDOW_LEDGER_H_
#define RETRYBUDGET_SERVER_WINDOW_LEDGER_H_

#include <array>
#include <cstdint>
#include <functional>

namespace retrybudget {

// The window's shape, from the tenant's policy (WindowShapeOf).
struct WindowShape {
  int64_t slot_ns = 1;       // W = ttl / kSlotsPerWindow
  int32_t deposit_slots = 32;  // a deposit is live in the slots i .. i + deposit_slots - 1
  int32_t lease_slots = 4;   // ceil(lease_ttl / W): a grant is live in j .. j + 32 + lease_slots
  double floor = 0;          // min_retries_per_second * ttl
};

class WindowLedger {
 public:
  // 32: a deposit expires W/2 early and a grant W late on average; memory is 16 bytes a slot.
  static constexpr int32_t kSlotsPerWindow = 32;
  // Slots kept: a grant's whole life (32 + lease_slots + 1, lease_ttl <= ttl).
  static constexpr int32_t kRing = 2 * kSlotsPerWindow + 1;

  // The shape of a windowed policy: `ttl_ns` in [1 s, 60 s], `lease_ttl_ns` in (0, ttl].
  static WindowShape ShapeOf(int64_t ttl_ns, int64_t lease_ttl_ns, double floor);

  // The slot of a time in Unix nanoseconds.
  static int64_t SlotOf(const WindowShape& shape, int64_t now_ns) {
    return now_ns >= 0 ? now_ns / shape.slot_ns : -((-now_ns + shape.slot_ns - 1) / shape.slot_ns);
  }

  // Adds `tokens` (retry_ratio * requests) to the deposits of now's slot.
  void Deposit(const WindowShape& shape, int64_t now_ns, double tokens);
  // The most tokens that may be granted now (floor: whole tokens), 0 when none; what the
  // slot boundaries of the next lease_ttl allow (see the file comment).
  uint64_t Grantable(const WindowShape& shape, int64_t now_ns);
  // The same before rounding: may be negative (tokens counted beyond the floor and the
  // deposits, e.g. after a crash restore).
  double Available(const WindowShape& shape, int64_t now_ns);
  // Counts `tokens` granted (or carried) now, in now's slot; returns that slot.
  int64_t Add(const WindowShape& shape, int64_t now_ns, uint64_t tokens);
  // Takes up to `tokens` out of the grants of `slot`, if it is still live now; returns how
  // many were taken (0 for a slot that expired: its tokens no longer count).
  uint64_t Release(const WindowShape& shape, int64_t now_ns, int64_t slot, uint64_t tokens);
  // Moves `tokens` a client still holds into a lease that starts now: taken out of the oldest
  // live grant slots (what is not found there is added all the same) and counted in now's slot,
  // if the ledger then still allows every future time (Available >= 0). Otherwise changes
  // nothing and returns false: the tokens must not outlive the lease they were counted for.
  bool Carry(const WindowShape& shape, int64_t now_ns, uint64_t tokens);
  // Puts back `tokens` a Release of `slot` just took (the same call's time).
  void Unrelease(const WindowShape& shape, int64_t now_ns, int64_t slot, uint64_t tokens);
  // Takes up to `tokens` out of the oldest live grant slots first; returns how many.
  uint64_t ReleaseOldest(const WindowShape& shape, int64_t now_ns, uint64_t tokens);

  // Deposits and grants live now.
  double LiveDeposits(const WindowShape& shape, int64_t now_ns);
  double LiveGrants(const WindowShape& shape, int64_t now_ns);

  // The live slots, oldest first: f(slot, deposits, grants). For snapshots.
  void ForEachLive(const WindowShape& shape, int64_t now_ns,
                   const std::function<void(int64_t, double, double)>& f);
  // Restores one slot (ForEachLive's output; slots not yet expired at now, in any order).
  void RestoreSlot(const WindowShape& shape, int64_t now_ns, int64_t slot, double deposits,
                   double grants);

 private:
  struct Slot {
    double deposits = 0;
    double grants = 0;
  };
  // Moves the ring up to now's slot (clearing the slots it reuses); a clock going back stays
  // in the newest slot. Returns the current slot.
  int64_t Advance(int64_t now_slot);
  static size_t Index(int64_t slot) {
    const int64_t r = slot % kRing;
    return static_cast<size_t>(r < 0 ? r + kRing : r);
  }
  static size_t Next(size_t index) { return index + 1 == kRing ? 0 : index + 1; }
  Slot& At(int64_t slot) { return ring_[Index(slot)]; }
  // The oldest slot whose grants are live at `slot`.
  static int64_t OldestGrant(const WindowShape& shape, int64_t slot) {
    return slot - shape.deposit_slots - shape.lease_slots;
  }

  std::array<Slot, kRing> ring_{};
  int64_t newest_ = INT64_MIN;  // the newest slot in the ring (INT64_MIN: empty)
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_WINDOW_LEDGER_H_
