// One tenant's budget inside a client: the handle workers call, and the per-tenant half of the
// leasing protocol the refresher drives (a port of the C++ TenantBudgetImpl and Lease, as the
// Python client's tenant_budget.py). Node runs it on one thread: the hot path needs no lock,
// and the refresher's methods run between two of the workers' synchronous calls.

import * as ledgerMod from './ledger.js';
import {
  INFINITE_FUTURE, INFINITE_PAST, MAX_COUNTER, MAX_LEASE_TOKENS, MAX_LEASE_TTL_MS,
  DemandEstimator, FallbackBucket, LocalCredit, RecentSmallest, lowWaterMark, nextSyncDelay, wantFor,
} from './bucket-math.js';

const TENANT_RE = /^[A-Za-z0-9._:/-]{1,128}$/;

/** The largest cost of one retry (tryAcquire(cost), refund(cost)). */
export const MAX_COST = 1_000_000;
// budget.proto's Mode: TenantGrant.mode MODE_SHADOW makes a tenant shadow, any other value
// enforce.
const MODE_SHADOW = 2;

// Internal modes (the C++ LeaseMode).
const AWAITING = 0;
const LEASED = 1;
const EXPIRED = 2;
const REFUSED = 3;
const IN_FALLBACK = 4;
const IN_DENY_FALLBACK = 5;
const SHUTDOWN = 6;
// Their names, spelled alike in every client (client/conformance/README.md, `mode`).
const LEASE_MODE_NAMES = Object.freeze(['awaiting_lease', 'leased', 'expired', 'refused', 'fallback', 'deny_fallback', 'shutdown']);

/** Public modes (the `mode` label of the client metrics). */
export const NO_LEASE = 'no_lease';
export const LEASE = 'lease';
export const FALLBACK = 'fallback';
export const DENY_FALLBACK = 'deny_fallback';
export const MODES = Object.freeze([NO_LEASE, LEASE, FALLBACK, DENY_FALLBACK]);

function publicMode(mode) {
  if (mode === LEASED) return LEASE;
  if (mode === IN_FALLBACK) return FALLBACK;
  if (mode === IN_DENY_FALLBACK) return DENY_FALLBACK;
  return NO_LEASE;
}

/** What the refresher knows of the server from its last Sync attempt. */
export const ANSWERING = 'answering'; // no attempt yet, or the last one got a response
export const UNREACHABLE = 'unreachable'; // the last attempt failed: fall back
export const REFUSING = 'refusing'; // UNAUTHENTICATED / PERMISSION_DENIED: deny
// Unreachable for a refresh period (or the shard has no owner): a spent lease falls back at once.
export const DOWN = 'down';

export function checkTenantName(name) {
  if (typeof name !== 'string' || !TENANT_RE.test(name)) {
    throw new TypeError(`tenant ${JSON.stringify(name)} is malformed; expected 1-128 characters of [A-Za-z0-9._:/-]`);
  }
}

function badCost(cost) {
  const shown = typeof cost === 'string' ? JSON.stringify(cost) : String(cost);
  return new RangeError(`cost is ${shown}; expected an integer in [1, ${MAX_COST}]`);
}

function wholeCount(value) {
  // A uint64 from the wire (a Number, or a string / Long for values past 2^53): a whole,
  // non-negative count, anything unreadable as 0.
  const n = typeof value === 'number' ? value : Number(value);
  if (!Number.isFinite(n) || n <= 0) return 0;
  return Math.floor(n);
}

/** A tenant's budget as seen from this process. tryAcquire(), refund(), recordSuccess() and
 * recordRequest() are the hot path: synchronous, no allocation, no I/O, no clock read. The
 * other methods belong to the refresher. */
export class TenantBudget {
  constructor(tenant, waker, created, fallbackMode, neverReached) {
    this.tenant = tenant;
    this._waker = waker; // wakes the refresher (cheap, never blocks)
    this._fallbackMode = fallbackMode;
    this._neverReached = neverReached;
    // The lease word: tokens held, the low-water mark, closed; and the hot-path counters.
    this._held = 0;
    this._mark = 0;
    this._closed = true;
    this._successes = 0;
    this._requests = 0;
    this._allowed = 0; // retries allowed with tokens (a count, whatever their cost)
    this._denied = 0;
    this._shadowDenied = 0;
    // Tokens asked by denied and shadow-denied retries: with the tokens spent, the demand.
    this._deniedTokens = 0;
    this._refunds = 0; // refund() calls that gave tokens back
    this._syncWanted = false;
    // Shadow mode (TenantGrant.mode): a retry enforcement would deny is allowed without a token
    // and its cost added to `_unbacked`, which refunds pay back first.
    this._shadow = false;
    this._unbacked = 0;
    // Refresher side.
    this._mode = AWAITING;
    this._ledger = new ledgerMod.TenantLedger();
    this._demand = new DemandEstimator(created);
    this._expiry = INFINITE_PAST;
    this._nextDue = INFINITE_PAST;
    this._dryUntil = INFINITE_PAST;
    this._error = null;
    this._safeShares = new RecentSmallest();
    this._lastSafeShareAt = INFINITE_PAST;
    this._fallback = null;
    // Fallback episodes: {cap, refill, start, end (null while in it)}; see fallbackAllowance().
    this._episodes = [];
    // Locally funded fallback: successes (TenantSync.successes_credited_locally) and requests
    // (requests_credited_locally), one rule for both.
    this._successCredit = new LocalCredit();
    this._requestCredit = new LocalCredit();
    // ready() callers waiting for the first answer: {resolve, reject, signal, onAbort}.
    this._readyWaiters = [];
    this._requested = false; // put in a request yet (its first Sync is exempt from minSyncInterval)
  }

  // ---- worker side (hot path) ----

  /** Asks for one retry of `cost` tokens (an integer in [1, MAX_COST]; default 1): true when
   * they were taken (send the retry), false when not as many are available (fail the call
   * now); all or nothing, never a part. On false, or when the lease runs low, it wakes the
   * refresher so a grant arrives within one round trip. In shadow mode, a retry that would be
   * denied is allowed without a token and counted as a would-be denial. Throws RangeError for a
   * bad cost (nothing counted). */
  tryAcquire(cost = 1) {
    if (cost !== 1 && !(Number.isInteger(cost) && cost >= 1 && cost <= MAX_COST)) throw badCost(cost);
    const held = this._held;
    if (this._closed || held < cost) {
      this._deniedTokens += cost;
      if (!this._syncWanted) this._requestSync();
      if (this._shadow) {
        this._shadowDenied++;
        this._unbacked += cost;
        return true;
      }
      this._denied++;
      return false;
    }
    this._held = held - cost;
    this._allowed++;
    // Crossing the low-water mark (reaching it, for a cost of 1).
    if (held > this._mark && held - cost <= this._mark && !this._syncWanted) this._requestSync();
    return true;
  }

  /** Gives back `cost` tokens (default 1) taken by tryAcquire(cost) for a retry that was never
   * sent (e.g. aborted during its backoff): exactly as `cost` refunds of one token. At most once
   * per successful tryAcquire(), with its cost. While at least `cost` tokens of retries shadow
   * mode allowed without a token are out, it pays those back first and gives nothing back.
   * Throws RangeError for a bad cost (nothing changed). */
  refund(cost = 1) {
    if (cost !== 1 && !(Number.isInteger(cost) && cost >= 1 && cost <= MAX_COST)) throw badCost(cost);
    if (this._unbacked >= cost) {
      this._unbacked -= cost;
      return;
    }
    this._held += cost;
    this._refunds++;
  }

  /** Records one successful logical call; it earns the budget `success_credit`. */
  recordSuccess() {
    this._successes++;
  }

  /** Records one request (a logical call's first attempt); it deposits a windowed policy's
   * `retry_ratio`. The retry helpers call it once per call. */
  recordRequest() {
    this._requests++;
  }

  _requestSync() {
    // The first worker to find the lease low or empty since the last applied response wakes
    // the refresher; later ones see the flag set.
    this._syncWanted = true;
    this._waker();
  }

  /** True once the tenant's first Sync was answered (a lease, or a refusal), or the server
   * could not be reached and the configured fallback applies, or the client closed. Until
   * then tryAcquire() denies because nothing was asked yet, not because the budget is dry. */
  get isReady() {
    return this._mode !== AWAITING;
  }

  /** Resolves with the mode (see `mode`) once isReady is true: at once when it already is,
   * else when the first Sync (sent when the handle was created) is answered or fails. Rejects
   * with signal.reason when `signal` aborts first. Never takes a token. */
  ready(signal = null) {
    if (this._mode !== AWAITING) return Promise.resolve(publicMode(this._mode));
    if (signal !== null && signal !== undefined) {
      if (typeof signal !== 'object' || typeof signal.aborted !== 'boolean') {
        return Promise.reject(new TypeError(`signal is ${String(signal)}; expected an AbortSignal`));
      }
      if (signal.aborted) return Promise.reject(signal.reason);
    }
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject, signal: signal ?? null, onAbort: null };
      if (waiter.signal !== null) {
        waiter.onAbort = () => {
          const i = this._readyWaiters.indexOf(waiter);
          if (i >= 0) this._readyWaiters.splice(i, 1);
          reject(waiter.signal.reason);
        };
        waiter.signal.addEventListener('abort', waiter.onAbort, { once: true });
      }
      this._readyWaiters.push(waiter);
    });
  }

  _settleReady() {
    if (this._readyWaiters.length === 0 || this._mode === AWAITING) return;
    const waiters = this._readyWaiters;
    this._readyWaiters = [];
    const mode = publicMode(this._mode);
    for (const w of waiters) {
      if (w.signal !== null) w.signal.removeEventListener('abort', w.onAbort);
      w.resolve(mode);
    }
  }

  /** The public mode right now: 'no_lease', 'lease', 'fallback' or 'deny_fallback'. */
  get mode() {
    return publicMode(this._mode);
  }

  /** The internal lease mode ('awaiting_lease', 'leased', 'expired', 'refused', 'fallback',
   * 'deny_fallback' or 'shutdown'): finer than `mode`, for tests and the conformance corpus. */
  get leaseMode() {
    return LEASE_MODE_NAMES[this._mode];
  }

  /** True while the tenant is in shadow mode (its last answer said MODE_SHADOW). */
  get shadow() {
    return this._shadow;
  }

  /** A snapshot of this process's counters for the tenant (allocates; not a hot-path call). */
  stats() {
    const held = this._held;
    return {
      successes: this._successes,
      requests: this._requests,
      retriesAllowed: Math.max(0, this._allowed - this._refunds),
      tokensSpent: this._ledger.exactSpent(held),
      retriesDenied: this._denied,
      shadowDenied: this._shadowDenied,
      unbacked: this._unbacked,
      fallbackAllowed: this._ledger.exactFallbackSpent(held),
      tokensReceived: this._ledger.tokensReceived,
      tokensReturned: this._ledger.tokensReturned,
      tokensHeld: held,
      refunds: this._refunds,
      successesCreditedLocally: this._successCredit.credited,
      requestsCreditedLocally: this._requestCredit.credited,
      leaseActive: this._mode === LEASED && !this._closed,
      mode: publicMode(this._mode),
      shadow: this._shadow,
      error: this._error,
    };
  }

  /** What this tenant's fallback buckets may have handed out up to `now` (client clock
   * seconds): the sum over its fallback episodes of capacity (at least 1 when refilling) +
   * refill * seconds in fallback. For fleet checks. */
  fallbackAllowance(now) {
    let total = 0;
    for (const e of this._episodes) total += e.cap + e.refill * ((e.end === null ? now : e.end) - e.start);
    return total;
  }

  // ---- the lease word, refresher side ----

  _deposit(tokens, mark) {
    const added = this._held >= MAX_LEASE_TOKENS ? 0 : Math.min(tokens, MAX_LEASE_TOKENS - this._held);
    this._held += added;
    this._mark = mark;
    this._closed = false;
    return added;
  }

  _replace(tokens, mark) {
    const old = this._held;
    this._held = Math.min(tokens, MAX_LEASE_TOKENS);
    this._mark = mark;
    this._closed = false;
    return old;
  }

  _withdrawAndClose() {
    const old = this._held;
    this._held = 0;
    this._mark = 0;
    this._closed = true;
    return old;
  }

  // ---- refresher side ----

  syncDueAt() {
    if (this._mode === SHUTDOWN) return INFINITE_FUTURE;
    if (this._syncWanted) return Math.min(this._nextDue, this._dryUntil);
    return this._nextDue;
  }

  leaseEndsAt() {
    return this._mode === LEASED ? this._expiry : INFINITE_FUTURE;
  }

  _endEpisode(now) {
    const last = this._episodes[this._episodes.length - 1];
    if (last !== undefined && last.end === null) last.end = now;
  }

  _withdrawAll(now) {
    const withdrawn = this._withdrawAndClose();
    this._ledger.withdrew(withdrawn, this._held);
    this._ledger.switchTo(ledgerMod.LEASE);
    if (this._fallback !== null) this._endEpisode(now);
    this._fallback = null;
  }

  _fallbackMark() {
    // A full bucket asks to hear of the very first take (mark = held - 1, and the wake flag
    // cleared) so its refill restarts at once; otherwise an empty word wakes the refresher.
    const fb = this._fallback;
    if (!fb.full() || fb.held === 0) return 0;
    this._syncWanted = false;
    return fb.held - 1;
  }

  _enterFallback(now, startFull = true) {
    if (this._fallbackMode === 'deny') {
      this._withdrawAll(now);
      this._mode = IN_DENY_FALLBACK;
      this._settleReady();
      return;
    }
    const share = this._lastSafeShareAt === INFINITE_PAST ? null : this._safeShares.get(this._lastSafeShareAt);
    this._fallback = new FallbackBucket(share ?? this._neverReached, now, startFull);
    this._episodes.push({ cap: this._fallback.cap, refill: this._fallback.shape.refillPerSecond, start: now, end: null });
    const first = this._refillBucket(now, 0);
    const withdrawn = this._replace(first, this._fallbackMark());
    this._ledger.withdrew(withdrawn, 0);
    this._ledger.switchTo(ledgerMod.FALLBACK);
    this._ledger.fallbackDeposited(Math.min(first, MAX_LEASE_TOKENS));
    this._mode = IN_FALLBACK;
    this._settleReady();
  }

  /** Refills the fallback bucket while the word holds `held`, with the successes and requests
   * it may credit (LocalCredit); the whole tokens to add. */
  _refillBucket(now, held) {
    const fb = this._fallback;
    const add = fb.refill(now, held, this._successCredit.creditable(this._successes), this._requestCredit.creditable(this._requests));
    this._successCredit.credited += fb.lastCredited;
    this._requestCredit.credited += fb.lastRequestsCredited;
    return add;
  }

  _refillFallback(now) {
    const add = this._refillBucket(now, this._held);
    this._ledger.fallbackDeposited(this._deposit(add, this._fallbackMark()));
    return this._fallback.nextTokenAt();
  }

  /** One refresher step at `now`: ends a lease at its expiry, enters / refills / leaves
   * fallback. Returns when this tenant next needs a step. */
  step(now, server) {
    const unreachable = server === UNREACHABLE || server === DOWN;
    if (this._mode === LEASED) {
      if (now < this._expiry) {
        if (server !== DOWN || this._held > 0) return this._expiry;
        // The lease is spent and the server has been down a while: fall back now rather than
        // deny until the lease's expiry (a blip is not "down"), into an EMPTY bucket: the share
        // of the burst went in the lease (a slow server is "down" too).
        this._enterFallback(now, false);
        return this._mode === IN_FALLBACK ? this._refillFallback(now) : INFINITE_FUTURE;
      }
      if (unreachable) {
        this._enterFallback(now);
        return this._mode === IN_FALLBACK ? this._refillFallback(now) : INFINITE_FUTURE;
      }
      // The lease ends at send time + TTL: every unspent token goes back.
      this._withdrawAll(now);
      this._mode = EXPIRED;
      return INFINITE_FUTURE;
    }
    if (this._mode === IN_FALLBACK) {
      if (server !== REFUSING) return this._refillFallback(now);
      this._withdrawAll(now);
      this._mode = EXPIRED;
      return INFINITE_FUTURE;
    }
    if (this._mode === IN_DENY_FALLBACK && server === REFUSING) this._mode = EXPIRED;
    if ((this._mode === AWAITING || this._mode === EXPIRED) && unreachable) {
      this._enterFallback(now);
      return this._mode === IN_FALLBACK ? this._refillFallback(now) : INFINITE_FUTURE;
    }
    // A closed word: tokens can only be there from a refund after a withdrawal.
    if (this._held > 0) {
      const withdrawn = this._withdrawAndClose();
      this._ledger.withdrew(withdrawn, this._held);
    }
    return INFINITE_FUTURE;
  }

  _counters(held) {
    const successes = this._successes;
    const requests = this._requests;
    const r = this._ledger.report(held);
    const entry = {
      tenant: this.tenant,
      successes,
      retriesSpent: r.retriesSpent,
      retriesDenied: this._denied,
      tokensReturned: r.tokensReturned,
      tokensReceived: r.tokensReceived,
      want: 0,
      fallbackSpent: r.fallbackSpent,
      successesCreditedLocally: this._successCredit.credited,
      retriesRefunded: r.retriesRefunded,
      fallbackRefunded: r.fallbackRefunded,
      requests,
      requestsCreditedLocally: this._requestCredit.credited,
      shadowDenied: this._shadowDenied,
      // At most retries_spent (budget.proto): a retry refunded before any report leaves no
      // trace in retries_spent but was counted here. The smaller of two counters that never go
      // down never goes down.
      retriesAllowed: Math.min(this._allowed, r.retriesSpent),
    };
    // From now on the server may credit every success and request this request carries.
    this._successCredit.carried(successes);
    this._requestCredit.carried(requests);
    return entry;
  }

  /** False until the tenant was first put in a request. */
  get everRequested() {
    return this._requested;
  }

  /** The TenantSync entry of a NEW request built at `now`. */
  fillSync(now, policy) {
    this._requested = true;
    const held = this._held;
    const entry = this._counters(held);
    // Demand in tokens: those spent, and those denied (or shadow-denied) retries asked for.
    this._demand.observe(now, entry.retriesSpent + this._deniedTokens);
    const leased = this._ledger.source === ledgerMod.LEASE ? held : 0;
    entry.want = wantFor(this._demand.rate, policy.refreshPeriod, policy.leaseBurst, leased);
    return entry;
  }

  /** Applies a grant answering a request first sent at `sent`: the lease (every token held)
   * now ends at `sent` + lease_ttl_ms. */
  applyGrant(grant, sentEntry, sent, received, policy) {
    if (this._mode === SHUTDOWN) return;
    // Cleared before the tokens land: a worker that runs dry after this wakes the refresher
    // again; one that ran dry before is served by this grant.
    this._syncWanted = false;
    // The lease holds at most MAX_LEASE_TOKENS: the rest of a hostile grant is counted as
    // received and returned at once (grant-clamped), as the C++ client's ledger does. A grant
    // beyond 2^53 (no Number holds it exactly; the wire contract keeps counters below it) is
    // read as 2^53.
    const granted = Math.min(wholeCount(grant.granted), MAX_COUNTER);
    const deposit = Math.min(granted, MAX_LEASE_TOKENS);
    const mark = Math.min(lowWaterMark(granted), MAX_LEASE_TOKENS);
    let deposited;
    if (this._ledger.source === ledgerMod.FALLBACK) {
      // Back from fallback: swap the fallback tokens for the leased ones at once.
      deposited = deposit;
      const withdrawn = this._replace(deposit, mark);
      this._ledger.withdrew(withdrawn, 0);
      this._ledger.switchTo(ledgerMod.LEASE);
      this._endEpisode(received);
      this._fallback = null;
    } else {
      deposited = this._deposit(deposit, mark);
    }
    this._ledger.received(granted, deposited);
    const share = grant.safeShare;
    if (share !== null && share !== undefined && typeof share === 'object') {
      this._safeShares.note({
        capacity: Number(share.capacity), refillPerSecond: Number(share.refillPerSecond),
        successCredit: Number(share.successCredit ?? 0), requestCredit: Number(share.requestCredit ?? 0),
      }, received);
      this._lastSafeShareAt = received;
    }
    // A TTL <= 0 (or unreadable) ends the lease at once: the safe reading of a missing value;
    // one above the longest a policy allows is read as that (a lease is never for ever).
    const ttl = Number(grant.leaseTtlMs);
    this._expiry = sent + (Number.isFinite(ttl) && ttl > 0 ? Math.min(ttl, MAX_LEASE_TTL_MS) : 0) / 1000;
    this._mode = LEASED;
    this._shadow = Number(grant.mode) === MODE_SHADOW;
    this._error = null;
    this._settleReady();
    const nextMs = Number(grant.nextSyncMs);
    const delay = nextSyncDelay(Number.isFinite(nextMs) ? nextMs : 0, policy);
    this._nextDue = received + delay;
    // Granted less than asked: the bucket is dry; next_sync_ms is then the server's retry-after.
    this._dryUntil = granted < sentEntry.want ? received + delay : INFINITE_PAST;
  }

  applyRefusal(codeName, message, received, policy) {
    if (this._mode === SHUTDOWN) return;
    this._syncWanted = false;
    if (this._mode === LEASED || this._mode === IN_FALLBACK || this._held > 0) this._withdrawAll(received);
    this._mode = REFUSED;
    this._error = `${codeName}: budget server refused tenant "${this.tenant}": ${message}`;
    this._settleReady();
    this._nextDue = received + policy.refreshPeriod;
    this._dryUntil = this._nextDue;
  }

  /** The server did not apply this tenant's entry (it named another owner, or none can grant
   * now): the lease stays as it is; the next sync is due at `due`. */
  syncAgainAt(due) {
    if (this._mode === SHUTDOWN) return;
    this._nextDue = due;
    this._dryUntil = due;
  }

  /** Shuts the tenant down for good: withdraws every token; the final counters (want 0). */
  fillFinal(now) {
    this._mode = SHUTDOWN;
    this._withdrawAll(now);
    this._settleReady();
    return this._counters(this._held);
  }
}
