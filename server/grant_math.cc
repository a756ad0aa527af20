#include "server/grant_math.h"

#include <algorithm>
#include <cmath>

namespace retrybudget {

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

SafeShareOf SafeShare(double capacity, double refill_per_second, uint64_t fleet) {
  const double n = static_cast<double>(std::max<uint64_t>(fleet, 1));
  return {.capacity = capacity / n, .refill_per_second = refill_per_second / n};
}

absl::Duration DryNextSync(double inflow, uint64_t want, uint64_t want_sum,
                           absl::Duration normal, absl::Duration min_next_sync) {
  const double share_rate =
      inflow * static_cast<double>(want) / static_cast<double>(std::max(want_sum, want));
  const absl::Duration dry_cap = std::min(normal, absl::Milliseconds(250));
  const absl::Duration next = share_rate > 0 ? absl::Seconds(1.0 / share_rate) : dry_cap;
  return std::clamp(next, min_next_sync, dry_cap);
}

LedgerEntry Baseline(const CumulativeCounters& sent) {
  return {.applied = sent, .expected_received = sent.tokens_received, .outstanding = 0,
          .charged = 0};
}

// Why the caps never bind for a record whose whole history is with this server (its baseline
// had all counters 0, as a client's first Sync of a tenant has before it receives anything):
// let G be the grants made since the baseline and R the reclaimed total. Every grant is either
// received or reclaimed at the next report, so received = G - R. outstanding starts at 0 and is
// G - R - spent_lease - returned after each report, i.e. received - spent_lease - returned,
// which validation keeps >= 0 (spent_lease + returned <= received; spent_lease is net of
// refunds). So min(d, outstanding) = d for every spent, returned and reclaimed delta, and the
// holdings (received - spent_lease - returned) equal outstanding: the well-behaved client is
// credited exactly. `charged` is then spent_lease itself, so a refund (spent_lease going down
// by r <= spent_lease) gives back all r. Only a record that
// started with tokens from elsewhere (a previous life, another server) or a client that lies
// meets the caps, and then they credit less, never more.
ReportEffect ApplyReport(LedgerEntry& entry, const CumulativeCounters& sent) {
  const CumulativeCounters& was = entry.applied;
  ReportEffect e;
  e.d_successes = sent.successes - was.successes;
  // Successes the client's fallback bucket already credited are not credited again. A client
  // that claims fewer than it credited gains no more than one that claims more successes.
  const uint64_t now_central = sent.centrally_credited();
  const uint64_t was_central = was.centrally_credited();
  e.d_credited_successes =
      std::min(e.d_successes, now_central > was_central ? now_central - was_central : 0);
  e.d_retries = sent.retries_spent - was.retries_spent;
  e.d_refunded = sent.retries_refunded - was.retries_refunded;
  e.d_denied = sent.retries_denied - was.retries_denied;
  e.d_fallback = sent.fallback_spent - was.fallback_spent;
  e.d_fallback_refunded = sent.fallback_refunded - was.fallback_refunded;
  e.d_requests = sent.requests - was.requests;
  e.d_shadow_denied = sent.shadow_denied - was.shadow_denied;
  e.d_retries_allowed = sent.retries_allowed - was.retries_allowed;
  e.d_returned = sent.tokens_returned - was.tokens_returned;
  e.spent_since = e.d_retries > e.d_refunded ? e.d_retries - e.d_refunded : 0;
  e.reclaimed = entry.expected_received - sent.tokens_received;
  const uint64_t lease_now = sent.lease_spent();
  const uint64_t lease_was = was.lease_spent();
  if (lease_now >= lease_was) {
    const uint64_t spent = std::min(lease_now - lease_was, entry.outstanding);
    entry.outstanding -= spent;
    entry.charged = SaturatingAdd(entry.charged, spent);
  } else {
    // Refunds outweigh new spending: the client holds those tokens again.
    const uint64_t back = std::min(lease_was - lease_now, entry.charged);
    entry.charged -= back;
    entry.outstanding = SaturatingAdd(entry.outstanding, back);
  }
  // Both are at most 2^53 (validated bounds), so the sum cannot overflow.
  const uint64_t back = e.d_returned + e.reclaimed;
  e.credited_back = std::min(back, entry.outstanding);
  e.uncredited = back - e.credited_back;
  entry.outstanding -= e.credited_back;
  entry.applied = sent;
  entry.expected_received = sent.tokens_received;
  return e;
}

uint64_t CountedHoldings(const LedgerEntry& entry) {
  const CumulativeCounters& c = entry.applied;
  const uint64_t used = c.lease_spent() + c.tokens_returned;
  const uint64_t held = c.tokens_received > used ? c.tokens_received - used : 0;
  return std::min(held, entry.outstanding);
}

void RecordGrant(LedgerEntry& entry, uint64_t granted) {
  entry.outstanding = SaturatingAdd(entry.outstanding, granted);
  entry.expected_received = SaturatingAdd(entry.expected_received, granted);
}

uint64_t ReservationBlock(double capacity) {
  return std::clamp<uint64_t>(static_cast<uint64_t>(capacity / 8), 8, 1'000'000);
}

uint64_t ClusterReservationBlock(double capacity, double grant_rate, double inflow,
                                 absl::Duration ahead) {
  const double rate = std::max(0.0, std::min(grant_rate, inflow));
  const double sized = std::ceil(rate * absl::ToDoubleSeconds(ahead));
  const uint64_t by_rate =
      sized >= 1e6 ? 1'000'000 : static_cast<uint64_t>(std::max(0.0, sized));
  return std::clamp<uint64_t>(std::max(ReservationBlock(capacity), by_rate), 8, 1'000'000);
}

}  // namespace retrybudget
