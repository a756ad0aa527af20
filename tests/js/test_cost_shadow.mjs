// Issue 36's client rules against the real server: a retry of cost 5 takes 5 tokens of the
// server's bucket (the server counts tokens in retries_total and retries in
// retries_allowed_total, and the call's one request), a shadow tenant denies nothing, reports
// its would-be denials and follows a live switch to enforce.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BudgetClient, BudgetExhaustedError, callWithRetry, Status, grpc } from '../../client/js/src/index.js';
import { AdminClient, startServer, getBudget, waitUntil } from './helpers.mjs';

const unavailable = () => Object.assign(new Error('14 UNAVAILABLE: down'), { code: Status.UNAVAILABLE, details: 'down', metadata: new grpc.Metadata() });
const fixed = (tenant, capacity, extra = '') => `tenants { tenant: "${tenant}" policy { capacity: ${capacity} refill_per_second: 0 success_credit: 0 initial_tokens: ${capacity} lease_ttl_ms: 5000 ${extra} } }\n`;

test('a retry of cost 5 takes 5 tokens of the server\'s bucket; retries_total counts tokens, retries_allowed_total retries', async (t) => {
  const server = await startServer(t, fixed('cost', 22));
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, leaseBurst: 22, logger: () => {} });
  const budget = client.tenant('cost');
  await waitUntil(() => budget.stats().tokensHeld === 22, { what: 'the whole bucket leased' });
  await assert.rejects(callWithRetry(budget, async () => { throw unavailable(); }, { maxAttempts: 10, initialBackoffMs: 0, maxBackoffMs: 0, cost: 5 }),
    (e) => e instanceof BudgetExhaustedError && e.attempts === 5); // four retries of 5 from 22, the fifth denied
  const s = budget.stats();
  assert.deepEqual([s.retriesAllowed, s.tokensSpent, s.retriesDenied, s.requests, s.tokensHeld], [4, 20, 1, 1, 2]);
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 'cost');
  assert.deepEqual([Number(status.retriesTotal), Number(status.retriesAllowedTotal), Number(status.requestsTotal), Number(status.retriesDeniedTotal)], [20, 4, 1, 1]);
  assert.equal(Number(status.tokens), 2, 'the 2 left went back with the final Sync');
});

test('a shadow tenant denies nothing, reports its would-be denials, and follows a live switch to enforce', async (t) => {
  const server = await startServer(t, fixed('dry', 3, 'mode: MODE_SHADOW'));
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, leaseBurst: 3, logger: () => {} });
  const budget = client.tenant('dry');
  await waitUntil(() => budget.stats().tokensHeld === 3, { what: 'the whole bucket leased' });
  assert.equal(budget.shadow, true);
  for (let i = 0; i < 10; i++) assert.equal(budget.tryAcquire(), true, `retry ${i} allowed`);
  const s = budget.stats();
  assert.deepEqual([s.retriesAllowed, s.retriesDenied, s.shadowDenied, s.unbacked], [3, 0, 7, 7]);
  await waitUntil(async () => Number((await getBudget(server.target, 'dry')).shadowDeniedTotal) === 7, { what: 'the would-be denials reported' });
  // Switched to enforce live: the client follows within a refresh period, no restart.
  const admin = new AdminClient(server.target);
  t.after(() => admin.close());
  await admin.putPolicy('dry', { capacity: 3, refillPerSecond: 0, successCredit: 0, leaseTtlMs: 5000, mode: 1 });
  await waitUntil(() => !budget.shadow, { what: 'the switch to enforce' });
  assert.equal(budget.tryAcquire(), false);
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 'dry');
  assert.deepEqual([Number(status.shadowDeniedTotal), Number(status.retriesDeniedTotal), Number(status.retriesTotal)], [7, 1, 3]);
});

test('a windowed tenant: the helpers report each call\'s request once, and the tokens spent stay within floor * ttl + retry_ratio * requests', async (t) => {
  // A floor of 0.5 retries a second over a window of 10 s (5 tokens), and 0.5 a request.
  const server = await startServer(t, 'tenants { tenant: "window" policy { retry_ratio: 0.5 min_retries_per_second: 0.5 ttl_ms: 10000 } }\n');
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, logger: () => {} });
  const budget = client.tenant('window');
  assert.equal(await budget.ready(), 'lease');
  for (let i = 0; i < 40; i++) assert.equal(await callWithRetry(budget, async () => i), i);
  const deadline = Date.now() + 1500;
  while (Date.now() < deadline) {
    budget.tryAcquire(2); // a retry of 2 tokens: the bound counts tokens
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  assert.equal(await client.close(), null);
  const s = budget.stats();
  const status = await getBudget(server.target, 'window');
  t.diagnostic(`floor 5 + 40 requests at 0.5: ${s.retriesAllowed} retries of 2 allowed (${s.tokensSpent} tokens); the server counts ${status.requestsTotal} requests, ${status.retriesTotal} tokens`);
  assert.equal(s.requests, 40);
  assert.equal(Number(status.requestsTotal), 40, 'each request reported once');
  assert.ok(s.tokensSpent <= 5 + 0.5 * 40, `${s.tokensSpent} tokens spent, the bound is 25`);
  assert.equal(s.tokensSpent, 2 * s.retriesAllowed);
  assert.equal(Number(status.retriesTotal), s.tokensSpent);
  assert.equal(Number(status.retriesAllowedTotal), s.retriesAllowed);
});

test('a windowed tenant in fallback: requests fund the local bucket with the share\'s request_credit, once each, reported as credited locally', async (t) => {
  // The server's safe share of this policy: capacity floor * ttl = 5, refill 0.5/s, request_credit 1.
  const server = await startServer(t, 'tenants { tenant: "wfb" policy { retry_ratio: 1 min_retries_per_second: 0.5 ttl_ms: 10000 lease_ttl_ms: 200 } }\n');
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, syncTimeoutMs: 200, logger: () => {} });
  const budget = client.tenant('wfb');
  assert.equal(await budget.ready(), 'lease');
  await waitUntil(() => budget.stats().tokensHeld > 0, { what: 'a lease' }); // a safe share noted
  await server.kill();
  await waitUntil(() => budget.mode === 'fallback', { what: 'fallback' });
  assert.equal(budget.tryAcquire(5), true, 'the bucket starts full');
  for (let i = 0; i < 3; i++) budget.recordRequest();
  await waitUntil(() => budget.stats().requestsCreditedLocally === 3, { what: 'the requests credited' });
  assert.ok(budget.tryAcquire(3), 'three requests at 1 token each');
  await server.restart();
  await waitUntil(() => budget.mode === 'lease', { what: 'a lease again' });
  const s = budget.stats();
  assert.deepEqual([s.requests, s.requestsCreditedLocally], [3, 3], 'credited once, never again');
  assert.ok(s.fallbackAllowed >= 8, `${s.fallbackAllowed} fallback tokens spent`);
  assert.equal(await client.close(), null);
});

test('a windowed tenant: requests recorded by the helpers deposit retry_ratio each, and fund that many retries', async (t) => {
  const server = await startServer(t, 'tenants { tenant: "ratio" policy { retry_ratio: 1 min_retries_per_second: 0 ttl_ms: 10000 } }\n');
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, leaseBurst: 10, logger: () => {} });
  const budget = client.tenant('ratio');
  assert.equal(await budget.ready(), 'lease');
  assert.equal(budget.tryAcquire(), false, 'no request yet: no deposit, no floor');
  // Five calls succeed at once: five requests, no retry.
  for (let i = 0; i < 5; i++) assert.equal(await callWithRetry(budget, async () => i), i);
  assert.equal(budget.stats().requests, 5);
  await waitUntil(() => budget.stats().tokensHeld === 5, { what: 'the five deposits leased' });
  assert.equal(budget.tryAcquire(5), true);
  assert.equal(budget.tryAcquire(), false);
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 'ratio');
  assert.deepEqual([Number(status.requestsTotal), Number(status.retriesTotal)], [5, 5]);
});
