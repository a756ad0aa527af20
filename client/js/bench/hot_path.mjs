#!/usr/bin/env node
// The hot path against a bare counter, in the same run: ns per call of tryAcquire() (a lease
// that never runs dry: every take is refunded every 1,000 calls), recordSuccess(), and a bare
// `counter.n++` / `if (counter.n > 0) counter.n--` loop of the same shape; and the GCs seen
// during the TenantBudget loops (0: nothing allocated per call).
//
//   node client/js/bench/hot_path.mjs [--iterations=20000000] [--runs=5]
//
// Prints one JSON line per run and a summary line (medians, ratios to the bare counter).

import { PerformanceObserver, performance } from 'node:perf_hooks';
import { TenantBudget } from '../src/tenant-budget.js';

const arg = (name, dflt) => Number((process.argv.find((a) => a.startsWith(`--${name}=`)) ?? `=${dflt}`).split('=')[1]);
const N = arg('iterations', 20_000_000);
const RUNS = arg('runs', 5);

let gcs = 0;
const obs = new PerformanceObserver((list) => { gcs += list.getEntries().length; });
obs.observe({ entryTypes: ['gc'] });

const budget = new TenantBudget('bench', () => {}, 0, 'deny', { capacity: 0, refillPerSecond: 0 });
budget._deposit(2_000_000, 0);

function benchTryAcquire(n) {
  let allowed = 0;
  for (let i = 0; i < n; i++) {
    if (budget.tryAcquire()) allowed++;
    if ((i & 1023) === 1023) for (let k = 0; k < 1024; k++) budget.refund();
  }
  return allowed;
}

function benchRecordSuccess(n) {
  for (let i = 0; i < n; i++) budget.recordSuccess();
  return n;
}

const counter = { n: 2_000_000, refunds: 0 };
function benchBare(n) {
  let allowed = 0;
  for (let i = 0; i < n; i++) {
    if (counter.n > 0) { counter.n--; allowed++; }
    if ((i & 1023) === 1023) for (let k = 0; k < 1024; k++) { counter.n++; counter.refunds++; }
  }
  return allowed;
}

function time(fn, n) {
  const t0 = performance.now();
  const r = fn(n);
  const ns = ((performance.now() - t0) * 1e6) / n;
  if (r <= 0) throw new Error('nothing done');
  return ns;
}

// Warm-up (JIT).
time(benchTryAcquire, 1_000_000); time(benchRecordSuccess, 1_000_000); time(benchBare, 1_000_000);
await new Promise((r) => setTimeout(r, 50));

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rows = [];
for (let run = 0; run < RUNS; run++) {
  const bare = time(benchBare, N);
  await new Promise((r) => setTimeout(r, 20));
  const before = gcs;
  const acquire = time(benchTryAcquire, N);
  const success = time(benchRecordSuccess, N);
  await new Promise((r) => setTimeout(r, 50)); // gc entries are delivered asynchronously
  const row = { run, iterations: N, bare_counter_ns: +bare.toFixed(3), try_acquire_ns: +acquire.toFixed(3), record_success_ns: +success.toFixed(3), try_acquire_ratio: +(acquire / bare).toFixed(2), gcs_during_budget_loops: gcs - before };
  rows.push(row);
  console.log(JSON.stringify(row));
}
obs.disconnect();
console.log(JSON.stringify({
  summary: true, node: process.version, runs: RUNS, iterations: N,
  median_bare_counter_ns: median(rows.map((r) => r.bare_counter_ns)),
  median_try_acquire_ns: median(rows.map((r) => r.try_acquire_ns)),
  median_record_success_ns: median(rows.map((r) => r.record_success_ns)),
  median_try_acquire_ratio: median(rows.map((r) => r.try_acquire_ratio)),
  total_gcs_during_budget_loops: rows.reduce((a, r) => a + r.gcs_during_budget_loops, 0),
}));
