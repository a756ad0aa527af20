// prom-client metrics with the C++ client's names and labels, in the registry the caller
// passes; updated by the refresher, never on the hot path.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
// The prom-client the package depends on (client/js/node_modules), as a worker would use it.
import client from '../../client/js/node_modules/prom-client/index.js';
import { BudgetClient } from '../../client/js/src/index.js';
import { PrometheusClientMetrics } from '../../client/js/src/metrics.js';
import { startServer, policy, waitUntil } from './helpers.mjs';

function value(metrics, name, labels) {
  const m = metrics.find((x) => x.name === name);
  assert.ok(m, `metric ${name} is registered`);
  const v = m.values.find((x) => Object.entries(labels).every(([k, val]) => x.labels[k] === val) && Object.keys(x.labels).length === Object.keys(labels).length);
  return v?.value;
}

test('retry_budget_client_* metrics as the C++ client names them', async (t) => {
  const server = await startServer(t, policy('t', { capacity: 20, refill: 0, credit: 0 }));
  const registry = new client.Registry();
  const c = new BudgetClient({ target: server.target, refreshPeriodMs: 50, metricsRegistry: registry });
  const budget = c.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease' });
  assert.ok(budget.tryAcquire());
  assert.ok(budget.tryAcquire());
  budget.recordSuccess();
  budget.recordRequest();
  budget.recordRequest();
  while (budget.tryAcquire());
  const denied = budget.stats().retriesDenied;
  await waitUntil(async () => value(await registry.getMetricsAsJSON(), 'retry_budget_client_successes_total', { tenant: 't' }) === 1, { what: 'the metrics to catch up' });
  let m = await registry.getMetricsAsJSON();
  assert.ok(value(m, 'retry_budget_client_retries_allowed_total', { tenant: 't' }) >= 2);
  assert.ok(value(m, 'retry_budget_client_retries_denied_total', { tenant: 't' }) >= 1);
  assert.equal(value(m, 'retry_budget_client_fallback_retries_total', { tenant: 't' }), 0);
  assert.equal(value(m, 'retry_budget_client_requests_total', { tenant: 't' }), 2);
  assert.equal(value(m, 'retry_budget_client_shadow_denied_total', { tenant: 't' }), 0);
  assert.equal(value(m, 'retry_budget_client_mode', { tenant: 't', mode: 'lease' }), 1);
  assert.equal(value(m, 'retry_budget_client_mode', { tenant: 't', mode: 'fallback' }), 0);
  assert.ok(value(m, 'retry_budget_client_syncs_total', { result: 'ok' }) >= 1);
  assert.equal(value(m, 'retry_budget_client_redirects_total', {}), 0);
  assert.ok(typeof value(m, 'retry_budget_client_tokens_held', { tenant: 't' }) === 'number');
  assert.equal(await c.close(), null);
  m = await registry.getMetricsAsJSON();
  assert.equal(value(m, 'retry_budget_client_retries_allowed_total', { tenant: 't' }), budget.stats().retriesAllowed);
  assert.equal(value(m, 'retry_budget_client_retries_denied_total', { tenant: 't' }), budget.stats().retriesDenied);
  assert.ok(budget.stats().retriesDenied >= denied);
  const text = await registry.metrics();
  assert.match(text, /^retry_budget_client_retries_allowed_total\{tenant="t"\} \d+$/m);
  // A second client on the same registry is refused, naming the option.
  assert.throws(() => new BudgetClient({ target: server.target, metricsRegistry: registry }), { name: 'TypeError', message: /options\.metricsRegistry: cannot register/ });
});

test('sync errors are counted by code; fallback shows in the mode gauge', async () => {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  const registry = new client.Registry();
  const c = new BudgetClient({ target: `127.0.0.1:${port}`, refreshPeriodMs: 50, syncTimeoutMs: 200, metricsRegistry: registry, logger: () => {} });
  const budget = c.tenant('t');
  await waitUntil(() => budget.mode === 'fallback', { what: 'fallback' });
  await waitUntil(async () => value(await registry.getMetricsAsJSON(), 'retry_budget_client_mode', { tenant: 't', mode: 'fallback' }) === 1, { what: 'the mode gauge' });
  const m = await registry.getMetricsAsJSON();
  assert.ok(value(m, 'retry_budget_client_sync_errors_total', { code: 'UNAVAILABLE' }) >= 1);
  assert.ok(value(m, 'retry_budget_client_syncs_total', { result: 'error' }) >= 1);
  await c.close();
});

test('retries_allowed counts retries whatever their cost; shadow_denied and requests follow the tenant\'s counters and never go back', async () => {
  const registry = new client.Registry();
  const metrics = new PrometheusClientMetrics(registry);
  const stats = (o) => ({ retriesAllowed: 0, retriesDenied: 0, fallbackAllowed: 0, successes: 0, shadowDenied: 0, requests: 0, tokensHeld: 0, mode: 'lease', ...o });
  metrics.tenantUpdated('t', stats({ retriesAllowed: 2, shadowDenied: 3, requests: 7 }));
  let m = await registry.getMetricsAsJSON();
  assert.equal(value(m, 'retry_budget_client_retries_allowed_total', { tenant: 't' }), 2);
  assert.equal(value(m, 'retry_budget_client_shadow_denied_total', { tenant: 't' }), 3);
  assert.equal(value(m, 'retry_budget_client_requests_total', { tenant: 't' }), 7);
  // A refund lowers retriesAllowed for a moment: the counter stays.
  metrics.tenantUpdated('t', stats({ retriesAllowed: 1, shadowDenied: 5, requests: 9 }));
  m = await registry.getMetricsAsJSON();
  assert.equal(value(m, 'retry_budget_client_retries_allowed_total', { tenant: 't' }), 2);
  assert.equal(value(m, 'retry_budget_client_shadow_denied_total', { tenant: 't' }), 5);
  assert.equal(value(m, 'retry_budget_client_requests_total', { tenant: 't' }), 9);
  assert.match(await registry.metrics(), /^retry_budget_client_shadow_denied_total\{tenant="t"\} 5$/m);
});
