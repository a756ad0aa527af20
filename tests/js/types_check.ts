// A TypeScript user of @retry-budget/client: compiled with `tsc --noEmit` (CTest js_types_test)
// so the hand-written declarations match what the package offers. The @ts-expect-error lines
// must stay errors: they prove the check can fail.
import {
  BudgetClient, BudgetExhaustedError, callWithRetry, grpc, retryInterceptor, MAX_COST, Status, type Attempt,
  type BudgetMode, type ClientOptions, type TenantBudget, type TenantStats,
} from '@retry-budget/client';
import { localBudget, ServerProcess } from '@retry-budget/client/testing';
import { pRetryWithBudget } from '@retry-budget/client/p-retry';
import { budgetRetry } from '@retry-budget/client/cockatiel';
import pRetry from 'p-retry';
import { wrap, circuitBreaker, handleAll, handleType, ConsecutiveBreaker } from 'cockatiel';
import { Registry } from 'prom-client';

async function worker(signal: AbortSignal): Promise<number> {
  const options: ClientOptions = { target: 'ipv4:127.0.0.1:1,127.0.0.1:2', refreshPeriodMs: 100, fallback: 'deny', metricsRegistry: new Registry() };
  await using client = new BudgetClient(options);
  const budget: TenantBudget = client.tenant('payments');
  const ok: boolean = budget.tryAcquire();
  budget.recordSuccess();
  budget.recordRequest();
  if (budget.tryAcquire(5)) budget.refund(5);
  budget.refund();
  const stats: TenantStats = budget.stats();
  const mode: BudgetMode = stats.mode;
  const shadow: boolean = budget.shadow && stats.shadow;
  const counts: number = stats.requests + stats.requestsCreditedLocally + stats.shadowDenied + stats.unbacked + stats.tokensSpent + MAX_COST;
  // @ts-expect-error: a cost is a number
  budget.tryAcquire('5');
  void shadow; void counts;
  // AWS SDKs' shape: 5 tokens for a retryable error, 10 for a timeout.
  const awsCost = (e: any): number => (e?.code === Status.DEADLINE_EXCEEDED || e?.name === 'TimeoutError' ? 10 : 5);
  await callWithRetry(budget, async () => 1, { cost: awsCost });
  await callWithRetry(budget, async () => 1, { cost: 3 });
  // @ts-expect-error: cost is a number or a function returning one
  await callWithRetry(budget, async () => 1, { cost: () => 'ten' });
  const value = await callWithRetry(budget, async (attempt: Attempt, s: AbortSignal) => {
    attempt.pushbackMs = s.aborted ? -1 : null;
    return attempt.idempotencyKey.length;
  }, { signal, timeoutMs: 2000, maxAttempts: 3 });
  try {
    await callWithRetry(budget, () => { throw new Error('x'); });
  } catch (e) {
    if (e instanceof BudgetExhaustedError) console.log(e.attempts, e.cause);
  }
  const first: BudgetMode = await budget.ready(signal);
  const answered: boolean = budget.isReady;
  const viaPRetry: string = await pRetryWithBudget(pRetry, budget, async (n: number) => `attempt ${n}`, { retries: 3, signal, onFailedAttempt: () => {}, cost: (e: Error) => (e.name === 'TimeoutError' ? 10 : 5) });
  const policy = wrap(budgetRetry(budget, { handle: handleType(TypeError), maxAttempts: 3, cost: awsCost }), circuitBreaker(handleAll, { halfOpenAfter: 1000, breaker: new ConsecutiveBreaker(3) }));
  const viaCockatiel: number = await policy.execute(({ attempt, signal: s }) => (s.aborted ? -1 : attempt), signal);
  // @ts-expect-error: ready() takes an AbortSignal
  await budget.ready(5);
  void first; void answered; void viaPRetry; void viaCockatiel;
  const interceptor: grpc.Interceptor = retryInterceptor(budget, { maxAttempts: 2, cost: awsCost });
  const status: string | null = await client.close();
  // @ts-expect-error: fallback is 'local_bucket' or 'deny'
  new BudgetClient({ fallback: 'open' });
  // @ts-expect-error: durations are numbers of milliseconds
  new BudgetClient({ syncTimeoutMs: '1s' });
  void ok; void mode; void interceptor; void status;
  const local = await localBudget(3);
  const server = new ServerProcess('/bin/false', '/tmp');
  void server.target;
  return value + local.stats().tokensHeld;
}

void worker(new AbortController().signal);
