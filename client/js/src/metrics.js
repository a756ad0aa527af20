// The client's metrics with prom-client, named and labelled as the C++ client's
// (client/cpp/prometheus_client_metrics.cc): retry_budget_client_{retries_allowed,retries_denied,
// fallback_retries,successes,shadow_denied,requests}_total{tenant},
// retry_budget_client_syncs_total{result},
// retry_budget_client_sync_errors_total{code}, retry_budget_client_redirects_total,
// retry_budget_client_tokens_held{tenant} and retry_budget_client_mode{tenant,mode}. Updated by
// the refresher after each of its steps, never on the hot path, so they lag by at most one step.
// Two clients must not share one registry (prom-client refuses a second registration).

import client from 'prom-client';
import { MODES } from './tenant-budget.js';
import { codeName } from './codes.js';

export class PrometheusClientMetrics {
  constructor(registry) {
    const counter = (name, help, labelNames) => new client.Counter({ name, help, labelNames, registers: [registry] });
    const gauge = (name, help, labelNames) => new client.Gauge({ name, help, labelNames, registers: [registry] });
    try {
      this.allowed = counter('retry_budget_client_retries_allowed_total', 'Retries this process allowed with tokens (TryAcquire() true, net of refunds), from leases and from the local fallback bucket: a count, whatever their cost.', ['tenant']);
      this.denied = counter('retry_budget_client_retries_denied_total', 'Retries this process denied for lack of a token.', ['tenant']);
      this.fallback = counter('retry_budget_client_fallback_retries_total', 'Tokens spent from the local fallback bucket while the budget server was unreachable (net of refunds).', ['tenant']);
      this.successes = counter('retry_budget_client_successes_total', 'Successful calls recorded by this process.', ['tenant']);
      this.shadowDenied = counter('retry_budget_client_shadow_denied_total', 'Retries a shadow tenant let through that enforcement would have denied (no token taken).', ['tenant']);
      this.requests = counter('retry_budget_client_requests_total', 'Requests (first attempts, recordRequest()) recorded by this process.', ['tenant']);
      this.held = gauge('retry_budget_client_tokens_held', 'Retry tokens this process holds right now (lease or fallback).', ['tenant']);
      this.mode = gauge('retry_budget_client_mode', '1 for the mode the tenant\'s budget is in (no_lease, lease, fallback, deny_fallback), 0 for the others.', ['tenant', 'mode']);
      this.syncs = counter('retry_budget_client_syncs_total', 'Sync attempts to the budget server, by result (ok: a response; error: the RPC failed).', ['result']);
      this.syncErrors = counter('retry_budget_client_sync_errors_total', 'Failed Sync attempts, by gRPC status code (UNAVAILABLE, DEADLINE_EXCEEDED: unreachable; INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...: refused by a server that answers).', ['code']);
      this.redirects = counter('retry_budget_client_redirects_total', 'Tenant entries a server answered with the address of the tenant\'s owner (cluster mode).', []);
    } catch (error) {
      throw new TypeError(`options.metricsRegistry: cannot register the client metrics: ${error.message}`);
    }
    this.syncs.inc({ result: 'ok' }, 0);
    this.syncs.inc({ result: 'error' }, 0);
    this.redirects.inc(0);
    this.last = new Map(); // tenant -> the counters last exported (counters only go up)
  }

  redirected() {
    this.redirects.inc();
  }

  syncAttempted(ok) {
    this.syncs.inc({ result: ok ? 'ok' : 'error' });
  }

  syncFailed(code) {
    this.syncErrors.inc({ code: codeName(code) });
  }

  tenantUpdated(tenant, stats) {
    const last = this.last.get(tenant) ?? [0, 0, 0, 0, 0, 0];
    const now = [stats.retriesAllowed, stats.retriesDenied, stats.fallbackAllowed, stats.successes, stats.shadowDenied, stats.requests];
    const metrics = [this.allowed, this.denied, this.fallback, this.successes, this.shadowDenied, this.requests];
    for (let i = 0; i < metrics.length; i++) {
      if (now[i] > last[i]) metrics[i].inc({ tenant }, now[i] - last[i]);
      else if (!this.last.has(tenant)) metrics[i].inc({ tenant }, 0);
      last[i] = Math.max(last[i], now[i]);
    }
    this.last.set(tenant, last);
    this.held.set({ tenant }, Math.max(0, stats.tokensHeld));
    for (const mode of MODES) this.mode.set({ tenant, mode }, mode === stats.mode ? 1 : 0);
  }
}
