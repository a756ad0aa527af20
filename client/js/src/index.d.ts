// Type declarations of @retry-budget/client (hand-written; checked by `tsc --noEmit` against
// tests/js/types_check.ts in CTest). Durations are milliseconds unless a name says otherwise.

import type * as grpcJs from '@grpc/grpc-js';
import type { Registry } from 'prom-client';

export * as grpc from '@grpc/grpc-js';

/** Where a tenant's retry tokens come from right now (the `mode` label of the metrics). */
export type BudgetMode = 'no_lease' | 'lease' | 'fallback' | 'deny_fallback';
export const NO_LEASE: 'no_lease';
export const LEASE: 'lease';
export const FALLBACK: 'fallback';
export const DENY_FALLBACK: 'deny_fallback';
export const MODES: readonly BudgetMode[];
/** The largest cost of one retry: tryAcquire(cost), refund(cost), the helpers' `cost`. */
export const MAX_COST: 1000000;
export const MAX_TENANTS_PER_CLIENT: 256;

export interface ClientOptions {
  /** gRPC target: "127.0.0.1:50051", "dns:///budget:50051", or a cluster's
   * "ipv4:10.0.0.1:50051,10.0.0.2:50051" (round_robin over its addresses). */
  target?: string;
  /** Random when empty; 1-128 printable ASCII characters. */
  instanceId?: string;
  /** How often the refresher syncs when nothing wakes it earlier. Default 200. */
  refreshPeriodMs?: number;
  /** Never sync more often than this. Default 5; in [0, refreshPeriodMs]. */
  minSyncIntervalMs?: number;
  /** Deadline of one Sync RPC. Default 1000. */
  syncTimeoutMs?: number;
  /** Longest wait between two reconnection attempts. Default 1000; in [1, 3600000]. */
  maxReconnectBackoffMs?: number;
  /** Tokens asked for on top of one refresh period's estimated spend. Default 2. */
  leaseBurst?: number;
  /** Monotonic time source in milliseconds. Default performance.now. */
  clock?: (() => number) | null;
  /** When the server is unreachable and the lease has ended. Default 'local_bucket'. */
  fallback?: 'local_bucket' | 'deny';
  /** The local bucket of a tenant the server never answered for. Defaults 1 and 0.1. */
  fallbackCapacity?: number;
  fallbackRefillPerSecond?: number;
  /** A prom-client Registry for the retry_budget_client_* metrics (one client per registry). */
  metricsRegistry?: Registry | null;
  /** TLS / mTLS credentials; null: insecure plaintext (loopback, tests). */
  channelCredentials?: grpcJs.ChannelCredentials | null;
  /** When non-empty, every Sync carries `authorization: Bearer <bearerToken>`. */
  bearerToken?: string;
  /** Directory holding retrybudget/v1/budget.proto. Default $RETRY_BUDGET_PROTO_DIR when set,
   * else the copy packed in the package (or, in a checkout, the repository's proto/). */
  protoDir?: string | null;
  /** Where the client's log lines go. Default: errors to stderr. */
  logger?: ((level: 'error' | 'info', line: string) => void) | null;
}

export const DEFAULT_OPTIONS: Readonly<Required<ClientOptions>>;

/** Counters of one tenant in this process, cumulative since the client was created. */
export interface TenantStats {
  successes: number;
  /** recordRequest() calls (first attempts). */
  requests: number;
  /** Retries tryAcquire() allowed with tokens (true, whatever their cost), minus the refund()
   * calls that gave tokens back (lease + fallback). A count of retries. */
  retriesAllowed: number;
  /** The tokens those retries took (a retry of cost c takes c), net of refunds:
   * tokensReceived = tokensSpent + tokensReturned + tokensHeld (no fallback). */
  tokensSpent: number;
  /** tryAcquire() returned false (never in shadow mode). */
  retriesDenied: number;
  /** Shadow mode's would-be denials: retries let through that enforcement would have denied
   * (no token taken). */
  shadowDenied: number;
  /** Their tokens not yet refunded (refund() pays these back first, giving nothing back). */
  unbacked: number;
  /** Of tokensSpent, the tokens from the local fallback bucket. */
  fallbackAllowed: number;
  tokensReceived: number;
  tokensReturned: number;
  tokensHeld: number;
  /** refund() calls that gave tokens back (already deducted from retriesAllowed; their tokens
   * from tokensSpent). */
  refunds: number;
  /** Of successes, those whose credit this process's fallback buckets deposited locally
   * (success-funded fallback; the server does not credit them again). */
  successesCreditedLocally: number;
  /** Of requests, those whose credit (a windowed policy's retry_ratio) this process's fallback
   * buckets deposited locally (the server does not credit them again). */
  requestsCreditedLocally: number;
  leaseActive: boolean;
  mode: BudgetMode;
  /** The tenant's policy is a dry run (the last answer for it said shadow). */
  shadow: boolean;
  /** Why the server refused this tenant in the last Sync; null after a grant. */
  error: string | null;
}

/** One tenant's budget in this process. The hot path (tryAcquire, refund, recordSuccess,
 * recordRequest) is synchronous, allocation-free and never does I/O. */
export class TenantBudget {
  private constructor();
  readonly tenant: string;
  /** One retry of `cost` tokens (an integer in [1, MAX_COST]; default 1), all or nothing.
   * True: the tokens were taken, send the retry. False: fail the call now. In shadow mode a
   * retry enforcement would deny is allowed without a token (counted in shadowDenied). Throws
   * RangeError naming `cost` and the value for a bad cost (nothing counted). */
  tryAcquire(cost?: number): boolean;
  /** Gives back the `cost` tokens (default 1) taken by tryAcquire(cost) for a retry that was
   * never sent. In shadow mode, pays back would-be denials first (nothing given back). Throws
   * RangeError for a bad cost (nothing changed). */
  refund(cost?: number): void;
  /** Records one successful logical call. */
  recordSuccess(): void;
  /** Records one request (a logical call's first attempt; a windowed policy deposits its
   * retry_ratio per request). The retry helpers call it once per call. */
  recordRequest(): void;
  readonly mode: BudgetMode;
  /** True while the tenant is in shadow mode (its last answer said MODE_SHADOW; false until
   * the first answer). */
  readonly shadow: boolean;
  /** True once the tenant's first Sync (sent when the handle was created) was answered, or
   * failed and the fallback applies, or the client closed. */
  readonly isReady: boolean;
  /** Resolves with the mode once isReady (at once if it is); rejects with signal.reason when
   * `signal` aborts first. Takes no token; callWithRetry and retryInterceptor wait for it
   * themselves within the backoff of a new client's first retry. */
  ready(signal?: AbortSignal | null): Promise<BudgetMode>;
  stats(): TenantStats;
  /** What this tenant's fallback buckets may have handed out up to `nowSeconds`
   * (BudgetClient.now()). */
  fallbackAllowance(nowSeconds: number): number;
}

export class ClientClosedError extends Error {}

export class BudgetClient implements AsyncDisposable {
  /** Throws TypeError / RangeError naming a bad option and its value. */
  constructor(options?: ClientOptions);
  readonly options: Readonly<Required<ClientOptions>>;
  readonly instanceId: string;
  /** The tenant's handle (the same object on every call). */
  tenant(name: string): TenantBudget;
  /** null when the last Sync attempt got a response, else "CODE: message". */
  lastSyncStatus(): string | null;
  /** The client's clock in seconds. */
  now(): number;
  /** The final Sync, then stops; null when it got a response, else "CODE: message". */
  close(): Promise<string | null>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** What an attempt is told about itself; it may set pushbackMs (>= 0: wait exactly this
 * long; < 0: do not retry) before throwing. */
export interface Attempt {
  readonly number: number;
  readonly previousAttempts: number;
  readonly idempotencyKey: string;
  /** Overall and this attempt's deadline, in the call's clock (ms); Infinity: none. */
  readonly deadline: number;
  readonly attemptDeadline: number;
  pushbackMs: number | null;
}

export interface RetryPolicyOptions {
  /** Most attempts, the first included. Default 4. */
  maxAttempts?: number;
  /** Full jitter: uniform in [0, min(maxBackoffMs, initialBackoffMs * multiplier^(k-1))). */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  multiplier?: number;
  perAttemptTimeoutMs?: number | null;
  isRetryable?: (error: unknown) => boolean;
  /** The tokens each retry takes: an integer in [1, MAX_COST], or a function of the failed
   * attempt's error returning one (checked at each retry: a bad value ends the call with a
   * RangeError naming options.cost; the interceptor ends it with INTERNAL). Default 1. The
   * cost taken is the cost refunded when the retry is never sent. AWS SDKs' shape:
   * `(e) => (e?.code === Status.DEADLINE_EXCEEDED || e?.name === 'TimeoutError' ? 10 : 5)`. */
  cost?: number | ((error: any) => number);
}

export interface RetryPolicy extends Required<RetryPolicyOptions> {}

export interface CallOptions extends RetryPolicyOptions {
  /** Aborting it rejects the call with signal.reason at once (a backoff's token refunded). */
  signal?: AbortSignal | null;
  /** Overall time allowed to the logical call. */
  timeoutMs?: number | null;
  /** Absolute overall deadline on `clock` (ms). */
  deadline?: number | null;
  /** The same on every attempt; a fresh random key when empty. */
  idempotencyKey?: string;
  /** Jitter source in [0, 1). */
  random?: () => number;
  /** Time source (ms). Default performance.now. */
  clock?: () => number;
}

export function callWithRetry<T>(budget: TenantBudget, fn: (attempt: Attempt, signal: AbortSignal) => Promise<T> | T, options?: CallOptions): Promise<T>;

export class BudgetExhaustedError extends Error {
  constructor(lastError: unknown, attempts: number);
  readonly attempts: number;
  readonly cause: unknown;
}

export class RetryDeadlineExceededError extends Error {
  constructor(message: string, lastError?: unknown);
  readonly cause: unknown;
}

export function retryPolicy(options?: RetryPolicyOptions): RetryPolicy;
export function computeBackoff(policy: RetryPolicy, retry: number, random: number): number;
export function defaultIsRetryable(error: unknown): boolean;
export function newIdempotencyKey(): string;
export function parseRetryPushback(metadata: grpcJs.Metadata | null | undefined): number | null;
export function abortableSleep(ms: number, signal?: AbortSignal | null): Promise<void>;
export const IDEMPOTENCY_KEY_HEADER: 'x-idempotency-key';
export const PREVIOUS_ATTEMPTS_HEADER: 'grpc-previous-rpc-attempts';
export const RETRY_PUSHBACK_HEADER: 'grpc-retry-pushback-ms';

/** A grpc-js client interceptor retrying unary calls through `budget` (recordRequest() once per
 * call; options.cost, when a function, gets an Error with the attempt's `code`, `details` and
 * `metadata`). */
export function retryInterceptor(budget: TenantBudget, options?: RetryPolicyOptions): grpcJs.Interceptor;
export const BUDGET_EXHAUSTED_TRAILER: 'retry-budget-exhausted';

/** grpc-js client constructors of the wire contract, loaded from proto/ at run time. */
export function budgetServices(protoDir?: string | null): {
  RetryBudgetService: grpcJs.ServiceClientConstructor;
  BudgetAdminService: grpcJs.ServiceClientConstructor;
};
export function loadProto(file: string, includeDir: string): grpcJs.GrpcObject;
export function protoDir(dir?: string | null): string;

export const Status: Readonly<Record<'OK' | 'CANCELLED' | 'UNKNOWN' | 'INVALID_ARGUMENT' | 'DEADLINE_EXCEEDED' | 'NOT_FOUND' | 'ALREADY_EXISTS' | 'PERMISSION_DENIED' | 'RESOURCE_EXHAUSTED' | 'FAILED_PRECONDITION' | 'ABORTED' | 'OUT_OF_RANGE' | 'UNIMPLEMENTED' | 'INTERNAL' | 'UNAVAILABLE' | 'DATA_LOSS' | 'UNAUTHENTICATED', number>>;
