// The JS client against a real 3-server cluster (build/tests/support/cluster-under-test: etcd
// and three retry-budget servers in cluster mode): every tenant ends up synced with its
// shard's owner (redirects followed from the round_robin main target), the owners count
// exactly what was spent, and after a kill -9 of an owner its tenants lease from the new owner.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { BudgetClient } from '../../client/js/src/index.js';
import { serverBinary, waitUntil, getBudget, tempDir } from './helpers.mjs';
import { writeFileSync } from 'node:fs';
import path from 'node:path';

const TENANTS = ['c-alpha', 'c-bravo', 'c-charlie', 'c-delta', 'c-echo', 'c-foxtrot'];

async function startCluster(t) {
  const bin = process.env.RETRY_BUDGET_CLUSTER_BIN ?? '';
  assert.ok(bin !== '', 'RETRY_BUDGET_CLUSTER_BIN is not set');
  const dir = tempDir('rb-js-cluster-');
  const policyFile = path.join(dir, 'policy.textproto');
  writeFileSync(policyFile, 'default_policy { capacity: 200 refill_per_second: 0 success_credit: 0 lease_ttl_ms: 1000 }\n');
  const child = spawn(bin, [`--server-bin=${serverBinary()}`, '--servers=3', '--shards=8', `--policy=${policyFile}`], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout });
  const queue = [];
  const waiters = [];
  lines.on('line', (l) => (waiters.length > 0 ? waiters.shift()(l) : queue.push(l)));
  const next = () => (queue.length > 0 ? Promise.resolve(queue.shift()) : new Promise((resolve) => waiters.push(resolve)));
  const exited = new Promise((resolve) => child.on('exit', resolve));
  t.after(async () => {
    child.stdin.end('quit\n');
    const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    await exited;
    clearTimeout(timer);
  });
  const first = await Promise.race([next(), exited.then((code) => assert.fail(`cluster-under-test exited with ${code}`))]);
  const cluster = JSON.parse(first);
  cluster.command = async (line) => {
    child.stdin.write(`${line}\n`);
    const answer = JSON.parse(await next());
    assert.equal(answer.ok, true, `${line}: ${answer.error}`);
    return answer;
  };
  return cluster;
}

test('redirects to shard owners; owners count the spending; a killed owner\'s tenants lease from the new owner', { timeout: 120_000 }, async (t) => {
  const cluster = await startCluster(t);
  assert.match(cluster.target, /^ipv4:127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,127\.0\.0\.1:\d+$/);
  const client = new BudgetClient({ target: cluster.target, refreshPeriodMs: 50, syncTimeoutMs: 500, logger: () => {} });
  const budgets = TENANTS.map((name) => client.tenant(name));
  await waitUntil(() => budgets.every((b) => b.stats().leaseActive), { timeoutMs: 20_000, what: 'a lease for every tenant' });
  const owners = {};
  for (const name of TENANTS) owners[name] = (await cluster.command(`owner ${name}`)).address;
  assert.ok(new Set(Object.values(owners)).size >= 2, 'the tenants spread over several owners');
  // Each tenant is synced with its owner (a tenant owned by the server its first Sync hit
  // needs no redirect; the others were redirected).
  const engine = client._engine;
  await waitUntil(() => TENANTS.every((name, i) => {
    const r = engine.routed.get(budgets[i]);
    return r !== undefined && r.owner === owners[name];
  }), { timeoutMs: 10_000, what: 'every tenant routed to its owner' });
  assert.ok(engine.redirects > 0);
  const spent = budgets.map((b, i) => {
    let n = 0;
    for (let k = 0; k < i + 1; k++) if (b.tryAcquire()) n++;
    return n;
  });
  assert.equal(await client.close(), null);
  for (const [i, name] of TENANTS.entries()) {
    const status = await getBudget(owners[name], name);
    assert.equal(status.retriesTotal, spent[i], `${name} at its owner ${owners[name]}`);
  }

  // kill -9 of the owner of the first tenant: its tenants lease again, from the new owner.
  const second = new BudgetClient({ target: cluster.target, refreshPeriodMs: 50, syncTimeoutMs: 500, logger: () => {} });
  const victimTenant = TENANTS[0];
  const b = second.tenant(victimTenant);
  await waitUntil(() => b.stats().leaseActive && second._engine.routed.get(b)?.owner === owners[victimTenant], { timeoutMs: 20_000, what: 'a lease from the owner' });
  const index = cluster.servers.find((s) => s.address === owners[victimTenant]).index;
  const receivedBefore = b.stats().tokensReceived;
  await cluster.command(`kill ${index}`);
  // The shard moves once the killed server's etcd lease expires.
  const newOwner = await waitUntil(async () => {
    const a = (await cluster.command(`owner ${victimTenant}`)).address;
    return a !== owners[victimTenant] ? a : null;
  }, { timeoutMs: 30_000, what: 'a new owner' });
  await waitUntil(() => b.mode === 'lease' && b.stats().tokensReceived > receivedBefore && second._engine.routed.get(b)?.owner === newOwner,
    { timeoutMs: 30_000, what: 'a lease from the new owner' });
  assert.equal(await second.close(), null);
});
