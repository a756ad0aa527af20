// No denial before the first answer, against the real server: a new client's first retry
// waits for the tenant's first Sync (sent when the handle was made) within its backoff, in
// callWithRetry and in the interceptor; the wait ends with the call's signal or deadline; when
// the server cannot be reached the configured fallback decides (never fail open).
// A SyncProxy holding the Sync responses makes "the first attempt failed before the first
// answer" certain rather than likely.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BudgetClient, callWithRetry, retryInterceptor, BudgetExhaustedError, RetryDeadlineExceededError, Status, grpc } from '../../client/js/src/index.js';
import { startFlakyBackend, flakyEchoClient } from '../../examples/js_worker/flaky_backend.mjs';
import { SyncProxy } from './sync_proxy.mjs';
import { startServer, policy, getBudget } from './helpers.mjs';

const unavailable = () => Object.assign(new Error('14 UNAVAILABLE: down'), { code: Status.UNAVAILABLE, details: 'down', metadata: new grpc.Metadata() });
const quiet = () => {};

/** A gate for SyncProxy.hold: responses wait until open() is called. */
function gate() {
  let open;
  const promise = new Promise((resolve) => { open = resolve; });
  return { promise, open };
}

/** Counts budget.ready() calls and runs `onCall` at each (the moment a helper starts waiting). */
function watchReady(budget, onCall = () => {}) {
  const seen = { calls: 0 };
  const ready = budget.ready.bind(budget);
  budget.ready = (signal) => {
    seen.calls++;
    onCall();
    return ready(signal);
  };
  return seen;
}

test('a new client whose first action is a call that fails once then succeeds gets its success', async (t) => {
  const server = await startServer(t, policy('first', { capacity: 100, refill: 0, initial: 50, credit: 0 }));
  // The control: right after the handle is made there is no lease yet, so a bare
  // tryAcquire() at that moment is denied (what the wait below is for).
  const control = new BudgetClient({ target: server.target, logger: quiet });
  assert.equal(control.tenant('first').tryAcquire(), false);
  await control.close();

  const client = new BudgetClient({ target: server.target, logger: quiet });
  const budget = client.tenant('first');
  const readyAtFailure = [];
  const result = await callWithRetry(budget, async (attempt) => {
    if (attempt.number === 1) {
      readyAtFailure.push(budget.isReady);
      throw unavailable();
    }
    return 'ok';
  }, { random: () => 0 }); // no backoff of its own: only the wait for the first answer
  assert.equal(result, 'ok');
  assert.deepEqual(readyAtFailure, [false], 'the first attempt failed before the tenant had an answer');
  const s = budget.stats();
  assert.equal(s.retriesAllowed, 1);
  assert.equal(s.retriesDenied, 0);
  assert.equal(s.successes, 1);
  assert.equal(await client.close(), null);
  const status = await getBudget(server.target, 'first');
  assert.equal(Number(status.retriesTotal), 1);
  assert.equal(Number(status.successesTotal), 1);
});

test('the interceptor of a new client waits for the first answer (held by the proxy) and retries', async (t) => {
  const server = await startServer(t, policy('first-rpc', { capacity: 100, refill: 0, initial: 50, credit: 0 }));
  const proxy = await SyncProxy.start(server.target);
  const held = gate();
  proxy.hold = held.promise;
  const backend = await startFlakyBackend((call, n) => (n === 1 ? { code: grpc.status.UNAVAILABLE, details: 'first attempt fails' } : null));
  const client = new BudgetClient({ target: proxy.target, logger: quiet });
  const budget = client.tenant('first-rpc');
  // The Sync answers only once the interceptor waits for it, after the first attempt failed.
  const seen = watchReady(budget, () => held.open());
  const FlakyEcho = flakyEchoClient();
  const echo = new FlakyEcho(backend.target, grpc.credentials.createInsecure(), {
    interceptors: [retryInterceptor(budget, { initialBackoffMs: 0, maxBackoffMs: 0 })], 'grpc.enable_retries': 0,
  });
  t.after(() => {
    echo.close();
    backend.stop();
    proxy.stop();
  });
  const reply = await new Promise((resolve, reject) => echo.Echo({ message: 'hi' }, { deadline: new Date(Date.now() + 10_000) }, (e, r) => (e ? reject(e) : resolve(r))));
  assert.equal(reply.attemptsSeen, 2);
  assert.equal(seen.calls, 1);
  const s = budget.stats();
  assert.equal(s.retriesAllowed, 1);
  assert.equal(s.retriesDenied, 0);
  assert.equal(s.successes, 1);
  assert.equal(await client.close(), null);
});

test('the wait for the first answer ends with the signal or the deadline, no token taken', async (t) => {
  const server = await startServer(t, policy('held', { capacity: 100, refill: 0, initial: 50 }));
  const proxy = await SyncProxy.start(server.target);
  const held = gate();
  proxy.hold = held.promise;
  t.after(() => proxy.stop());
  const client = new BudgetClient({ target: proxy.target, logger: quiet, syncTimeoutMs: 30_000 });
  const budget = client.tenant('held');

  // Aborted while waiting: rejects with the reason.
  const controller = new AbortController();
  const reason = new Error('caller gone');
  watchReady(budget, () => setImmediate(() => controller.abort(reason)));
  await assert.rejects(callWithRetry(budget, async () => { throw unavailable(); }, { signal: controller.signal, random: () => 0 }), (e) => e === reason);
  // The deadline comes first: RetryDeadlineExceededError carrying the last error.
  await assert.rejects(callWithRetry(budget, async () => { throw unavailable(); }, { timeoutMs: 100, random: () => 0 }),
    (e) => e instanceof RetryDeadlineExceededError && e.cause?.code === Status.UNAVAILABLE);
  // ready(signal) itself: an aborted signal rejects at once.
  const aborted = AbortSignal.abort(reason);
  await assert.rejects(budget.ready(aborted), (e) => e === reason);
  assert.equal(budget.isReady, false);

  held.open();
  assert.equal(await budget.ready(), 'lease');
  const s = budget.stats();
  assert.equal(s.retriesAllowed, 0, 'no token was taken while waiting');
  assert.equal(s.retriesDenied, 0);
  assert.ok(s.tokensHeld > 0);
  assert.equal(await client.close(), null);
});

test('server unreachable: the first answer is the fallback; deny stays deny (never fail open)', async () => {
  // A port that was just free: nothing listens there.
  const probe = new grpc.Server();
  const port = await new Promise((resolve, reject) => probe.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  probe.forceShutdown();
  const target = `127.0.0.1:${port}`;

  const deny = new BudgetClient({ target, fallback: 'deny', logger: quiet });
  const denied = deny.tenant('down');
  assert.equal(typeof denied.tryAcquire(), 'boolean', 'tryAcquire never waits');
  let attempts = 0;
  await assert.rejects(callWithRetry(denied, async () => { attempts++; throw unavailable(); }, { random: () => 0 }), (e) => e instanceof BudgetExhaustedError);
  assert.equal(attempts, 1);
  assert.equal(denied.mode, 'deny_fallback');
  assert.equal(await denied.ready(), 'deny_fallback');
  await deny.close();

  const local = new BudgetClient({ target, fallbackCapacity: 1, fallbackRefillPerSecond: 0, logger: quiet });
  const fallback = local.tenant('down');
  attempts = 0;
  const result = await callWithRetry(fallback, async () => { if (attempts++ === 0) throw unavailable(); return 'ok'; }, { random: () => 0 });
  assert.equal(result, 'ok');
  assert.equal(fallback.mode, 'fallback');
  assert.equal(fallback.stats().fallbackAllowed, 1);
  // The bucket held one token: the next retry is denied.
  await assert.rejects(callWithRetry(fallback, async () => { throw unavailable(); }, { random: () => 0 }), (e) => e instanceof BudgetExhaustedError);
  await local.close();
});
