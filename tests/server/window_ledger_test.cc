#include "server/window_ledger.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace retrybudget {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kTtl = 1000 * kMs;   // 1 s window: 32 slots of 31.25 ms
constexpr int64_t kLease = 100 * kMs;  // ttl/10, the default
const int64_t kT0 = int64_t{1'700'000'000} * 1'000'000'000;  // a fake clock, in Unix ns

WindowShape Shape(double floor) { return WindowLedger::ShapeOf(kTtl, kLease, floor); }

TEST(WindowLedgerTest, ShapeIsThirtyTwoSlotsAndTheLeaseRoundedUp) {
  const WindowShape s = Shape(10);
  EXPECT_EQ(s.slot_ns, 31'250'000);
  EXPECT_EQ(s.deposit_slots, 32);
  EXPECT_EQ(s.lease_slots, 4);  // 100 ms is 3.2 slots
  EXPECT_DOUBLE_EQ(s.floor, 10);
}

TEST(WindowLedgerTest, AnEmptyLedgerGrantsTheFloor) {
  WindowLedger l;
  EXPECT_EQ(l.Grantable(Shape(10), kT0), 10u);
  EXPECT_EQ(l.Grantable(Shape(0), kT0), 0u);
}

TEST(WindowLedgerTest, GrantsCountAgainstTheFloorUntilTheyExpire) {
  const WindowShape s = Shape(10);
  WindowLedger l;
  l.Add(s, kT0, 10);
  EXPECT_EQ(l.Grantable(s, kT0), 0u);
  // Still counted a window later: a grant lives its slot's end + ttl + lease_ttl.
  EXPECT_EQ(l.Grantable(s, kT0 + kTtl), 0u);
  EXPECT_EQ(l.Grantable(s, kT0 + kTtl + kLease + 2 * s.slot_ns), 10u);
}

TEST(WindowLedgerTest, ADepositFundsGrantsWhoseLeaseEndsBeforeItExpires) {
  const WindowShape s = Shape(0);
  WindowLedger l;
  l.Deposit(s, kT0, 5);
  // A lease granted now ends within lease_ttl, long before the deposit expires.
  EXPECT_EQ(l.Grantable(s, kT0), 5u);
  EXPECT_DOUBLE_EQ(l.LiveDeposits(s, kT0), 5);
  // Within lease_ttl of its expiry it funds nothing: a lease granted then could be spent after.
  EXPECT_EQ(l.Grantable(s, kT0 + kTtl - kLease / 2), 0u);
  EXPECT_DOUBLE_EQ(l.LiveDeposits(s, kT0 + kTtl), 0);
}

TEST(WindowLedgerTest, DepositsAddToTheFloorWhileLive) {
  const WindowShape s = Shape(10);
  WindowLedger l;
  l.Add(s, kT0, 10);  // the floor spent
  const int64_t t1 = kT0 + kTtl + kLease + 2 * s.slot_ns;  // its grant expired
  l.Deposit(s, t1, 4);
  EXPECT_EQ(l.Grantable(s, t1), 14u);
  l.Add(s, t1, 14);
  EXPECT_EQ(l.Grantable(s, t1), 0u);
}

TEST(WindowLedgerTest, AGrantFundedByADepositCountsUntilItExpires) {
  const WindowShape s = Shape(10);
  WindowLedger l;
  l.Add(s, kT0, 10);
  // Before the first grant's expiry a deposit arrives: it funds a grant now (the floor is
  // spent).
  const int64_t t1 = kT0 + kTtl;
  l.Deposit(s, t1, 6);
  EXPECT_EQ(l.Grantable(s, t1), 6u);
  l.Add(s, t1, 6);
  EXPECT_EQ(l.Grantable(s, t1), 0u);
  // Once the first grant expired, the floor is back, the deposit still live and its grant
  // still counted: 10 + 6 - 6.
  EXPECT_EQ(l.Grantable(s, kT0 + kTtl + kLease + 2 * s.slot_ns), 10u);
  // Once the deposit expired too (its grant still counted), the floor less that grant.
  EXPECT_EQ(l.Grantable(s, t1 + kTtl + s.slot_ns), 4u);
}

TEST(WindowLedgerTest, ReleaseTakesFromALiveSlotOnly) {
  const WindowShape s = Shape(10);
  WindowLedger l;
  const int64_t slot = l.Add(s, kT0, 8);
  EXPECT_EQ(l.Release(s, kT0, slot, 3), 3u);
  EXPECT_EQ(l.Grantable(s, kT0), 5u);
  EXPECT_EQ(l.Release(s, kT0, slot, 100), 5u);  // never more than the slot holds
  EXPECT_EQ(l.Grantable(s, kT0), 10u);
  const int64_t old = l.Add(s, kT0, 4);
  const int64_t late = kT0 + 3 * kTtl;
  EXPECT_EQ(l.Release(s, late, old, 4), 0u);  // expired: it counts nothing to release
}

TEST(WindowLedgerTest, ReleaseOldestTakesTheOldestSlotsFirst) {
  const WindowShape s = Shape(20);
  WindowLedger l;
  const int64_t a = l.Add(s, kT0, 4);
  const int64_t b = l.Add(s, kT0 + 5 * s.slot_ns, 4);
  EXPECT_EQ(l.ReleaseOldest(s, kT0 + 5 * s.slot_ns, 6), 6u);
  EXPECT_EQ(l.Release(s, kT0 + 5 * s.slot_ns, a, 10), 0u);
  EXPECT_EQ(l.Release(s, kT0 + 5 * s.slot_ns, b, 10), 2u);
}

TEST(WindowLedgerTest, SnapshotRoundTrip) {
  const WindowShape s = Shape(10);
  WindowLedger l;
  l.Deposit(s, kT0, 3);
  l.Add(s, kT0 + s.slot_ns, 7);
  WindowLedger copy;
  const int64_t now = kT0 + 3 * s.slot_ns;
  l.ForEachLive(s, now, [&](int64_t slot, double d, double g) {
    copy.RestoreSlot(s, now, slot, d, g);
  });
  EXPECT_DOUBLE_EQ(copy.LiveDeposits(s, now), 3);
  EXPECT_DOUBLE_EQ(copy.LiveGrants(s, now), 7);
  EXPECT_DOUBLE_EQ(copy.Available(s, now), l.Available(s, now));
}

TEST(WindowLedgerTest, ACarryMovesHeldTokensToNowOnlyWhenTheyFit) {
  const WindowShape s = Shape(10);
  WindowLedger l;
  l.Add(s, kT0, 6);
  const int64_t later = kT0 + 10 * s.slot_ns;
  EXPECT_TRUE(l.Carry(s, later, 6));  // moved: still 6 counted, now from `later`
  EXPECT_DOUBLE_EQ(l.LiveGrants(s, later), 6);
  EXPECT_EQ(l.Grantable(s, kT0 + kTtl + kLease + 2 * s.slot_ns), 4u);  // the first expiry passed
  l.Add(s, later, 4);
  // Nothing left: a carry of more than was counted would outlive the floor.
  EXPECT_FALSE(l.Carry(s, later + s.slot_ns, 11));
  EXPECT_DOUBLE_EQ(l.LiveGrants(s, later + s.slot_ns), 10);  // unchanged
}

// A brute-force check of the bound: a simulated fleet leases tokens from the ledger (grants at
// most Grantable, spends each token at a random time before its lease ends, returns or carries
// the rest into a new lease), and every window of length ttl is checked against
// floor + ratio * requests reported in it.
TEST(WindowLedgerTest, SpendingInEveryWindowStaysWithinTheBound) {
  int windows_beyond_floor = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    const double floor = static_cast<double>(rng() % 20);
    const double ratio = 0.05 * static_cast<double>(rng() % 40);
    const int64_t lease = (100 + static_cast<int64_t>(rng() % 900)) * kMs;
    const WindowShape s = WindowLedger::ShapeOf(kTtl, lease, floor);
    WindowLedger l;
    struct Lease {
      int64_t slot = 0;
      int64_t ends = 0;  // no token is spent after it
      uint64_t held = 0;
    };
    std::vector<Lease> leases(4);
    std::vector<int64_t> requests;  // times of requests reported
    std::vector<int64_t> spends;
    const int64_t step = 7 * kMs;
    for (int64_t now = kT0; now < kT0 + 8 * kTtl; now += step) {
      // Bursts of requests, some quiet stretches.
      const uint64_t n = (now / (3 * kTtl)) % 2 == 0 ? rng() % 6 : 0;
      for (uint64_t i = 0; i < n; ++i) requests.push_back(now);
      l.Deposit(s, now, ratio * static_cast<double>(n));
      for (Lease& le : leases) {
        // Spend some held tokens while the lease runs.
        if (now <= le.ends) {
          // Mostly idle, at times all at once: held tokens are carried across syncs.
          // And at times everything at the lease's last moment, the adversary's choice.
          const bool last = now + step > le.ends && rng() % 2 == 0;
          const uint64_t spend = last ? le.held
                                 : le.held == 0 || rng() % 10 != 0 ? 0
                                                                   : rng() % (le.held + 1);
          for (uint64_t i = 0; i < spend; ++i) spends.push_back(now);
          le.held -= spend;
        }
        if (rng() % 5 != 0) continue;  // this instance syncs now
        if (now > le.ends) {  // expired: the rest comes back (within a lease TTL: active)
          if (now - le.ends <= lease) l.ReleaseOldest(s, now, le.held);
          le.held = 0;
        }
        // Carry what is held into the new lease when it fits (taken from the oldest slots);
        // else the lease ends now (the core answers with a lease TTL of 0: the client gives
        // the tokens back) and nothing is granted.
        if (seed % 2 == 0) {  // even seeds: Carry; odd ones: the lease's own slot
          if (l.Carry(s, now, le.held)) {
            le.ends = now + lease;
            const uint64_t grant = std::min<uint64_t>(l.Grantable(s, now), rng() % 64);
            l.Add(s, now, grant);
            le.held += grant;
          } else {
            le.ends = now;
          }
          continue;
        }
        // The same with the lease's own slot (Release + Add).
        const uint64_t released = l.Release(s, now, le.slot, le.held);
        if (static_cast<double>(le.held) <= l.Available(s, now)) {
          le.slot = l.Add(s, now, le.held);
          le.ends = now + lease;
          const uint64_t grant = std::min<uint64_t>(l.Grantable(s, now), rng() % 64);
          l.Add(s, now, grant);
          le.held += grant;
        } else {
          l.Unrelease(s, now, le.slot, released);
        }
      }
    }
    // Every window ending at a retry (the bound's form: the file comment of window_ledger.h).
    std::sort(spends.begin(), spends.end());
    for (const int64_t x : spends) {
      const auto in = [&](const std::vector<int64_t>& v) {
        return std::upper_bound(v.begin(), v.end(), x) -
               std::upper_bound(v.begin(), v.end(), x - kTtl);
      };
      const double bound = floor + ratio * static_cast<double>(in(requests));
      ASSERT_LE(static_cast<double>(in(spends)), bound + 1e-6)
          << "seed " << seed << " x = " << (x - kT0) / kMs << " ms";
      // Not vacuous: deposits funded spending beyond the floor.
      if (static_cast<double>(in(spends)) > floor) ++windows_beyond_floor;
    }
  }
  EXPECT_GT(windows_beyond_floor, 100);
}

}  // namespace
}  // namespace retrybudget
