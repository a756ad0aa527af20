// The grpc-js retry interceptor against a real flaky grpc-js backend (FlakyEcho of
// examples/flaky_backend/flaky.proto): retries only when the budget allows, the headers of
// every attempt, status classification as the C++ RetryUnary, pushback, the call's deadline,
// cancellation during a backoff (the token refunded), successes recorded; and once with a
// budget leased from the real server.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BudgetClient, retryInterceptor, grpc } from '../../client/js/src/index.js';
import { localBudget } from '../../client/js/src/testing.js';
import { startFlakyBackend, flakyEchoClient, randomFailures } from '../../examples/js_worker/flaky_backend.mjs';
import { startServer, policy, waitUntil, getBudget } from './helpers.mjs';

const FlakyEcho = flakyEchoClient();

function echo(client, message, { deadlineMs = 10_000 } = {}) {
  let call;
  const promise = new Promise((resolve, reject) => {
    call = client.Echo({ message }, { deadline: new Date(Date.now() + deadlineMs) }, (error, reply) => (error ? reject(error) : resolve(reply)));
  });
  return { promise, call };
}

async function rig(t, decide, budgetTokens, interceptorOptions = { initialBackoffMs: 1, maxBackoffMs: 2 }) {
  const backend = await startFlakyBackend(decide);
  const budget = await localBudget(budgetTokens);
  const client = new FlakyEcho(backend.target, grpc.credentials.createInsecure(), {
    interceptors: [retryInterceptor(budget, interceptorOptions)], 'grpc.enable_retries': 0,
  });
  t.after(() => {
    client.close();
    backend.stop();
  });
  return { backend, budget, client };
}

const failFirst = (k, code = grpc.status.UNAVAILABLE, pushbackMs = null) => (call, n) => (n <= k ? { code, details: `attempt ${n} fails`, pushbackMs } : null);

test('retries UNAVAILABLE through the budget with the same key and grpc-previous-rpc-attempts', async (t) => {
  const { backend, budget, client } = await rig(t, failFirst(2), 10);
  const reply = await echo(client, 'hi').promise;
  assert.equal(reply.message, 'hi');
  assert.equal(reply.attemptsSeen, 3);
  assert.equal(reply.duplicate, false);
  assert.equal(backend.attempts.length, 3);
  assert.equal(new Set(backend.attempts.map((a) => a.key)).size, 1);
  assert.match(backend.attempts[0].key, /^[0-9a-f]{32}$/);
  assert.deepEqual(backend.attempts.map((a) => a.previous), [null, '1', '2']);
  assert.equal(budget.stats().tokensHeld, 8);
  assert.equal(budget.stats().successes, 1);
  // A new logical call: a new key.
  await echo(client, 'again').promise;
  assert.notEqual(backend.attempts[3].key, backend.attempts[0].key);
  assert.equal(budget.stats().successes, 2);
});

test('an empty budget means no retry: the caller gets the status, marked as exhausted', async (t) => {
  const { backend, budget, client } = await rig(t, failFirst(5), 0);
  await assert.rejects(echo(client, 'x').promise, (e) => e.code === grpc.status.UNAVAILABLE && /retry budget exhausted after 1 attempt/.test(e.details) && e.metadata.get('retry-budget-exhausted')[0] === '1');
  assert.equal(backend.attempts.length, 1);
  assert.equal(budget.stats().retriesDenied, 1);
});

test('status codes are classified as the C++ RetryUnary; max attempts bound the retries', async (t) => {
  for (const code of [grpc.status.INVALID_ARGUMENT, grpc.status.NOT_FOUND, grpc.status.INTERNAL, grpc.status.PERMISSION_DENIED]) {
    const { backend, budget, client } = await rig(t, failFirst(1, code), 10);
    await assert.rejects(echo(client, 'x').promise, (e) => e.code === code);
    assert.equal(backend.attempts.length, 1, `code ${code} is not retried`);
    assert.equal(budget.stats().tokensHeld, 10);
  }
  for (const code of [grpc.status.RESOURCE_EXHAUSTED, grpc.status.ABORTED, grpc.status.UNAVAILABLE]) {
    const { backend, client } = await rig(t, failFirst(1, code), 10);
    await echo(client, 'x').promise;
    assert.equal(backend.attempts.length, 2, `code ${code} is retried`);
  }
  const { backend, budget, client } = await rig(t, failFirst(100), 10, { initialBackoffMs: 1, maxBackoffMs: 1, maxAttempts: 3 });
  await assert.rejects(echo(client, 'x').promise, (e) => e.code === grpc.status.UNAVAILABLE);
  assert.equal(backend.attempts.length, 3);
  assert.equal(budget.stats().tokensHeld, 8);
});

test('pushback: negative means do not retry, >= 0 replaces the backoff', async (t) => {
  const a = await rig(t, failFirst(1, grpc.status.UNAVAILABLE, -1), 10);
  await assert.rejects(echo(a.client, 'x').promise, (e) => e.code === grpc.status.UNAVAILABLE);
  assert.equal(a.backend.attempts.length, 1);
  const b = await rig(t, failFirst(1, grpc.status.UNAVAILABLE, 80), 10, { initialBackoffMs: 10_000, maxBackoffMs: 10_000 });
  const start = Date.now();
  await echo(b.client, 'x').promise;
  const took = Date.now() - start;
  assert.ok(took >= 75 && took < 5000, `took ${took} ms`);
});

test('the call\'s deadline: every attempt carries it, and a backoff that would cross it is not started', async (t) => {
  const { backend, budget, client } = await rig(t, failFirst(100, grpc.status.UNAVAILABLE, 400), 10);
  const start = Date.now();
  await assert.rejects(echo(client, 'x', { deadlineMs: 200 }).promise, (e) => e.code === grpc.status.UNAVAILABLE);
  assert.ok(Date.now() - start < 2000);
  assert.equal(backend.attempts.length, 1);
  assert.equal(budget.stats().tokensHeld, 10, 'no token for a retry that could not start before the deadline');
  // A hung attempt: DEADLINE_EXCEEDED at the call's deadline is not retried.
  const hung = await rig(t, () => ({ code: grpc.status.UNAVAILABLE, delayMs: 5000 }), 10);
  await assert.rejects(echo(hung.client, 'x', { deadlineMs: 150 }).promise, (e) => e.code === grpc.status.DEADLINE_EXCEEDED);
  assert.equal(hung.backend.attempts.length, 1);
  assert.ok(hung.backend.attempts[0].deadline instanceof Date || typeof hung.backend.attempts[0].deadline === 'number');
});

test('cancelling the call during a backoff ends it at once and refunds the token', async (t) => {
  const { backend, budget, client } = await rig(t, failFirst(100, grpc.status.UNAVAILABLE, 10_000), 10);
  const { promise, call } = echo(client, 'x', { deadlineMs: 60_000 });
  await waitUntil(() => backend.attempts.length === 1 && budget.stats().tokensHeld === 9, { what: 'the backoff' });
  const start = Date.now();
  const controller = new AbortController();
  controller.signal.addEventListener('abort', () => call.cancel());
  controller.abort();
  await assert.rejects(promise, (e) => e.code === grpc.status.CANCELLED);
  assert.ok(Date.now() - start < 1000);
  assert.equal(budget.stats().tokensHeld, 10);
  assert.equal(budget.stats().refunds, 1);
  assert.equal(backend.attempts.length, 1);
});

test('with a budget leased from the real server: retries spent are the server\'s count', async (t) => {
  const server = await startServer(t, policy('echo', { capacity: 50, refill: 0, credit: 0 }));
  const budgetClient = new BudgetClient({ target: server.target, refreshPeriodMs: 50 });
  const budget = budgetClient.tenant('echo');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  const backend = await startFlakyBackend(randomFailures(0.5, 42));
  const client = new FlakyEcho(backend.target, grpc.credentials.createInsecure(), { interceptors: [retryInterceptor(budget, { initialBackoffMs: 1, maxBackoffMs: 5 })], 'grpc.enable_retries': 0 });
  t.after(() => { client.close(); backend.stop(); });
  let ok = 0;
  let failed = 0;
  await Promise.all(Array.from({ length: 40 }, (_, i) => echo(client, `m${i}`).promise.then(() => ok++, () => failed++)));
  const retries = backend.attempts.length - 40;
  assert.equal(await budgetClient.close(), null);
  assert.equal(budget.stats().retriesAllowed, retries);
  assert.equal(budget.stats().successes, ok);
  const status = await getBudget(server.target, 'echo');
  assert.equal(status.retriesTotal, retries);
  assert.equal(status.successesTotal, ok);
  assert.ok(retries > 0 && ok > 0, `ok ${ok} failed ${failed} retries ${retries}`);
});

test('perAttemptTimeoutMs: a hung attempt times out on its own deadline and is retried within the call\'s', async (t) => {
  const { backend, budget, client } = await rig(t, (call, n) => (n === 1 ? { code: grpc.status.UNAVAILABLE, delayMs: 5000 } : null), 10, { initialBackoffMs: 1, maxBackoffMs: 2, perAttemptTimeoutMs: 150 });
  const start = Date.now();
  const reply = await echo(client, 'x', { deadlineMs: 10_000 }).promise;
  assert.equal(reply.attemptsSeen, 2);
  assert.ok(Date.now() - start < 4000, 'the first attempt did not wait out its 5 s');
  assert.equal(budget.stats().tokensHeld, 9);
  assert.equal(backend.attempts.length, 2);
});

test('options.cost prices each retry from its status (AWS\'s shape); the call records one request', async (t) => {
  const codes = [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED];
  const decide = (call, n) => (n <= codes.length ? { code: codes[n - 1], details: `attempt ${n} fails` } : null);
  const seen = [];
  const cost = (e) => {
    seen.push([e.code, e.details]);
    return e.code === grpc.status.DEADLINE_EXCEEDED ? 10 : 5;
  };
  const { backend, budget, client } = await rig(t, decide, 20, { initialBackoffMs: 1, maxBackoffMs: 2, cost });
  const reply = await echo(client, 'hi').promise;
  assert.equal(reply.attemptsSeen, 3);
  assert.deepEqual(seen, [[grpc.status.UNAVAILABLE, 'attempt 1 fails'], [grpc.status.DEADLINE_EXCEEDED, 'attempt 2 fails']]);
  const s = budget.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.requests, s.successes], [5, 2, 15, 1, 1]);
  // 5 left: the retry after UNAVAILABLE takes them; the one after the timeout (10) is denied
  // whole, and the caller gets the status marked as exhausted.
  await assert.rejects(echo(client, 'x').promise, (e) => e.code === grpc.status.DEADLINE_EXCEEDED && e.metadata.get('retry-budget-exhausted')[0] === '2');
  assert.equal(backend.attempts.length, 3 + 2);
  assert.deepEqual([budget.stats().tokensHeld, budget.stats().retriesDenied, budget.stats().requests], [0, 1, 2]);
});

test('a cost function returning a bad cost ends the call with INTERNAL naming options.cost; a bad number is refused when the interceptor is made', async (t) => {
  const { backend, budget, client } = await rig(t, failFirst(5), 10, { initialBackoffMs: 1, maxBackoffMs: 2, cost: () => 2.5 });
  await assert.rejects(echo(client, 'x').promise, (e) => e.code === grpc.status.INTERNAL && /options\.cost returned 2\.5/.test(e.details) && /last attempt: 14 attempt 1 fails/.test(e.details));
  assert.equal(backend.attempts.length, 1);
  assert.equal(budget.stats().tokensHeld, 10);
  assert.throws(() => retryInterceptor(budget, { cost: 0 }), (e) => e instanceof RangeError && /options\.cost is 0/.test(e.message));
});

test('cancelling the call during a backoff refunds the retry\'s whole cost', async (t) => {
  const { backend, budget, client } = await rig(t, failFirst(100, grpc.status.UNAVAILABLE, 10_000), 10, { cost: 3 });
  const { promise, call } = echo(client, 'x', { deadlineMs: 60_000 });
  await waitUntil(() => backend.attempts.length === 1 && budget.stats().tokensHeld === 7, { what: 'the backoff' });
  call.cancel();
  await assert.rejects(promise, (e) => e.code === grpc.status.CANCELLED);
  assert.deepEqual([budget.stats().tokensHeld, budget.stats().refunds, budget.stats().retriesAllowed, budget.stats().tokensSpent], [10, 1, 0, 0]);
});
