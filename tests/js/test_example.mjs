// The example worker (examples/js_worker/worker.mjs) with the real server: it runs, closes its
// client, and every retry it made is the server's count.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { startServer, policy, getBudget, SOURCE_DIR } from './helpers.mjs';

test('the example worker spends the server\'s budget and reports it', async (t) => {
  const server = await startServer(t, policy('flaky-echo', { capacity: 100, refill: 10, credit: 0.1 }));
  const { stdout } = await promisify(execFile)(process.execPath, [path.join(SOURCE_DIR, 'examples/js_worker/worker.mjs'), `--server=${server.target}`, '--calls=100', '--concurrency=8', '--failure-rate=0.3'], { timeout: 60_000 });
  const r = JSON.parse(stdout);
  assert.equal(r.close, 'OK');
  assert.equal(r.rpc_ok + r.rpc_failed, 100);
  assert.equal(r.fn_ok + r.fn_exhausted + r.fn_failed, 100);
  assert.equal(r.successes, r.rpc_ok + r.fn_ok);
  assert.ok(r.backend_attempts > 100, 'the interceptor retried some RPCs');
  const status = await getBudget(server.target, 'flaky-echo');
  assert.equal(status.retriesTotal, r.retries_allowed);
  assert.equal(status.successesTotal, r.successes);
});
