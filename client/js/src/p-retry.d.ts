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
}

/** Runs `pRetry(input, options)` with `budget` deciding every retry: the first attempt free,
 * one token per retry (a denial rejects with BudgetExhaustedError), the token refunded when
 * `options.signal` aborts the backoff, recordSuccess() on success. */
export function pRetryWithBudget<T, O extends PRetryBudgetOptions>(
  pRetry: (input: (attemptNumber: number) => PromiseLike<T> | T, options?: O) => Promise<T>,
  budget: TenantBudget,
  input: (attemptNumber: number) => PromiseLike<T> | T,
  options?: O,
): Promise<T>;
