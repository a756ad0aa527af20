// callWithRetry against real TenantBudgets: the loop's decisions (same key, one token per
// retry, exhausted with the last error as cause, pushback, deadline) and the abort during a
// backoff: it rejects at once with the signal's reason, refunds the token, and leaves nothing
// running (a child process, with a real client on the real server, exits by itself).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { callWithRetry, BudgetExhaustedError, RetryDeadlineExceededError, Status, grpc } from '../../client/js/src/index.js';
import { localBudget } from '../../client/js/src/testing.js';
import { startServer, policy, SOURCE_DIR } from './helpers.mjs';

const unavailable = () => Object.assign(new Error('14 UNAVAILABLE: down'), { code: Status.UNAVAILABLE, details: 'down', metadata: new grpc.Metadata() });
const FAST = { initialBackoffMs: 0, maxBackoffMs: 0 };

test('the first attempt is free, every retry takes a token, every attempt has the same key', async () => {
  const budget = await localBudget(10);
  const keys = [];
  const result = await callWithRetry(budget, async (attempt, signal) => {
    keys.push(attempt.idempotencyKey);
    assert.ok(signal instanceof AbortSignal);
    if (attempt.number < 3) throw unavailable();
    return 'ok';
  }, FAST);
  assert.equal(result, 'ok');
  assert.equal(new Set(keys).size, 1);
  assert.match(keys[0], /^[0-9a-f]{32}$/);
  assert.equal(budget.stats().tokensHeld, 8);
  assert.equal(budget.stats().successes, 1);
  await callWithRetry(budget, async () => 'x', FAST);
  assert.equal(budget.stats().tokensHeld, 8);
  assert.equal(budget.stats().successes, 2);
});

test('a denied retry ends the call with BudgetExhaustedError carrying the last error', async () => {
  const budget = await localBudget(1);
  let attempts = 0;
  const last = unavailable();
  await assert.rejects(callWithRetry(budget, async () => {
    attempts++;
    throw attempts === 2 ? last : unavailable();
  }, { ...FAST, maxAttempts: 10 }), (e) => e instanceof BudgetExhaustedError && e.cause === last && e.attempts === 2);
  assert.equal(attempts, 2);
  assert.equal(budget.stats().successes, 0);
  // Stacked layers do not multiply: an inner BudgetExhaustedError is never retried.
  const outer = await localBudget(5);
  const inner = new BudgetExhaustedError(unavailable(), 1);
  await assert.rejects(callWithRetry(outer, async () => { throw inner; }, FAST), (e) => e === inner);
  assert.equal(outer.stats().tokensHeld, 5);
});

test('non-retryable errors, max attempts and negative pushback end the call unchanged; pushback >= 0 sets the wait', async () => {
  const budget = await localBudget(100);
  const bad = Object.assign(new Error('3 INVALID_ARGUMENT'), { code: Status.INVALID_ARGUMENT, details: '', metadata: new grpc.Metadata() });
  await assert.rejects(callWithRetry(budget, async () => { throw bad; }, FAST), (e) => e === bad);
  let n = 0;
  await assert.rejects(callWithRetry(budget, async () => { n++; throw unavailable(); }, { ...FAST, maxAttempts: 3 }), { code: Status.UNAVAILABLE });
  assert.equal(n, 3);
  const noRetry = unavailable();
  noRetry.metadata.set('grpc-retry-pushback-ms', '-1');
  n = 0;
  await assert.rejects(callWithRetry(budget, async () => { n++; throw noRetry; }, FAST), (e) => e === noRetry);
  assert.equal(n, 1);
  // A pushback of 30 ms replaces a computed backoff of about 10 s.
  const start = Date.now();
  n = 0;
  await callWithRetry(budget, async () => {
    if (n++ === 0) {
      const e = unavailable();
      e.metadata.set('grpc-retry-pushback-ms', '30');
      throw e;
    }
    return 1;
  }, { initialBackoffMs: 10_000, maxBackoffMs: 10_000, random: () => 0.99 });
  assert.ok(Date.now() - start >= 25 && Date.now() - start < 5000);
});

test('a backoff that would cross the deadline ends the call now, without a token', async () => {
  const budget = await localBudget(5);
  await assert.rejects(callWithRetry(budget, async () => { throw unavailable(); }, { timeoutMs: 200, initialBackoffMs: 10_000, maxBackoffMs: 10_000, random: () => 0.5 }),
    (e) => e instanceof RetryDeadlineExceededError && e.cause?.code === Status.UNAVAILABLE);
  assert.equal(budget.stats().tokensHeld, 5);
});

test('an attempt sees the abort through its signal; the call rejects with the reason', async () => {
  const budget = await localBudget(5);
  const controller = new AbortController();
  const reason = new Error('client went away');
  const seen = [];
  const p = callWithRetry(budget, (attempt, signal) => new Promise((_, reject) => {
    signal.addEventListener('abort', () => { seen.push(signal.reason); reject(signal.reason); });
  }), { signal: controller.signal });
  setTimeout(() => controller.abort(reason), 20);
  await assert.rejects(p, (e) => e === reason);
  assert.deepEqual(seen, [reason]);
  assert.equal(budget.stats().tokensHeld, 5);
  // Per-attempt timeout: a TimeoutError aborts the attempt, and it is retried.
  let n = 0;
  const r = await callWithRetry(budget, (attempt, signal) => (n++ === 0
    ? new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)))
    : Promise.resolve('second')), { perAttemptTimeoutMs: 30, ...FAST });
  assert.equal(r, 'second');
  assert.equal(budget.stats().tokensHeld, 4);
});

// The child: a real client leasing from the real server, one logical call failing into a
// 60-second backoff, aborted 100 ms in. It must print its result and exit by itself.
const CHILD = `
import { BudgetClient, callWithRetry, Status } from ${JSON.stringify(path.join(SOURCE_DIR, 'client/js/src/index.js'))};
const client = new BudgetClient({ target: process.argv[1] });
const budget = client.tenant('abort');
const t0 = Date.now();
while (budget.stats().tokensHeld < 2) { if (Date.now() - t0 > 10000) throw new Error('no lease'); await new Promise(r => setTimeout(r, 5)); }
const before = budget.stats();
const controller = new AbortController();
const reason = new Error('request gone');
const abort = process.argv[2] === 'abort';
if (abort) setTimeout(() => controller.abort(reason), 100);
let attempts = 0, outcome = 'resolved', rejectedAfter = -1, heldInBackoff = -1;
const started = Date.now();
try {
  await callWithRetry(budget, async () => { attempts++; heldInBackoff = budget.stats().tokensHeld; throw Object.assign(new Error('down'), { code: Status.UNAVAILABLE, details: 'down' }); },
    { signal: controller.signal, initialBackoffMs: 60000, maxBackoffMs: 60000, random: () => 0.99 });
} catch (e) { outcome = e === reason ? 'aborted' : String(e); rejectedAfter = Date.now() - started; }
const during = budget.stats();
const status = await client.close();
console.log(JSON.stringify({ outcome, attempts, rejectedAfter, heldBefore: before.tokensHeld, heldAfter: during.tokensHeld, refunds: during.refunds, retriesAllowed: during.retriesAllowed, tokensSpent: during.tokensSpent, status }));
`;

function runChild(target, mode) {
  const child = spawn(process.execPath, ['--input-type=module', '-e', CHILD, target, mode], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return { child, exited, output: () => out };
}

test('an abort during the backoff rejects at once, refunds the token, and the process exits by itself', async (t) => {
  const server = await startServer(t, policy('abort', { capacity: 100, refill: 0, initial: 50 }));
  const run = runChild(server.target, 'abort');
  const timer = setTimeout(() => run.child.kill('SIGKILL'), 15_000);
  const { code, signal } = await run.exited;
  clearTimeout(timer);
  assert.equal(signal, null, 'the child had to be killed: something kept it alive');
  assert.equal(code, 0);
  const r = JSON.parse(run.output());
  assert.equal(r.outcome, 'aborted');
  assert.equal(r.attempts, 1);
  assert.ok(r.rejectedAfter < 5000, `rejected ${r.rejectedAfter} ms after the start`);
  assert.equal(r.refunds, 1);
  assert.equal(r.retriesAllowed, 0, 'the retry taken came back: none allowed');
  assert.equal(r.tokensSpent, 0, 'the token taken for the retry came back: nothing spent');
  assert.equal(r.status, null);

  // The control: without the abort the same child is still waiting out its backoff (so the
  // check above can fail).
  const control = runChild(server.target, 'no-abort');
  const alive = await Promise.race([control.exited.then(() => false), new Promise((resolve) => setTimeout(() => resolve(true), 1500))]);
  control.child.kill('SIGKILL');
  await control.exited;
  assert.equal(alive, true, 'the un-aborted child exited during a 60 s backoff');
});

test('options.cost: each retry takes its cost (a number, or a function of the error), the first attempt none; one request per call', async () => {
  const budget = await localBudget(20);
  const timeout = () => Object.assign(new Error('4 DEADLINE_EXCEEDED'), { code: Status.DEADLINE_EXCEEDED, details: '', metadata: new grpc.Metadata() });
  // AWS SDKs' shape: 10 tokens after a timeout, 5 after any other retryable error.
  const awsCost = (e) => (e?.code === Status.DEADLINE_EXCEEDED ? 10 : 5);
  const errors = [unavailable(), timeout()];
  const seen = [];
  const result = await callWithRetry(budget, async (attempt) => {
    if (attempt.number <= errors.length) throw errors[attempt.number - 1];
    return 'ok';
  }, { ...FAST, cost: (e) => { seen.push(e); return awsCost(e); } });
  assert.equal(result, 'ok');
  assert.deepEqual(seen, errors, 'the cost function gets each failed attempt\'s error');
  let s = budget.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.requests, s.successes], [5, 2, 15, 1, 1]);
  // A retry costing more than what is left is denied whole: BudgetExhaustedError, nothing taken.
  await assert.rejects(callWithRetry(budget, async () => { throw unavailable(); }, { ...FAST, cost: 6 }), BudgetExhaustedError);
  s = budget.stats();
  assert.deepEqual([s.tokensHeld, s.retriesDenied, s.requests], [5, 1, 2]);
});

test('options.cost: a bad number is refused up front; a function returning a bad cost ends the call with a RangeError, no token taken', async () => {
  const budget = await localBudget(10);
  for (const bad of [0, 1.5, 1_000_001, -3, NaN]) {
    await assert.rejects(callWithRetry(budget, async () => 1, { cost: bad }), (e) => e instanceof RangeError && e.message.startsWith(`options.cost is ${bad}`));
  }
  await assert.rejects(callWithRetry(budget, async () => 1, { cost: '5' }), (e) => e instanceof TypeError && /options\.cost is "5"/.test(e.message));
  assert.equal(budget.stats().requests, 0, 'no call made, no request recorded');
  let n = 0;
  await assert.rejects(callWithRetry(budget, async () => { n++; throw unavailable(); }, { ...FAST, cost: () => 0 }),
    (e) => e instanceof RangeError && /options\.cost returned 0/.test(e.message));
  assert.equal(n, 1);
  assert.deepEqual([budget.stats().tokensHeld, budget.stats().retriesDenied, budget.stats().requests], [10, 0, 1]);
});

test('an abort during the backoff refunds the retry\'s whole cost', async () => {
  const budget = await localBudget(10);
  const controller = new AbortController();
  const reason = new Error('gone');
  const call = callWithRetry(budget, async () => {
    setImmediate(() => controller.abort(reason));
    throw unavailable();
  }, { signal: controller.signal, cost: 4, initialBackoffMs: 60_000, maxBackoffMs: 60_000, random: () => 0.99 });
  await assert.rejects(call, (e) => e === reason);
  const s = budget.stats();
  assert.deepEqual([s.tokensHeld, s.refunds, s.retriesAllowed, s.tokensSpent, s.requests], [10, 1, 0, 0, 1]);
});
