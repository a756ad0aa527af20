// The JS client's protocol logic without a server, on an injected clock (seconds) and scripted
// Sync outcomes: the numbers of the C++ client's refresh_policy / demand_estimator /
// fallback_bucket / tenant_ledger, and every rule of client/cpp/refresher.h's class comment,
// including hostile responses. No real sleeps: time only moves when a test moves it.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  DemandEstimator, FallbackBucket, LocalCredit, RecentSmallest, lowWaterMark, nextSyncDelay, retryBackoff,
  wantFor, MAX_LEASE_TOKENS,
} from '../../client/js/src/bucket-math.js';
import { TenantLedger, FALLBACK } from '../../client/js/src/ledger.js';
import { SyncEngine, MAX_REDIRECT_HOPS, tenantLimitIn } from '../../client/js/src/sync-engine.js';
import { TenantBudget } from '../../client/js/src/tenant-budget.js';
import { validateOptions } from '../../client/js/src/options.js';
import { Status } from '../../client/js/src/codes.js';
import { computeBackoff, retryPolicy } from '../../client/js/src/retry.js';

const POLICY = { refreshPeriod: 0.2, minSyncInterval: 0.005, leaseBurst: 2 };

function rig({ policy = POLICY, syncTimeout = 1, fallback = 'local_bucket', neverReached = { capacity: 1, refillPerSecond: 0.1 } } = {}) {
  const clock = { t: 0 };
  const now = () => clock.t;
  const tenants = [];
  const wakes = { n: 0 };
  const engine = new SyncEngine({ instanceId: 'unit', policy, syncTimeout, clock: now, registry: { snapshot: () => tenants } });
  return {
    clock, engine, tenants, wakes,
    add(name) {
      const t = new TenantBudget(name, () => wakes.n++, now(), fallback, neverReached);
      tenants.push(t);
      return t;
    },
    // One refresher step; `respond(plan)` gives each attempt's outcome.
    step(respond) {
      const sent = [];
      let plan = engine.beginStep();
      while (plan !== null) {
        sent.push(structuredClone(plan));
        engine.endAttempt(plan, respond(plan, sent.length - 1));
        plan = engine.nextPlan();
      }
      return { sent, next: engine.endStep() };
    },
  };
}

function grants(plan, over = {}) {
  return {
    code: null,
    response: {
      stale: false,
      tenants: plan.request.tenants.map((e) => ({
        tenant: e.tenant, granted: e.want, leaseTtlMs: 1000, nextSyncMs: 200,
        safeShare: { capacity: 4, refillPerSecond: 2 }, bucketTokens: 50, capacity: 100,
        activeInstances: 1, error: null, ...(typeof over === 'function' ? over(e) : over),
      })),
    },
  };
}
const unavailable = () => ({ code: Status.UNAVAILABLE, details: 'down' });

test('bucket math matches the C++ client', () => {
  assert.deepEqual([0, 1, 5, 6, 100].map(lowWaterMark), [0, 1, 1, 2, 20]);
  assert.equal(nextSyncDelay(0, POLICY), 0.2);
  assert.equal(nextSyncDelay(50, POLICY), 0.05);
  assert.equal(nextSyncDelay(1, POLICY), 0.005);
  assert.equal(nextSyncDelay(10_000, POLICY), 0.2);
  assert.equal(nextSyncDelay(-5, POLICY), 0.2);
  assert.deepEqual([1, 2, 3, 7, 20].map((f) => retryBackoff(f, POLICY)), [0.02, 0.04, 0.08, 1.0, 1.0]);
  assert.equal(wantFor(0, 0.2, 2, 0), 2);
  assert.equal(wantFor(100, 0.2, 2, 5), 17);
  assert.equal(wantFor(100, 0.2, 2, 50), 0);
  assert.equal(wantFor(1e12, 1, 0, 0), 1_000_000);
  const d = new DemandEstimator(0);
  for (let i = 1; i <= 100; i++) d.observe(i * 0.1, i * 10);
  assert.ok(Math.abs(d.rate - 100) < 10, `rate ${d.rate}`);
});

test('a fallback bucket never hands out more than capacity + refill * elapsed', () => {
  let seed = 3;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const bucket = new FallbackBucket({ capacity: 5, refillPerSecond: 20 }, 0);
  let held = 0;
  let handedOut = 0;
  let now = 0;
  for (let i = 0; i < 5000; i++) {
    now += rnd() * 0.01;
    const added = bucket.refill(now, held);
    held += added;
    handedOut += added;
    held -= Math.floor(rnd() * (held + 1));
  }
  assert.ok(handedOut - held <= 5 + 20 * now + 1e-6);
  assert.ok(handedOut - held >= 0.9 * (5 + 20 * now) - 5);
  const small = new FallbackBucket({ capacity: 0.25, refillPerSecond: 0.5 }, 0);
  assert.equal(small.refill(0, 0), 0);
  assert.equal(small.refill(2, 0), 1);
  assert.equal(small.nextTokenAt(), Infinity);
  // A lie (NaN, negative, huge) is a bucket of nothing, or of at most a lease's worth.
  for (const shape of [{ capacity: NaN, refillPerSecond: NaN }, { capacity: -5, refillPerSecond: -1 }]) {
    const b = new FallbackBucket(shape, 0);
    assert.equal(b.refill(0, 0) + b.refill(1000, 0), 0);
  }
  assert.ok(new FallbackBucket({ capacity: 1e300, refillPerSecond: 0 }, 0).refill(0, 0) <= MAX_LEASE_TOKENS);
});

test('the smallest share of the last minute is kept', () => {
  const r = new RecentSmallest();
  r.note({ capacity: 10, refillPerSecond: 30 }, 0);
  r.note({ capacity: 40, refillPerSecond: 90 }, 30);
  assert.deepEqual(r.get(59), { capacity: 10, refillPerSecond: 30, successCredit: 0, requestCredit: 0 });
  assert.equal(r.get(200), null);
});

// The ledger rule (the same in every client): every reported counter is monotonic, a refund
// after a report is reported as refunded (not absorbed), and the refunded token counts as
// returned when withdrawn; the server's bound holds at every report.
function checkReport(r) {
  assert.ok(r.retriesRefunded <= r.retriesSpent && r.fallbackRefunded <= r.fallbackSpent && r.fallbackRefunded <= r.retriesRefunded, JSON.stringify(r));
  assert.ok((r.retriesSpent - r.fallbackSpent) - (r.retriesRefunded - r.fallbackRefunded) + r.tokensReturned <= r.tokensReceived, JSON.stringify(r));
  return r;
}

function monotonic(before, after) {
  for (const k of Object.keys(before)) assert.ok(after[k] >= before[k], `${k} went back: ${before[k]} -> ${after[k]}`);
}

test('ledger: counters never go back, and a refund after the report is a refund', () => {
  const l = new TenantLedger();
  l.received(10, 10);
  const r1 = checkReport(l.report(7)); // 3 taken
  assert.deepEqual(r1, { retriesSpent: 3, retriesRefunded: 0, fallbackSpent: 0, fallbackRefunded: 0, tokensReturned: 0, tokensReceived: 10 });
  const r2 = checkReport(l.report(8)); // one of them refunded after the report
  assert.deepEqual(r2, { ...r1, retriesRefunded: 1 });
  assert.equal(l.exactSpent(8), 2);
  l.withdrew(8, 0); // the refunded token goes back to the server with the rest
  assert.equal(l.tokensReturned, 8);
  const r3 = checkReport(l.report(0));
  assert.deepEqual(r3, { ...r2, tokensReturned: 8 });
  assert.equal(r3.retriesSpent - r3.retriesRefunded + r3.tokensReturned, r3.tokensReceived, 'received = spent (net) + returned + held');
  l.switchTo(FALLBACK);
  l.fallbackDeposited(4);
  const r4 = checkReport(l.report(1));
  assert.deepEqual(r4, { retriesSpent: 6, retriesRefunded: 1, fallbackSpent: 3, fallbackRefunded: 0, tokensReturned: 8, tokensReceived: 10 });
  monotonic(r3, r4);
});

test('ledger: refund after a report, then spent again, then returned: reported once each way', () => {
  const l = new TenantLedger();
  l.received(5, 5);
  const steps = [];
  steps.push(checkReport(l.report(4))); // take 1, report: spent 1
  steps.push(checkReport(l.report(5))); // refund it (a cancelled backoff), report: refunded 1
  steps.push(checkReport(l.report(4))); // take it again (sent), report: spent 2, refunded 1
  steps.push(checkReport(l.report(5))); // refund again, report: refunded 2
  for (let i = 1; i < steps.length; i++) monotonic(steps[i - 1], steps[i]);
  assert.deepEqual(steps.map((r) => [r.retriesSpent, r.retriesRefunded]), [[1, 0], [1, 1], [2, 1], [2, 2]]);
  l.withdrew(5, 0); // the lease ends: every token, the refunded one too, goes back
  const last = checkReport(l.report(0));
  monotonic(steps[3], last);
  assert.deepEqual(last, { retriesSpent: 2, retriesRefunded: 2, fallbackSpent: 0, fallbackRefunded: 0, tokensReturned: 5, tokensReceived: 5 });
  assert.equal(l.exactSpent(0), 0);
  // A refund that raced in after the withdrawal (heldAfter 1) is withdrawn later: out once.
  const m = new TenantLedger();
  m.received(3, 3);
  checkReport(m.report(1)); // 2 taken, reported
  m.withdrew(1, 1); // withdrew 1; a refund landed right after
  m.withdrew(1, 0);
  const r = checkReport(m.report(0));
  assert.deepEqual([r.retriesSpent, r.retriesRefunded, r.tokensReturned], [2, 1, 2]);
});

test('ledger: a token refunded into the word after the source switched is absorbed by the new source', () => {
  const l = new TenantLedger();
  l.received(2, 2);
  checkReport(l.report(1)); // one lease token taken
  l.withdrew(1, 0); // the lease ends with one token left
  l.switchTo(FALLBACK);
  l.fallbackDeposited(1);
  const held = 2; // the fallback token + the lease token refunded now
  const before = checkReport(l.report(held));
  l.withdrew(2, 0); // a grant replaces the word: only the fallback token is the fallback's
  assert.equal(l.fallback.out, 1);
  assert.equal(l.fallback.absorbed, 1);
  l.switchTo('lease');
  const after = checkReport(l.report(0));
  monotonic(before, after);
  // The lease's books keep the refunded token spent (the safe direction): returned 1 of 2.
  assert.equal(after.tokensReturned, 1);
  assert.equal(after.retriesSpent - after.fallbackSpent - (after.retriesRefunded - after.fallbackRefunded), 1);
});

test('full-jitter backoff and retry policy validation', () => {
  const p = retryPolicy({ initialBackoffMs: 50, maxBackoffMs: 1000, multiplier: 2 });
  assert.equal(computeBackoff(p, 1, 0.5), 25);
  assert.ok(Math.abs(computeBackoff(p, 3, 0.999) - 199.8) < 1e-9);
  assert.equal(computeBackoff(p, 10, 0.5), 500);
  assert.ok(computeBackoff(p, 2, 7) < 100);
  assert.equal(computeBackoff(p, 2, NaN), 0);
  assert.throws(() => retryPolicy({ maxAttempts: 0 }), { name: 'RangeError', message: /options\.maxAttempts is 0/ });
  assert.throws(() => retryPolicy({ multiplier: 'x' }), { name: 'TypeError', message: /options\.multiplier is "x"/ });
  assert.throws(() => retryPolicy({ maxBackoffMs: 1, initialBackoffMs: 5 }), { name: 'RangeError', message: /options\.maxBackoffMs is 1/ });
});

test('bad client options name the option and its value', () => {
  assert.throws(() => validateOptions({ refreshPeriodMs: -1 }), { name: 'RangeError', message: /options\.refreshPeriodMs is -1/ });
  assert.throws(() => validateOptions({ minSyncIntervalMs: 500 }), { name: 'RangeError', message: /options\.minSyncIntervalMs is 500/ });
  assert.throws(() => validateOptions({ syncTimeoutMs: '1s' }), { name: 'TypeError', message: /options\.syncTimeoutMs is "1s"/ });
  assert.throws(() => validateOptions({ leaseBurst: 1.5 }), { name: 'RangeError', message: /options\.leaseBurst is 1\.5/ });
  assert.throws(() => validateOptions({ fallback: 'open' }), { name: 'RangeError', message: /options\.fallback is "open"/ });
  assert.throws(() => validateOptions({ fallbackCapacity: Infinity }), { name: 'RangeError', message: /options\.fallbackCapacity is Infinity/ });
  assert.throws(() => validateOptions({ bearerToken: 'a b' }), { name: 'RangeError', message: /options\.bearerToken has character code 32/ });
  assert.throws(() => validateOptions({ instanceId: 'x'.repeat(129) }), { name: 'RangeError', message: /options\.instanceId/ });
  assert.throws(() => validateOptions({ target: '' }), { name: 'TypeError', message: /options\.target is ""/ });
  assert.throws(() => validateOptions({ refreshPeriod: 5 }), { name: 'TypeError', message: /options\.refreshPeriod is not an option/ });
  assert.match(validateOptions({}).instanceId, /^rb-[0-9a-f]{32}$/);
});

test('a failed Sync is resent unchanged (same seq) while younger than the refresh period, then abandoned for a new seq', () => {
  const r = rig();
  r.add('a');
  const first = r.step(unavailable);
  assert.equal(first.sent.length, 1);
  assert.equal(first.sent[0].request.seq, 1);
  assert.equal(first.sent[0].waitForReady, false); // the first attempt after a success fails fast
  r.clock.t = 0.05;
  const second = r.step(unavailable);
  assert.equal(second.sent.length, 1);
  assert.deepEqual(second.sent[0].request, first.sent[0].request); // the same bytes
  assert.equal(second.sent[0].waitForReady, true);
  r.clock.t = 0.25; // older than refresh_period: a new request
  const third = r.step(unavailable);
  assert.equal(third.sent[0].request.seq, 2);
});

test('the lease ends at the FIRST send + TTL, not the resend', () => {
  const r = rig();
  const a = r.add('a');
  r.step(unavailable); // first send at 0
  r.clock.t = 0.1;
  r.step((plan) => grants(plan, { leaseTtlMs: 1000 })); // the resend at 0.1 is answered
  assert.equal(a.mode, 'lease');
  assert.equal(a.leaseEndsAt(), 1.0);
  r.clock.t = 1.0;
  r.engine.beginStep(); // steps the tenants: the lease ends at 1.0 exactly
  assert.equal(a.mode, 'no_lease');
  assert.equal(a.stats().tokensHeld, 0);
});

test('counters are cumulative and want follows demand', () => {
  const r = rig();
  const a = r.add('a');
  r.step((plan) => grants(plan, { granted: 10 }));
  for (let i = 0; i < 10; i++) assert.ok(a.tryAcquire());
  a.recordSuccess();
  r.clock.t = 0.3;
  const { sent } = r.step((plan) => grants(plan, { granted: 0 }));
  const e = sent[0].request.tenants[0];
  assert.equal(e.retriesSpent, 10);
  assert.equal(e.successes, 1);
  assert.equal(e.tokensReceived, 10);
  assert.equal(e.want, 4, 'ceil(rate 10/s * 0.2 s) + burst 2 - held 0');
  r.clock.t = 0.6;
  const again = r.step((plan) => grants(plan, { granted: 0 })).sent[0].request.tenants[0];
  assert.ok(again.retriesSpent >= 10 && again.tokensReceived === 10); // never back
});

test('an empty or low lease wakes the refresher once per applied response', () => {
  const r = rig();
  const a = r.add('a');
  assert.equal(a.tryAcquire(), false);
  assert.equal(a.tryAcquire(), false);
  assert.equal(r.wakes.n, 1);
  r.step((plan) => grants(plan, { granted: 5 })); // low-water mark ceil(5 * 0.2) = 1
  assert.ok(a.tryAcquire() && a.tryAcquire() && a.tryAcquire());
  assert.equal(r.wakes.n, 1);
  assert.ok(a.tryAcquire()); // 1 left: the mark
  assert.equal(r.wakes.n, 2);
  assert.equal(a.syncDueAt(), -Infinity); // wanted now (the last grant was not short)
});

test('hostile responses are clamped or refused, never fail open', () => {
  const r = rig();
  const [a, b] = [r.add('a'), r.add('b')];
  // Huge grant: at most a lease's worth lands; the rest is counted as received and returned at
  // once (as the C++ client), a grant past 2^53 read as 2^53.
  r.step((plan) => grants(plan, (e) => (e.tenant === 'a' ? { granted: 2 ** 60 } : { granted: -7 })));
  assert.equal(a.stats().tokensHeld, MAX_LEASE_TOKENS);
  assert.equal(a.stats().tokensReceived, 2 ** 53);
  assert.equal(a.stats().tokensReturned, 2 ** 53 - MAX_LEASE_TOKENS);
  assert.equal(b.stats().tokensHeld, 0);
  // A TTL <= 0 ends the lease at once; NaN next_sync_ms is the refresh period.
  r.clock.t = 0.3;
  r.step((plan) => grants(plan, { granted: 3, leaseTtlMs: -1, nextSyncMs: NaN }));
  r.engine.beginStep();
  assert.equal(a.stats().tokensHeld, 0);
  assert.equal(a.mode, 'no_lease');
  // Wrong tenant names and a short response: nothing applied to the others.
  r.clock.t = 0.6;
  r.step((plan) => ({ code: null, response: { stale: false, tenants: [{ tenant: 'zzz', granted: 50, leaseTtlMs: 5000, error: null }] } }));
  assert.equal(a.stats().tokensHeld + b.stats().tokensHeld, 0);
  // Stale: dropped.
  r.clock.t = 0.9;
  r.step((plan) => ({ ...grants(plan, { granted: 9 }), response: { ...grants(plan, { granted: 9 }).response, stale: true } }));
  assert.equal(a.stats().tokensHeld, 0);
  // A response with no tenants at all, or not an object.
  r.clock.t = 1.2;
  r.step(() => ({ code: null, response: {} }));
  r.clock.t = 1.5;
  r.step(() => ({ code: null, response: null }));
  assert.equal(a.stats().tokensHeld + b.stats().tokensHeld, 0);
});

test('fallback uses the smallest share of the last minute (NaN share: nothing), and deny mode denies', () => {
  const r = rig();
  const a = r.add('a');
  r.step((plan) => grants(plan, { granted: 2, leaseTtlMs: 1000, safeShare: { capacity: 3, refillPerSecond: 1 } }));
  r.clock.t = 0.5;
  r.step((plan) => grants(plan, { granted: 0, leaseTtlMs: 1000, safeShare: { capacity: 8, refillPerSecond: 9 } }));
  r.clock.t = 1.6; // lease over, server down
  r.step(unavailable);
  r.step(unavailable);
  assert.equal(a.mode, 'fallback');
  assert.equal(a.stats().tokensHeld, 3); // the smaller share's capacity, not 8
  let taken = 0;
  while (a.tryAcquire()) taken++;
  assert.equal(taken, 3);
  // Tokens taken between two steps count as taken just before the later one: the bucket was
  // full until 2.6, and refills from there.
  r.clock.t = 2.6;
  r.step(unavailable);
  assert.equal(a.stats().tokensHeld, 0);
  r.clock.t = 3.6;
  r.step(unavailable);
  assert.equal(a.stats().tokensHeld, 1); // refill 1/s
  assert.ok(Math.abs(a.fallbackAllowance(3.6) - 5) < 1e-9, `${a.fallbackAllowance(3.6)}`);
  assert.equal(a.stats().fallbackAllowed, 3);

  const n = rig();
  const x = n.add('x');
  n.step((plan) => grants(plan, { granted: 0, safeShare: { capacity: NaN, refillPerSecond: -1 } }));
  n.clock.t = 2;
  n.step(unavailable);
  assert.equal(x.mode, 'fallback');
  assert.equal(x.stats().tokensHeld, 0);

  const d = rig({ fallback: 'deny' });
  const y = d.add('y');
  d.step(unavailable);
  assert.equal(y.mode, 'deny_fallback');
  assert.equal(y.tryAcquire(), false);
});

test('back from fallback the fallback tokens are swapped for the grant and reported as fallback_spent', () => {
  const r = rig({ neverReached: { capacity: 2, refillPerSecond: 0 } });
  const a = r.add('a');
  r.step(unavailable);
  assert.equal(a.mode, 'fallback');
  assert.ok(a.tryAcquire());
  r.clock.t = 0.1;
  const { sent } = r.step((plan) => grants(plan, { granted: 4 }));
  assert.equal(a.mode, 'lease');
  assert.equal(a.stats().tokensHeld, 4);
  r.clock.t = 0.4;
  const e = r.step((plan) => grants(plan, { granted: 0 })).sent[0].request.tenants[0];
  assert.equal(e.fallbackSpent, 1);
  assert.equal(e.retriesSpent, 1);
  assert.ok(sent.length >= 1);
});

test('UNAUTHENTICATED / PERMISSION_DENIED deny instead of falling back; a whole-request refusal denies one tenant or splits many', () => {
  const r = rig();
  const a = r.add('a');
  r.step(() => ({ code: Status.PERMISSION_DENIED, details: 'no' }));
  assert.equal(a.mode, 'no_lease');
  assert.equal(a.tryAcquire(), false);

  const s = rig();
  s.add('a');
  s.add('b');
  s.add('c');
  s.add('d');
  const { sent } = s.step((plan) => (plan.request.tenants.length > 1 ? { code: Status.INVALID_ARGUMENT, details: 'at most 1 tenants are allowed in one request' } : grants(plan)));
  assert.equal(sent[0].request.tenants.length, 4);
  assert.equal(sent[1].request.tenants.length, 1);
  assert.equal(tenantLimitIn('too many: at most 17 are allowed in one request'), 17);
  const one = rig();
  const z = one.add('z');
  one.step(() => ({ code: Status.INVALID_ARGUMENT, details: 'counters went backwards' }));
  assert.match(z.stats().error, /INVALID_ARGUMENT/);
  assert.equal(z.mode, 'no_lease');
});

test('a redirect moves the tenant to its owner in the same step; loops, garbage owners and UNAVAILABLE park it', () => {
  const r = rig();
  const a = r.add('a');
  const { sent } = r.step((plan) => (plan.address === null
    ? grants(plan, { error: { code: Status.FAILED_PRECONDITION, message: 'not mine', owner: '127.0.0.1:7001' } })
    : grants(plan, { granted: 3 })));
  assert.deepEqual(sent.map((p) => p.address), [null, '127.0.0.1:7001']);
  assert.ok(sent[1].request.seq > sent[0].request.seq); // seq grows across routes
  assert.equal(a.stats().tokensHeld, 3);
  // Later Syncs of the tenant go to the owner only.
  r.clock.t = 0.3;
  assert.deepEqual(r.step((plan) => grants(plan, { granted: 0 })).sent.map((p) => p.address), ['127.0.0.1:7001']);

  // A loop: every server names another; parked after MAX_REDIRECT_HOPS.
  const l = rig();
  const b = l.add('b');
  let hop = 0;
  const loop = l.step((plan) => {
    l.clock.t += 0.01; // each round trip takes 10 ms
    return grants(plan, { error: { code: Status.FAILED_PRECONDITION, message: '', owner: `127.0.0.1:${7100 + (hop++ % 2)}` } });
  });
  assert.ok(loop.sent.length <= MAX_REDIRECT_HOPS + 1, `${loop.sent.length} sends`);
  assert.equal(l.engine.stateFor(b), 'unreachable'); // parked: down once that lasts
  assert.equal(l.engine.stateFor(b, l.engine.clock() + 0.2), 'down'); // a refresh period later
  l.step(unavailable);
  assert.equal(b.mode, 'fallback'); // never fail open, never crash

  const g = rig();
  const c = g.add('c');
  const garbage = g.step((plan) => grants(plan, { error: { code: Status.FAILED_PRECONDITION, message: '', owner: 'not an address\n' } }));
  assert.equal(garbage.sent.length, 1);
  assert.equal(g.engine.stateFor(c), 'unreachable'); // parked
  assert.equal(g.engine.stateFor(c, g.engine.clock() + 0.2), 'down');

  const u = rig();
  const d = u.add('d');
  u.step((plan) => grants(plan, { granted: 2 })); // a lease
  u.clock.t = 0.3;
  u.step((plan) => grants(plan, { error: { code: Status.UNAVAILABLE, message: 'failover', owner: '' } }));
  assert.equal(d.mode, 'lease'); // the lease runs to its expiry
  assert.equal(d.syncDueAt(), 0.3 + 0.2); // asked again a refresh period later
  u.clock.t = 1.0;
  u.step((plan) => grants(plan, { error: { code: Status.UNAVAILABLE, message: 'failover', owner: '' } }));
  assert.equal(d.mode, 'fallback');
});

test('an owner failing for a whole refresh period sends its tenants back to the main target', () => {
  const r = rig();
  const a = r.add('a');
  r.step((plan) => (plan.address === null
    ? grants(plan, { error: { code: Status.FAILED_PRECONDITION, message: '', owner: '127.0.0.1:7001' } })
    : unavailable()));
  for (let t = 0.05; t < 0.4; t += 0.05) {
    r.clock.t = t;
    r.step((plan) => (plan.address === null ? grants(plan, { granted: 1 }) : unavailable()));
  }
  assert.equal(a.stats().tokensHeld > 0 || a.mode === 'fallback', true);
  assert.ok(!r.engine.owners.has('127.0.0.1:7001') || r.engine.routed.get(a).owner === null);
});

test('the final Sync carries final=true, every counter, want 0, and returns every token', () => {
  const r = rig();
  const a = r.add('a');
  r.step((plan) => grants(plan, { granted: 6 }));
  a.tryAcquire();
  a.recordSuccess();
  assert.equal(r.engine.beginFinal(), true);
  const plan = r.engine.nextFinal();
  const req = plan.request;
  assert.equal(plan.address, null);
  assert.equal(req.final, true);
  assert.equal(req.seq, 2);
  assert.deepEqual(req.tenants[0], {
    tenant: 'a', successes: 1, retriesSpent: 1, retriesDenied: 0, tokensReturned: 5, tokensReceived: 6, want: 0, fallbackSpent: 0,
    successesCreditedLocally: 0, retriesRefunded: 0, fallbackRefunded: 0, requests: 0, requestsCreditedLocally: 0, shadowDenied: 0, retriesAllowed: 1,
  });
  assert.equal(a.tryAcquire(), false);
  assert.equal(r.engine.endFinal(plan, { code: null, response: { tenants: [], stale: false } }), null);
  assert.equal(r.engine.nextFinal(), null);
  r.engine.finishFinal();
  assert.equal(r.engine.lastStatus, null);
  assert.equal(r.engine.beginFinal(), false); // once
});

test('a Sync is cut short by the next lease expiry and resent at once with the same seq', () => {
  const r = rig({ policy: { refreshPeriod: 2, minSyncInterval: 0.005, leaseBurst: 2 } });
  r.add('a');
  r.step((plan) => grants(plan, { granted: 2, leaseTtlMs: 1000 }));
  r.clock.t = 0.05;
  assert.equal(r.engine.beginStep(), null); // nothing due yet (next sync at 0.2)
  r.clock.t = 0.2;
  const plan = r.engine.beginStep();
  assert.equal(plan.deadline, 1.0); // the lease's end, before 0.2 + sync_timeout
  r.clock.t = plan.deadline;
  r.engine.endAttempt(plan, { code: Status.DEADLINE_EXCEEDED, details: 'cut' });
  assert.equal(r.engine.main.failures, 0); // no verdict on the server
  assert.equal(r.engine.main.retryAt, plan.deadline);
  r.engine.endStep();
  const again = r.engine.beginStep();
  assert.equal(again.request.seq, plan.request.seq);
});

test('the hot path allocates nothing: no GC during millions of calls (a control that allocates sees some)', async () => {
  const { PerformanceObserver } = await import('node:perf_hooks');
  let gcs = 0;
  const obs = new PerformanceObserver((list) => { gcs += list.getEntries().length; });
  obs.observe({ entryTypes: ['gc'] });
  const settle = () => new Promise((r) => setTimeout(r, 50));
  const budget = new TenantBudget('hot', () => {}, 0, 'deny', { capacity: 0, refillPerSecond: 0 });
  budget._deposit(10, 0);
  const run = (n, f) => { for (let i = 0; i < n; i++) f(i); };
  // Costs of 1 and 3, a denial, a request; and a shadow tenant's would-be denials.
  const shadow = new TenantBudget('shadow', () => {}, 0, 'deny', { capacity: 0, refillPerSecond: 0 });
  shadow._shadow = true;
  const calls = () => {
    if (budget.tryAcquire()) budget.refund();
    if (budget.tryAcquire(3)) budget.refund(3);
    budget.tryAcquire(11);
    budget.recordSuccess();
    budget.recordRequest();
    if (shadow.tryAcquire(2)) shadow.refund(2);
  };
  run(100_000, calls); // JIT warm-up
  await settle();
  const before = gcs;
  run(3_000_000, calls);
  await settle();
  const hot = gcs - before;
  const keep = [];
  const control = gcs;
  run(3_000_000, (i) => { const o = { i, s: `x${i}` }; if ((i & 0xffff) === 0) keep.push(o); });
  await settle();
  obs.disconnect();
  assert.ok(gcs - control > 0, 'the control allocated and was collected (the observer works)');
  assert.equal(hot, 0, `${hot} GCs during the hot-path loop`);
  assert.equal(budget.stats().successes, 3_100_000);
  assert.equal(budget.stats().requests, 3_100_000);
  assert.equal(shadow.stats().shadowDenied, 3_100_000);
  assert.equal(shadow.stats().unbacked, 0);
});

test('tenants redirected to the same owner share one Sync per refresh', () => {
  const r = rig();
  const ts = ['a', 'b', 'c'].map((n) => r.add(n));
  const first = r.step((plan) => (plan.address === null
    ? grants(plan, (e) => (e.tenant === 'c' ? { granted: 2 } : { error: { code: Status.FAILED_PRECONDITION, message: '', owner: '127.0.0.1:7001' } }))
    : grants(plan, { granted: 2 })));
  assert.deepEqual(first.sent.map((p) => [p.address, p.request.tenants.map((e) => e.tenant)]), [[null, ['a', 'b', 'c']], ['127.0.0.1:7001', ['a', 'b']]]);
  r.clock.t = 0.3;
  const second = r.step((plan) => grants(plan, { granted: 0 }));
  assert.deepEqual(second.sent.map((p) => [p.address, p.request.tenants.map((e) => e.tenant)]), [[null, ['c']], ['127.0.0.1:7001', ['a', 'b']]]);
  assert.ok(ts.every((t) => t.mode === 'lease'));
});

test('at most MAX_OWNER_ROUTES owner routes: a redirect to one more parks the tenant', async () => {
  const { MAX_OWNER_ROUTES } = await import('../../client/js/src/sync-engine.js');
  const r = rig();
  const ts = Array.from({ length: MAX_OWNER_ROUTES + 1 }, (_, i) => r.add(`t${i}`));
  r.step((plan) => (plan.address === null
    ? grants(plan, (e) => ({ error: { code: Status.FAILED_PRECONDITION, message: '', owner: `127.0.0.1:${8000 + Number(e.tenant.slice(1))}` } }))
    : grants(plan, { granted: 1 })));
  assert.equal(r.engine.owners.size, MAX_OWNER_ROUTES);
  assert.equal(ts.filter((t) => t.mode === 'lease').length, MAX_OWNER_ROUTES);
  assert.equal(r.engine.stateFor(ts[MAX_OWNER_ROUTES]), 'unreachable'); // parked, never fail open
  assert.equal(r.engine.stateFor(ts[MAX_OWNER_ROUTES], r.engine.clock() + 0.2), 'down');
});

test('a spent lease falls back once the server has been down for a refresh period; a blip does not', () => {
  const r = rig(); // refresh period 0.2
  const a = r.add('a');
  r.step((plan) => grants(plan, { granted: 2, leaseTtlMs: 5000, safeShare: { capacity: 3, refillPerSecond: 10 } }));
  assert.ok(a.tryAcquire() && a.tryAcquire()); // spent
  r.clock.t = 0.3;
  r.step(unavailable); // first failure at 0.3: a blip
  r.clock.t = 0.4;
  r.step(unavailable);
  assert.equal(a.mode, 'lease'); // denied until the lease's end or a refresh period of failures
  assert.equal(a.tryAcquire(), false);
  r.clock.t = 0.51; // failing since 0.3 for more than 0.2 s: down
  r.step(unavailable);
  assert.equal(a.mode, 'fallback');
  // The bucket starts empty (the share of the burst went in the lease): refill only, 10/s.
  assert.equal(a.stats().tokensHeld, 0);
  r.clock.t = 0.61;
  r.step(unavailable);
  assert.equal(a.stats().tokensHeld, 1);
  // A lease with tokens left is spent to its expiry even when down.
  const b = rig();
  const x = b.add('x');
  b.step((plan) => grants(plan, { granted: 2, leaseTtlMs: 5000 }));
  for (let t = 0.3; t < 1.0; t += 0.1) {
    b.clock.t = t;
    b.step(unavailable);
  }
  assert.equal(x.mode, 'lease');
  assert.equal(x.stats().tokensHeld, 2);
});

test('success-funded fallback: successes no request carried deposit the share\'s credit, reported as successes_credited_locally', () => {
  const r = rig();
  const a = r.add('a');
  a.recordSuccess(); // carried by the first request: the server's to credit
  r.step((plan) => grants(plan, { granted: 0, leaseTtlMs: 100, safeShare: { capacity: 2, refillPerSecond: 0, successCredit: 0.5 } }));
  r.clock.t = 0.3; // lease over, server down
  r.step(unavailable);
  assert.equal(a.mode, 'fallback');
  while (a.tryAcquire());
  const fallbackBefore = a.stats().fallbackAllowed;
  assert.equal(fallbackBefore, 2);
  for (let i = 0; i < 3; i++) a.recordSuccess();
  r.clock.t = 0.36;
  r.step(unavailable); // 3 successes * 0.5 = 1.5 -> 1 whole token (the bucket holds 2 at most)
  assert.equal(a.stats().tokensHeld, 1);
  assert.equal(a.stats().successesCreditedLocally, 3);
  assert.ok(a.tryAcquire());
  r.clock.t = 0.6;
  const { sent } = r.step((plan) => grants(plan, { granted: 1 }));
  const e = sent[sent.length - 1].request.tenants[0];
  assert.equal(e.successes, 4);
  assert.equal(e.successesCreditedLocally, 3);
  assert.equal(e.fallbackSpent, 3);
  assert.ok(e.successesCreditedLocally <= e.successes);
});

// After one failed attempt the next ones wait for the channel to connect, each up to its
// deadline (syncTimeout, 1 s). The server turns "down" a refresh period after the first failure,
// and the attempt waiting then is cut short for it: the spent lease falls back at that moment,
// not when the wait gives up.
test('an attempt waiting for the server is cut short when the server turns down', () => {
  const r = rig(); // refresh period 0.2, sync timeout 1
  const a = r.add('a');
  r.step((plan) => grants(plan, { granted: 3, leaseTtlMs: 5000, safeShare: { capacity: 2, refillPerSecond: 10 } }));
  let taken = 0;
  while (a.tryAcquire()) taken++;
  assert.equal(taken, 3); // spent
  // The first attempt fails at once (connection refused); the later ones wait out their
  // deadline, as a waitForReady call on a dead address does.
  let failingSince = null;
  const waiting = (plan) => {
    if (failingSince === null) {
      failingSince = plan.sent;
      return { code: Status.UNAVAILABLE, details: 'connection refused' };
    }
    assert.equal(plan.waitForReady, true);
    r.clock.t += plan.timeout;
    return { code: Status.DEADLINE_EXCEEDED, details: 'waited for the channel' };
  };
  const giveUp = r.clock.t + 3;
  let { next } = r.step(waiting);
  while (a.mode !== 'fallback') {
    assert.ok(next <= giveUp, `still in ${a.mode}`);
    r.clock.t = Math.max(r.clock.t, next);
    next = r.step(waiting).next;
  }
  assert.notEqual(failingSince, null);
  const after = r.clock.t - failingSince;
  assert.ok(after >= 0.2, `in fallback ${after} s after the first failure`);
  assert.ok(after <= 0.25, `the spent lease fell back only when an attempt gave up (${after} s after the first failure)`);
});

test('a new tenant\'s first Sync goes out at once, even within minSyncInterval of the last one (once per tenant)', () => {
  const r = rig({ policy: { refreshPeriod: 0.2, minSyncInterval: 0.05, leaseBurst: 2 } });
  const a = r.add('a');
  r.step((plan) => grants(plan));
  assert.equal(a.mode, 'lease');
  r.clock.t = 0.001;
  a.tryAcquire();
  a.tryAcquire(); // the lease runs dry: a wake, but within minSyncInterval
  assert.equal(r.engine.beginStep(), null);
  const b = r.add('b');
  const plan = r.engine.nextPlan();
  assert.notEqual(plan, null, 'the new tenant is sent at once');
  assert.deepEqual(plan.request.tenants.map((e) => e.tenant), ['a', 'b']);
  r.engine.endAttempt(plan, unavailable());
  r.engine.endStep();
  // Failed: the resend follows the retry backoff as any other; and once sent, b is not new.
  assert.equal(b.everRequested, true);
  r.clock.t = 0.3;
  r.step((p) => grants(p));
  r.clock.t = 0.301;
  b.tryAcquire();
  b.tryAcquire();
  b.tryAcquire();
  assert.equal(r.engine.beginStep(), null, 'minSyncInterval holds again for a tenant already asked for');
});

test('ready(): resolves at the first answer (lease, fallback, refusal, shutdown); aborts with the signal', async () => {
  const r = rig();
  const a = r.add('a');
  const b = r.add('b');
  const c = r.add('c');
  assert.equal(a.isReady, false);
  const reason = new Error('gone');
  const controller = new AbortController();
  const aborted = a.ready(controller.signal);
  controller.abort(reason);
  await assert.rejects(aborted, (e) => e === reason);
  const waits = [a.ready(), b.ready(), c.ready()];
  r.step((plan) => grants(plan, (e) => (e.tenant === 'b' ? { error: { code: Status.PERMISSION_DENIED, message: 'no' } } : {})));
  assert.equal(a.isReady, true);
  assert.equal(await waits[0], 'lease');
  assert.equal(await waits[1], 'no_lease'); // refused: denied, and answered
  assert.equal(await waits[2], 'lease');
  // Unreachable: the fallback is the answer.
  const f = rig();
  const d = f.add('d');
  const waitD = d.ready();
  f.step(unavailable);
  assert.equal(await waitD, 'fallback');
  // Closed before any answer.
  const g = rig();
  const e = g.add('e');
  const waitE = e.ready();
  g.engine.beginFinal();
  assert.equal(await waitE, 'no_lease');
  assert.equal(await e.ready(), 'no_lease');
});

// ---- issue 36: the cost of a retry, shadow mode, requests ----

/** A tenant of `r` granted `tokens` (TTL 1 s) with the entry fields `over`. */
function granted(r, name, tokens, over = {}) {
  const t = r.add(name);
  r.step((plan) => grants(plan, { granted: tokens, ...over }));
  return t;
}

test('tryAcquire(cost) takes cost tokens or none; refund(cost) gives them back; counted as one retry of cost tokens', () => {
  const r = rig();
  const a = granted(r, 'a', 5);
  assert.equal(a.tryAcquire(6), false, 'more than the lease holds: denied');
  assert.equal(a.stats().tokensHeld, 5, 'never a partial take');
  assert.equal(a.tryAcquire(4), true);
  assert.equal(a.tryAcquire(2), false);
  assert.equal(a.tryAcquire(1), true);
  let s = a.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.retriesDenied], [0, 2, 5, 2]);
  a.refund(4);
  s = a.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.refunds], [4, 1, 1, 1]);
  assert.equal(a.tryAcquire(4), true, 'the refunded tokens are there to take again');
  r.clock.t = 0.1;
  const { sent } = r.step((plan) => grants(plan, { granted: 0 }));
  const e = sent[0].request.tenants[0];
  // retries_spent is tokens, retries_allowed retries; the refund before the report is not seen.
  assert.deepEqual([e.retriesSpent, e.retriesAllowed, e.retriesDenied, e.retriesRefunded], [5, 3, 2, 0]);
});

test('a cost outside [1, 1000000] throws a RangeError naming cost and the value, and changes nothing', () => {
  const r = rig();
  const a = granted(r, 'a', 3);
  const wakes = r.wakes.n;
  for (const bad of [0, -1, 1.5, 1_000_001, NaN, Infinity, '2', null]) {
    assert.throws(() => a.tryAcquire(bad), (e) => e instanceof RangeError && e.message.includes(`cost is ${typeof bad === 'string' ? JSON.stringify(bad) : String(bad)}`) && /\[1, 1000000\]/.test(e.message));
    assert.throws(() => a.refund(bad), RangeError);
  }
  const s = a.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.retriesDenied, s.refunds], [3, 0, 0, 0]);
  assert.equal(r.wakes.n, wakes, 'the refresher was not woken');
  assert.equal(a.tryAcquire(1_000_000), false, 'the largest cost is in range (denied for lack of tokens)');
  assert.equal(a.tryAcquire(undefined), true, 'undefined is the default cost, 1');
});

test('a take of cost c wakes the refresher when it crosses the low-water mark, not only when it lands on it', () => {
  const r = rig();
  const a = granted(r, 'a', 10); // mark 2
  const wakes = r.wakes.n;
  assert.ok(a.tryAcquire(5));
  assert.equal(r.wakes.n, wakes, '5 left: above the mark');
  assert.ok(a.tryAcquire(4));
  assert.equal(r.wakes.n, wakes + 1, '1 left: crossed the mark of 2');
  assert.ok(a.tryAcquire(1));
  assert.equal(r.wakes.n, wakes + 1, 'once per applied response');
});

test('demand counts tokens: the cost of the retries spent and of those denied', () => {
  const r = rig();
  const a = granted(r, 'a', 3);
  assert.equal(a.tryAcquire(6), false);
  assert.ok(a.tryAcquire(2));
  assert.equal(a.tryAcquire(2), false);
  r.clock.t = 0.01;
  const { sent } = r.step((plan) => grants(plan, { granted: 0 }));
  // 2 spent + 8 denied = 10 tokens in 10 ms: ceil(10 * 0.2) + burst 2 - 1 held = 3.
  assert.equal(sent[0].request.tenants[0].want, 3);
});

test('shadow mode comes from every answered entry; an error, a failed Sync and fallback keep it', () => {
  const r = rig();
  const a = r.add('a');
  assert.equal(a.shadow, false, 'enforce until the first answer');
  assert.equal(a.tryAcquire(), false, 'awaiting: denied, not shadow-denied');
  assert.deepEqual([a.stats().retriesDenied, a.stats().shadowDenied], [1, 0]);
  r.step((plan) => grants(plan, { granted: 1, mode: 2, leaseTtlMs: 100 }));
  assert.equal(a.shadow, true);
  assert.equal(a.stats().shadow, true);
  r.clock.t = 0.2; // the lease ended, the server unreachable: fallback
  r.step(unavailable);
  assert.equal(a.mode, 'fallback');
  assert.equal(a.shadow, true, 'a failed Sync and fallback keep the mode');
  r.clock.t = 0.25;
  r.step((plan) => grants(plan, { error: { code: Status.RESOURCE_EXHAUSTED, message: 'no' } }));
  assert.equal(a.leaseMode, 'refused');
  assert.equal(a.shadow, true, 'an entry with an error keeps the mode');
  r.clock.t = 0.45;
  r.step((plan) => ({ code: null, response: { ...grants(plan, { granted: 1, mode: 1 }).response, stale: true } }));
  assert.equal(a.shadow, true, 'a stale response keeps the mode');
  r.clock.t = 0.5;
  r.step((plan) => grants(plan, { granted: 1, mode: 1 }));
  assert.equal(a.shadow, false, 'MODE_ENFORCE');
  r.clock.t = 0.8;
  r.step((plan) => grants(plan, { granted: 1, mode: 2 }));
  assert.equal(a.shadow, true);
  r.clock.t = 1.1;
  r.step((plan) => grants(plan, { granted: 1, mode: 7 }));
  assert.equal(a.shadow, false, 'an unknown mode is enforce');
});

test('shadow: a retry enforcement would deny is allowed without a token, counted as shadow_denied, and wakes the refresher', () => {
  const r = rig();
  const a = granted(r, 'a', 2, { mode: 2 });
  assert.ok(a.tryAcquire(2), 'backed');
  const wakes = r.wakes.n;
  assert.ok(a.tryAcquire(3), 'would be denied: allowed');
  assert.ok(a.tryAcquire(), 'again');
  assert.equal(r.wakes.n, wakes, 'woken once per applied response, as a denial');
  const s = a.stats();
  assert.deepEqual([s.tokensHeld, s.retriesAllowed, s.tokensSpent, s.retriesDenied, s.shadowDenied, s.unbacked], [0, 1, 2, 0, 2, 4]);
  // Unbacked refunds first: nothing comes back while at least `cost` unbacked tokens are out.
  a.refund(3);
  a.refund();
  assert.deepEqual([a.stats().tokensHeld, a.stats().refunds, a.stats().unbacked], [0, 0, 0]);
  a.refund(2); // the backed one
  assert.deepEqual([a.stats().tokensHeld, a.stats().refunds, a.stats().retriesAllowed], [2, 1, 0]);
  // Unbacked below the cost: a normal refund, the unbacked ones stay out.
  assert.ok(a.tryAcquire(2));
  assert.ok(a.tryAcquire());
  a.refund(2);
  assert.deepEqual([a.stats().tokensHeld, a.stats().unbacked], [2, 1]);
  r.clock.t = 0.01;
  const { sent } = r.step((plan) => grants(plan, { granted: 0, mode: 2 }));
  const e = sent[0].request.tenants[0];
  // Every backed take was refunded: no token spent, none reported allowed (at most spent).
  assert.deepEqual([e.shadowDenied, e.retriesDenied, e.retriesSpent, e.retriesAllowed], [3, 0, 0, 0]);
  // The would-be denials count in the demand (tokens): 5 shadow-denied in 10 ms, 2 held.
  assert.equal(e.want, Math.ceil(5 * 0.2) + 2 - 2);
});

test('retries_allowed reported is at most retries_spent: a retry refunded before any report', () => {
  const r = rig();
  const a = granted(r, 'a', 4);
  assert.ok(a.tryAcquire());
  a.refund();
  r.clock.t = 0.2;
  let e = r.step((plan) => grants(plan, { granted: 0 })).sent[0].request.tenants[0];
  assert.deepEqual([e.retriesSpent, e.retriesAllowed], [0, 0]);
  assert.ok(a.tryAcquire(3));
  r.clock.t = 0.4;
  e = r.step((plan) => grants(plan, { granted: 0 })).sent[0].request.tenants[0];
  assert.deepEqual([e.retriesSpent, e.retriesAllowed], [3, 2], 'the counters never go back and allowed <= spent');
});

test('requests are reported cumulative; in fallback each request no request carried deposits request_credit, as successes do', () => {
  const r = rig();
  const a = r.add('a');
  a.recordRequest(); // carried by the first request: the server's to credit
  r.step((plan) => grants(plan, { granted: 0, leaseTtlMs: 100, safeShare: { capacity: 2, refillPerSecond: 0, successCredit: 0.5, requestCredit: 0.25 } }));
  r.clock.t = 0.3; // lease over, server down
  r.step(unavailable);
  assert.equal(a.mode, 'fallback');
  while (a.tryAcquire());
  assert.equal(a.stats().tokensHeld, 0);
  for (let i = 0; i < 5; i++) a.recordRequest();
  a.recordSuccess();
  r.clock.t = 0.36;
  // 1 success * 0.5 + 5 requests * 0.25 = 1.75 -> 1 whole token; both credited in full.
  r.step(unavailable);
  assert.deepEqual([a.stats().tokensHeld, a.stats().successesCreditedLocally, a.stats().requestsCreditedLocally], [1, 1, 5]);
  // Up to the cap: 1.75 + 0.25 * 1 fits, the rest are left to the server.
  for (let i = 0; i < 3; i++) a.recordRequest();
  r.clock.t = 0.42;
  r.step(unavailable);
  assert.deepEqual([a.stats().tokensHeld, a.stats().requestsCreditedLocally], [2, 6]);
  // Never again: a later step credits nothing of those.
  assert.ok(a.tryAcquire(2));
  r.clock.t = 0.48;
  r.step(unavailable);
  assert.deepEqual([a.stats().tokensHeld, a.stats().requestsCreditedLocally], [0, 6]);
  r.clock.t = 0.6;
  const { sent } = r.step((plan) => grants(plan, { granted: 1 }));
  const e = sent[sent.length - 1].request.tenants[0];
  assert.deepEqual([e.requests, e.requestsCreditedLocally, e.successes, e.successesCreditedLocally], [9, 6, 1, 1]);
});

test('the fallback bucket credits successes and requests through one rule (LocalCredit), and steps while credit can fit', () => {
  const b = new FallbackBucket({ capacity: 3, refillPerSecond: 0, successCredit: 1, requestCredit: 0.5 }, 0, false);
  assert.equal(b.nextTokenAt(), 0 + 0.05, 'credit can fit: a step within CREDIT_STEP_INTERVAL');
  assert.equal(b.refill(0.05, 0, 2, 3), 3);
  assert.deepEqual([b.lastCredited, b.lastRequestsCredited], [2, 2], 'the successes first, then the requests that fit');
  assert.equal(b.nextTokenAt(), Infinity, 'full: nothing to wait for');
  const c = new LocalCredit();
  assert.equal(c.creditable(4), 4);
  assert.equal(c.creditable(4), 0, 'considered once');
  c.carried(7);
  assert.equal(c.creditable(9), 2, 'only those no request carried');
});
