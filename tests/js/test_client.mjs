// The JS client against the real server: leases, the final Sync (close() and
// Symbol.asyncDispose), a lost response resent with the same seq, lease expiry, many
// concurrent async callers on one tenant, and a process that exits with its client open.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { BudgetClient, ClientClosedError, callWithRetry, Status } from '../../client/js/src/index.js';
import { startServer, policy, waitUntil, getBudget, SOURCE_DIR } from './helpers.mjs';
import { SyncProxy } from './sync_proxy.mjs';

// A bucket that never refills and earns nothing: every token is accounted for.
const fixed = (capacity, ttlMs = 5000) => policy('t', { capacity, refill: 0, credit: 0, ttlMs });

test('close() sends a final Sync returning every unspent token; the server counts what was spent', async (t) => {
  const server = await startServer(t, fixed(40));
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, leaseBurst: 10 });
  assert.throws(() => client.tenant('bad name'), { name: 'TypeError', message: /tenant "bad name" is malformed/ });
  const budget = client.tenant('t');
  assert.equal(client.tenant('t'), budget);
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  assert.ok(budget.tryAcquire());
  assert.ok(budget.tryAcquire());
  budget.recordSuccess();
  assert.ok((await getBudget(server.target, 't')).tokens < 38); // the lease is out of the bucket
  assert.equal(await client.close(), null);
  const stats = budget.stats();
  assert.equal(stats.retriesAllowed, 2);
  assert.equal(stats.tokensHeld, 0);
  assert.equal(stats.tokensReturned, stats.tokensReceived - 2);
  assert.equal(budget.tryAcquire(), false); // closed: deny for good
  const status = await getBudget(server.target, 't');
  assert.ok(Math.abs(status.tokens - 38) < 1e-6, `tokens ${status.tokens}`);
  assert.equal(status.retriesTotal, 2);
  assert.equal(status.successesTotal, 1);
  assert.equal(await client.close(), null); // idempotent
  assert.throws(() => client.tenant('other'), ClientClosedError);
});

test('Symbol.asyncDispose is close()', async (t) => {
  const server = await startServer(t, fixed(30));
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50 });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  assert.ok(budget.tryAcquire());
  await client[Symbol.asyncDispose]();
  assert.ok(Math.abs((await getBudget(server.target, 't')).tokens - 29) < 1e-6);
});

test('a lost response is resent with the same seq and content; spending equals the server\'s count', async (t) => {
  const server = await startServer(t, fixed(100));
  const proxy = await SyncProxy.start(server.target);
  t.after(() => proxy.stop());
  const client = new BudgetClient({ target: proxy.target, refreshPeriodMs: 200, leaseBurst: 4 });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  for (let i = 0; i < 3; i++) assert.ok(budget.tryAcquire());
  const seen = proxy.requests.length;
  proxy.dropNext = 1;
  await waitUntil(() => proxy.dropped.length === 1 && proxy.requests.length >= seen + 2, { what: 'the resend' });
  const lost = proxy.dropped[0];
  const sameSeq = proxy.requests.filter((r) => r.seq === lost.seq);
  assert.ok(sameSeq.length >= 2, 'the lost request went out again');
  assert.deepEqual(sameSeq[1], lost); // unchanged
  assert.equal(proxy.requests[proxy.requests.indexOf(sameSeq[0]) + 1], sameSeq[1], 'the very next request is the resend');
  assert.equal(sameSeq[0].tenants[0].retriesSpent, 3);
  // The resend's answer (the server's same grant) lands.
  await waitUntil(() => budget.stats().tokensReceived > lost.tenants[0].tokensReceived, { what: 'the resend\'s grant' });
  for (let i = 0; i < 2; i++) budget.tryAcquire();
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 't');
  assert.equal(status.retriesTotal, budget.stats().retriesAllowed);
  assert.equal(status.reclaimedTotal, 0); // the resend got the same answer: nothing reclaimed
  const seqs = proxy.requests.map((r) => r.seq);
  assert.deepEqual([...seqs].sort((a, b) => a - b), seqs, 'seq never goes back');
});

test('a lease ends at its first send + TTL when no response arrives, then the fallback share', async (t) => {
  const server = await startServer(t, fixed(8, 300));
  const proxy = await SyncProxy.start(server.target);
  t.after(() => proxy.stop());
  const client = new BudgetClient({ target: proxy.target, refreshPeriodMs: 50, syncTimeoutMs: 300, fallbackCapacity: 0, fallbackRefillPerSecond: 0 });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  proxy.dropAll = true;
  const since = Date.now();
  await waitUntil(() => budget.mode !== 'lease', { timeoutMs: 10_000, what: 'the lease to end' });
  const ended = Date.now() - since;
  // Tolerant of a loaded machine: the point is that it ends (at first send + 300 ms).
  assert.ok(ended < 6000, `the 300 ms lease lasted ${ended} ms without a response`);
  assert.equal(budget.mode, 'fallback'); // unreachable as far as the client knows
  let allowed = 0;
  for (let i = 0; i < 100; i++) if (budget.tryAcquire()) allowed++;
  assert.ok(allowed <= 8, `${allowed} from the fallback bucket (the safe share is at most 8)`);
  proxy.dropAll = false;
  await waitUntil(() => budget.mode === 'lease', { timeoutMs: 10_000, what: 'a lease again' });
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 't');
  assert.equal(status.retriesTotal, budget.stats().retriesAllowed);
  assert.equal(status.fallbackRetriesTotal, allowed);
});

test('many concurrent async callers on one tenant: the server counts exactly what they spent', async (t) => {
  const server = await startServer(t, policy('t', { capacity: 200, refill: 50, credit: 0.5, ttlMs: 2000 }));
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50 });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  let retries = 0;
  let exhausted = 0;
  let successes = 0;
  const end = Date.now() + 1500;
  let seed = 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const worker = async () => {
    while (Date.now() < end) {
      try {
        await callWithRetry(budget, async (attempt) => {
          if (attempt.number > 1) retries++;
          await new Promise((r) => setImmediate(r));
          if (rnd() < 0.5) throw Object.assign(new Error('flaky'), { code: Status.UNAVAILABLE, details: 'flaky' });
        }, { initialBackoffMs: 1, maxBackoffMs: 2, maxAttempts: 5 });
        successes++;
      } catch (e) {
        if (e.name === 'BudgetExhaustedError') exhausted++;
      }
    }
  };
  await Promise.all(Array.from({ length: 64 }, worker));
  assert.equal(await client.close(), null);
  const stats = budget.stats();
  assert.equal(stats.retriesAllowed, retries);
  assert.equal(stats.successes, successes);
  const status = await getBudget(server.target, 't');
  assert.equal(status.retriesTotal, retries);
  assert.equal(status.successesTotal, successes);
  assert.ok(retries > 20 && successes > 20, `retries ${retries}, successes ${successes}, exhausted ${exhausted}`);
});

test('a process exits by itself with its client still open (the refresher timer is unref()ed)', async (t) => {
  const server = await startServer(t, fixed(20));
  const script = `
    import { BudgetClient } from ${JSON.stringify(path.join(SOURCE_DIR, 'client/js/src/index.js'))};
    const client = new BudgetClient({ target: process.argv[1], refreshPeriodMs: 50 });
    const budget = client.tenant('t');
    const t0 = Date.now();
    while (!budget.stats().leaseActive && Date.now() - t0 < 10000) await new Promise((r) => setTimeout(r, 5));
    console.log(budget.stats().leaseActive ? 'leased' : 'no lease');
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script, server.target], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  const killer = setTimeout(() => child.kill('SIGKILL'), 15_000);
  const [code, signal] = await new Promise((resolve) => child.on('exit', (c, s) => resolve([c, s])));
  clearTimeout(killer);
  assert.equal(out.trim(), 'leased');
  assert.equal(signal, null, 'killed: the open client kept the process alive');
  assert.equal(code, 0);
});

test('the bearer token is sent; a refusal (UNAUTHENTICATED / PERMISSION_DENIED) denies without falling back', async (t) => {
  const { createHash } = await import('node:crypto');
  const sha = (s) => createHash('sha256').update(s).digest('hex');
  const server = await startServer(t, `${fixed(10)}credentials { name: "w" token_sha256: "${sha('s3cret-token')}" tenants: "t" }\n`);
  const good = new BudgetClient({ target: server.target, refreshPeriodMs: 50, bearerToken: 's3cret-token' });
  const g = good.tenant('t');
  await waitUntil(() => g.stats().leaseActive, { what: 'a lease with the token' });
  assert.equal(await good.close(), null);
  const bad = new BudgetClient({ target: server.target, refreshPeriodMs: 50, bearerToken: 'wrong', fallbackCapacity: 5, logger: () => {} });
  const b = bad.tenant('t');
  await waitUntil(() => bad.lastSyncStatus() !== null, { what: 'a refused Sync' });
  assert.match(bad.lastSyncStatus(), /^(UNAUTHENTICATED|PERMISSION_DENIED): /);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(b.mode, 'no_lease'); // refused, not unreachable: no fallback bucket
  assert.equal(b.tryAcquire(), false);
  await bad.close();
});

test('round_robin over an ipv4:a,b,c target: the Syncs of one client reach every address', async (t) => {
  const servers = [];
  for (let i = 0; i < 3; i++) servers.push(await startServer(t, fixed(50)));
  const target = `ipv4:${servers.map((s) => s.target).join(',')}`;
  const client = new BudgetClient({ target, refreshPeriodMs: 20, minSyncIntervalMs: 1 });
  const budget = client.tenant('t');
  await waitUntil(async () => {
    const seen = await Promise.all(servers.map((s) => getBudget(s.target, 't').then(() => true, () => false)));
    return seen.every(Boolean);
  }, { timeoutMs: 10_000, what: 'a Sync at every address' });
  assert.ok(budget.stats().tokensReceived > 0);
  await client.close();
});
