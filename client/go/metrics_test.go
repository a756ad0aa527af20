package retrybudget

import (
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
)

func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := f.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func TestMetricsHaveTheCppClientsNamesAndLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, grantAll(5, 1000), func(o *ClientOptions) { o.MetricsRegistry = reg })
	b := h.tenant(t, "t1")
	b.TryAcquire() // denied: no lease yet
	h.ref.runOnce()
	b.TryAcquire()
	b.TryAcquire()
	b.Refund()
	b.RecordSuccess()
	b.RecordRequest()
	b.RecordRequest()
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	got := gather(t, reg)
	want := map[string]float64{
		"retry_budget_client_retries_allowed_total{tenant=t1}":   1,
		"retry_budget_client_retries_denied_total{tenant=t1}":    1,
		"retry_budget_client_fallback_retries_total{tenant=t1}":  0,
		"retry_budget_client_successes_total{tenant=t1}":         1,
		"retry_budget_client_requests_total{tenant=t1}":          2,
		"retry_budget_client_shadow_denied_total{tenant=t1}":     0,
		"retry_budget_client_tokens_held{tenant=t1}":             9,
		"retry_budget_client_mode{mode=lease,tenant=t1}":         1,
		"retry_budget_client_mode{mode=no_lease,tenant=t1}":      0,
		"retry_budget_client_mode{mode=fallback,tenant=t1}":      0,
		"retry_budget_client_mode{mode=deny_fallback,tenant=t1}": 0,
		"retry_budget_client_syncs_total{result=ok}":             2,
		"retry_budget_client_syncs_total{result=error}":          0,
		"retry_budget_client_redirects_total{}":                  0,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	h.stub.answer = unavailable
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	if got := gather(t, reg); got["retry_budget_client_sync_errors_total{code=UNAVAILABLE}"] != 1 ||
		got["retry_budget_client_syncs_total{result=error}"] != 1 {
		t.Errorf("sync errors: %v", got)
	}
	// Two clients must not share one registry: the second is refused, naming the option.
	o := DefaultClientOptions()
	o.MetricsRegistry = reg
	if _, err := NewClient(o); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "options.MetricsRegistry") {
		t.Fatalf("second client on one registry: %v", err)
	}
}

func TestMetricsCountAShadowTenantsWouldBeDenialsAndRetriesNotTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, grantMode(6, pb.Mode_MODE_SHADOW, 0, 0), func(o *ClientOptions) { o.MetricsRegistry = reg })
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	b.TryAcquireN(3)
	b.TryAcquireN(3)
	b.TryAcquireN(3) // would be denied
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	got := gather(t, reg)
	for k, v := range map[string]float64{
		"retry_budget_client_retries_allowed_total{tenant=t1}": 2,
		"retry_budget_client_shadow_denied_total{tenant=t1}":   1,
		"retry_budget_client_retries_denied_total{tenant=t1}":  0,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
