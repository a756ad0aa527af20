package retrybudget

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
)

// The client rules of costs, shadow mode and requests (client/conformance/RULES.md:
// cost.all-or-nothing, cost.refund, shadow.*, requests.*), through the real refresher.

// grantMode answers every entry with `granted` tokens in `mode`, and a safe share of
// `capacity` tokens that never refills and gains `requestCredit` per request.
func grantMode(granted uint64, mode pb.Mode, capacity, requestCredit float64) func(*pb.SyncRequest) (*pb.SyncResponse, error) {
	return func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		resp := &pb.SyncResponse{}
		for _, e := range req.Tenants {
			g := granted
			if req.Final {
				g = 0
			}
			resp.Tenants = append(resp.Tenants, &pb.TenantGrant{Tenant: e.Tenant, Granted: g,
				LeaseTtlMs: 1000, NextSyncMs: 200, Mode: mode,
				SafeShare: &pb.SafeShare{Capacity: capacity, RequestCredit: requestCredit}})
		}
		return resp, nil
	}
}

// lines is a Logger keeping what it was told.
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Printf(format string, args ...interface{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprintf(format, args...))
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

func TestTryAcquireNTakesItsCostAllOrNothingAndReportsTokensAndRetries(t *testing.T) {
	h := newHarness(t, grantMode(10, pb.Mode_MODE_ENFORCE, 0, 0))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	if !b.TryAcquireN(4) || !b.TryAcquireN(4) {
		t.Fatal("two retries of cost 4 from a lease of 10 denied")
	}
	if b.TryAcquireN(4) {
		t.Fatal("a retry of cost 4 allowed with 2 tokens left")
	}
	if s := b.Stats(); s.TokensHeld != 2 {
		t.Fatalf("a denied take of 4 took part of the lease: %d held, want 2", s.TokensHeld)
	}
	if !b.TryAcquireN(2) {
		t.Fatal("a retry of cost 2 denied with 2 tokens left")
	}
	s := b.Stats()
	if s.RetriesAllowed != 3 || s.TokensSpent != 10 || s.RetriesDenied != 1 || s.TokensHeld != 0 {
		t.Fatalf("stats %+v: want 3 retries allowed, 10 tokens spent, 1 denied", s)
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	e := h.stub.last(t).Tenants[0]
	if e.RetriesSpent != 10 || e.RetriesAllowed != 3 || e.RetriesDenied != 1 || e.ShadowDenied != 0 {
		t.Fatalf("entry %v: want retries_spent 10, retries_allowed 3, retries_denied 1", e)
	}
	// The demand is in tokens: 10 spent + 4 denied since the first Sync, 0.2 s ago, a rate
	// of 14/s: ceil(14 * 0.2) + the burst of 2 (counting retries, 4/s, it would be 3).
	if e.Want != 5 {
		t.Fatalf("want %d after 14 tokens of demand, want 5", e.Want)
	}
	serverRules(t, h.stub.sent())
}

func TestRefundNGivesTheCostBackAsThatManySingleRefunds(t *testing.T) {
	h := newHarness(t, grantMode(10, pb.Mode_MODE_ENFORCE, 0, 0))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	if !b.TryAcquireN(7) {
		t.Fatal("cost 7 of 10 denied")
	}
	b.RefundN(7)
	s := b.Stats()
	if s.TokensHeld != 10 || s.RetriesAllowed != 0 || s.TokensSpent != 0 || s.Refunds != 1 {
		t.Fatalf("after TryAcquireN(7) and RefundN(7): %+v", s)
	}
	// Refunded after the report: reported as refunded, in tokens.
	if !b.TryAcquireN(7) {
		t.Fatal("cost 7 of 10 denied")
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	b.RefundN(7)
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	e := h.stub.last(t).Tenants[0]
	// retries_allowed does not deduct refunds: 2 retries were allowed (the first, refunded
	// before any report, is in no other counter).
	if e.RetriesSpent != 7 || e.RetriesRefunded != 7 || e.RetriesAllowed != 2 {
		t.Fatalf("entry %v: want retries_spent 7, retries_refunded 7, retries_allowed 2", e)
	}
	serverRules(t, h.stub.sent())
}

func TestACostOutsideItsRangeDeniesCountsNothingAndIsLoggedAtMostOnceAMinute(t *testing.T) {
	log := &lines{}
	h := newHarness(t, grantMode(10, pb.Mode_MODE_SHADOW, 0, 0), func(o *ClientOptions) { o.Logger = log })
	b := h.tenant(t, "a")
	h.ref.runOnce()
	for _, cost := range []int{0, -1, MaxCost + 1} {
		if b.TryAcquireN(cost) {
			t.Fatalf("TryAcquireN(%d) allowed (in shadow mode too)", cost)
		}
	}
	b.RefundN(0)
	s := b.Stats()
	if s.TokensHeld != 10 || s.RetriesDenied != 0 || s.ShadowDenied != 0 || s.Refunds != 0 || s.RetriesAllowed != 0 {
		t.Fatalf("a bad cost counted something: %+v", s)
	}
	var bad []string
	for _, l := range log.all() {
		if strings.Contains(l, "outside [1, 1000000]") {
			bad = append(bad, l)
		}
	}
	if len(bad) != 1 || !strings.Contains(bad[0], "TryAcquireN(0)") || !strings.Contains(bad[0], "cost 0") {
		t.Fatalf("log lines %q: want one naming cost 0", bad)
	}
	h.clock.Advance(time.Minute)
	b.TryAcquireN(MaxCost + 1)
	got := log.all()
	if last := got[len(got)-1]; !strings.Contains(last, "cost 1000001") || !strings.Contains(last, "(3 more") {
		t.Fatalf("the next minute's line %q: want cost 1000001 and the 3 left out", last)
	}
	if !b.TryAcquireN(MaxCost) && b.Stats().ShadowDenied != 1 {
		t.Fatal("the largest cost is not a cost")
	}
}

func TestShadowModeFollowsEveryAnswerAndAllowsAndCountsWhatEnforcementDenies(t *testing.T) {
	h := newHarness(t, grantMode(2, pb.Mode_MODE_SHADOW, 0, 0))
	b := h.tenant(t, "a")
	// A new tenant enforces until its first answer.
	if b.TryAcquire() || b.Shadow() {
		t.Fatal("a new tenant is in shadow mode before its first answer")
	}
	h.ref.runOnce()
	if !b.Shadow() {
		t.Fatal("MODE_SHADOW in the answer did not switch the tenant")
	}
	if !b.TryAcquire() || !b.TryAcquire() {
		t.Fatal("the lease's 2 tokens denied")
	}
	// Enforcement would deny these: allowed, no token, counted as would-be denials.
	if !b.TryAcquireN(3) || !b.TryAcquire() {
		t.Fatal("shadow mode denied a retry")
	}
	s := b.Stats()
	if s.ShadowDenied != 2 || s.RetriesDenied != 1 || s.RetriesAllowed != 2 || s.TokensSpent != 2 || s.TokensHeld != 0 {
		t.Fatalf("stats %+v: want 2 would-be denials, the 1 denial of before, 2 allowed with tokens", s)
	}
	// Refunds go to the unbacked permits first: nothing comes back, nothing is counted.
	b.RefundN(3)
	b.Refund()
	if s := b.Stats(); s.TokensHeld != 0 || s.Refunds != 0 || s.RetriesAllowed != 2 {
		t.Fatalf("refunds of unbacked permits gave something back: %+v", s)
	}
	// None unbacked: a normal refund.
	b.Refund()
	if s := b.Stats(); s.TokensHeld != 1 || s.Refunds != 1 {
		t.Fatalf("a refund with nothing unbacked: %+v", s)
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	e := h.stub.sent()[1].Tenants[0]
	if e.ShadowDenied != 2 || e.RetriesDenied != 1 || e.RetriesSpent != 1 || e.RetriesAllowed != 1 {
		t.Fatalf("entry %v: want shadow_denied 2, retries_denied 1, retries_spent 1, retries_allowed 1", e)
	}
	// The would-be denials are demand in tokens, as denials are: 1 spent + 4 would-be denied
	// since the first Sync (which saw the 1 denial) 0.2 s ago: a rate of 1 x e^-0.2 + 5 per s,
	// ceil(1.16) + the burst of 2 - the 1 token held (counting retries it would be 2).
	if e.Want != 3 {
		t.Fatalf("want %d: the would-be denials' tokens are not demand, want 3", e.Want)
	}
	// An entry with an error keeps the mode; so does a failed Sync.
	h.stub.answer = func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		return &pb.SyncResponse{Tenants: []*pb.TenantGrant{{Tenant: "a", Mode: pb.Mode_MODE_ENFORCE,
			Error: &pb.TenantError{Code: 5, Message: "no such tenant"}}}}, nil
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	h.stub.answer = unavailable
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	if !b.Shadow() {
		t.Fatal("an entry with an error or a failed Sync changed the mode")
	}
	// Any value but MODE_SHADOW enforces.
	h.stub.answer = grantMode(1, pb.Mode_MODE_UNSPECIFIED, 0, 0)
	h.clock.Advance(time.Second)
	h.ref.runOnce()
	if b.Shadow() || !b.TryAcquire() || b.TryAcquire() {
		t.Fatal("MODE_UNSPECIFIED did not switch the tenant back to enforcement")
	}
	serverRules(t, h.stub.sent())
}

func TestRequestsAreReportedAndFundTheFallbackBucketOnce(t *testing.T) {
	// A share of 2 tokens that never refills; each request in fallback is worth half a token.
	h := newHarness(t, grantMode(5, pb.Mode_MODE_ENFORCE, 2, 0.5))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	b.RecordRequest()
	b.RecordRequest()
	h.stub.answer = unavailable
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	if got := h.stub.last(t).Tenants[0].Requests; got != 2 {
		t.Fatalf("the failing request carries %d requests, want 2", got)
	}
	stepUntilMode(t, h, b, ModeFallback, time.Minute)
	// The 2 requests a request carried are the server's to credit.
	if got, s := takeAll(b), b.Stats(); got != 2 || s.RequestsCreditedLocally != 0 {
		t.Fatalf("fallback gave %d tokens with %d requests credited locally, want 2 and 0", got,
			s.RequestsCreditedLocally)
	}
	// 3 requests in fallback: 1.5 tokens, one whole; 10 more fill the bucket (1 of them fits).
	for i := 0; i < 3; i++ {
		b.RecordRequest()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got, s := takeAll(b), b.Stats(); got != 1 || s.RequestsCreditedLocally != 3 || s.Requests != 5 {
		t.Fatalf("3 requests at 0.5: %d tokens, stats %+v", got, s)
	}
	for i := 0; i < 10; i++ {
		b.RecordRequest()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got, s := takeAll(b), b.Stats(); got != 2 || s.RequestsCreditedLocally != 6 {
		t.Fatalf("10 requests into a bucket at 0.5 of 2: %d tokens, %d credited; want 2, 6", got,
			s.RequestsCreditedLocally)
	}
	h.stub.answer = grantMode(5, pb.Mode_MODE_ENFORCE, 2, 0.5)
	stepUntilMode(t, h, b, ModeLease, 2*time.Second)
	through := h.stub.last(t).Tenants[0]
	if through.Requests != 15 || through.RequestsCreditedLocally != 6 {
		t.Fatalf("the request that got through: %v; want requests 15, requests_credited_locally 6", through)
	}
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	serverRules(t, h.stub.sent())
}

// Takes of cost 1 and 3 race on one lease, with refunds and Stats readers beside them:
// retries_allowed counts retries, not tokens (a take of cost 3 is one retry), exactly, and no
// reading made during the race ever counts more retries than were allowed by the end.
func TestRetriesAllowedCountsMixedCostTakesExactlyUnderConcurrency(t *testing.T) {
	h := newHarness(t, grantAll(3000, 60000))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed, refunds, tokens := 0, 0, 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			a, r, n := 0, 0, 0
			for i := 0; i < 400; i++ {
				cost := 1 + 2*((g+i)%2)
				if !b.TryAcquireN(cost) {
					continue
				}
				a++
				n += cost
				if i%7 == 0 {
					b.RefundN(cost)
					r++
					n -= cost
				}
			}
			mu.Lock()
			allowed, refunds, tokens = allowed+a, refunds+r, tokens+n
			mu.Unlock()
		}(g)
	}
	done := make(chan struct{})
	var most uint64
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			if s := b.Stats(); s.RetriesAllowed > most {
				most = s.RetriesAllowed
			}
		}
	}()
	wg.Wait()
	<-done
	s := b.Stats()
	if want := uint64(allowed - refunds); s.RetriesAllowed != want || s.Refunds != uint64(refunds) ||
		s.TokensSpent != uint64(tokens) || s.TokensHeld != int64(3000-tokens) {
		t.Fatalf("%d allowed, %d refunded, %d tokens spent; stats %+v", allowed, refunds, tokens, s)
	}
	if most > s.RetriesAllowed+uint64(refunds) {
		t.Fatalf("a reading during the race counted %d retries allowed; %d were allowed in all", most, allowed)
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	if e := h.stub.last(t).Tenants[0]; e.RetriesSpent != uint64(tokens) || e.RetriesAllowed > uint64(allowed) ||
		e.RetriesAllowed < uint64(allowed-refunds) {
		t.Fatalf("entry %v: want retries_spent %d, retries_allowed in [%d, %d]", e, tokens, allowed-refunds, allowed)
	}
	serverRules(t, h.stub.sent())
}
