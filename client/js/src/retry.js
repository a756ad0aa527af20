// callWithRetry: runs an operation and retries it so that callers never write the loop
// themselves, as the C++ retrybudget::Retry (client/cpp/retry.cc) and the Python call_with_retry.
//
//     const row = await callWithRetry(budget, (attempt, signal) => db.get(key, { signal }),
//                                     { signal: request.signal, timeoutMs: 2000 });
//
// What one logical call does:
//  * budget.recordRequest() once, as the first attempt is sent (a windowed policy's deposit).
//  * The first attempt is always sent (unless already aborted or past the deadline); the budget
//    decides every RETRY: one budget.tryAcquire(cost) per retry, `cost` from options.cost (a
//    number, or a function of the failed attempt's error; default 1).
//  * Every attempt gets the same idempotency key and an AbortSignal that fires when the call's
//    signal aborts, the overall deadline passes or the attempt's own timeout does.
//  * After a failed attempt, in this order: aborted? (reject with signal.reason) -> retryable?
//    -> attempts left? -> backoff (the server's pushback, or full jitter) -> would the backoff
//    end at or after the deadline? (RetryDeadlineExceededError now, no token taken) -> the
//    tenant's first answer, when it has none yet (budget.ready(): the first Sync went out when
//    the handle was created; the wait is part of the backoff, bounded by the deadline and
//    ended by the signal like the sleep) -> tryAcquire(cost) (denied: BudgetExhaustedError, the
//    last error as `cause`) -> the rest of the backoff, a sleep which rejects at once on abort
//    with signal.reason, clears its timer and refund(cost)s the tokens -> next attempt.
//  * A call that succeeds, at any attempt, calls recordSuccess() exactly once.
//  * A BudgetExhaustedError thrown by an attempt (an inner retry layer's budget said no) is never
//    retried: stacked retry layers must not multiply.
// Nothing is kept between calls; nothing is left running when the returned promise settles.

import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { Status } from './codes.js';
import { MAX_COST } from './tenant-budget.js';

export const IDEMPOTENCY_KEY_HEADER = 'x-idempotency-key';
export const PREVIOUS_ATTEMPTS_HEADER = 'grpc-previous-rpc-attempts';
export const RETRY_PUSHBACK_HEADER = 'grpc-retry-pushback-ms';

export const RETRYABLE_GRPC_CODES = Object.freeze([Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.ABORTED, Status.DEADLINE_EXCEEDED]);
const RETRYABLE_NET_CODES = new Set(['ECONNRESET', 'ECONNREFUSED', 'ETIMEDOUT', 'EPIPE', 'EAI_AGAIN', 'ENETUNREACH', 'EHOSTUNREACH', 'UND_ERR_SOCKET', 'UND_ERR_CONNECT_TIMEOUT']);

/** The retry budget denied a retry. `cause` is the last attempt's error. */
export class BudgetExhaustedError extends Error {
  constructor(lastError, attempts) {
    super(`retry budget exhausted after ${attempts} attempt(s); last error: ${lastError?.message ?? String(lastError)}`, { cause: lastError });
    this.name = 'BudgetExhaustedError';
    this.attempts = attempts;
  }
}

/** The overall deadline passed, or a backoff would have crossed it. `cause` is the last
 * attempt's error (undefined if no attempt ran). */
export class RetryDeadlineExceededError extends Error {
  constructor(message, lastError) {
    super(message, lastError === undefined ? undefined : { cause: lastError });
    this.name = 'RetryDeadlineExceededError';
  }
}

export function newIdempotencyKey() {
  return randomBytes(16).toString('hex');
}

function isGrpcError(error) {
  return error !== null && typeof error === 'object' && typeof error.code === 'number' && 'details' in error;
}

/** gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED; connection errors
 * (ECONNRESET, ECONNREFUSED, ETIMEDOUT, ...) and an attempt's own timeout (TimeoutError). */
export function defaultIsRetryable(error) {
  if (error instanceof BudgetExhaustedError) return false;
  if (isGrpcError(error)) return RETRYABLE_GRPC_CODES.includes(error.code);
  if (error !== null && typeof error === 'object') {
    if (typeof error.code === 'string' && RETRYABLE_NET_CODES.has(error.code)) return true;
    if (error.name === 'TimeoutError') return true;
  }
  return false;
}

/** The server's pushback in a grpc-js Metadata (trailers): null when absent; its value in ms
 * when a non-negative integer; -1 ("do not retry") when negative or unparsable (gRFC A6). */
export function parseRetryPushback(metadata) {
  if (metadata === null || typeof metadata !== 'object' || typeof metadata.get !== 'function') return null;
  const values = metadata.get(RETRY_PUSHBACK_HEADER);
  if (values.length === 0) return null;
  const text = String(values[0]);
  if (!/^[0-9]{1,15}$/.test(text)) return -1;
  return Number(text);
}

function show(value) {
  return typeof value === 'string' ? JSON.stringify(value) : String(value);
}

function isCost(cost) {
  return Number.isInteger(cost) && cost >= 1 && cost <= MAX_COST;
}

/** The tokens a retry after `error` costs under `policy` (its cost: a number, or a function of
 * the error); throws RangeError naming options.cost and the value when it is not an integer in
 * [1, MAX_COST] (a function that throws: its error). */
export function retryCost(policy, error) {
  if (typeof policy.cost === 'number') return policy.cost;
  const cost = policy.cost(error);
  if (!isCost(cost)) throw new RangeError(`options.cost returned ${show(cost)} for ${error?.message ?? show(error)}; expected an integer in [1, ${MAX_COST}]`);
  return cost;
}

/** A validated retry policy (milliseconds); throws TypeError / RangeError naming the option. */
export function retryPolicy(o = {}) {
  const p = {
    maxAttempts: o.maxAttempts ?? 4,
    initialBackoffMs: o.initialBackoffMs ?? 50,
    maxBackoffMs: o.maxBackoffMs ?? 5000,
    multiplier: o.multiplier ?? 2,
    perAttemptTimeoutMs: o.perAttemptTimeoutMs ?? null,
    isRetryable: o.isRetryable ?? defaultIsRetryable,
    cost: o.cost ?? 1,
  };
  const num = (name) => {
    if (typeof p[name] !== 'number' || Number.isNaN(p[name])) throw new TypeError(`options.${name} is ${show(p[name])}; expected a number`);
  };
  num('maxAttempts');
  if (!Number.isInteger(p.maxAttempts) || p.maxAttempts < 1) throw new RangeError(`options.maxAttempts is ${show(p.maxAttempts)}; it must be an integer >= 1`);
  num('initialBackoffMs');
  if (!(p.initialBackoffMs >= 0) || !Number.isFinite(p.initialBackoffMs)) throw new RangeError(`options.initialBackoffMs is ${show(p.initialBackoffMs)}; it must be finite and >= 0`);
  num('maxBackoffMs');
  if (!(p.maxBackoffMs >= p.initialBackoffMs) || !Number.isFinite(p.maxBackoffMs)) throw new RangeError(`options.maxBackoffMs is ${show(p.maxBackoffMs)}; it must be finite and >= initialBackoffMs (${p.initialBackoffMs})`);
  num('multiplier');
  if (!(p.multiplier >= 1) || !Number.isFinite(p.multiplier)) throw new RangeError(`options.multiplier is ${show(p.multiplier)}; it must be finite and >= 1`);
  if (p.perAttemptTimeoutMs !== null) {
    num('perAttemptTimeoutMs');
    if (!(p.perAttemptTimeoutMs > 0)) throw new RangeError(`options.perAttemptTimeoutMs is ${show(p.perAttemptTimeoutMs)}; it must be > 0`);
  }
  if (typeof p.isRetryable !== 'function') throw new TypeError(`options.isRetryable is ${show(p.isRetryable)}; expected a function`);
  if (typeof p.cost === 'number') {
    if (!isCost(p.cost)) throw new RangeError(`options.cost is ${show(p.cost)}; expected an integer in [1, ${MAX_COST}] or a function (error) => cost`);
  } else if (typeof p.cost !== 'function') {
    throw new TypeError(`options.cost is ${show(p.cost)}; expected an integer in [1, ${MAX_COST}] or a function (error) => cost`);
  }
  return p;
}

/** Full-jitter backoff before retry `retry` (1 = the first retry) for `random` in [0, 1):
 * uniform in [0, min(maxBackoffMs, initialBackoffMs * multiplier^(retry-1))). */
export function computeBackoff(policy, retry, random) {
  const ceiling = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * policy.multiplier ** Math.max(0, retry - 1));
  const r = random > 0 ? Math.min(random, 0.9999999999999999) : 0; // NaN too
  return ceiling * r;
}

/** The decisions of one logical call, shared by callWithRetry and the grpc-js interceptor. */
export class RetryLoop {
  constructor(budget, o = {}) {
    if (budget === null || typeof budget !== 'object' || typeof budget.tryAcquire !== 'function') {
      throw new TypeError(`budget is ${show(budget)}; expected a TenantBudget`);
    }
    this.policy = retryPolicy(o);
    this.budget = budget;
    this.clock = o.clock ?? (() => performance.now());
    this.random = o.random ?? Math.random;
    let deadline = o.deadline ?? null;
    if (o.timeoutMs !== undefined && o.timeoutMs !== null) {
      if (typeof o.timeoutMs !== 'number' || !(o.timeoutMs >= 0)) throw new RangeError(`options.timeoutMs is ${show(o.timeoutMs)}; it must be a number >= 0`);
      const t = this.clock() + o.timeoutMs;
      deadline = deadline === null ? t : Math.min(deadline, t);
    }
    if (deadline !== null && typeof deadline !== 'number') throw new TypeError(`options.deadline is ${show(deadline)}; expected milliseconds on options.clock`);
    this.deadline = deadline ?? Infinity;
    const key = o.idempotencyKey ?? '';
    if (typeof key !== 'string') throw new TypeError(`options.idempotencyKey is ${show(key)}; expected a string`);
    this.key = key === '' ? newIdempotencyKey() : key;
    this.number = 0;
    this.lastError = undefined;
    this.heldCost = 0; // tokens taken for the retry about to start; 0 once it is sent
  }

  /** Records the call's request (its first attempt) with the budget: once per call. */
  recordRequest() {
    if (typeof this.budget.recordRequest === 'function') this.budget.recordRequest();
  }

  /** The next attempt's description, or throws RetryDeadlineExceededError. */
  nextAttempt() {
    const now = this.clock();
    if (now >= this.deadline) {
      throw new RetryDeadlineExceededError(`retry: overall deadline passed before attempt ${this.number + 1}`, this.lastError);
    }
    this.number++;
    let attemptDeadline = this.deadline;
    if (this.policy.perAttemptTimeoutMs !== null) attemptDeadline = Math.min(attemptDeadline, now + this.policy.perAttemptTimeoutMs);
    return {
      number: this.number,
      previousAttempts: this.number - 1,
      idempotencyKey: this.key,
      deadline: this.deadline,
      attemptDeadline,
      pushbackMs: null,
    };
  }

  /** After attempt `attempt` failed with `error` (retryable per `retryable`): throws what ends
   * the call (the error itself, RetryDeadlineExceededError), or returns the backoff (ms)
   * before the next attempt. Takes no token: acquire() does, after firstAnswer(). */
  afterFailure(attempt, error, retryable) {
    this.lastError = error;
    if (error instanceof BudgetExhaustedError || !retryable) throw error;
    const now = this.clock();
    // An attempt's own timeout is worth retrying; the overall deadline running out is not.
    if (isGrpcError(error) && error.code === Status.DEADLINE_EXCEEDED && now >= this.deadline) throw error;
    const pushback = attempt.pushbackMs;
    if (pushback !== null && pushback !== undefined && !(pushback >= 0)) throw error;
    if (this.number >= this.policy.maxAttempts) throw error;
    const backoff = pushback !== null && pushback !== undefined ? pushback : computeBackoff(this.policy, this.number, this.random());
    if (now + backoff >= this.deadline) {
      throw new RetryDeadlineExceededError(`retry: a backoff of ${backoff.toFixed(1)} ms after attempt ${this.number} would end at or after the overall deadline (${(this.deadline - now).toFixed(1)} ms left)`, error);
    }
    return backoff;
  }

  /** False while the budget has not had its first answer (a TenantBudget's isReady; any
   * other object with tryAcquire() is always ready). */
  budgetReady() {
    return this.budget.isReady !== false || typeof this.budget.ready !== 'function';
  }

  /** Waits for the budget's first answer: resolves with the milliseconds waited (0 when it
   * already had one); rejects with signal.reason on abort, or RetryDeadlineExceededError when
   * the deadline comes first. */
  async firstAnswer(signal) {
    if (this.budgetReady()) return 0;
    const start = this.clock();
    if (!(await waitFirstAnswer(this.budget, signal, this.deadline - start))) {
      throw new RetryDeadlineExceededError(`retry: the overall deadline passed while waiting for the budget's first answer after attempt ${this.number}`, this.lastError);
    }
    return Math.max(0, this.clock() - start);
  }

  /** Takes the tokens for the next retry (options.cost of the last error), or throws
   * BudgetExhaustedError (the last error as its cause), or RangeError for a bad cost. */
  acquire() {
    const cost = retryCost(this.policy, this.lastError);
    if (!this.budget.tryAcquire(cost)) throw new BudgetExhaustedError(this.lastError, this.number);
    this.heldCost = cost;
  }

  /** The retry about to start is sent: its tokens are spent. */
  sent() {
    this.heldCost = 0;
  }

  /** The retry about to start is never sent: its tokens go back (no-op when none are held). */
  refund() {
    if (this.heldCost > 0) this.budget.refund(this.heldCost);
    this.heldCost = 0;
  }
}

/** Waits up to `ms` (Infinity: no bound) for `budget`'s first answer (budget.ready()):
 * resolves true when it came (or the budget has no ready()), false when the time ran out;
 * rejects with signal.reason when `signal` aborts first. Takes no token. */
export async function waitFirstAnswer(budget, signal, ms) {
  if (budget.isReady !== false || typeof budget.ready !== 'function') return true;
  if (signal?.aborted) throw signal.reason;
  const bounded = new AbortController();
  const onAbort = () => bounded.abort(signal.reason);
  const timedOut = {};
  let timer = null;
  signal?.addEventListener('abort', onAbort, { once: true });
  if (Number.isFinite(ms)) timer = setTimeout(() => bounded.abort(timedOut), Math.max(0, ms));
  try {
    await budget.ready(bounded.signal);
    return true;
  } catch (reason) {
    if (reason === timedOut) return false;
    throw reason;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}

/** Resolves after `ms`, or rejects with signal.reason as soon as `signal` aborts (the timer is
 * cleared and the listener removed either way). */
export function abortableSleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    let timer = null;
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A signal aborted by `parent`, or with a TimeoutError `ms` from now; dispose() clears the
 * timer and the listener. */
function attemptSignal(parent, ms) {
  const controller = new AbortController();
  let timer = null;
  const onAbort = () => controller.abort(parent.reason);
  if (parent !== null) {
    if (parent.aborted) controller.abort(parent.reason);
    else parent.addEventListener('abort', onAbort, { once: true });
  }
  if (Number.isFinite(ms)) {
    timer = setTimeout(() => controller.abort(new DOMException('retry: the attempt timed out', 'TimeoutError')), Math.max(0, ms));
  }
  return {
    signal: controller.signal,
    dispose() {
      clearTimeout(timer);
      if (parent !== null) parent.removeEventListener('abort', onAbort);
    },
  };
}

/**
 * Runs fn(attempt, signal) and retries it as described at the top of this module. Resolves to
 * fn's first result; rejects with what ended the call: a non-retryable error or the last one
 * unchanged, BudgetExhaustedError, RetryDeadlineExceededError, options.signal's reason (aborted),
 * TypeError / RangeError for a bad option (no attempt made, no request recorded), or the
 * RangeError of an options.cost function's bad value (no token taken).
 */
export async function callWithRetry(budget, fn, options = {}) {
  if (typeof fn !== 'function') throw new TypeError(`fn is ${show(fn)}; expected a function (attempt, signal) => Promise`);
  const loop = new RetryLoop(budget, options);
  const signal = options.signal ?? null;
  if (signal !== null && (typeof signal !== 'object' || typeof signal.aborted !== 'boolean')) {
    throw new TypeError(`options.signal is ${show(signal)}; expected an AbortSignal`);
  }
  // The tokens taken for the retry about to start (loop.heldCost) go back if it is never sent.
  for (;;) {
    if (signal?.aborted) {
      loop.refund();
      throw signal.reason;
    }
    let attempt;
    try {
      attempt = loop.nextAttempt();
    } catch (error) {
      loop.refund();
      throw error;
    }
    loop.sent(); // the retry is sent now: its tokens are spent
    if (attempt.number === 1) loop.recordRequest();
    const own = attemptSignal(signal, attempt.attemptDeadline - loop.clock());
    let result;
    let failed = false;
    let error;
    try {
      result = await fn(attempt, own.signal);
    } catch (e) {
      failed = true;
      error = e;
    } finally {
      own.dispose();
    }
    if (!failed) {
      budget.recordSuccess();
      return result;
    }
    if (signal?.aborted) throw signal.reason;
    if (isGrpcError(error) && (attempt.pushbackMs === null || attempt.pushbackMs === undefined)) {
      attempt.pushbackMs = parseRetryPushback(error.metadata);
    } else if (error !== null && typeof error === 'object' && typeof error.pushbackMs === 'number' && attempt.pushbackMs === null) {
      attempt.pushbackMs = error.pushbackMs;
    }
    const backoff = loop.afterFailure(attempt, error, loop.policy.isRetryable(error));
    const waited = await loop.firstAnswer(signal); // no token held while waiting
    loop.acquire();
    try {
      await abortableSleep(Math.max(0, backoff - waited), signal);
    } catch (reason) {
      loop.refund(); // the retry is never sent
      throw reason;
    }
  }
}
