// The open-loop mode of the JS worker (worker.mjs --backend=TARGET): a worker of
// bench/metastable.py's fleet (docs/BENCHMARKS.md 13), speaking the protocol of
// bench/metastable_worker.cc with the fleet strategy and immediate resends:
//
//   node tools/fleet/js_worker/worker.mjs --backend=TARGET --server=BUDGET --tenant=T --rate=R
//        --phase=P --epoch-ms=E --duration=SECONDS --timeout-ms=MS --max-attempts=N
//
// It waits for the tenant's first answer (ready()), prints {"ready":true}, then from the epoch
// for DURATION starts R logical calls per second (one every 1/R s, shifted by P of an
// interval), whatever happened to earlier ones. A call is attempts of the backend's Work RPC,
// each with a deadline of MS; a failed attempt is resent at once while attempts remain and
// tryAcquire() allows (a denied resend ends the call as failed); a success calls
// recordSuccess(). One JSON line per second ({"t":T,"offered","ok","failed","attempts",
// "retries","denied"}, printed once the second is 2 s old), then {"totals":{...}}. Closing stdin
// stops the calls early. The Work request is encoded by hand (field 1, attempt, a varint): no
// generated code of bench/metastable.proto is needed.

import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';
import { BudgetClient } from '../../../client/js/src/index.js';

// @grpc/grpc-js as the client package resolves it (client/js/node_modules).
const grpc = createRequire(new URL('../../../client/js/package.json', import.meta.url))('@grpc/grpc-js');

const WORK = '/retrybudget.bench.MetastableBackend/Work';

function parse(argv) {
  const want = { backend: 's', server: 's', tenant: 's', rate: 'n', phase: 'n', 'epoch-ms': 'n', duration: 'n', 'timeout-ms': 'n', 'max-attempts': 'n' };
  const a = { phase: 0, 'timeout-ms': 1000, 'max-attempts': 5, duration: 10 };
  for (const arg of argv) {
    const m = /^--([a-z-]+)=(.*)$/.exec(arg);
    if (!m || !(m[1] in want)) throw new Error(`unknown argument ${JSON.stringify(arg)}`);
    a[m[1]] = want[m[1]] === 's' ? m[2] : Number(m[2]);
    if (want[m[1]] === 'n' && !Number.isFinite(a[m[1]])) throw new Error(`--${m[1]} is ${JSON.stringify(m[2])}; expected a number`);
  }
  for (const k of ['backend', 'server', 'tenant', 'rate', 'epoch-ms']) if (a[k] === undefined || a[k] === '') throw new Error(`--${k} is required`);
  if (!(a.rate > 0)) throw new Error(`--rate is ${a.rate}; it must be > 0`);
  if (!(a.phase >= 0 && a.phase < 1)) throw new Error(`--phase is ${a.phase}; it must be in [0, 1)`);
  if (!(a['max-attempts'] >= 1)) throw new Error(`--max-attempts is ${a['max-attempts']}; it must be >= 1`);
  return a;
}

const fields = (r) => `"offered":${r.offered},"ok":${r.ok},"failed":${r.failed},"attempts":${r.attempts},"retries":${r.retries},"denied":${r.denied}`;
const emptyRow = () => ({ offered: 0, ok: 0, failed: 0, attempts: 0, retries: 0, denied: 0 });

export async function runOpenLoop(argv) {
  let a;
  try {
    a = parse(argv);
  } catch (error) {
    process.stderr.write(`js_worker: ${error.message}\n`);
    return 2;
  }
  const client = new BudgetClient({ target: a.server });
  const budget = client.tenant(a.tenant);
  await budget.ready(AbortSignal.timeout(10000));
  const backend = new grpc.Client(a.backend, grpc.credentials.createInsecure());
  const epoch = a['epoch-ms'];
  const rows = new Map();
  const totals = emptyRow();
  const add = (f) => {
    const t = Date.now() < epoch ? -1 : Math.floor((Date.now() - epoch) / 1000);
    if (!rows.has(t)) rows.set(t, emptyRow());
    f(rows.get(t));
    f(totals);
  };
  const printBefore = (before) => {
    for (const t of [...rows.keys()].sort((x, y) => x - y)) {
      if (t >= before) break;
      process.stdout.write(`{"t":${t},${fields(rows.get(t))}}\n`);
      rows.delete(t);
    }
  };
  let stop = false;
  process.stdin.on('data', () => {});
  process.stdin.on('end', () => { stop = true; });
  process.stdin.on('error', () => { stop = true; });
  process.stdout.write('{"ready":true}\n');
  const printer = setInterval(() => printBefore(Math.floor((Date.now() - epoch) / 1000) - 2), 250);

  const attempt = (n) => new Promise((resolve) => {
    backend.makeUnaryRequest(WORK, (b) => b, (b) => b, Buffer.from([0x08, n]), new grpc.Metadata(),
      { deadline: Date.now() + a['timeout-ms'] }, (err) => resolve(err === null || err === undefined));
  });
  const call = async () => {
    for (let n = 1; ; n++) {
      add((r) => { r.attempts++; if (n > 1) r.retries++; });
      if (await attempt(n)) {
        budget.recordSuccess();
        add((r) => { r.ok++; });
        return;
      }
      if (n >= a['max-attempts']) {
        add((r) => { r.failed++; });
        return;
      }
      if (!budget.tryAcquire()) {
        add((r) => { r.denied++; r.failed++; });
        return;
      }
    }
  };
  const interval = 1000 / a.rate;
  const first = epoch + a.phase * interval;
  const end = epoch + a.duration * 1000;
  const calls = [];
  for (let i = 0; ; i++) {
    const at = first + i * interval;
    if (at >= end || stop) break;
    const wait = at - Date.now();
    if (wait > 0) await sleep(wait);
    add((r) => { r.offered++; });
    calls.push(call());
  }
  await Promise.all(calls);
  clearInterval(printer);
  printBefore(Number.MAX_SAFE_INTEGER);
  process.stdout.write(`{"totals":{${fields(totals)}}}\n`);
  backend.close();
  await client.close();
  process.stdin.destroy();
  return 0;
}
