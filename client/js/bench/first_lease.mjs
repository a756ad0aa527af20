#!/usr/bin/env node
// Time from creating a tenant handle to its first lease, on loopback against the real server
// (started here on port 0 from a temporary directory), over N fresh clients:
//
//  * fresh: `new BudgetClient(...)` then at once `client.tenant(...)`: the handle's first Sync
//    also opens the connection (what a CLI or an agent that starts, calls and retries sees).
//  * live: a client already connected (another tenant leased), then a new tenant handle: one
//    Sync round trip.
//  * cold: a new Node process per sample (--processes of them) that imports the package,
//    makes a client and at once a tenant handle: the handle -> lease time, and the time from
//    the process's start to the lease (what a CLI that starts, calls and retries sees).
//
// Each time ends when `await budget.ready()` resolves; a sample counts only if the tenant then
// holds a lease (tokens > 0), so a fallback or a denial is never timed as a lease.
//
// The baseline, in the same run: `cold bare grpc-js`, a new Node process per sample that loads
// the same .proto with @grpc/proto-loader, makes a bare grpc-js stub and sends one Sync asking
// for a token, timed from making the stub to the response (one connection set-up and one
// Sync, with nothing of this package's), and the cold handle -> lease time as a ratio of it.
//
//   node client/js/bench/first_lease.mjs [--server=BIN] [--clients=100] [--processes=20]
//
// BIN defaults to $RETRY_BUDGET_SERVER_BIN. Prints one JSON line per mode (ms: median, p99,
// max) and the number of samples that were not leases (must be 0).

import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { BudgetClient } from '../src/index.js';
import { ServerProcess } from '../src/testing.js';

const arg = (name, dflt) => {
  const hit = process.argv.find((a) => a.startsWith(`--${name}=`));
  return hit === undefined ? dflt : hit.slice(name.length + 3);
};
const N = Number(arg('clients', '100'));
const PROCESSES = Number(arg('processes', '20'));

// One cold sample: run as `first_lease.mjs --cold=TARGET` in a process of its own.
const coldTarget = arg('cold', '');
if (coldTarget !== '') {
  const { BudgetClient: Client } = await import('../src/index.js');
  const client = new Client({ target: coldTarget, logger: () => {} });
  const t0 = performance.now();
  const budget = client.tenant('cold');
  await budget.ready();
  const t1 = performance.now();
  console.log(JSON.stringify({ handle_ms: t1 - t0, start_ms: t1, leased: budget.stats().tokensHeld > 0 }));
  await client.close();
  process.exit(0);
}
// One baseline sample: `first_lease.mjs --cold-bare=TARGET`, in a process of its own.
const bareTarget = arg('cold-bare', '');
if (bareTarget !== '') {
  const grpc = await import('@grpc/grpc-js');
  const { budgetServices } = await import('../src/proto.js');
  const { RetryBudgetService } = budgetServices();
  const t0 = performance.now();
  const stub = new RetryBudgetService(bareTarget, grpc.credentials.createInsecure());
  const request = { instanceId: `bare-${process.pid}`, seq: 1, tenants: [{ tenant: 'cold-bare', want: 1 }], final: false };
  const response = await new Promise((resolve, reject) => {
    stub.Sync(request, { deadline: Date.now() + 30_000 }, (err, r) => (err ? reject(err) : resolve(r)));
  });
  const t1 = performance.now();
  console.log(JSON.stringify({ handle_ms: t1 - t0, start_ms: t1, leased: response.tenants[0].granted > 0 }));
  stub.close();
  process.exit(0);
}
const binary = arg('server', process.env.RETRY_BUDGET_SERVER_BIN ?? '');
if (binary === '' || !(N >= 1)) {
  console.error('usage: first_lease.mjs --server=BIN (or RETRY_BUDGET_SERVER_BIN) [--clients=N]');
  process.exit(2);
}

const dir = mkdtempSync(path.join(os.tmpdir(), 'rb-first-lease-'));
const policy = path.join(dir, 'policy.textproto');
// Enough tokens that no sample is ever denied by the bucket.
writeFileSync(policy, 'default_policy { capacity: 1000000 refill_per_second: 100000 success_credit: 0 initial_tokens: 1000000 lease_ttl_ms: 10000 }\n');
const server = await new ServerProcess(binary, dir, [`--policy=${policy}`]).start();

function summary(mode, samples, notLeased) {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
  return { mode, clients: samples.length, median_ms: +at(0.5).toFixed(2), p99_ms: +at(0.99).toFixed(2), max_ms: +s[s.length - 1].toFixed(2), not_leased: notLeased };
}

try {
  const fresh = [];
  const live = [];
  let freshMisses = 0;
  let liveMisses = 0;
  for (let i = 0; i < N; i++) {
    const client = new BudgetClient({ target: server.target, logger: () => {} });
    let t0 = performance.now();
    const first = client.tenant(`fresh-${i}`);
    await first.ready();
    fresh.push(performance.now() - t0);
    if (first.stats().tokensHeld === 0) freshMisses++;
    t0 = performance.now();
    const second = client.tenant(`live-${i}`);
    await second.ready();
    live.push(performance.now() - t0);
    if (second.stats().tokensHeld === 0) liveMisses++;
    await client.close();
  }
  console.log(JSON.stringify(summary('fresh', fresh, freshMisses)));
  console.log(JSON.stringify(summary('live', live, liveMisses)));
  const handle = [];
  const start = [];
  let coldMisses = 0;
  const bare = [];
  let bareMisses = 0;
  for (let i = 0; i < PROCESSES; i++) {
    const r = JSON.parse(execFileSync(process.execPath, [import.meta.filename, `--cold=${server.target}`], { timeout: 60_000 }).toString());
    handle.push(r.handle_ms);
    start.push(r.start_ms);
    if (!r.leased) coldMisses++;
    // The baseline's sample right after, in turns, so that neither side runs on a quieter box.
    const b = JSON.parse(execFileSync(process.execPath, [import.meta.filename, `--cold-bare=${server.target}`], { timeout: 60_000 }).toString());
    bare.push(b.handle_ms);
    if (!b.leased) bareMisses++;
  }
  if (PROCESSES > 0) {
    const cold = summary('cold (handle -> lease)', handle, coldMisses);
    const baseline = summary('cold bare grpc-js (stub -> Sync response)', bare, bareMisses);
    console.log(JSON.stringify(cold));
    console.log(JSON.stringify(summary('cold (process start -> lease)', start, coldMisses)));
    console.log(JSON.stringify(baseline));
    console.log(JSON.stringify({ mode: 'cold ratio (median handle -> lease / median bare Sync)', ratio: +(cold.median_ms / baseline.median_ms).toFixed(2) }));
  }
} finally {
  await server.kill();
  rmSync(dir, { recursive: true, force: true });
}
