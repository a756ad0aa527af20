// The refresher's books for one tenant: what went into the lease word and what came out, split
// by where the tokens came from (the server's leases or the local fallback bucket), turned into
// the cumulative counters a Sync reports.
#ifndef RETRYBUDGET_CLIENT_TENANT_LEDGER_H_
#define RETRYBUDGET_CLIENT_TENANT_LEDGER_H_

#include <algorithm>
#include <cstdint>

namespace retrybudget::client_internal {

// The books of one source of tokens. Workers never count what they spend: the refresher knows
// everything it put into the lease word (`in`) and took out of it (`out`), so with `held` read
// from the word while this source owns it,
//
//     exact = in - out - held
//
// counts every TryAcquire() that took a token minus every Refund() (a refund puts the token back
// into the word, so it is simply not spent): the retries really sent.
//
// A Sync carries cumulative counters that must never go backwards, but a Refund() that comes
// after a report lowers `exact`. So each report keeps two monotonic counters:
//
//     refunded       = max(refunded, reported_spent - exact)
//     reported_spent = exact + refunded
//
// and `reported_spent - refunded` is the exact count at that report: a token refunded after the
// Sync that reported it is reported as refunded (it was never sent). It is then either spent
// again (`exact` rises back, `refunded` stays: the pair stays exact) or withdrawn with the rest
// of the word (expiry, refusal, shutdown) and counted as out, so it goes back to the server's
// bucket as a returned token.
//
// A withdrawal counts as out only the tokens this source can have in the word:
//
//     back = min(withdrawn, max(0, in - out - held_after))
//
// The rest are tokens refunded into the word after a change of source (the other source's
// tokens): they are absorbed, staying spent in the other source's books (the safe direction:
// the server is never told of a return it did not grant). So at every report
//
//     (reported_spent - refunded) + out = in - held <= in,
//     refunded <= reported_spent,
//
// and all of `in`, `out`, `refunded` and `reported_spent` are monotonic.
//
// One case the books cannot tell apart: a token of the other source refunded while this
// source's own tokens are still in the word (a fallback token refunded after the tenant went
// back to a lease) reads as one of this source's tokens refunded. The lease books then report a
// lease refund, and the token goes back to the server with the lease's. The other source's
// books keep it spent, so the fleet's total is unchanged: one token moves from the fallback
// allowance to the server's bucket, at most one per such refund, never a token more in all.
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
  // Brings reported_spent() and refunded() up to date while the word holds `held` of this
  // source's tokens (neither ever goes down).
  void Report(uint64_t held);
  // Spent really (takes minus refunds, `in - out - held`), for Stats. Not monotonic.
  uint64_t ExactSpent(uint64_t held) const;

  uint64_t in() const { return in_; }
  uint64_t out() const { return out_; }
  uint64_t reported_spent() const { return reported_spent_; }
  uint64_t refunded() const { return refunded_; }
  // Withdrawn tokens that were not this source's (diagnostics and tests only).
  uint64_t absorbed() const { return absorbed_; }

 private:
  uint64_t in_ = 0;
  uint64_t out_ = 0;
  uint64_t absorbed_ = 0;
  uint64_t reported_spent_ = 0;
  uint64_t refunded_ = 0;
};

// What a worker changed in the lease word besides taking tokens, as the refresher reads it for
// a report: read `refunded` first, then `held`, then `extra` (TenantBudgetImpl::Snapshot), so a
// take or a refund racing with the read is at worst left out of this report, never counted
// ahead of the word.
struct WordSnapshot {
  uint64_t refunded = 0;  // tokens Refund() put back into the word, cumulative
  uint64_t held = 0;      // tokens in the word
  uint64_t extra = 0;     // of the takes of cost c > 1, the c - 1 above one token, cumulative
};

// Both sources of one tenant. At any time exactly one source owns the tokens in the lease word;
// the owner switches only after the word was emptied (TenantBudgetImpl withdraws first), so a
// token is attributed to the source that put it there. The wire counters are:
//
//     tokens_received   = lease.in          (granted by the server and received)
//     tokens_returned   = lease.out         (leased tokens given back: never fallback tokens)
//     fallback_spent    = fallback.reported_spent
//     fallback_refunded = fallback.refunded
//     retries_spent     = lease.reported_spent + fallback_spent
//     retries_refunded  = lease.refunded + fallback_refunded
//     retries_allowed   = min(takes, retries_spent), never lower than its last report
//
// where `takes`, the retries allowed with tokens whatever their cost, is what the word lost to
// workers, `put + refunded - withdrawn - held` (every token the refresher put in or took out
// passes through this ledger), less the `extra` tokens of the takes of cost above 1: the hot path
// counts nothing for a take of cost 1. Capped at retries_spent (the server checks
// retries_allowed <= retries_spent) because a take refunded before any report is left out of
// retries_spent.
//
// so every report keeps the server's constraints: retries_refunded <= retries_spent,
// fallback_refunded <= fallback_spent, fallback_refunded <= retries_refunded,
// `(retries_spent - fallback_spent) - (retries_refunded - fallback_refunded) + tokens_returned
// <= tokens_received`, and each counter is monotonic. Fallback tokens taken out of the word just
// vanish: the server never granted them. A Refund() that lands after a change of source is
// absorbed by the source that withdraws it (TokenAccount): the token stays spent in the books
// of the source it came from.
//
// Not thread-safe: the owner serialises calls (TenantBudgetImpl holds its mutex).
class TenantLedger {
 public:
  enum class Source { kLease, kFallback };

  // `granted` tokens arrived in a response; `deposited` of them went into the word (the rest was
  // cut by the word's cap and counts as returned at once). The source must be kLease.
  void Received(uint64_t granted, uint64_t deposited);

  // `n` tokens from the local fallback bucket went into the word. The source must be kFallback.
  void FallbackDeposited(uint64_t n) {
    fallback_.In(n);
    put_ += n;
  }

  // `withdrawn` tokens were taken out of the word (expiry, refusal, change of source, shutdown);
  // they are counted to the current source. `held_after` is what the word holds right after.
  void Withdrew(uint64_t withdrawn, uint64_t held_after);

  // The word now holds (only) tokens of `source`. Call after emptying the word.
  void SwitchTo(Source source) { source_ = source; }
  Source source() const { return source_; }

  // Brings every reported counter up to date while the word holds `held` tokens (of the current
  // source); read them with the accessors below. Call once per request built.
  void Report(uint64_t held);
  // Report(word.held), then brings reported_allowed() up to date.
  void Report(const WordSnapshot& word);
  // Report(held), then the cumulative `retries_spent`.
  uint64_t ReportSpent(uint64_t held) {
    Report(held);
    return reported_spent();
  }

  // Retries allowed with tokens so far (takes, whatever their cost; refunds not deducted).
  uint64_t Takes(const WordSnapshot& word) const;

  // Retries really spent (TryAcquire() minus Refund()), for Stats. Not monotonic.
  uint64_t ExactSpent(uint64_t held) const;
  // Of ExactSpent(), those from the fallback bucket.
  uint64_t ExactFallbackSpent(uint64_t held) const;

  uint64_t received() const { return lease_.in(); }
  uint64_t returned() const { return lease_.out(); }
  // The wire counters as of the last Report().
  uint64_t reported_spent() const {
    return lease_.reported_spent() + fallback_.reported_spent();
  }
  uint64_t reported_refunded() const { return lease_.refunded() + fallback_.refunded(); }
  uint64_t reported_fallback_spent() const { return fallback_.reported_spent(); }
  uint64_t reported_fallback_refunded() const { return fallback_.refunded(); }
  uint64_t reported_allowed() const { return reported_allowed_; }

 private:
  uint64_t HeldBy(Source source, uint64_t held) const { return source_ == source ? held : 0; }

  TokenAccount lease_;
  TokenAccount fallback_;
  Source source_ = Source::kLease;
  uint64_t put_ = 0;        // tokens put into the word, both sources
  uint64_t withdrawn_ = 0;  // tokens taken out of the word by the refresher, both sources
  uint64_t reported_allowed_ = 0;
};

// The books of success- or request-funded fallback for one kind of event (successes, or
// requests): a fallback bucket may credit only events that no request built so far carried (the
// server may have credited those), and each at most once; the count it credited is reported
// (TenantSync.successes_credited_locally / requests_credited_locally) so that the server credits
// only the others.
//
// Not thread-safe: the owner serialises calls.
class LocalCredit {
 public:
  // Of the `recorded` events so far (cumulative), those no fallback step has considered and no
  // request carried; marks them considered (credited or not, they are never offered again).
  uint64_t Creditable(uint64_t recorded) {
    const uint64_t from = std::max(in_requests_, considered_);
    considered_ = std::max(considered_, recorded);
    return recorded > from ? recorded - from : 0;
  }
  // `n` of those were credited by a fallback bucket.
  void Credited(uint64_t n) { credited_ += n; }
  // A request was built carrying `reported` events: the server may credit every one of them.
  void Carried(uint64_t reported) { in_requests_ = std::max(in_requests_, reported); }
  uint64_t credited() const { return credited_; }

 private:
  uint64_t in_requests_ = 0;  // the most events any request built so far carried
  uint64_t considered_ = 0;   // events up to which fallback steps considered crediting
  uint64_t credited_ = 0;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_TENANT_LEDGER_H_
