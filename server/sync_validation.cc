#include "server/sync_validation.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "retrybudget/names.h"
#include "server/cumulative_counters.h"

namespace retrybudget {
namespace {

// Whether the strings in `tenants` are pairwise distinct; -1 if so, else the index of the first
// repeated one. A scan for the few entries of a typical request, a set beyond.
template <typename Entries>
int FirstRepeatedTenant(const Entries& tenants) {
  constexpr int kScanUpTo = 16;
  const int n = tenants.size();
  if (n <= kScanUpTo) {
    for (int i = 1; i < n; ++i) {
      for (int j = 0; j < i; ++j) {
        if (tenants[i].tenant() == tenants[j].tenant()) return i;
      }
    }
    return -1;
  }
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(n);
  for (int i = 0; i < n; ++i) {
    if (!seen.insert(tenants[i].tenant()).second) return i;
  }
  return -1;
}

}  // namespace

absl::Status ValidateRequest(const v1::SyncRequest& request, const SyncLimits& limits) {
  if (!IsValidInstanceId(request.instance_id())) return ValidateInstanceId(request.instance_id());
  if (request.seq() == 0) {
    return absl::InvalidArgumentError("seq = 0 is invalid: seq starts at 1 and increases");
  }
  if (request.seq() > kMaxCounter) {
    return absl::InvalidArgumentError(
        absl::StrFormat("seq = %d is over the limit of 2^53 = %d", request.seq(), kMaxCounter));
  }
  if (static_cast<size_t>(request.tenants_size()) > limits.max_tenants_per_request) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tenants has %d entries; at most %d are allowed in one request", request.tenants_size(),
        limits.max_tenants_per_request));
  }
  for (int i = 0; i < request.tenants_size(); ++i) {
    const v1::TenantSync& t = request.tenants(i);
    // The field name is only formatted for the error.
    if (!IsValidTenantName(t.tenant())) {
      return ValidateTenantName(t.tenant(), absl::StrCat("tenants[", i, "].tenant"));
    }
    if (t.want() > limits.max_want) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d].want = %d for tenant %s is over the limit of %d tokens", i, t.want(),
          QuoteForError(t.tenant()), limits.max_want));
    }
    const CumulativeCounters sent = CountersOf(t);
    if (const CounterField* f = FirstCounterWhere(
            [&](const CounterField& c) { return sent.*c.value > kMaxCounter; })) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d].%s = %d for tenant %s is over the limit of 2^53 = %d", i, f->name,
          sent.*f->value, QuoteForError(t.tenant()), kMaxCounter));
    }
    for (const PartOfCounter& c : kPartsOfCounters) {
      if (sent.*c.part > sent.*c.whole) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tenants[%d].%s = %d exceeds %s = %d for tenant %s", i, c.part_name, sent.*c.part,
            c.whole_name, sent.*c.whole, QuoteForError(t.tenant())));
      }
    }
    if (sent.fallback_refunded > sent.retries_refunded) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d].fallback_refunded = %d exceeds retries_refunded = %d for tenant %s", i,
          sent.fallback_refunded, sent.retries_refunded, QuoteForError(t.tenant())));
    }
    // Refunds of lease tokens are at most the lease tokens spent.
    const uint64_t lease_gross = sent.retries_spent - sent.fallback_spent;
    if (sent.lease_refunded() > lease_gross) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d] for tenant %s: refunds of lease tokens (retries_refunded - "
          "fallback_refunded = %d) exceed retries spent from leases (retries_spent - "
          "fallback_spent = %d)",
          i, QuoteForError(t.tenant()), sent.lease_refunded(), lease_gross));
    }
    // Tokens spent for good from leases plus tokens given back can never exceed tokens
    // received: a client returning what it never had would create tokens. (Each is at most
    // 2^53: the sum cannot overflow.)
    const uint64_t lease_spent = sent.lease_spent();
    if (lease_spent + sent.tokens_returned > sent.tokens_received) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenants[%d] for tenant %s: retries spent from leases, refunds deducted (%d) + "
          "tokens_returned (%d) exceed tokens_received (%d)",
          i, QuoteForError(t.tenant()), lease_spent, sent.tokens_returned, sent.tokens_received));
    }
  }
  if (const int i = FirstRepeatedTenant(request.tenants()); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tenants[%d].tenant %s appears more than once in the request", i,
                        QuoteForError(request.tenants(i).tenant())));
  }
  return absl::OkStatus();
}

absl::Status CheckAgainstApplied(int index, const v1::TenantSync& sent,
                                 const LedgerEntry& applied) {
  const CumulativeCounters counters = CountersOf(sent);
  if (const CounterField* f = FirstCounterWhere([&](const CounterField& c) {
        return counters.*c.value < applied.applied.*c.value;
      })) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tenants[%d].%s = %d for tenant %s is lower than %d already applied; counters are "
        "cumulative and never go backwards",
        index, f->name, counters.*f->value, QuoteForError(sent.tenant()),
        applied.applied.*f->value));
  }
  if (counters.tokens_received > applied.expected_received) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tenants[%d].tokens_received = %d for tenant %s exceeds the %d tokens this instance "
        "had received when first seen plus those granted since",
        index, counters.tokens_received, QuoteForError(sent.tenant()), applied.expected_received));
  }
  return absl::OkStatus();
}

}  // namespace retrybudget
