// A retry policy for cockatiel users (@retry-budget/client/cockatiel): budgetRetry(budget,
// options) has the shape of a cockatiel policy (execute(fn, signal), onSuccess, onFailure), so
// it composes with cockatiel's own policies in wrap() (circuit breaker, timeout, bulkhead),
// and runs each call through callWithRetry:
//
//     import { circuitBreaker, handleAll, wrap, ConsecutiveBreaker } from 'cockatiel';
//     import { budgetRetry } from '@retry-budget/client/cockatiel';
//     const policy = wrap(budgetRetry(budget, { maxAttempts: 4 }), circuitBreaker(handleAll, { halfOpenAfter: 10_000, breaker: new ConsecutiveBreaker(5) }));
//     await policy.execute(({ signal }) => fetch(url, { signal }), request.signal);
//
// Why not cockatiel's retry(): its RetryPolicy sleeps the backoff on a plain timer that the
// signal does not end (and then calls fn again with the aborted signal), and has no hook where
// a token could be taken or refunded. Here: the first attempt is free, each retry takes
// options.cost tokens (a number, or a function of the failed attempt's error; default 1; a
// denial rejects with BudgetExhaustedError), the backoff ends at once on abort and refunds its
// tokens, a new client's first retry waits for the tenant's first answer, each call records one
// request (recordRequest()) and a success calls recordSuccess(). fn gets cockatiel's context:
// {attempt (0 for the first), signal}.
// Which errors are retried: `handle` (a cockatiel Policy such as handleType(...), read through
// its options.errorFilter), else options.isRetryable, else callWithRetry's default.
// The package does not depend on cockatiel.

import { performance } from 'node:perf_hooks';
import { callWithRetry, retryPolicy } from './retry.js';

function emitter() {
  const listeners = new Set();
  const event = (listener) => {
    listeners.add(listener);
    return { dispose: () => listeners.delete(listener) };
  };
  return { event, emit: (value) => { for (const l of [...listeners]) l(value); } };
}

/** A cockatiel-shaped retry policy over `budget` (see above). `options` are callWithRetry's
 * (maxAttempts, backoff, timeoutMs, isRetryable, cost, ...) plus `handle`. */
export function budgetRetry(budget, options = {}) {
  const { handle, ...callOptions } = options;
  if (handle !== undefined) {
    const filter = handle?.options?.errorFilter;
    if (typeof filter !== 'function') throw new TypeError('options.handle is not a cockatiel Policy (handleAll, handleType(...), handleWhen(...))');
    callOptions.isRetryable = (error) => filter(error) === true;
  }
  // Validates the options now (a bad one throws here, not in a call).
  if (typeof budget?.tryAcquire !== 'function') throw new TypeError('budget is not a TenantBudget');
  retryPolicy(callOptions);
  const success = emitter();
  const failure = emitter();
  return {
    _altReturn: undefined,
    onSuccess: success.event,
    onFailure: failure.event,
    async execute(fn, signal) {
      const start = performance.now();
      try {
        const value = await callWithRetry(budget, (attempt, attemptSignal) => fn({ attempt: attempt.number - 1, signal: attemptSignal }),
          { ...callOptions, signal: signal ?? callOptions.signal ?? null });
        success.emit({ duration: performance.now() - start });
        return value;
      } catch (error) {
        failure.emit({ duration: performance.now() - start, handled: true, reason: { error } });
        throw error;
      }
    },
  };
}
