// p-retry through the retry budget (@retry-budget/client/p-retry). p-retry keeps its own loop,
// options and backoff; the budget decides every RETRY, as in callWithRetry:
//
//     import pRetry from 'p-retry';
//     import { pRetryWithBudget } from '@retry-budget/client/p-retry';
//     const body = await pRetryWithBudget(pRetry, budget, () => fetchJson(url), { retries: 4, signal });
//
//  * The first attempt is free; each retry takes options.cost tokens (a number, or a function of
//    the failed attempt's error; default 1: budget.tryAcquire(cost)), asked only once p-retry
//    has decided to retry (retries left, time left, the error retryable, your shouldRetry said
//    yes). A denial rejects with BudgetExhaustedError (the last error as its
//    cause) instead of retrying; a BudgetExhaustedError thrown by an attempt (an inner layer's
//    budget said no) is never retried.
//  * A new client's first retry waits for the tenant's first answer (bounded by maxRetryTime,
//    ended by the signal), so it is not denied for want of a lease.
//  * Aborting `signal` during p-retry's backoff rejects at once (p-retry's own behaviour) and
//    refund(cost)s the tokens of the retry that was never sent.
//  * budget.recordRequest() once per call, as the first attempt starts; a success calls
//    budget.recordSuccess() once.
// p-retry is passed in (the package does not depend on it).

import { performance } from 'node:perf_hooks';
import { BudgetExhaustedError, retryCost, retryPolicy, waitFirstAnswer } from './retry.js';

function show(value) {
  return typeof value === 'string' ? JSON.stringify(value) : String(value);
}

/** Runs pRetry(input, options) with `budget` deciding every retry (see above). Resolves to
 * input's first result; rejects as pRetry does, or with BudgetExhaustedError. */
export async function pRetryWithBudget(pRetry, budget, input, options = {}) {
  if (typeof pRetry !== 'function') throw new TypeError(`pRetry is ${show(pRetry)}; expected p-retry's default export`);
  if (budget === null || typeof budget !== 'object' || typeof budget.tryAcquire !== 'function') {
    throw new TypeError(`budget is ${show(budget)}; expected a TenantBudget`);
  }
  if (typeof input !== 'function') throw new TypeError(`input is ${show(input)}; expected a function (attemptNumber) => Promise`);
  const { cost, ...pRetryOptions } = options;
  const costPolicy = { cost: retryPolicy({ cost }).cost };
  const userShouldRetry = options.shouldRetry;
  const signal = options.signal ?? null;
  const maxRetryTime = options.maxRetryTime ?? Infinity;
  const start = performance.now();
  let heldCost = 0; // taken for the retry about to start; refunded if it never starts

  const shouldRetry = async (context) => {
    if (context.error instanceof BudgetExhaustedError) return false;
    if (userShouldRetry !== undefined && !(await userShouldRetry(context))) return false;
    // Out of time while waiting for a new tenant's first answer: p-retry gives up with the error.
    if (!(await waitFirstAnswer(budget, signal, maxRetryTime - (performance.now() - start)))) return false;
    const n = retryCost(costPolicy, context.error);
    if (!budget.tryAcquire(n)) throw new BudgetExhaustedError(context.error, context.attemptNumber);
    heldCost = n;
    return true;
  };
  const attempt = (attemptNumber) => {
    heldCost = 0; // this attempt is sent: its tokens are spent
    if (attemptNumber === 1 && typeof budget.recordRequest === 'function') budget.recordRequest();
    return input(attemptNumber);
  };
  let result;
  try {
    result = await pRetry(attempt, { ...pRetryOptions, shouldRetry });
  } catch (error) {
    if (heldCost > 0) {
      budget.refund(heldCost);
      heldCost = 0;
    }
    throw error;
  }
  budget.recordSuccess();
  return result;
}
