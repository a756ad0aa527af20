//go:build integration

package integration

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

// 32 goroutines race on one tenant for 2 s: what they were allowed equals the library's count
// and the server's own count, and stays within the bound.
func TestRace32GoroutinesOnOneTenantSpendWhatTheServerCounts(t *testing.T) {
	const tenant = "race"
	s := startServer(t, policyText(tenant, 50, 20, 0.05, 2000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, tenant)
	waitForLease(t, b)
	var allowed, denied, successes atomic.Uint64
	var wg sync.WaitGroup
	end := time.Now().Add(2 * time.Second)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				if b.TryAcquire() {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
				if i%4 == g%4 {
					b.RecordSuccess()
					successes.Add(1)
				}
				if i%64 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}(g)
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := getBudget(t, s.target(), tenant)
	stats := b.Stats()
	t.Logf("allowed %d denied %d successes %d; server retries %d denied %d successes %d",
		allowed.Load(), denied.Load(), successes.Load(), st.RetriesTotal, st.RetriesDeniedTotal, st.SuccessesTotal)
	if stats.RetriesAllowed != allowed.Load() || st.RetriesTotal != allowed.Load() {
		t.Fatalf("goroutines allowed %d, library %d, server %d", allowed.Load(), stats.RetriesAllowed, st.RetriesTotal)
	}
	if st.SuccessesTotal != successes.Load() || st.RetriesDeniedTotal != denied.Load() {
		t.Fatalf("server successes %d denied %d, goroutines %d %d", st.SuccessesTotal, st.RetriesDeniedTotal,
			successes.Load(), denied.Load())
	}
	if allowed.Load() == 0 || denied.Load() == 0 {
		t.Fatal("the run must both spend and exhaust the budget")
	}
	checkBound(t, st.RetriesTotal, 50, 20, 0.05, time.Since(s.started), st.SuccessesTotal, 0)
	_ = retrybudget.ModeLease
}
