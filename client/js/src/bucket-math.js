// The numbers behind a tenant's leases and its fallback bucket (a port of the C++ client's
// refresh_policy, demand_estimator, fallback_bucket and recent_extreme, as the Python client's
// _bucket_math). Times are seconds on the client's clock. Single-owner objects: the refresher
// is the only caller.

/** Largest `want` a request may carry (budget.proto: TenantSync.want). */
export const MAX_WANT = 1_000_000;
/** Most tokens a lease holds (the C++ lease word's 31-bit count). */
export const MAX_LEASE_TOKENS = 2 ** 31 - 1;
/** Longest lease a grant can give (ms): a longer lease_ttl_ms is read as this (the C++
 * client's kMaxLeaseTtlMs, the longest a policy allows). */
export const MAX_LEASE_TTL_MS = 600_000;
/** Fraction of the last grant at which the lease counts as low and the refresher is woken. */
export const LOW_WATER_FRACTION = 0.2;
/** First and largest wait before resending a Sync that failed (seconds). */
export const FIRST_RETRY_BACKOFF = 0.02;
export const MAX_RETRY_BACKOFF = 1.0;
/** A Sync is cut short for a fallback step due sooner than this (never for a lease expiry). */
export const MIN_FALLBACK_STEP_WINDOW = 0.02;
/** Attempts of the final Sync sent by close(), each bounded by syncTimeout. */
export const FINAL_SYNC_ATTEMPTS = 3;
/** A fallback bucket is the smallest SafeShare of this long before the server's last answer. */
export const SAFE_SHARE_MEMORY = 60.0;
/** Longest wait between two fallback steps of a bucket funded by success credit (seconds). */
export const CREDIT_STEP_INTERVAL = 0.05;
/** Decay time constant of the demand rate (seconds). */
export const DEMAND_TAU = 1.0;
/** Every counter and seq of the wire contract is at most 2^53. */
export const MAX_COUNTER = 2 ** 53;

export const INFINITE_FUTURE = Infinity;
export const INFINITE_PAST = -Infinity;

/** ceil(20%) of a grant: any grant of one token or more has a mark of at least 1. */
export function lowWaterMark(granted) {
  return Math.ceil(granted * LOW_WATER_FRACTION);
}

/** The server's hint, at most refreshPeriod and at least minSyncInterval (seconds). */
export function nextSyncDelay(nextSyncMs, policy) {
  if (!(nextSyncMs > 0)) return policy.refreshPeriod;
  return Math.max(policy.minSyncInterval, Math.min(nextSyncMs / 1000, policy.refreshPeriod));
}

/** 20 ms doubling up to 1 s after `failures` (>= 1) failed Syncs, never below minSyncInterval. */
export function retryBackoff(failures, policy) {
  let backoff = FIRST_RETRY_BACKOFF;
  for (let i = 1; i < failures && backoff < MAX_RETRY_BACKOFF; i++) backoff *= 2;
  return Math.max(policy.minSyncInterval, Math.min(backoff, MAX_RETRY_BACKOFF));
}

/** Exponentially decayed rate of retry demand (spent + denied) per second. */
export class DemandEstimator {
  constructor(start) {
    this.last = start;
    this.lastTotal = 0;
    this.rate = 0;
  }

  observe(now, cumulativeDemand) {
    const dt = Math.max(0, now - this.last);
    const delta = Math.max(0, cumulativeDemand - this.lastTotal);
    this.rate = this.rate * Math.exp(-dt / DEMAND_TAU) + delta / DEMAND_TAU;
    this.last = Math.max(this.last, now);
    this.lastTotal = Math.max(this.lastTotal, cumulativeDemand);
  }
}

/** Enough for `rate` per second over `period`, plus `burst`, minus what is `held`. */
export function wantFor(rate, period, burst, held) {
  const total = Math.ceil(Math.max(0, rate) * period) + burst;
  if (total <= held) return 0;
  return Math.min(MAX_WANT, total - held);
}

/** A bucket's shape: capacity (tokens), refill (tokens per second), successCredit and
 * requestCredit (tokens per success / per request recorded in fallback, not divided). */
export function smallerShape(a, b) {
  return {
    capacity: Math.min(a.capacity, b.capacity),
    refillPerSecond: Math.min(a.refillPerSecond, b.refillPerSecond),
    successCredit: Math.min(a.successCredit ?? 0, b.successCredit ?? 0),
    requestCredit: Math.min(a.requestCredit ?? 0, b.requestCredit ?? 0),
  };
}

/** The smallest shape noted within the last window: two aligned slots, exactly as the C++
 * RecentExtreme (covers [now - window, now], never anything 2 windows old). A NaN in a shape
 * stays NaN through min() and is sanitised to 0 by FallbackBucket. */
export class RecentSmallest {
  constructor(window = SAFE_SHARE_MEMORY) {
    this.window = window;
    this.start = INFINITE_PAST;
    this.current = null;
    this.previous = null;
  }

  roll(now) {
    const age = now - this.start;
    if (age < this.window) return;
    if (age < 2 * this.window) {
      this.previous = this.current;
      this.start += this.window;
    } else {
      this.previous = null;
      this.start = now;
    }
    this.current = null;
  }

  note(shape, now) {
    this.roll(now);
    this.current = this.current === null ? shape : smallerShape(this.current, shape);
  }

  get(now) {
    this.roll(now);
    if (this.previous === null) return this.current;
    if (this.current === null) return this.previous;
    return smallerShape(this.current, this.previous);
  }
}

const EPSILON = 1e-6;

function sanitize(value, most) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) return 0;
  return Math.min(value, most);
}

/** The local bucket of a tenant whose server is unreachable. Its whole tokens sit in the lease,
 * where workers take them without telling anyone; refill() is told what the lease holds and
 * returns how many whole tokens to add. Starts full at `capacity` (at least one token when it
 * refills at all), refills at `refillPerSecond`; tokens taken between two steps count as taken
 * just before the later one, so over a run: handed out <= cap + refill * elapsed
 * + successCredit * successes credited + requestCredit * requests credited.
 *
 * Locally funded fallback: refill() also takes the successes and the requests recorded since
 * the last step that may be credited here (only those no request carried yet: the server may
 * have credited any it saw; see LocalCredit). Each success deposits successCredit, then each
 * request requestCredit, up to the cap; one whose credit does not fit is not credited here and
 * stays the server's to credit. `lastCredited` / `lastRequestsCredited` say how many the last
 * refill() credited. */
export class FallbackBucket {
  constructor(shape, now, startFull = true) {
    this.shape = {
      capacity: sanitize(shape.capacity, MAX_LEASE_TOKENS),
      refillPerSecond: sanitize(shape.refillPerSecond, MAX_LEASE_TOKENS),
      successCredit: sanitize(shape.successCredit ?? 0, MAX_LEASE_TOKENS),
      requestCredit: sanitize(shape.requestCredit ?? 0, MAX_LEASE_TOKENS),
    };
    this.cap = this.shape.refillPerSecond > 0 ? Math.max(this.shape.capacity, 1) : this.shape.capacity;
    // Empty for a spent lease falling back early (its share of the burst went in the lease).
    this.level = startFull ? this.shape.capacity : 0;
    this.held = 0;
    this.lastCredited = 0;
    this.lastRequestsCredited = 0;
    this.last = now;
  }

  refill(now, held, successes = 0, requests = 0) {
    const dt = Math.max(0, now - this.last);
    this.last = Math.max(this.last, now);
    const grown = Math.max(this.level, Math.min(this.cap, this.level + this.shape.refillPerSecond * dt));
    let level = Math.max(grown - this.held + held, held);
    const fitSuccesses = this._fit(level, successes, this.shape.successCredit);
    level += fitSuccesses * this.shape.successCredit;
    const fitRequests = this._fit(level, requests, this.shape.requestCredit);
    level += fitRequests * this.shape.requestCredit;
    const whole = Math.floor(level + EPSILON);
    const add = whole > held ? whole - held : 0;
    this.level = level;
    this.held = held + add;
    this.lastCredited = fitSuccesses;
    this.lastRequestsCredited = fitRequests;
    return add;
  }

  /** How many of `count` deposits of `credit` each fit between `level` and the cap. */
  _fit(level, count, credit) {
    if (count <= 0 || credit <= 0 || level >= this.cap) return 0;
    return Math.min(count, Math.floor((this.cap - level) / credit + EPSILON));
  }

  full() {
    return this.shape.refillPerSecond > 0 && Math.floor(this.level + EPSILON) + 1 > this.cap + EPSILON;
  }

  /** The next step: the next whole token of refill or, while success or request credit can
   * still fit, at most CREDIT_STEP_INTERVAL away (both are only seen at steps). */
  nextTokenAt() {
    const credits = this.shape.successCredit > 0 || this.shape.requestCredit > 0;
    const creditStep = credits && this.level + EPSILON < this.cap ? this.last + CREDIT_STEP_INTERVAL : INFINITE_FUTURE;
    if (this.shape.refillPerSecond <= 0 || this.full()) return creditStep;
    const nextWhole = Math.floor(this.level + EPSILON) + 1;
    const micros = ((nextWhole - this.level) / this.shape.refillPerSecond) * 1e6;
    return Math.min(creditStep, this.last + Math.max(1, Math.ceil(micros - 1e-3)) / 1e6);
  }
}

/** One count that funds a fallback bucket locally (the successes, the requests), the rule of
 * locally funded fallback: an event is credited by the fallback bucket only when no request
 * built so far carried it (the server may credit every one a request carried), and at most
 * once (never again in a later step or episode). `credited` is what the buckets credited: the
 * *_credited_locally counter, at most the count. Single owner: the refresher. */
export class LocalCredit {
  constructor() {
    this.inRequests = 0; // the most any request built so far carried
    this.considered = 0; // the count up to which fallback steps considered crediting
    this.credited = 0;
  }

  /** Of `count` recorded so far, those no request carried and no step considered yet; marks
   * them considered. */
  creditable(count) {
    const start = Math.max(this.inRequests, this.considered);
    this.considered = Math.max(this.considered, count);
    return count > start ? count - start : 0;
  }

  /** A request built now carries `count`: the server may credit all of those. */
  carried(count) {
    this.inRequests = Math.max(this.inRequests, count);
  }
}
