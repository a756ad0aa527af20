// The refresher's books for one tenant (the C++ client's tenant_ledger, and the same rule in
// every client): what went into the lease word and what came out, per source (server leases,
// local fallback bucket), turned into the cumulative counters a Sync reports. Single owner: the
// refresher.
//
// Workers never count what they spend: with `held` read from the word while this source owns
// it, `exact = in - out - held` is every take minus every refund, and it goes DOWN when a
// refund lands after a report. The reported counters must never go back, so a report splits it:
//
//     refunded = max(refunded, reportedSpent - exact)    (a spent token that came back)
//     reportedSpent = exact + refunded                   (both monotonic)
//
// and a refunded token withdrawn later counts as `out` like any other (returned to the server,
// for the lease source). The one exception: a token refunded into the word after its source
// was switched is not this source's; only `min(withdrawn, in - out - heldAfter)` count as out,
// the rest are absorbed (they stay spent in the other source's books: the safe direction).
// The wire counters:
//
//     tokensReceived = lease.in              tokensReturned = lease.out
//     retriesSpent = lease.reportedSpent + fallback.reportedSpent
//     retriesRefunded = lease.refunded + fallback.refunded
//     fallbackSpent = fallback.reportedSpent  fallbackRefunded = fallback.refunded
//
// so for every report: refunded <= spent per source, and
// (retriesSpent - fallbackSpent) - (retriesRefunded - fallbackRefunded) + tokensReturned
// = lease.in - held <= tokensReceived.

export const LEASE = 'lease';
export const FALLBACK = 'fallback';

function sub(a, b) {
  return a > b ? a - b : 0;
}

/** The books of one source of tokens. */
export class TokenAccount {
  constructor() {
    this.in = 0;
    this.out = 0;
    this.absorbed = 0; // withdrawn tokens of the other source (never counted as out)
    this.reportedSpent = 0;
    this.refunded = 0;
  }

  /** `withdrawn` tokens were taken out of the word; `heldAfter` is what it holds right after
   * (normally 0; more if a refund raced in). */
  withdrew(withdrawn, heldAfter) {
    const back = Math.min(withdrawn, sub(sub(this.in, this.out), heldAfter));
    this.out += back;
    this.absorbed += withdrawn - back;
  }

  /** Takes minus refunds while the word holds `held` of this source's tokens. Not monotonic. */
  exactSpent(held) {
    return sub(this.in, this.out + held);
  }

  /** The cumulative spent count to report (and its refunded part, this.refunded afterwards);
   * remembered as reported: neither ever goes back. */
  report(held) {
    const exact = this.exactSpent(held);
    this.refunded = Math.max(this.refunded, this.reportedSpent - exact);
    this.reportedSpent = exact + this.refunded;
    return this.reportedSpent;
  }
}

export class TenantLedger {
  constructor() {
    this.lease = new TokenAccount();
    this.fallback = new TokenAccount();
    this.source = LEASE;
  }

  heldBy(source, held) {
    return this.source === source ? held : 0;
  }

  /** `granted` tokens arrived; `deposited` of them went into the word (the rest was cut by
   * the word's cap and counts as returned at once). */
  received(granted, deposited) {
    this.lease.in += granted;
    if (deposited < granted) this.lease.out += granted - deposited;
  }

  fallbackDeposited(n) {
    this.fallback.in += n;
  }

  withdrew(withdrawn, heldAfter) {
    (this.source === LEASE ? this.lease : this.fallback).withdrew(withdrawn, heldAfter);
  }

  /** The word now holds (only) tokens of `source`. Call after emptying the word. */
  switchTo(source) {
    this.source = source;
  }

  /** Reports both sources while the word holds `held` tokens: the wire counters
   * {retriesSpent, retriesRefunded, fallbackSpent, fallbackRefunded, tokensReturned,
   * tokensReceived}. */
  report(held) {
    const leaseSpent = this.lease.report(this.heldBy(LEASE, held));
    const fallbackSpent = this.fallback.report(this.heldBy(FALLBACK, held));
    return {
      retriesSpent: leaseSpent + fallbackSpent,
      retriesRefunded: this.lease.refunded + this.fallback.refunded,
      fallbackSpent,
      fallbackRefunded: this.fallback.refunded,
      tokensReturned: this.lease.out,
      tokensReceived: this.lease.in,
    };
  }

  /** Retries really spent (takes minus refunds), for stats. Not monotonic. */
  exactSpent(held) {
    return this.lease.exactSpent(this.heldBy(LEASE, held)) + this.exactFallbackSpent(held);
  }

  exactFallbackSpent(held) {
    return this.fallback.exactSpent(this.heldBy(FALLBACK, held));
  }

  get tokensReceived() {
    return this.lease.in;
  }

  get tokensReturned() {
    return this.lease.out;
  }
}
