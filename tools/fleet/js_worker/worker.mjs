#!/usr/bin/env node
// The JS worker of the fleet of every language (tools/fleet/mixed_fleet.py runs it beside the
// C++, Python and Go workers on one tenant). The protocol is mixed_fleet.py's run_worker:
//
//   node tools/fleet/js_worker/worker.mjs --server=TARGET --tenant=T --threads=N
//        --duration=SECONDS --failure-rate=F --call-latency=SECONDS --seed=K
//        [--timeline-slice=SECONDS] [--retry-cost=N] [--call-interval=SECONDS] [--max-attempts=N]
//
//  1. prints `ready` once loaded and waits for the start signal on stdin: `go <origin>` (the
//     fleet's start, CLOCK_MONOTONIC microseconds: its timelines count from there,
//     tools/fleet/start_signal.h) or a bare `go` (from now); anything else: exit 3;
//  2. then creates its client (TARGET, default options) and the tenant's handle, waits for its
//     first answer (at most 3 s), and runs N
//     concurrent async loops for DURATION: a logical call is attempts to a simulated backend
//     (sleep CALL_LATENCY, fail with probability F), its request recorded (recordRequest())
//     before the first; a failed attempt is retried only when tryAcquire(N) allows (N tokens,
//     --retry-cost, default 1); a denied retry ends the call as failed, so does the end of the
//     run or --max-attempts attempts (0, the default: no cap); a success calls
//     recordSuccess(). With --call-interval each loop starts a call every that many seconds
//     (paced) instead of back to back. A monitor polls the tenant's mode every 10 ms;
//  3. closes the client (the final Sync) and prints ONE JSON line (fields as run_worker's, with
//     the timelines: calls, retries, denied retries and successes per --timeline-slice by the
//     call's start; requests and tokens per slice when recorded / taken),
//     then exits 0 (bad arguments: 2).
//
// With --backend=TARGET it is instead an open-loop worker of bench/metastable.py's fleet,
// calling a real backend: see open-loop.mjs.

import { createInterface } from 'node:readline';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep, setImmediate as yieldNow } from 'node:timers/promises';
import { BudgetClient } from '../../../client/js/src/index.js';

function parseArgs(argv) {
  const want = { server: 'string', tenant: 'string', threads: 'int', duration: 'float', 'failure-rate': 'float', 'call-latency': 'float', seed: 'int', 'timeline-slice': 'float', 'retry-cost': 'int', 'call-interval': 'float', 'max-attempts': 'int' };
  const args = { threads: 1, duration: 1, 'failure-rate': 0, 'call-latency': 0, seed: 1, 'timeline-slice': 0.1, 'retry-cost': 1, 'call-interval': 0, 'max-attempts': 0 };
  for (const a of argv) {
    const m = /^--([a-z-]+)=(.*)$/.exec(a);
    if (!m || !(m[1] in want)) throw new Error(`unknown argument ${JSON.stringify(a)}`);
    const v = want[m[1]] === 'string' ? m[2] : Number(m[2]);
    if (want[m[1]] !== 'string' && (!Number.isFinite(v) || (want[m[1]] === 'int' && !Number.isInteger(v)))) throw new Error(`--${m[1]} is ${JSON.stringify(m[2])}; expected a number`);
    args[m[1]] = v;
  }
  for (const k of ['server', 'tenant']) if (typeof args[k] !== 'string' || args[k] === '') throw new Error(`--${k} is required`);
  if (args.threads < 1) throw new Error(`--threads is ${args.threads}; it must be >= 1`);
  if (!(args['timeline-slice'] > 0)) throw new Error(`--timeline-slice is ${args['timeline-slice']}; it must be > 0`);
  if (args['retry-cost'] < 1 || args['retry-cost'] > 1000000) throw new Error(`--retry-cost is ${args['retry-cost']}; it must be in [1, 1000000]`);
  if (args['call-interval'] < 0) throw new Error(`--call-interval is ${args['call-interval']}; it must be >= 0`);
  return args;
}

// xorshift32, seeded per loop: each loop's failures are reproducible.
function rng(seed) {
  let s = (seed >>> 0) || 0x9e3779b9;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 2 ** 32;
  };
}

// The timelines' origin (CLOCK_MONOTONIC nanoseconds, a BigInt) a start signal gives a worker that
// read it at `nowNs`: the line's for `go <microseconds>`, `nowNs` for a bare `go`; null for
// anything else or an origin after `nowNs`.
function startSignalOriginNs(line, nowNs) {
  if (line === 'go') return nowNs;
  const m = /^go (\d+)$/.exec(line ?? '');
  if (!m) return null;
  const origin = BigInt(m[1]) * 1000n;
  return origin > nowNs ? null : origin;
}

function firstLine() {
  return new Promise((resolve) => {
    const rl = createInterface({ input: process.stdin });
    let done = false;
    rl.once('line', (line) => {
      done = true;
      rl.close();
      process.stdin.destroy(); // the rest of stdin is ignored (and must not keep the process alive)
      resolve(line.trim());
    });
    rl.once('close', () => { if (!done) resolve(null); });
  });
}

async function main() {
  // --backend=TARGET: the open-loop worker of bench/metastable.py (open-loop.mjs).
  if (process.argv.slice(2).some((a) => a.startsWith('--backend='))) {
    return (await import('./open-loop.mjs')).runOpenLoop(process.argv.slice(2));
  }
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`js_worker: ${error.message}\n`);
    return 2;
  }
  process.stdout.write('ready\n');
  const signal = await firstLine();
  // process.hrtime is CLOCK_MONOTONIC (libuv), the clock of the start signal's origin.
  const originNs = startSignalOriginNs(signal, process.hrtime.bigint());
  if (originNs === null) {
    process.stderr.write(`js_worker: bad start signal ${JSON.stringify(signal)} (want 'go' or 'go <CLOCK_MONOTONIC microseconds, not after now>')\n`);
    return 3;
  }
  const client = new BudgetClient({ target: args.server });
  const budget = client.tenant(args.tenant);
  // Calls start once the tenant's first answer is in (as the fleet tool's C++ workers do): a
  // client is in enforce mode and has no lease until then, and what it counts before it is the
  // server's baseline. Bounded, so a server that is down does not hold the run.
  await budget.ready(AbortSignal.timeout(3000)).catch(() => {});
  const totals = { calls: 0, attempts: 0, successes: 0, failures: 0, retries_allowed: 0, retries_denied: 0, requests: 0, tokens_spent: 0 };
  let maxTryAcquire = 0;
  const begin = performance.now();
  const end = begin + args.duration * 1000;
  // Per slice of --timeline-slice seconds from the start signal's origin (the fleet's start,
  // however late this worker began), by the call's start.
  const sliceMs = args['timeline-slice'] * 1000;
  const sinceOriginMs = () => Number(process.hrtime.bigint() - originNs) / 1e6;
  const slices = Math.floor((sinceOriginMs() + args.duration * 1000) / sliceMs) + 2;
  const timelines = { calls: new Array(slices).fill(0), retries: new Array(slices).fill(0), denied: new Array(slices).fill(0), successes: new Array(slices).fill(0) };
  // Counted when the request is recorded and when the tokens are taken (the windowed bound).
  const atTimelines = { requests: [], tokens: [] };
  const countAt = (timeline, n) => {
    const i = Math.max(0, Math.floor(sinceOriginMs() / sliceMs));
    while (timeline.length <= i) timeline.push(0);
    timeline[i] += n;
  };
  const cost = args['retry-cost'];
  const intervalMs = args['call-interval'] * 1000;
  const latencyMs = args['call-latency'] * 1000;
  const failureRate = args['failure-rate'];

  const loop = async (seed) => {
    const random = rng(seed);
    for (let k = 0; ; k++) {
      if (intervalMs > 0) {
        const wait = begin + k * intervalMs - performance.now();
        if (wait > 0) await sleep(wait);
      }
      const now = performance.now();
      if (now >= end) break;
      const slice = Math.min(Math.floor(sinceOriginMs() / sliceMs), slices - 1); // < slices - 1: now < end
      totals.calls++;
      timelines.calls[slice]++;
      budget.recordRequest();
      totals.requests++;
      countAt(atTimelines.requests, 1);
      for (let attempt = 1; ; attempt++) {
        totals.attempts++;
        if (latencyMs > 0) await sleep(latencyMs);
        else await yieldNow();
        if (random() >= failureRate) {
          budget.recordSuccess();
          totals.successes++;
          timelines.successes[slice]++;
          break;
        }
        if ((args['max-attempts'] > 0 && attempt >= args['max-attempts']) || performance.now() >= end) {
          totals.failures++;
          break;
        }
        const start = performance.now();
        const allowed = budget.tryAcquire(cost);
        const took = performance.now() - start;
        if (took > maxTryAcquire) maxTryAcquire = took;
        if (!allowed) {
          totals.retries_denied++;
          totals.failures++;
          timelines.denied[slice]++;
          break;
        }
        totals.retries_allowed++;
        totals.tokens_spent += cost;
        timelines.retries[slice]++;
        countAt(atTimelines.tokens, cost);
      }
    }
  };

  // Lease -> fallback -> lease, as seen by polling the mode.
  const seen = { fallback: false, leaseAfterFallback: false };
  // When this client's tenant changed mode (enforce <-> shadow), ms from the origin, as polled.
  const modeChanges = [];
  let shadow = false;
  const monitor = setInterval(() => {
    if (budget.shadow !== shadow) {
      shadow = budget.shadow;
      modeChanges.push(Math.max(0, Math.floor(sinceOriginMs())));
    }
    const mode = budget.mode;
    if (mode === 'fallback' || mode === 'deny_fallback') seen.fallback = true;
    else if (mode === 'lease' && seen.fallback) seen.leaseAfterFallback = true;
  }, 10);
  await Promise.all(Array.from({ length: args.threads }, (_, i) => loop(args.seed * 1000 + i)));
  clearInterval(monitor);
  const status = await client.close();
  const stats = budget.stats();
  const line = {
    ...totals,
    lib_retries_allowed: stats.retriesAllowed,
    lib_fallback_allowed: stats.fallbackAllowed,
    lib_tokens_held: stats.tokensHeld,
    lib_successes_credited_locally: stats.successesCreditedLocally,
    lib_requests: stats.requests,
    lib_shadow_denied: stats.shadowDenied,
    fallback_allowance: budget.fallbackAllowance(client.now()),
    saw_fallback: seen.fallback,
    lease_after_fallback: seen.leaseAfterFallback,
    shutdown_status: status === null ? 'OK' : status,
    max_try_acquire_ms: maxTryAcquire,
    mode_changes_ms: modeChanges,
  };
  let used = slices;
  while (used > 0 && timelines.calls[used - 1] === 0) used--; // the empty tail
  line.timeline_slice_seconds = args['timeline-slice'];
  line.timeline_origin_us = Number(originNs / 1000n);
  for (const [k, v] of Object.entries(timelines)) line[`${k}_timeline`] = v.slice(0, used);
  for (const [k, v] of Object.entries(atTimelines)) line[`${k}_timeline`] = v;
  process.stdout.write(`${JSON.stringify(line)}\n`);
  return 0;
}

process.exitCode = await main();
