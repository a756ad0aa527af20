// Types of @retry-budget/client/cockatiel. cockatiel's own types are not imported (the
// package does not depend on it); the policy has the shape cockatiel's IPolicy and wrap() use.

import type { CallOptions, TenantBudget } from './index.js';

export interface BudgetRetryContext {
  /** 0 for the first attempt, as cockatiel's retry context. */
  readonly attempt: number;
  readonly signal: AbortSignal;
}

interface Disposable_ {
  dispose(): void;
}

export interface BudgetRetryPolicy {
  readonly _altReturn: never;
  readonly onSuccess: (listener: (event: { duration: number }) => void) => Disposable_;
  readonly onFailure: (listener: (event: { duration: number; handled: boolean; reason: { error: Error } }) => void) => Disposable_;
  execute<T>(fn: (context: BudgetRetryContext) => PromiseLike<T> | T, signal?: AbortSignal): Promise<T>;
}

export interface BudgetRetryOptions extends CallOptions {
  /** Which errors are retried: a cockatiel Policy (handleAll, handleType(...), handleWhen(...)). */
  handle?: { readonly options: { errorFilter: (error: Error) => boolean } };
}

/** A cockatiel-shaped retry policy: callWithRetry through `budget`, composable in wrap(). */
export function budgetRetry(budget: TenantBudget, options?: BudgetRetryOptions): BudgetRetryPolicy;
