// The JS client when the server is unreachable: the configured bucket for a server never
// reached, deny mode, and kill -9 -> the safe share -> restart on the same port (same
// --data_dir) -> leases again. Never failing open.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { BudgetClient } from '../../client/js/src/index.js';
import { startServer, policy, waitUntil, getBudget } from './helpers.mjs';

async function unusedPort() {
  const s = net.createServer();
  await new Promise((resolve) => s.listen(0, '127.0.0.1', resolve));
  const { port } = s.address();
  await new Promise((resolve) => s.close(resolve));
  return port;
}

test('a client that never reached a server gets the configured bucket only', async () => {
  const client = new BudgetClient({ target: `127.0.0.1:${await unusedPort()}`, refreshPeriodMs: 50, syncTimeoutMs: 200, fallbackCapacity: 2, fallbackRefillPerSecond: 0, logger: () => {} });
  const budget = client.tenant('t');
  await waitUntil(() => budget.mode === 'fallback', { what: 'fallback' });
  let allowed = 0;
  for (let i = 0; i < 100; i++) if (budget.tryAcquire()) allowed++;
  assert.equal(allowed, 2);
  assert.equal(budget.stats().fallbackAllowed, 2);
  assert.equal(budget.stats().retriesDenied, 98);
  assert.match(await client.close(), /^UNAVAILABLE: /); // nothing could be reported: close() says so
});

test('deny mode allows nothing while the server is unreachable', async () => {
  const client = new BudgetClient({ target: `127.0.0.1:${await unusedPort()}`, refreshPeriodMs: 50, syncTimeoutMs: 200, fallback: 'deny', logger: () => {} });
  const budget = client.tenant('t');
  await waitUntil(() => budget.mode === 'deny_fallback', { what: 'deny' });
  for (let i = 0; i < 100; i++) assert.equal(budget.tryAcquire(), false);
  await client.close();
});

test('kill -9 means the safe share until the lease ends, then fallback; a restart on the same port means leases', async (t) => {
  // Capacity 8, no refill: this one instance's safe share is the whole bucket.
  const server = await startServer(t, policy('t', { capacity: 8, refill: 0, credit: 0, ttlMs: 300 }));
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, syncTimeoutMs: 300, fallbackCapacity: 0, fallbackRefillPerSecond: 0, logger: () => {} });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  const leased = budget.tryAcquire() ? 1 : 0; // the bucket keeps tokens to grant after the restart
  await server.kill();
  await waitUntil(() => budget.mode === 'fallback', { timeoutMs: 5000, what: 'fallback after the kill' });
  let inFallback = 0;
  for (let i = 0; i < 100; i++) if (budget.tryAcquire()) inFallback++;
  // The safe share (capacity 8 for the only instance), not the configured 0, and never more.
  assert.ok(inFallback >= 1 && inFallback <= 8, `${inFallback} in fallback`);
  assert.equal(budget.stats().fallbackAllowed, inFallback);
  assert.ok(budget.fallbackAllowance(client.now()) >= inFallback);
  const receivedBefore = budget.stats().tokensReceived;
  await server.restart();
  // A lease again (of no tokens: the restarted server charged the fallback spending to the
  // bucket, which never refills).
  await waitUntil(() => budget.mode === 'lease', { timeoutMs: 10_000, what: 'a lease from the restarted server' });
  assert.equal(client.lastSyncStatus(), null);
  assert.equal(budget.stats().tokensReceived, receivedBefore);
  assert.equal(await client.close(), null);
  const stats = budget.stats();
  assert.equal(stats.fallbackAllowed, inFallback);
  assert.equal(stats.tokensHeld, 0);
  // The restarted server (its state from --data_dir) never counts more than was spent.
  const status = await getBudget(server.target, 't');
  assert.ok(status.retriesTotal <= stats.retriesAllowed, `server ${status.retriesTotal} > client ${stats.retriesAllowed}`);
  assert.ok(status.fallbackRetriesTotal <= inFallback);
  assert.equal(leased, 1);
});
