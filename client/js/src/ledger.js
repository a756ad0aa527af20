// The refresher's books for one tenant (a port of the C++ client's tenant_ledger): what went
// into the lease and what came out, per source (server leases, local fallback bucket), turned
// into the cumulative counters a Sync reports. Single owner: the refresher.
//
//     spent = in - out - held          (takes minus refunds)
//     tokensReceived = lease.in, tokensReturned = lease.out,
//     fallbackSpent = fallback.reportedSpent, retriesSpent = lease.reported + fallbackSpent
//
// A reported count never goes back: a refund after a report is absorbed (counted as spent).

export const LEASE = 'lease';
export const FALLBACK = 'fallback';

function sub(a, b) {
  return a > b ? a - b : 0;
}

class TokenAccount {
  constructor() {
    this.in = 0;
    this.out = 0;
    this.absorbed = 0;
    this.reportedSpent = 0;
  }

  withdrew(withdrawn, heldAfter) {
    const unaccounted = sub(sub(this.in, this.out), this.reportedSpent);
    const back = Math.min(withdrawn, sub(unaccounted, heldAfter));
    this.out += back;
    this.absorbed += withdrawn - back;
  }

  reportSpent(held) {
    this.reportedSpent = Math.max(this.reportedSpent, sub(this.in, this.out + held));
    return this.reportedSpent;
  }

  exactSpent(held) {
    return sub(this.in, this.out + this.absorbed + held);
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

  switchTo(source) {
    this.source = source;
  }

  reportSpent(held) {
    return this.lease.reportSpent(this.heldBy(LEASE, held)) + this.fallback.reportSpent(this.heldBy(FALLBACK, held));
  }

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

  get reportedFallbackSpent() {
    return this.fallback.reportedSpent;
  }
}
