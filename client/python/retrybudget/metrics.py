"""The client's metrics with prometheus_client, named as the C++ client's
(client/cpp/prometheus_client_metrics.cc): retry_budget_client_{retries_allowed,retries_denied,
shadow_denied,fallback_retries,successes,requests,syncs,redirects}_total,
retry_budget_client_tokens_held and retry_budget_client_mode. Updated by the refresher after each of its steps, never on the hot
path, so they lag by at most one step."""

from prometheus_client import Counter, Gauge

from ._types import MODES


class PrometheusClientMetrics:
    """Registers the metrics in `registry` (a CollectorRegistry); two clients must not share
    one. Only the refresher calls it."""

    def __init__(self, registry):
        def counter(name, doc, labels=("tenant",)):
            return Counter(name, doc, labels, registry=registry)

        # prometheus_client adds the _total suffix to counters.
        self._allowed = counter("retry_budget_client_retries_allowed",
                                "Retries this process allowed with tokens (TryAcquire() true, "
                                "net of refunds; a count, whatever their cost), from leases "
                                "and from the local fallback bucket.")
        self._denied = counter("retry_budget_client_retries_denied",
                               "Retries this process denied for lack of a token.")
        self._shadow_denied = counter("retry_budget_client_shadow_denied",
                                      "Retries a shadow tenant let through that enforcement "
                                      "would have denied (would-be denials; no token taken).")
        self._fallback = counter("retry_budget_client_fallback_retries",
                                 "Of the retries allowed, those from the local fallback bucket "
                                 "while the budget server was unreachable.")
        self._successes = counter("retry_budget_client_successes",
                                  "Successful calls recorded by this process.")
        self._requests = counter("retry_budget_client_requests",
                                 "Requests (first attempts, RecordRequest()) recorded by this "
                                 "process.")
        self._held = Gauge("retry_budget_client_tokens_held",
                           "Retry tokens this process holds right now (lease or fallback).",
                           ("tenant",), registry=registry)
        self._mode = Gauge("retry_budget_client_mode",
                           "1 for the mode the tenant's budget is in (no_lease, lease, "
                           "fallback, deny_fallback), 0 for the others.", ("tenant", "mode"),
                           registry=registry)
        syncs = counter("retry_budget_client_syncs", "Sync attempts to the budget server, by "
                        "result (ok: a response; error: the RPC failed).", ("result",))
        self._syncs_ok = syncs.labels(result="ok")
        self._syncs_error = syncs.labels(result="error")
        self._redirects = counter("retry_budget_client_redirects",
                                  "Tenant entries a server answered with the address of the "
                                  "tenant's owner (cluster mode).", ())
        self._last = {}  # tenant -> the counters last exported (counters only go up)

    def redirected(self) -> None:
        self._redirects.inc()

    def sync_attempted(self, ok: bool) -> None:
        (self._syncs_ok if ok else self._syncs_error).inc()

    def tenant_updated(self, tenant: str, stats) -> None:
        last = self._last.get(tenant, (0,) * 6)
        now = (stats.retries_allowed, stats.retries_denied, stats.fallback_allowed,
               stats.successes, stats.shadow_denied, stats.requests)
        for metric, before, after in zip((self._allowed, self._denied, self._fallback,
                                          self._successes, self._shadow_denied, self._requests),
                                         last, now):
            if after > before:
                metric.labels(tenant=tenant).inc(after - before)
        self._last[tenant] = tuple(max(a, b) for a, b in zip(last, now))
        self._held.labels(tenant=tenant).set(stats.tokens_held)
        for mode in MODES:
            self._mode.labels(tenant=tenant, mode=mode).set(1 if mode == stats.mode else 0)
