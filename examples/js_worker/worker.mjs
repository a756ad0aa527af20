#!/usr/bin/env node
// An example JS worker: calls a flaky gRPC backend (FlakyEcho, examples/flaky_backend) through
// the retry-budget interceptor, and a flaky async function through callWithRetry, both
// retrying only when the fleet-wide budget of tenant `--tenant` allows.
//
//   node examples/js_worker/worker.mjs --server=127.0.0.1:50051 [--backend=HOST:PORT]
//        [--tenant=flaky-echo] [--calls=200] [--concurrency=16] [--failure-rate=0.3]
//
// Without --backend it starts the grpc-js flaky backend (flaky_backend.mjs) in-process. Prints
// one JSON line: what the calls did and what the budget says.

import { BudgetClient, callWithRetry, retryInterceptor, grpc, BudgetExhaustedError } from '../../client/js/src/index.js';
import { flakyEchoClient, randomFailures, startFlakyBackend } from './flaky_backend.mjs';

const args = Object.fromEntries(process.argv.slice(2).map((a) => {
  const m = /^--([a-z-]+)=(.*)$/.exec(a);
  if (!m) {
    process.stderr.write(`usage: worker.mjs --server=TARGET [--backend=TARGET] [--tenant=T] [--calls=N] [--concurrency=N] [--failure-rate=F]\n`);
    process.exit(2);
  }
  return [m[1], m[2]];
}));
const server = args.server ?? '127.0.0.1:50051';
const tenant = args.tenant ?? 'flaky-echo';
const calls = Number(args.calls ?? 200);
const concurrency = Number(args.concurrency ?? 16);
const failureRate = Number(args['failure-rate'] ?? 0.3);

const local = args.backend === undefined ? await startFlakyBackend(randomFailures(failureRate, 7)) : null;
const backendTarget = args.backend ?? local.target;

// One budget client per process; `await using` (TypeScript, or Node with explicit resource
// management) closes it, else call close() (the final Sync returns the unspent tokens).
const client = new BudgetClient({ target: server });
const budget = client.tenant(tenant);
const FlakyEcho = flakyEchoClient();
const echo = new FlakyEcho(backendTarget, grpc.credentials.createInsecure(), {
  interceptors: [retryInterceptor(budget, { maxAttempts: 4, initialBackoffMs: 5, maxBackoffMs: 100 })],
  'grpc.enable_retries': 0, // gRPC's own retries would be a second, budget-blind layer
});

const result = { rpc_ok: 0, rpc_failed: 0, fn_ok: 0, fn_exhausted: 0, fn_failed: 0 };
let next = 0;
async function loop() {
  while (next < calls) {
    const i = next++;
    // A unary RPC: the interceptor retries it through the budget.
    await new Promise((resolve) => {
      echo.Echo({ message: `call ${i}` }, { deadline: new Date(Date.now() + 2000) }, (error) => {
        result[error ? 'rpc_failed' : 'rpc_ok']++;
        resolve();
      });
    });
    // Any async operation: callWithRetry, with an AbortSignal through every await.
    const controller = new AbortController();
    try {
      await callWithRetry(budget, async (attempt, signal) => {
        signal.throwIfAborted();
        if (Math.random() < failureRate) throw Object.assign(new Error('flaky'), { code: 'ECONNRESET' });
        return attempt.number;
      }, { signal: controller.signal, timeoutMs: 2000, initialBackoffMs: 5, maxBackoffMs: 100 });
      result.fn_ok++;
    } catch (error) {
      result[error instanceof BudgetExhaustedError ? 'fn_exhausted' : 'fn_failed']++;
    }
  }
}
await Promise.all(Array.from({ length: concurrency }, loop));
const status = await client.close();
echo.close();
local?.stop();
const stats = budget.stats();
process.stdout.write(`${JSON.stringify({ ...result, backend_attempts: local?.attempts.length ?? null, retries_allowed: stats.retriesAllowed, retries_denied: stats.retriesDenied, successes: stats.successes, close: status ?? 'OK' })}\n`);
