package retrybudget

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// clientMetrics is what the refresher reports after each of its steps (never the hot path,
// so the metrics lag by at most one step).
type clientMetrics interface {
	syncAttempted(ok bool)
	syncFailed(code codes.Code)
	redirected()
	tenantUpdated(tenant string, s TenantStats)
}

type noMetrics struct{}

func (noMetrics) syncAttempted(bool)                {}
func (noMetrics) syncFailed(codes.Code)             {}
func (noMetrics) redirected()                       {}
func (noMetrics) tenantUpdated(string, TenantStats) {}

// promMetrics are the C++ and Python clients' retry_budget_client_* metrics, same names,
// labels and meaning (client/prometheus_client_metrics.cc).
type promMetrics struct {
	allowed, denied, fallback, successes *prometheus.CounterVec
	shadowDenied, requests               *prometheus.CounterVec
	held, mode                           *prometheus.GaugeVec
	syncs, syncErrors                    *prometheus.CounterVec
	redirects                            prometheus.Counter

	mu        sync.Mutex
	published map[string]*[6]uint64 // per tenant: the cumulative counts already added
}

func newPromMetrics(reg prometheus.Registerer) (*promMetrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &promMetrics{
		allowed: counter("retry_budget_client_retries_allowed_total",
			"Retries this process allowed with tokens (TryAcquire() true, net of refunds; a "+
				"count of retries whatever their cost), from leases and from the local fallback "+
				"bucket.", "tenant"),
		denied: counter("retry_budget_client_retries_denied_total",
			"Retries this process denied for lack of tokens.", "tenant"),
		fallback: counter("retry_budget_client_fallback_retries_total",
			"Of the tokens the allowed retries spent, those from the local fallback bucket "+
				"while the budget server was unreachable (retries, when every retry costs 1).",
			"tenant"),
		successes: counter("retry_budget_client_successes_total",
			"Successful calls recorded by this process.", "tenant"),
		shadowDenied: counter("retry_budget_client_shadow_denied_total",
			"Retries a shadow tenant (a dry run) let through that enforcement would have "+
				"denied.", "tenant"),
		requests: counter("retry_budget_client_requests_total",
			"Requests (first attempts) recorded by this process.", "tenant"),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "retry_budget_client_tokens_held",
			Help: "Retry tokens this process holds right now (lease or fallback)."}, []string{"tenant"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "retry_budget_client_mode",
			Help: "1 for the mode the tenant's budget is in (no_lease, lease, fallback, " +
				"deny_fallback), 0 for the others."}, []string{"tenant", "mode"}),
		syncs: counter("retry_budget_client_syncs_total",
			"Sync attempts to the budget server, by result (ok: a response; error: the RPC "+
				"failed).", "result"),
		syncErrors: counter("retry_budget_client_sync_errors_total",
			"Failed Sync attempts, by gRPC status code (UNAVAILABLE, DEADLINE_EXCEEDED: "+
				"unreachable; INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...: refused by a server "+
				"that answers).", "code"),
		redirects: prometheus.NewCounter(prometheus.CounterOpts{Name: "retry_budget_client_redirects_total",
			Help: "Tenant entries a server answered with the address of the tenant's owner " +
				"(cluster mode)."}),
		published: map[string]*[6]uint64{},
	}
	for _, c := range []prometheus.Collector{m.allowed, m.denied, m.fallback, m.successes,
		m.shadowDenied, m.requests, m.held, m.mode, m.syncs, m.syncErrors, m.redirects} {
		if err := reg.Register(c); err != nil {
			return nil, invalidf("options.MetricsRegistry: cannot register the client metrics: %v", err)
		}
	}
	// Both results exist from the start, as in the C++ client.
	m.syncs.WithLabelValues("ok")
	m.syncs.WithLabelValues("error")
	return m, nil
}

func (m *promMetrics) syncAttempted(ok bool) {
	if ok {
		m.syncs.WithLabelValues("ok").Inc()
	} else {
		m.syncs.WithLabelValues("error").Inc()
	}
}

func (m *promMetrics) syncFailed(c codes.Code) { m.syncErrors.WithLabelValues(codeName(c)).Inc() }

func (m *promMetrics) redirected() { m.redirects.Inc() }

// tenantUpdated feeds the counters from cumulative counts, adding only what is new: a count
// that dips (a Refund after an update) never makes a counter go back.
func (m *promMetrics) tenantUpdated(tenant string, s TenantStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	last, ok := m.published[tenant]
	vecs := []*prometheus.CounterVec{m.allowed, m.denied, m.fallback, m.successes,
		m.shadowDenied, m.requests}
	if !ok {
		last = &[6]uint64{}
		m.published[tenant] = last
		for _, vec := range vecs {
			vec.WithLabelValues(tenant) // every series of a tenant exists from its first update
		}
	}
	now := [6]uint64{s.RetriesAllowed, s.RetriesDenied, s.FallbackAllowed, s.Successes,
		s.ShadowDenied, s.Requests}
	for i, vec := range vecs {
		if now[i] > last[i] {
			vec.WithLabelValues(tenant).Add(float64(now[i] - last[i]))
			last[i] = now[i]
		}
	}
	held := s.TokensHeld
	if held < 0 {
		held = 0
	}
	m.held.WithLabelValues(tenant).Set(float64(held))
	for _, mode := range allModes {
		v := 0.0
		if mode == s.Mode {
			v = 1
		}
		m.mode.WithLabelValues(tenant, mode.String()).Set(v)
	}
}
