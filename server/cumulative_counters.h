// The cumulative counters a client reports per tenant (TenantSync), defined once. Every step
// that handles them (validation, the check against what was applied, the replay fingerprint,
// the ledger, the snapshot and its restore) walks kCumulativeCounters, so a counter added here
// is handled everywhere and one missing from a step cannot happen. `want` is not cumulative
// and is not listed. tests/server/cumulative_counters_test.cc checks that every field of
// TenantSync is either listed here or handled by name.
#ifndef RETRYBUDGET_SERVER_CUMULATIVE_COUNTERS_H_
#define RETRYBUDGET_SERVER_CUMULATIVE_COUNTERS_H_

#include <array>
#include <cstdint>
#include <utility>

#include "absl/strings/string_view.h"
#include "retrybudget/v1/budget.pb.h"
#include "retrybudget/v1/state.pb.h"

namespace retrybudget {

// The largest value of any counter and of seq: 2^53, so that every counter is exact as a double
// (metrics, JSON) and sums of a few of them cannot overflow 64 bits.
inline constexpr uint64_t kMaxCounter = uint64_t{1} << 53;

struct CumulativeCounters {
  uint64_t successes = 0;
  uint64_t retries_spent = 0;
  uint64_t retries_denied = 0;
  uint64_t tokens_returned = 0;
  uint64_t tokens_received = 0;
  uint64_t fallback_spent = 0;
  uint64_t successes_credited_locally = 0;
  uint64_t retries_refunded = 0;
  uint64_t fallback_refunded = 0;
  uint64_t requests = 0;
  uint64_t requests_credited_locally = 0;
  uint64_t shadow_denied = 0;
  uint64_t retries_allowed = 0;

  // Requests the server deposits for (a windowed policy: not deposited by the client's fallback
  // bucket). Validated requests have requests_credited_locally <= requests.
  uint64_t centrally_deposited_requests() const { return Sub(requests, requests_credited_locally); }
  // Successes the server credits (not credited by the client's fallback bucket). Validated
  // requests have successes_credited_locally <= successes.
  uint64_t centrally_credited() const {
    return successes >= successes_credited_locally ? successes - successes_credited_locally : 0;
  }
  // Retries spent from leases (not from the local fallback bucket), refunds deducted: the lease
  // tokens spent for good. Validated requests have fallback_spent <= retries_spent and
  // lease_refunded() <= retries_spent - fallback_spent. Not monotonic: a refund lowers it.
  uint64_t lease_spent() const {
    const uint64_t gross = Sub(retries_spent, fallback_spent);
    return Sub(gross, lease_refunded());
  }
  // Refunds of tokens that came from leases.
  uint64_t lease_refunded() const { return Sub(retries_refunded, fallback_refunded); }

 private:
  static uint64_t Sub(uint64_t a, uint64_t b) { return a >= b ? a - b : 0; }
};

// One counter: its name in the protos and its place in each representation.
struct CounterField {
  absl::string_view name;
  uint64_t CumulativeCounters::*value;
  uint64_t (v1::TenantSync::*sent)() const;
  uint64_t (v1::InstanceTenantState::*saved)() const;
  void (v1::InstanceTenantState::*save)(uint64_t);
  // A counter added to the contract after others: hashed into the replay fingerprint only when
  // non-zero, so a request without it fingerprints as an older server saved it.
  bool fingerprint_only_when_set = false;
};

inline constexpr std::array<CounterField, 13> kCumulativeCounters = {{
    {"successes", &CumulativeCounters::successes, &v1::TenantSync::successes,
     &v1::InstanceTenantState::successes, &v1::InstanceTenantState::set_successes},
    {"retries_spent", &CumulativeCounters::retries_spent, &v1::TenantSync::retries_spent,
     &v1::InstanceTenantState::retries_spent, &v1::InstanceTenantState::set_retries_spent},
    {"retries_denied", &CumulativeCounters::retries_denied, &v1::TenantSync::retries_denied,
     &v1::InstanceTenantState::retries_denied, &v1::InstanceTenantState::set_retries_denied},
    {"tokens_returned", &CumulativeCounters::tokens_returned, &v1::TenantSync::tokens_returned,
     &v1::InstanceTenantState::tokens_returned, &v1::InstanceTenantState::set_tokens_returned},
    {"tokens_received", &CumulativeCounters::tokens_received, &v1::TenantSync::tokens_received,
     &v1::InstanceTenantState::tokens_received, &v1::InstanceTenantState::set_tokens_received},
    {"fallback_spent", &CumulativeCounters::fallback_spent, &v1::TenantSync::fallback_spent,
     &v1::InstanceTenantState::fallback_spent, &v1::InstanceTenantState::set_fallback_spent},
    {"successes_credited_locally", &CumulativeCounters::successes_credited_locally,
     &v1::TenantSync::successes_credited_locally,
     &v1::InstanceTenantState::successes_credited_locally,
     &v1::InstanceTenantState::set_successes_credited_locally, true},
    {"retries_refunded", &CumulativeCounters::retries_refunded,
     &v1::TenantSync::retries_refunded, &v1::InstanceTenantState::retries_refunded,
     &v1::InstanceTenantState::set_retries_refunded, true},
    {"fallback_refunded", &CumulativeCounters::fallback_refunded,
     &v1::TenantSync::fallback_refunded, &v1::InstanceTenantState::fallback_refunded,
     &v1::InstanceTenantState::set_fallback_refunded, true},
    {"requests", &CumulativeCounters::requests, &v1::TenantSync::requests,
     &v1::InstanceTenantState::requests, &v1::InstanceTenantState::set_requests, true},
    {"requests_credited_locally", &CumulativeCounters::requests_credited_locally,
     &v1::TenantSync::requests_credited_locally,
     &v1::InstanceTenantState::requests_credited_locally,
     &v1::InstanceTenantState::set_requests_credited_locally, true},
    {"shadow_denied", &CumulativeCounters::shadow_denied, &v1::TenantSync::shadow_denied,
     &v1::InstanceTenantState::shadow_denied, &v1::InstanceTenantState::set_shadow_denied, true},
    {"retries_allowed", &CumulativeCounters::retries_allowed, &v1::TenantSync::retries_allowed,
     &v1::InstanceTenantState::retries_allowed, &v1::InstanceTenantState::set_retries_allowed,
     true},
}};

// A counter that counts a part of another: at most the whole (`part <= whole`, validated for
// every request entry, the error naming both).
struct PartOfCounter {
  absl::string_view part_name;
  uint64_t CumulativeCounters::*part;
  absl::string_view whole_name;
  uint64_t CumulativeCounters::*whole;
};

inline constexpr std::array<PartOfCounter, 6> kPartsOfCounters = {{
    {"fallback_spent", &CumulativeCounters::fallback_spent, "retries_spent",
     &CumulativeCounters::retries_spent},
    {"successes_credited_locally", &CumulativeCounters::successes_credited_locally, "successes",
     &CumulativeCounters::successes},
    {"requests_credited_locally", &CumulativeCounters::requests_credited_locally, "requests",
     &CumulativeCounters::requests},
    {"retries_refunded", &CumulativeCounters::retries_refunded, "retries_spent",
     &CumulativeCounters::retries_spent},
    // A retry allowed spends its cost, at least one token.
    {"retries_allowed", &CumulativeCounters::retries_allowed, "retries_spent",
     &CumulativeCounters::retries_spent},
    {"fallback_refunded", &CumulativeCounters::fallback_refunded, "fallback_spent",
     &CumulativeCounters::fallback_spent},
}};

// Calls f(field) for each of kCumulativeCounters, in order, unrolled at compile time: each call
// reads its CumulativeCounters field (`value`) at a fixed offset, where a loop over the array
// loaded each member pointer from memory. (For the messages' accessors, a member-function
// pointer read this way still ends as an out-of-line call: CountersOf reads those.)
template <typename F>
void ForEachCounter(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f(kCumulativeCounters[I]), ...);
  }(std::make_index_sequence<kCumulativeCounters.size()>());
}

// The first counter for which `pred(field)` holds, or null; unrolled as ForEachCounter.
template <typename Pred>
const CounterField* FirstCounterWhere(Pred&& pred) {
  const CounterField* found = nullptr;
  [&]<size_t... I>(std::index_sequence<I...>) {
    (void)((pred(kCumulativeCounters[I]) ? (found = &kCumulativeCounters[I], true) : false) ||
           ...);
  }(std::make_index_sequence<kCumulativeCounters.size()>());
  return found;
}

// A request's counters, read once per entry and step: validation, the check against what was
// applied, the fingerprint and the ledger read them from this struct. Each accessor is a
// constant expression here, so the compiler inlines it (a load); one read from the array, even
// at a constant index, was only resolved to a call after inlining was decided.
inline CumulativeCounters CountersOf(const v1::TenantSync& sent) {
  CumulativeCounters c;
  [&]<size_t... I>(std::index_sequence<I...>) {
    ([&] {
      constexpr CounterField f = kCumulativeCounters[I];
      c.*f.value = (sent.*f.sent)();
    }(), ...);
  }(std::make_index_sequence<kCumulativeCounters.size()>());
  return c;
}

inline CumulativeCounters CountersOf(const v1::InstanceTenantState& saved) {
  CumulativeCounters c;
  for (const CounterField& f : kCumulativeCounters) c.*f.value = (saved.*f.saved)();
  return c;
}

inline void SaveCounters(const CumulativeCounters& c, v1::InstanceTenantState* out) {
  for (const CounterField& f : kCumulativeCounters) (out->*f.save)(c.*f.value);
}

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_CUMULATIVE_COUNTERS_H_
