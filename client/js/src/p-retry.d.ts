// Types of @retry-budget/client/p-retry. p-retry's own types are not imported (the package
// does not depend on it): the shapes below are what the adapter uses of it.

import type { TenantBudget } from './index.js';

/** What p-retry (>= 6) passes to shouldRetry. */
export interface PRetryContext {
  readonly error: Error;
  readonly attemptNumber: number;
  readonly retriesLeft: number;
}

/** The options the adapter reads; every other p-retry option is passed through unchanged. */
export interface PRetryBudgetOptions {
  signal?: AbortSignal;
  maxRetryTime?: number;
  shouldRetry?: (context: PRetryContext) => boolean | Promise<boolean>;
  /** The tokens each retry takes: an integer in [1, 1000000], or a function of the failed
   * attempt's error (e.g. AWS's shape: 10 for a timeout, 5 otherwise). Default 1. Not passed
   * to p-retry. */
  cost?: number | ((error: Error) => number);
}

/** Runs `pRetry(input, options)` with `budget` deciding every retry: the first attempt free,
 * `options.cost` tokens per retry (a denial rejects with BudgetExhaustedError), the tokens
 * refunded when `options.signal` aborts the backoff, recordRequest() once per call,
 * recordSuccess() on success. */
export function pRetryWithBudget<T, O extends PRetryBudgetOptions>(
  pRetry: (input: (attemptNumber: number) => PromiseLike<T> | T, options?: O) => Promise<T>,
  budget: TenantBudget,
  input: (attemptNumber: number) => PromiseLike<T> | T,
  options?: O,
): Promise<T>;
