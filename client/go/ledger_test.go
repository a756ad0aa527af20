package retrybudget

import (
	"math/rand"
	"testing"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
)

// grantOnce grants `granted` tokens to the first request and nothing to the later ones (each
// answer renews the lease for ttlMs), so a test counts every token it was given.
func grantOnce(granted uint64, ttlMs int64) func(*pb.SyncRequest) (*pb.SyncResponse, error) {
	n := 0
	return func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		n++
		g := uint64(0)
		if n == 1 {
			g = granted
		}
		return grantWithShare(g, 3, 1, ttlMs, 0)(req)
	}
}

type wireCounters struct{ spent, refunded, fallbackSpent, fallbackRefunded, returned, received uint64 }

func countersOf(e *pb.TenantSync) wireCounters {
	return wireCounters{e.RetriesSpent, e.RetriesRefunded, e.FallbackSpent, e.FallbackRefunded,
		e.TokensReturned, e.TokensReceived}
}

// syncNow moves the clock past the minimum interval and runs one refresher step that sends a
// new request (the tenant is asked to sync); returns that request's entry.
func syncNow(t *testing.T, h *harness, b *TenantBudget) wireCounters {
	t.Helper()
	before := len(h.stub.sent())
	b.syncWanted.Store(true)
	h.clock.Advance(10 * time.Millisecond)
	b.mu.Lock()
	b.nextDue, b.dryUntil = farPast, farPast
	b.mu.Unlock()
	h.ref.runOnce()
	sent := h.stub.sent()
	if len(sent) != before+1 {
		t.Fatalf("%d requests sent by one step, want 1", len(sent)-before)
	}
	return countersOf(sent[len(sent)-1].Tenants[0])
}

func TestRefundAfterTheReportIsReportedAsRefundedAndTheTokenReturned(t *testing.T) {
	h := newHarness(t, grantOnce(5, 60000))
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	if !b.TryAcquire() {
		t.Fatal("denied with a lease of 5")
	}
	if got := syncNow(t, h, b); got.spent != 1 || got.refunded != 0 {
		t.Fatalf("after one take: %+v, want spent 1 refunded 0", got)
	}
	b.Refund() // the backoff was cancelled: the retry is never sent
	if got := syncNow(t, h, b); got.spent != 1 || got.refunded != 1 || got.returned != 0 {
		t.Fatalf("after the refund: %+v, want spent 1 refunded 1", got)
	}
	if s := b.Stats(); s.RetriesAllowed != 0 || s.TokensHeld != 5 || s.TokensReceived != 5 {
		t.Fatalf("stats after the refund: %+v", s)
	}
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	final := countersOf(h.stub.last(t).Tenants[0])
	if final != (wireCounters{spent: 1, refunded: 1, returned: 5, received: 5}) {
		t.Fatalf("final: %+v, want spent 1 refunded 1 returned 5 received 5", final)
	}
	s := b.Stats()
	if s.TokensReceived != s.RetriesAllowed+s.TokensReturned+uint64(s.TokensHeld) {
		t.Fatalf("stats do not add up: %+v", s)
	}
}

func TestARefundedTokenSpentAgainIsSpentOnce(t *testing.T) {
	h := newHarness(t, grantOnce(5, 60000))
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	b.TryAcquire()
	syncNow(t, h, b) // spent 1
	b.Refund()
	if got := syncNow(t, h, b); got.spent != 1 || got.refunded != 1 {
		t.Fatalf("after the refund: %+v", got)
	}
	b.TryAcquire() // spent again: the refund stays reported, the take is a new spend
	if got := syncNow(t, h, b); got.spent != 2 || got.refunded != 1 {
		t.Fatalf("after the re-spend: %+v, want spent 2 refunded 1", got)
	}
	// A refund and a re-spend between two reports change nothing.
	b.Refund()
	b.TryAcquire()
	if got := syncNow(t, h, b); got.spent != 2 || got.refunded != 1 {
		t.Fatalf("after a refund and a re-spend between reports: %+v", got)
	}
	// A take refunded before any report is never reported.
	b.TryAcquire()
	b.Refund()
	if got := syncNow(t, h, b); got.spent != 2 || got.refunded != 1 {
		t.Fatalf("after a take refunded before its report: %+v", got)
	}
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	final := countersOf(h.stub.last(t).Tenants[0])
	if final != (wireCounters{spent: 2, refunded: 1, returned: 4, received: 5}) {
		t.Fatalf("final: %+v, want spent 2 refunded 1 returned 4 received 5", final)
	}
}

func TestARefundAfterTheSourceChangedStaysSpentInTheOtherSourcesBooks(t *testing.T) {
	h := newHarness(t, unavailable, func(o *ClientOptions) {
		o.FallbackCapacity = 1
		o.FallbackRefillPerSecond = 0
	})
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	if !b.TryAcquire() || b.Stats().Mode != ModeFallback {
		t.Fatalf("no fallback token: %+v", b.Stats())
	}
	// The server is back: the lease replaces the (empty) fallback word.
	h.stub.answer = grantOnce(3, 60000)
	stepUntilMode(t, h, b, ModeLease, 5*time.Second)
	b.Refund() // the fallback token's refund lands in the lease word
	got := syncNow(t, h, b)
	if got.spent != 1 || got.fallbackSpent != 1 || got.refunded != 0 || got.received != 3 {
		t.Fatalf("after a fallback token's refund into the lease: %+v", got)
	}
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	final := countersOf(h.stub.last(t).Tenants[0])
	// The three leased tokens go back; the refunded fallback token stays spent (absorbed).
	if final != (wireCounters{spent: 1, fallbackSpent: 1, returned: 3, received: 3}) {
		t.Fatalf("final: %+v", final)
	}
}

// Random takes, refunds, grants, outages and expiries: every request keeps the counters
// monotonic and within the server's checks, and the final one reports at least the retries
// really sent (exactly, when no refund crossed a change of source).
func TestLedgerCountersStayMonotonicAndWithinTheServersChecks(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		up := true
		h := newHarness(t, func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
			if !up && !req.Final {
				return unavailable(req)
			}
			return grantWithShare(uint64(rng.Intn(4)), 2, 5, int64(100+rng.Intn(400)), 0)(req)
		})
		b := h.tenant(t, "t1")
		outstanding, sent := 0, 0
		for i := 0; i < 300; i++ {
			switch op := rng.Intn(10); {
			case op < 4:
				if b.TryAcquire() {
					outstanding++
				}
			case op < 6:
				if outstanding > 0 {
					if rng.Intn(2) == 0 {
						b.Refund()
					} else {
						sent++
					}
					outstanding--
				}
			case op < 7:
				up = !up
			default:
				h.clock.Advance(time.Duration(rng.Intn(300)) * time.Millisecond)
				h.ref.runOnce()
			}
		}
		sent += outstanding // a take not refunded by the end counts as sent
		if err := h.client.Close(); err != nil {
			t.Fatal(err)
		}
		var prev wireCounters
		for i, r := range h.stub.sent() {
			c := countersOf(r.Tenants[0])
			if c.spent < prev.spent || c.refunded < prev.refunded || c.fallbackSpent < prev.fallbackSpent ||
				c.fallbackRefunded < prev.fallbackRefunded || c.returned < prev.returned || c.received < prev.received {
				t.Fatalf("seed %d request %d: a counter went back: %+v after %+v", seed, i, c, prev)
			}
			if c.refunded > c.spent || c.fallbackRefunded > c.fallbackSpent || c.fallbackRefunded > c.refunded ||
				c.fallbackSpent > c.spent ||
				(c.spent-c.fallbackSpent)-(c.refunded-c.fallbackRefunded)+c.returned > c.received {
				t.Fatalf("seed %d request %d: counters fail the server's checks: %+v", seed, i, c)
			}
			prev = c
		}
		if net := prev.spent - prev.refunded; net < uint64(sent) {
			t.Fatalf("seed %d: final reports %d retries sent, the program sent %d", seed, net, sent)
		}
		s := b.Stats()
		if s.RetriesAllowed < uint64(sent) || s.TokensHeld != 0 || s.TokensReturned != prev.returned {
			t.Fatalf("seed %d: stats %+v after Close (sent %d)", seed, s, sent)
		}
	}
}
