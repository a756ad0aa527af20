// @retry-budget/client: Node workers leasing retry tokens from a retry-budget server, sharing
// one fleet-wide budget with the C++, Python and Go workers. See client/js/README.md.

export { BudgetClient, ClientClosedError, MAX_TENANTS_PER_CLIENT } from './client.js';
export { TenantBudget, NO_LEASE, LEASE, FALLBACK, DENY_FALLBACK, MODES, MAX_COST } from './tenant-budget.js';
export {
  callWithRetry, BudgetExhaustedError, RetryDeadlineExceededError, computeBackoff, retryPolicy,
  defaultIsRetryable, newIdempotencyKey, parseRetryPushback, abortableSleep,
  IDEMPOTENCY_KEY_HEADER, PREVIOUS_ATTEMPTS_HEADER, RETRY_PUSHBACK_HEADER,
} from './retry.js';
export { retryInterceptor, BUDGET_EXHAUSTED_TRAILER } from './interceptor.js';
export { DEFAULT_OPTIONS } from './options.js';
export { budgetServices, loadProto, protoDir } from './proto.js';
export { Status } from './codes.js';
// The grpc-js this package uses (an interceptor must be given to clients of the same grpc-js).
export * as grpc from '@grpc/grpc-js';
