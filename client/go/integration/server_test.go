//go:build integration

package integration

import (
	"runtime"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"google.golang.org/protobuf/proto"
)

// spend takes every token it can and records successes, for `d`.
func spend(b *retrybudget.TenantBudget, d time.Duration) (allowed, successes uint64) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if b.TryAcquire() {
			allowed++
		}
		b.RecordSuccess()
		successes++
		time.Sleep(time.Millisecond)
	}
	return allowed, successes
}

func TestServerLostResponseIsResentWithTheSameSeq(t *testing.T) {
	s := startServer(t, policyText("lost", 50, 1, 0, 5000))
	p := startProxy(t, s.target())
	c := newClient(t, p.address, func(o *retrybudget.ClientOptions) { o.Logger = quietLogger() })
	b := tenantOf(t, c, "lost")
	waitForLease(t, b)
	p.mu.Lock()
	p.dropNext = 1
	p.mu.Unlock()
	// Spend the lease down so the refresher asks again; that Sync's response is lost.
	allowed, _ := spend(b, 300*time.Millisecond)
	waitFor(t, 10*time.Second, "a lost response and its resend", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.dropped) == 0 {
			return false
		}
		lost := p.dropped[0]
		for _, r := range p.requests {
			if r.Seq == lost.Seq && r != lost && proto.Equal(r, lost) {
				n := 0
				for _, q := range p.requests {
					if q.Seq == lost.Seq {
						n++
					}
				}
				return n >= 2
			}
		}
		return false
	})
	p.mu.Lock()
	lost := p.dropped[0]
	var resends, sameSeq int
	for _, r := range p.requests {
		if r.Seq == lost.Seq {
			sameSeq++
			if proto.Equal(r, lost) {
				resends++
			}
		}
	}
	p.mu.Unlock()
	if sameSeq < 2 || resends != sameSeq {
		t.Fatalf("seq %d sent %d times, %d of them identical to the lost request", lost.Seq, sameSeq, resends)
	}
	more, _ := spend(b, 200*time.Millisecond)
	allowed += more
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := getBudget(t, s.target(), "lost")
	stats := b.Stats()
	if st.RetriesTotal != stats.RetriesAllowed || stats.RetriesAllowed != allowed {
		t.Fatalf("server counted %d retries, the client allowed %d (library %d)", st.RetriesTotal, allowed, stats.RetriesAllowed)
	}
	// The lost grant was not spent twice: everything granted came back or was spent.
	if st.GrantedTotal-st.ReturnedTotal-st.ReclaimedTotal != st.RetriesTotal || st.LeasedTokens != 0 {
		t.Fatalf("granted %d returned %d reclaimed %d retries %d leased %.1f", st.GrantedTotal,
			st.ReturnedTotal, st.ReclaimedTotal, st.RetriesTotal, st.LeasedTokens)
	}
	checkBound(t, st.RetriesTotal, 50, 1, 0, time.Since(s.started), st.SuccessesTotal, 0)
}

func TestServerLeaseExpiresAtItsTtlThenFallsBack(t *testing.T) {
	s := startServer(t, policyText("expiry", 40, 0, 0, 600))
	p := startProxy(t, s.target())
	c := newClient(t, p.address, func(o *retrybudget.ClientOptions) { o.Logger = quietLogger() })
	b := tenantOf(t, c, "expiry")
	waitForLease(t, b)
	p.setDown(true)
	downAt := time.Now()
	// The lease in force is spent while the server is unreachable...
	if b.Stats().Mode != retrybudget.ModeLease || !b.TryAcquire() {
		t.Fatal("the lease in force must be spendable while the server is unreachable")
	}
	// ... until send time + TTL (600 ms): then the fallback bucket (the safe share).
	waitFor(t, 5*time.Second, "fallback after the lease's TTL", func() bool {
		return b.Stats().Mode == retrybudget.ModeFallback
	})
	if held := time.Since(downAt); held > 3*time.Second {
		t.Fatalf("the lease outlived its TTL by far: fallback after %v", held)
	}
	fallbackTaken := 0
	for b.TryAcquire() {
		fallbackTaken++
	}
	allowance := b.FallbackAllowance(time.Now())
	if float64(b.Stats().FallbackAllowed) > allowance {
		t.Fatalf("fallback allowed %d over its allowance %.2f", b.Stats().FallbackAllowed, allowance)
	}
	p.setDown(false)
	waitForLease(t, b)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := getBudget(t, s.target(), "expiry")
	stats := b.Stats()
	if st.RetriesTotal != stats.RetriesAllowed || st.FallbackRetriesTotal != stats.FallbackAllowed {
		t.Fatalf("server retries %d (fallback %d), client %d (fallback %d)", st.RetriesTotal,
			st.FallbackRetriesTotal, stats.RetriesAllowed, stats.FallbackAllowed)
	}
	if stats.TokensReturned == 0 {
		t.Fatal("the expired lease's unspent tokens were not returned")
	}
	checkBound(t, st.RetriesTotal, 40, 0, 0, time.Since(s.started), st.SuccessesTotal, allowance)
}

func TestServerKill9FallbackRestartLeasesAgain(t *testing.T) {
	const tenant = "kill"
	s := startServer(t, policyText(tenant, 30, 2, 0.1, 1000))
	c := newClient(t, s.target(), func(o *retrybudget.ClientOptions) { o.Logger = quietLogger() })
	b := tenantOf(t, c, tenant)
	waitForLease(t, b)
	var allowed, successes uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			a, su := spend(b, 50*time.Millisecond)
			allowed += a
			successes += su
		}
	}()
	time.Sleep(500 * time.Millisecond)
	s.kill()
	waitFor(t, 10*time.Second, "fallback after kill -9", func() bool {
		return b.Stats().Mode == retrybudget.ModeFallback
	})
	time.Sleep(300 * time.Millisecond)
	s.restart()
	waitFor(t, 15*time.Second, "a lease from the restarted server", func() bool {
		return b.Stats().Mode == retrybudget.ModeLease
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	allowance := b.FallbackAllowance(time.Now())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	stats := b.Stats()
	st := getBudget(t, s.target(), tenant)
	t.Logf("allowed %d (fallback %d of an allowance of %.2f, %d successes credited locally), server counted %d",
		stats.RetriesAllowed, stats.FallbackAllowed, allowance, stats.SuccessesCreditedLocally, st.RetriesTotal)
	if stats.RetriesAllowed != allowed {
		t.Fatalf("library allowed %d, the loop counted %d", stats.RetriesAllowed, allowed)
	}
	// Success-funded fallback: the successes recorded in fallback (one a millisecond) fund the
	// bucket at the policy's credit, 0.1 each; the allowance counts the share's capacity and
	// refill, the credit deposited comes on top.
	if stats.SuccessesCreditedLocally == 0 || stats.SuccessesCreditedLocally > stats.Successes {
		t.Fatalf("%d of %d successes credited locally during a fallback of over 300 ms",
			stats.SuccessesCreditedLocally, stats.Successes)
	}
	if most := allowance + 0.1*float64(stats.SuccessesCreditedLocally); float64(stats.FallbackAllowed) > most {
		t.Fatalf("fallback allowed %d over its allowance %.2f + the credit of %d successes", stats.FallbackAllowed,
			allowance, stats.SuccessesCreditedLocally)
	}
	// The restarted server counted what it could see: every retry reported after the restart
	// (the fallback spending and the leases since). Its totals never exceed the client's.
	if st.RetriesTotal > stats.RetriesAllowed {
		t.Fatalf("the server counted %d retries, more than the client spent (%d)", st.RetriesTotal, stats.RetriesAllowed)
	}
	// The invariant over the whole run, counting what the client really spent.
	checkBound(t, stats.RetriesAllowed, 30, 2, 0.1, time.Since(s.started), successes, allowance)
}

func TestServerFinalSyncReturnsEveryUnspentToken(t *testing.T) {
	s := startServer(t, policyText("final", 100, 0, 0, 30000))
	runtime.GC()
	goroutines := runtime.NumGoroutine()
	c := newClient(t, s.target())
	b := tenantOf(t, c, "final")
	waitForLease(t, b)
	if !b.TryAcquire() {
		t.Fatal("no token with a lease")
	}
	b.RecordSuccess()
	// The take woke the refresher (the lease ran low): wait for the next lease to land.
	waitFor(t, 5*time.Second, "tokens held", func() bool { return b.Stats().TokensHeld > 0 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := getBudget(t, s.target(), "final")
	stats := b.Stats()
	if stats.TokensHeld != 0 || st.RetriesTotal != 1 || st.SuccessesTotal != 1 {
		t.Fatalf("after Close: held %d, server retries %d successes %d", stats.TokensHeld, st.RetriesTotal, st.SuccessesTotal)
	}
	if st.ReturnedTotal != stats.TokensReturned || st.GrantedTotal != stats.TokensReceived ||
		st.GrantedTotal-st.ReturnedTotal != 1 || st.LeasedTokens != 0 {
		t.Fatalf("granted %d returned %d (client received %d returned %d), leased %.1f", st.GrantedTotal,
			st.ReturnedTotal, stats.TokensReceived, stats.TokensReturned, st.LeasedTokens)
	}
	if st.Tokens < 98.5 {
		t.Fatalf("the bucket holds %.2f after the final Sync; want 99 back", st.Tokens)
	}
	if b.TryAcquire() {
		t.Fatal("TryAcquire allowed after Close")
	}
	// Close stops the refresher and closes the channel: no goroutine of the client is left.
	waitFor(t, 5*time.Second, "the client's goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines })
}

func TestServerStrictServerRefusesAnUnknownTenant(t *testing.T) {
	s := startServer(t, "strict: true\n"+policyText("known", 10, 0, 0, 1000))
	c := newClient(t, s.target(), func(o *retrybudget.ClientOptions) { o.Logger = quietLogger() })
	b := tenantOf(t, c, "unknown")
	waitFor(t, 10*time.Second, "the refusal", func() bool { return b.Stats().Err != nil })
	if b.TryAcquire() || b.Stats().Mode != retrybudget.ModeNoLease {
		t.Fatalf("a refused tenant must deny (mode %v)", b.Stats().Mode)
	}
}
