// The fleet worker (tools/fleet/js_worker/worker.mjs) with the real server: the ready/go
// protocol, its one JSON line with mixed_fleet.py's fields, its counts equal to the library's
// and to the server's, and exit 3 on anything but `go`.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { startServer, policy, getBudget, SOURCE_DIR } from './helpers.mjs';

const WORKER = path.join(SOURCE_DIR, 'tools/fleet/js_worker/worker.mjs');

function startWorker(args) {
  const child = spawn(process.execPath, [WORKER, ...args], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  const lines = [];
  const waiters = [];
  child.stdout.on('data', (d) => {
    out += d;
    let i;
    while ((i = out.indexOf('\n')) >= 0) {
      lines.push(out.slice(0, i));
      out = out.slice(i + 1);
      while (waiters.length > 0 && lines.length > 0) waiters.shift()(lines.shift());
    }
  });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  const line = () => (lines.length > 0 ? Promise.resolve(lines.shift()) : new Promise((resolve) => waiters.push(resolve)));
  return { child, exited, line };
}

test('the worker protocol: ready, go, one JSON line; counts as the library\'s and the server\'s', async (t) => {
  const server = await startServer(t, policy('fleet', { capacity: 50, refill: 20, credit: 0.1, ttlMs: 1000 }));
  const w = startWorker([`--server=${server.target}`, '--tenant=fleet', '--threads=8', '--duration=1.0', '--failure-rate=0.3', '--call-latency=0.001', '--seed=5']);
  assert.equal(await w.line(), 'ready');
  w.child.stdin.write('go\n');
  const r = JSON.parse(await w.line());
  assert.equal(await w.exited, 0);
  for (const k of ['calls', 'attempts', 'successes', 'failures', 'retries_allowed', 'retries_denied', 'lib_retries_allowed', 'lib_fallback_allowed', 'lib_tokens_held']) {
    assert.ok(Number.isInteger(r[k]), `${k} is an integer: ${r[k]}`);
  }
  for (const k of ['fallback_allowance', 'max_try_acquire_ms']) assert.equal(typeof r[k], 'number');
  for (const k of ['saw_fallback', 'lease_after_fallback']) assert.equal(typeof r[k], 'boolean');
  assert.equal(r.shutdown_status, 'OK');
  assert.equal(r.calls, r.successes + r.failures);
  assert.equal(r.attempts, r.calls + r.retries_allowed);
  // A call fails when its retry is denied, or when the run ends during it (at most one such
  // call per loop: 8).
  assert.ok(r.failures >= r.retries_denied && r.failures <= r.retries_denied + 8, `failures ${r.failures}, denied ${r.retries_denied}`);
  assert.equal(r.lib_retries_allowed, r.retries_allowed);
  assert.equal(r.lib_requests, r.calls, 'one request recorded a call');
  assert.equal(r.lib_tokens_held, 0);
  assert.equal(r.saw_fallback, false);
  assert.ok(r.calls > 100 && r.retries_allowed > 0, JSON.stringify(r));
  const status = await getBudget(server.target, 'fleet');
  assert.equal(status.retriesTotal, r.retries_allowed);
  assert.equal(status.successesTotal, r.successes);
  assert.equal(Number(status.requestsTotal), r.calls);
});

test('anything but go: exit 3; bad arguments: exit 2', async () => {
  const w = startWorker(['--server=127.0.0.1:1', '--tenant=x']);
  assert.equal(await w.line(), 'ready');
  w.child.stdin.write('stop\n');
  assert.equal(await w.exited, 3);
  const bad = startWorker(['--server=127.0.0.1:1', '--tenant=x', '--threads=zero']);
  assert.equal(await bad.exited, 2);
});

test('three JS workers on one tenant stay within the budget, through a kill -9 and restart of the server', { timeout: 60_000 }, async (t) => {
  const capacity = 20;
  const refill = 10;
  const credit = 0.1;
  const server = await startServer(t, policy('fleet3', { capacity, refill, credit, ttlMs: 500 }));
  const workers = [1, 2, 3].map((seed) => startWorker([`--server=${server.target}`, '--tenant=fleet3', '--threads=4', '--duration=3.0', '--failure-rate=0.5', '--call-latency=0.002', `--seed=${seed}`]));
  for (const w of workers) assert.equal(await w.line(), 'ready');
  const start = Date.now();
  for (const w of workers) w.child.stdin.write('go\n');
  await new Promise((r) => setTimeout(r, 1000));
  await server.kill();
  await new Promise((r) => setTimeout(r, 700));
  await server.restart();
  const results = await Promise.all(workers.map(async (w) => JSON.parse(await w.line())));
  const elapsed = (Date.now() - start) / 1000;
  for (const w of workers) assert.equal(await w.exited, 0);
  const retries = results.reduce((a, r) => a + r.retries_allowed, 0);
  const successes = results.reduce((a, r) => a + r.successes, 0);
  const fallback = results.reduce((a, r) => a + r.fallback_allowance, 0);
  // The budget: the bucket's capacity + refill over the run + the successes' credit, plus what
  // the fallback buckets may hand out while the server is down (their own record).
  const bound = capacity + refill * elapsed + credit * successes + fallback;
  assert.ok(retries <= bound, `retries ${retries} > bound ${bound.toFixed(1)} (${JSON.stringify(results)})`);
  assert.ok(results.some((r) => r.saw_fallback), 'the kill -9 was seen as fallback');
  assert.ok(results.every((r) => r.lib_retries_allowed === r.retries_allowed));
  // The budget is used, not hoarded: more than the first bucketful (the bucket caps the
  // successes' credit at its capacity, so the bound above is loose; the lead's mixed fleet
  // measures utilisation).
  assert.ok(retries > capacity + refill * 0.5, `retries ${retries}, bound ${bound.toFixed(1)}`);
});
