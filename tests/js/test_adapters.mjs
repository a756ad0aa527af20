// The adapters for the retry libraries users already have, against the real server: p-retry
// (pRetryWithBudget) and cockatiel (budgetRetry, alone and in cockatiel's wrap()). Each keeps
// the budget's rules: the first attempt free, one token per retry, a denial is a
// BudgetExhaustedError, the token refunded when the signal ends the backoff, successes
// recorded; and a new client's first retry is not denied.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
// The libraries as the package's devDependencies installed them (client/js/node_modules: a bare
// import resolves only from a node_modules beside or above this file).
import pRetry from '../../client/js/node_modules/p-retry/index.js';
import { BudgetClient, BudgetExhaustedError, Status, grpc } from '../../client/js/src/index.js';
import { pRetryWithBudget } from '../../client/js/src/p-retry.js';
import { budgetRetry } from '../../client/js/src/cockatiel.js';
import { startServer, getBudget } from './helpers.mjs';

const { retry, wrap, circuitBreaker, handleAll, handleType, ConsecutiveBreaker, ConstantBackoff } = createRequire(new URL('../../client/js/package.json', import.meta.url))('cockatiel');

const unavailable = () => Object.assign(new Error('14 UNAVAILABLE: down'), { code: Status.UNAVAILABLE, details: 'down', metadata: new grpc.Metadata() });
const tenantPolicy = (name, initial) => `tenants { tenant: "${name}" policy { capacity: 100 refill_per_second: 0 success_credit: 0 initial_tokens: ${initial} lease_ttl_ms: 5000 } }\n`;
const POLICY = ['pr', 'pr-abort', 'ck', 'ck-abort'].map((n) => tenantPolicy(n, 50)).join('') + tenantPolicy('empty', 0);

async function rig(t) {
  const server = await startServer(t, POLICY);
  const client = new BudgetClient({ target: server.target, logger: () => {} });
  t.after(() => client.close());
  return { server, client };
}

test('p-retry: a new client\'s first retry is granted; one token per retry; success recorded; the server counts it', async (t) => {
  const { server, client } = await rig(t);
  const budget = client.tenant('pr'); // no wait: the first thing this client does is the call
  let n = 0;
  const result = await pRetryWithBudget(pRetry, budget, async (attemptNumber) => {
    n++;
    if (attemptNumber < 3) throw unavailable();
    return 'ok';
  }, { retries: 5, minTimeout: 0 });
  assert.equal(result, 'ok');
  assert.equal(n, 3);
  const s = budget.stats();
  assert.equal(s.retriesAllowed, 2);
  assert.equal(s.retriesDenied, 0);
  assert.equal(s.successes, 1);
  // p-retry's own "no": a TypeError is not retried, and takes no token.
  await assert.rejects(pRetryWithBudget(pRetry, budget, async () => { throw new TypeError('bug'); }, { retries: 5, minTimeout: 0 }), TypeError);
  // An inner layer's denial is never retried.
  const inner = new BudgetExhaustedError(unavailable(), 1);
  await assert.rejects(pRetryWithBudget(pRetry, budget, async () => { throw inner; }, { retries: 5, minTimeout: 0 }), (e) => e === inner);
  assert.equal(budget.stats().retriesAllowed, 2);
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 'pr');
  assert.equal(Number(status.retriesTotal), 2);
  assert.equal(Number(status.successesTotal), 1);
});

test('p-retry: a denied retry rejects with BudgetExhaustedError carrying the last error', async (t) => {
  const { client } = await rig(t);
  const budget = client.tenant('empty');
  const last = unavailable();
  let n = 0;
  await assert.rejects(pRetryWithBudget(pRetry, budget, async () => { n++; throw last; }, { retries: 5, minTimeout: 0 }),
    (e) => e instanceof BudgetExhaustedError && e.cause === last && e.attempts === 1);
  assert.equal(n, 1);
  assert.equal(budget.stats().retriesDenied, 1);
});

test('p-retry: aborting the backoff rejects at once and refunds the token', async (t) => {
  const { server, client } = await rig(t);
  const budget = client.tenant('pr-abort');
  await budget.ready();
  const controller = new AbortController();
  const reason = new Error('caller gone');
  let n = 0;
  const call = pRetryWithBudget(pRetry, budget, async () => {
    n++;
    setImmediate(() => controller.abort(reason)); // during the 60 s backoff that follows
    throw unavailable();
  }, { retries: 5, minTimeout: 60_000, signal: controller.signal });
  await assert.rejects(call, (e) => e === reason);
  assert.equal(n, 1);
  const s = budget.stats();
  assert.equal(s.refunds, 1);
  assert.equal(s.retriesAllowed, 0);
  assert.equal(s.tokensSpent, 0);
  assert.equal(await client.close(), null);
  assert.equal(Number((await getBudget(server.target, 'pr-abort')).retriesTotal), 0);
});

test('cockatiel: its own retry() does not end the backoff on abort (the reason for budgetRetry)', async () => {
  // The control, no budget involved: the abort comes during a 200 ms backoff; cockatiel
  // sleeps it out and calls fn again, with the aborted signal.
  const controller = new AbortController();
  const seen = [];
  const policy = retry(handleAll, { maxAttempts: 1, backoff: new ConstantBackoff(200) });
  await assert.rejects(policy.execute(({ signal }) => {
    seen.push(signal.aborted);
    if (seen.length === 1) setImmediate(() => controller.abort(new Error('gone')));
    throw unavailable();
  }, controller.signal));
  assert.deepEqual(seen, [false, true]);
});

test('cockatiel: budgetRetry ends the backoff on abort, refunds, and composes in wrap()', async (t) => {
  const { server, client } = await rig(t);
  // A new client's first retry, through wrap(budgetRetry, circuitBreaker).
  const budget = client.tenant('ck');
  const retries = budgetRetry(budget, { maxAttempts: 4, random: () => 0 });
  const breaker = circuitBreaker(handleAll, { halfOpenAfter: 10_000, breaker: new ConsecutiveBreaker(5) });
  const policy = wrap(retries, breaker);
  const successes = [];
  retries.onSuccess((e) => successes.push(e));
  const contexts = [];
  const value = await policy.execute(({ attempt, signal }) => {
    contexts.push({ attempt, aborted: signal.aborted });
    if (attempt === 0) throw unavailable();
    return 'ok';
  });
  assert.equal(value, 'ok');
  assert.deepEqual(contexts, [{ attempt: 0, aborted: false }, { attempt: 1, aborted: false }]);
  assert.equal(successes.length, 1);
  assert.equal(budget.stats().retriesAllowed, 1);
  assert.equal(budget.stats().successes, 1);

  // `handle` decides what is retried: an error outside it ends the call, no token taken.
  class Transient extends Error {}
  const only = budgetRetry(budget, { handle: handleType(Transient), random: () => 0 });
  let n = 0;
  await assert.rejects(only.execute(() => { n++; throw unavailable(); }), { code: Status.UNAVAILABLE });
  assert.equal(n, 1);
  n = 0;
  assert.equal(await only.execute(() => { if (n++ === 0) throw new Transient('again'); return 'ok'; }), 'ok');
  assert.equal(budget.stats().retriesAllowed, 2);

  // Aborted during a 60 s backoff: rejects at once with the reason, fn not called again, the
  // token refunded.
  const other = client.tenant('ck-abort');
  await other.ready();
  const controller = new AbortController();
  const reason = new Error('caller gone');
  const seen = [];
  await assert.rejects(budgetRetry(other, { initialBackoffMs: 60_000, maxBackoffMs: 60_000, random: () => 0.99 }).execute(({ signal }) => {
    seen.push(signal.aborted);
    setImmediate(() => controller.abort(reason));
    throw unavailable();
  }, controller.signal), (e) => e === reason);
  assert.deepEqual(seen, [false]);
  assert.equal(other.stats().refunds, 1);
  assert.equal(other.stats().retriesAllowed, 0);

  // A denial is a BudgetExhaustedError.
  const empty = client.tenant('empty');
  await assert.rejects(budgetRetry(empty, { random: () => 0 }).execute(() => { throw unavailable(); }), BudgetExhaustedError);

  assert.equal(await client.close(), null);
  assert.equal(Number((await getBudget(server.target, 'ck')).retriesTotal), 2);
  assert.equal(Number((await getBudget(server.target, 'ck-abort')).retriesTotal), 0);
});

test('p-retry and cockatiel: options.cost prices each retry from its error, refunded whole on abort; one request per call', async () => {
  const { localBudget } = await import('../../client/js/src/testing.js');
  const timeout = () => Object.assign(new Error('timed out'), { name: 'TimeoutError' });
  const awsCost = (e) => (e?.name === 'TimeoutError' ? 10 : 5);
  // p-retry: a timeout (10), then UNAVAILABLE (5), then success.
  const pr = await localBudget(20);
  const errors = [timeout(), unavailable()];
  let n = 0;
  assert.equal(await pRetryWithBudget(pRetry, pr, async () => {
    if (n < errors.length) throw errors[n++];
    return 'ok';
  }, { retries: 5, minTimeout: 0, cost: awsCost }), 'ok');
  let s = pr.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.requests, s.successes], [5, 2, 15, 1, 1]);
  await assert.rejects(pRetryWithBudget(pRetry, pr, async () => { throw timeout(); }, { retries: 5, minTimeout: 0, cost: awsCost }), BudgetExhaustedError);
  assert.deepEqual([pr.stats().tokensHeld, pr.stats().retriesDenied, pr.stats().requests], [5, 1, 2]);
  await assert.rejects(pRetryWithBudget(pRetry, pr, async () => 1, { cost: 0 }), (e) => e instanceof RangeError && /options\.cost is 0/.test(e.message));
  // Aborted during p-retry's backoff: the retry's 4 tokens come back.
  const controller = new AbortController();
  const reason = new Error('caller gone');
  await assert.rejects(pRetryWithBudget(pRetry, pr, async () => {
    setImmediate(() => controller.abort(reason));
    throw unavailable();
  }, { retries: 5, minTimeout: 60_000, signal: controller.signal, cost: 4 }), (e) => e === reason);
  assert.deepEqual([pr.stats().tokensHeld, pr.stats().refunds, pr.stats().tokensSpent], [5, 1, 15]);

  // cockatiel: the same through budgetRetry.
  const ck = await localBudget(20);
  n = 0;
  const policy = budgetRetry(ck, { initialBackoffMs: 0, maxBackoffMs: 0, cost: awsCost });
  assert.equal(await policy.execute(() => {
    if (n < errors.length) throw errors[n++];
    return 'ok';
  }), 'ok');
  s = ck.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.requests, s.successes], [5, 2, 15, 1, 1]);
  assert.throws(() => budgetRetry(ck, { cost: 1.5 }), (e) => e instanceof RangeError && /options\.cost is 1\.5/.test(e.message));
});
