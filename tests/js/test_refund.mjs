// A refund is a refund, against the real server: a token taken for a retry whose backoff was
// cancelled AFTER a Sync had reported it spent goes back to the server's bucket, the server's
// retries_total counts only the retries sent, and the client's stats add up
// (received = spent + returned + held).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BudgetClient, callWithRetry, Status, grpc } from '../../client/js/src/index.js';
import { startServer, policy, getBudget, waitUntil } from './helpers.mjs';

const unavailable = () => Object.assign(new Error('14 UNAVAILABLE: down'), { code: Status.UNAVAILABLE, details: 'down', metadata: new grpc.Metadata() });

test('a cancelled backoff\'s token, refunded after its report, is back in the server\'s bucket', async (t) => {
  // No refill, no success credit: the bucket's level moves only by what is spent.
  const server = await startServer(t, policy('refund', { capacity: 100, refill: 0, initial: 50, credit: 0 }));
  const client = new BudgetClient({ target: server.target, logger: () => {} });
  const budget = client.tenant('refund');
  assert.equal(await budget.ready(), 'lease');

  // One retry really sent.
  let n = 0;
  assert.equal(await callWithRetry(budget, async () => { if (n++ === 0) throw unavailable(); return 'ok'; }, { random: () => 0 }), 'ok');

  // One retry never sent: its token is taken, reported spent by a Sync during the backoff,
  // then given back when the caller aborts.
  const controller = new AbortController();
  const reason = new Error('caller gone');
  const call = callWithRetry(budget, async () => { throw unavailable(); }, { signal: controller.signal, initialBackoffMs: 60_000, maxBackoffMs: 60_000, random: () => 0.99 });
  await waitUntil(async () => Number((await getBudget(server.target, 'refund')).retriesTotal) === 2, { what: 'the backoff\'s token reported spent' });
  controller.abort(reason);
  await assert.rejects(call, (e) => e === reason);
  assert.equal(budget.stats().refunds, 1);

  // The next Sync reports it refunded: the server counts one retry sent.
  const reported = await waitUntil(async () => {
    const s = await getBudget(server.target, 'refund');
    return Number(s.refundedTotal) === 1 ? s : null;
  }, { what: 'the refund reported' });
  assert.equal(Number(reported.retriesTotal), 1);

  assert.equal(await client.close(), null);
  const stats = budget.stats();
  assert.equal(stats.retriesAllowed, 1);
  assert.equal(stats.tokensSpent, 1);
  assert.equal(stats.tokensHeld, 0);
  assert.equal(stats.tokensReceived, stats.tokensSpent + stats.tokensReturned + stats.tokensHeld, JSON.stringify(stats));

  const status = await getBudget(server.target, 'refund');
  assert.equal(Number(status.retriesTotal), 1, 'retries_total counts the retries sent');
  assert.equal(Number(status.refundedTotal), 1);
  assert.equal(Number(status.grantedTotal), stats.tokensReceived);
  assert.equal(Number(status.returnedTotal), stats.tokensReturned);
  // 50 tokens, one retry sent: the refunded token is back in the bucket.
  assert.equal(Number(status.tokens), 49);
});
