// The refresher's books for one tenant: what went into the lease word and what came out, split
// by where the tokens came from (the server's leases or the local fallback bucket), turned into
// the cumulative counters a Sync reports.
#ifndef RETRYBUDGET_CLIENT_TENANT_LEDGER_H_
#define RETRYBUDGET_CLIENT_TENANT_LEDGER_H_

#include <cstdint>

namespace retrybudget::client_internal {

// The books of one source of tokens. Workers never count what they spend: the refresher knows
// everything it put into the lease word (`in`) and took out of it (`out`), so with `held` read
// from the word while this source owns it,
//
//     spent = in - out - held
//
// counts every TryAcquire() that took a token minus every Refund() (a refund puts the token back
// into the word, so it is simply not spent).
//
// A Sync carries cumulative counters that must never go backwards, but a Refund() that comes
// after a report lowers `spent`. So the reported spent count is held at its last value until the
// real count catches up (the refunded token is spent again), and when such a token is withdrawn
// instead, it is "absorbed": counted as spent rather than as out. A withdrawal never counts more
// tokens as out than `in - out - reported_spent` allows (tokens refunded into the word across a
// change of source belong to the other source's books and are absorbed too), so always
//
//     reported_spent + out <= in.
//
// Not thread-safe: the owner serialises calls.
class TokenAccount {
 public:
  // `n` tokens went into the word.
  void In(uint64_t n) { in_ += n; }
  // `n` tokens arrived and went straight out (cut by the word's cap).
  void InAndOut(uint64_t n) {
    in_ += n;
    out_ += n;
  }
  // `withdrawn` tokens were taken out of the word; `held_after` is what it holds right after
  // (normally 0; more if a Refund() raced in).
  void Withdrew(uint64_t withdrawn, uint64_t held_after);
  // The cumulative spent count to report while the word holds `held` of this source's tokens;
  // remembered as reported (the next report is never lower).
  uint64_t ReportSpent(uint64_t held);
  // Spent really (takes minus refunds), for Stats. Not monotonic.
  uint64_t ExactSpent(uint64_t held) const;

  uint64_t in() const { return in_; }
  uint64_t out() const { return out_; }
  uint64_t reported_spent() const { return reported_spent_; }

 private:
  uint64_t in_ = 0;
  uint64_t out_ = 0;
  uint64_t absorbed_ = 0;
  uint64_t reported_spent_ = 0;
};

// Both sources of one tenant. At any time exactly one source owns the tokens in the lease word;
// the owner switches only after the word was emptied (TenantBudgetImpl withdraws first), so a
// token is attributed to the source that put it there. The wire counters are:
//
//     tokens_received = lease.in          (granted by the server and received)
//     tokens_returned = lease.out         (leased tokens given back: never fallback tokens)
//     fallback_spent  = fallback.reported_spent
//     retries_spent   = lease.reported_spent + fallback_spent
//
// so `fallback_spent <= retries_spent` and `(retries_spent - fallback_spent) + tokens_returned
// <= tokens_received` hold for every report, and each counter is monotonic. Fallback tokens
// taken out of the word just vanish: the server never granted them. A Refund() that lands after
// a change of source moves one token between the two books (the total stays exact).
//
// Not thread-safe: the owner serialises calls (TenantBudgetImpl holds its mutex).
class TenantLedger {
 public:
  enum class Source { kLease, kFallback };

  // `granted` tokens arrived in a response; `deposited` of them went into the word (the rest was
  // cut by the word's cap and counts as returned at once). The source must be kLease.
  void Received(uint64_t granted, uint64_t deposited);

  // `n` tokens from the local fallback bucket went into the word. The source must be kFallback.
  void FallbackDeposited(uint64_t n) { fallback_.In(n); }

  // `withdrawn` tokens were taken out of the word (expiry, refusal, change of source, shutdown);
  // they belong to the current source. `held_after` is what the word holds right after.
  void Withdrew(uint64_t withdrawn, uint64_t held_after);

  // The word now holds (only) tokens of `source`. Call after emptying the word.
  void SwitchTo(Source source) { source_ = source; }
  Source source() const { return source_; }

  // The cumulative `retries_spent` to report while the word holds `held` tokens, and remembers
  // it (and its fallback part, reported_fallback_spent()) as reported.
  uint64_t ReportSpent(uint64_t held);

  // Retries really spent (TryAcquire() minus Refund()), for Stats. Not monotonic.
  uint64_t ExactSpent(uint64_t held) const;
  // Of ExactSpent(), those from the fallback bucket.
  uint64_t ExactFallbackSpent(uint64_t held) const;

  uint64_t received() const { return lease_.in(); }
  uint64_t returned() const { return lease_.out(); }
  uint64_t reported_spent() const {
    return lease_.reported_spent() + fallback_.reported_spent();
  }
  uint64_t reported_fallback_spent() const { return fallback_.reported_spent(); }

 private:
  uint64_t HeldBy(Source source, uint64_t held) const { return source_ == source ? held : 0; }

  TokenAccount lease_;
  TokenAccount fallback_;
  Source source_ = Source::kLease;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_TENANT_LEDGER_H_
