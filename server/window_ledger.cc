#include "server/window_ledger.h"

#include <algorithm>
#include <cmath>

namespace retrybudget {

WindowShape WindowLedger::ShapeOf(int64_t ttl_ns, int64_t lease_ttl_ns, double floor) {
  WindowShape s;
  // ttl is a whole number of milliseconds (policy.cc), so W is exact: a deposit lives exactly
  // 32 slots, i.e. until its slot's start + ttl.
  s.slot_ns = std::max<int64_t>(1, ttl_ns / kSlotsPerWindow);
  s.deposit_slots = kSlotsPerWindow;
  const int64_t lease = std::clamp<int64_t>(lease_ttl_ns, 0, ttl_ns);
  s.lease_slots = static_cast<int32_t>((lease + s.slot_ns - 1) / s.slot_ns);
  s.floor = floor;
  return s;
}

int64_t WindowLedger::Advance(int64_t now_slot) {
  if (newest_ == INT64_MIN) {
    ring_.fill(Slot{});
    newest_ = now_slot;
    return newest_;
  }
  if (now_slot <= newest_) return newest_;
  if (now_slot - newest_ >= kRing) {
    ring_.fill(Slot{});
  } else {
    for (int64_t s = newest_ + 1; s <= now_slot; ++s) At(s) = Slot{};
  }
  newest_ = now_slot;
  return newest_;
}

void WindowLedger::Deposit(const WindowShape& shape, int64_t now_ns, double tokens) {
  if (!(tokens > 0)) return;
  At(Advance(SlotOf(shape, now_ns))).deposits += tokens;
}

double WindowLedger::Available(const WindowShape& shape, int64_t now_ns) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  const int64_t k = shape.deposit_slots;
  const int64_t oldest_grant = OldestGrant(shape, s);
  // At s: every deposit of the last k slots and every grant still live. (Walked by ring index:
  // a division per slot was most of a windowed Sync's added cost.)
  double a = shape.floor;
  size_t i = Index(s - k + 1);
  for (int64_t n = 0; n < k; ++n, i = Next(i)) a += ring_[i].deposits;
  size_t j = Index(oldest_grant);
  for (int64_t n = oldest_grant; n <= s; ++n, j = Next(j)) a -= ring_[j].grants;
  double low = a;
  // Each later slot boundary within the lease that starts now (a token granted now is spent by
  // now + lease_ttl, before the end of slot s + lease_slots): the oldest deposit expires
  // (lowers it), the oldest grant too (raises it). Later times are checked by later grants.
  size_t expiring_grant = Index(s - k - shape.lease_slots);
  size_t expiring_deposit = Index(s - k + 1);
  for (int64_t u = s; u < s + shape.lease_slots; ++u) {
    a += ring_[expiring_grant].grants - ring_[expiring_deposit].deposits;
    low = std::min(low, a);
    expiring_grant = Next(expiring_grant);
    expiring_deposit = Next(expiring_deposit);
  }
  return low;
}

uint64_t WindowLedger::Grantable(const WindowShape& shape, int64_t now_ns) {
  const double a = Available(shape, now_ns);
  // Deposits are fractions (retry_ratio * requests): a sum that should be whole may be a hair
  // below it.
  return a <= 0 ? 0 : static_cast<uint64_t>(std::floor(a + 1e-9));
}

int64_t WindowLedger::Add(const WindowShape& shape, int64_t now_ns, uint64_t tokens) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  At(s).grants += static_cast<double>(tokens);
  return s;
}

uint64_t WindowLedger::Release(const WindowShape& shape, int64_t now_ns, int64_t slot,
                               uint64_t tokens) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  if (tokens == 0 || slot < OldestGrant(shape, s) || slot > s) return 0;
  Slot& at = At(slot);
  const uint64_t taken =
      std::min<uint64_t>(tokens, static_cast<uint64_t>(std::max(0.0, at.grants)));
  at.grants -= static_cast<double>(taken);
  return taken;
}

bool WindowLedger::Carry(const WindowShape& shape, int64_t now_ns, uint64_t tokens) {
  if (tokens == 0) return true;
  const int64_t s = Advance(SlotOf(shape, now_ns));
  std::array<double, kRing> taken{};
  double left = static_cast<double>(tokens);
  const int64_t oldest = OldestGrant(shape, s);
  for (int64_t j = oldest; j <= s && left > 0; ++j) {
    Slot& at = At(j);
    const double t = std::min(left, std::max(0.0, at.grants));
    at.grants -= t;
    taken[static_cast<size_t>(j - oldest)] = t;
    left -= t;
  }
  At(s).grants += static_cast<double>(tokens);
  if (Available(shape, now_ns) >= -1e-9) return true;
  At(s).grants -= static_cast<double>(tokens);
  for (int64_t j = oldest; j <= s; ++j) At(j).grants += taken[static_cast<size_t>(j - oldest)];
  return false;
}

void WindowLedger::Unrelease(const WindowShape& shape, int64_t now_ns, int64_t slot,
                             uint64_t tokens) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  if (tokens == 0 || slot < OldestGrant(shape, s) || slot > s) return;
  At(slot).grants += static_cast<double>(tokens);
}

uint64_t WindowLedger::ReleaseOldest(const WindowShape& shape, int64_t now_ns, uint64_t tokens) {
  if (tokens == 0) return 0;
  const int64_t s = Advance(SlotOf(shape, now_ns));
  double left = static_cast<double>(tokens);
  size_t i = Index(OldestGrant(shape, s));
  for (int64_t j = OldestGrant(shape, s); j <= s && left > 0; ++j, i = Next(i)) {
    Slot& at = ring_[i];
    const double t = std::min(left, std::floor(std::max(0.0, at.grants)));
    at.grants -= t;
    left -= t;
  }
  return tokens - static_cast<uint64_t>(left);
}

double WindowLedger::LiveDeposits(const WindowShape& shape, int64_t now_ns) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  double d = 0;
  for (int64_t i = s - shape.deposit_slots + 1; i <= s; ++i) d += At(i).deposits;
  return d;
}

double WindowLedger::LiveGrants(const WindowShape& shape, int64_t now_ns) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  double g = 0;
  for (int64_t j = OldestGrant(shape, s); j <= s; ++j) g += At(j).grants;
  return g;
}

void WindowLedger::ForEachLive(const WindowShape& shape, int64_t now_ns,
                               const std::function<void(int64_t, double, double)>& f) {
  const int64_t s = Advance(SlotOf(shape, now_ns));
  const int64_t first_deposit = s - shape.deposit_slots + 1;
  for (int64_t j = OldestGrant(shape, s); j <= s; ++j) {
    const Slot& at = At(j);
    const double deposits = j >= first_deposit ? at.deposits : 0;
    if (deposits != 0 || at.grants != 0) f(j, deposits, at.grants);
  }
}

void WindowLedger::RestoreSlot(const WindowShape& shape, int64_t now_ns, int64_t slot,
                               double deposits, double grants) {
  // A slot ahead of now (a clock that went back since it was written) is kept where it was:
  // the ring then stays at it, as for any clock going back.
  const int64_t s = Advance(std::max(SlotOf(shape, now_ns), slot));
  if (slot < OldestGrant(shape, s)) return;  // expired
  Slot& at = At(slot);
  at.deposits = slot >= s - shape.deposit_slots + 1 ? deposits : 0;
  at.grants = grants;
}

}  // namespace retrybudget
