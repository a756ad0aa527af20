package retrybudget

import (
	"context"
	"math"
	"testing"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Success-funded fallback and the early fallback of a spent lease (the C++ client's
// fallback_test.cc and fallback_bucket_test.cc), on the FakeClock.

// grantWithShare answers every entry with `granted` tokens (0 in a final Sync), a TTL, a
// next_sync_ms of 200 and a SafeShare of the given shape.
func grantWithShare(granted uint64, capacity, refill float64, ttlMs int64, credit float64) func(*pb.SyncRequest) (*pb.SyncResponse, error) {
	return func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		resp := &pb.SyncResponse{}
		for _, e := range req.Tenants {
			g := granted
			if req.Final {
				g = 0
			}
			resp.Tenants = append(resp.Tenants, &pb.TenantGrant{Tenant: e.Tenant, Granted: g,
				LeaseTtlMs: ttlMs, NextSyncMs: 200, SafeShare: &pb.SafeShare{Capacity: capacity,
					RefillPerSecond: refill, SuccessCredit: credit}})
		}
		return resp, nil
	}
}

// stepUntilMode runs refresher steps at the times they ask for until the tenant is in `mode`
// (the clock is left at the step that switched it).
func stepUntilMode(t *testing.T, h *harness, b *TenantBudget, mode Mode, atMost time.Duration) {
	t.Helper()
	giveUp := h.clock.Now().Add(atMost)
	next := h.ref.runOnce()
	for b.Stats().Mode != mode {
		if next.After(giveUp) {
			t.Fatalf("still in mode %v at %v (waiting for %v)", b.Stats().Mode, h.clock.Now().Sub(epoch), mode)
		}
		h.clock.Set(next)
		next = h.ref.runOnce()
	}
}

// serverRules checks every request sent against the server's rules for the counters (as the
// C++ tests' ServerRules): successes_credited_locally <= successes, fallback_spent <=
// retries_spent, and no cumulative counter of a tenant going backwards.
func serverRules(t *testing.T, reqs []*pb.SyncRequest) {
	t.Helper()
	last := map[string]*pb.TenantSync{}
	for _, r := range reqs {
		for _, e := range r.Tenants {
			if e.SuccessesCreditedLocally > e.Successes {
				t.Errorf("seq %d: successes_credited_locally %d > successes %d", r.Seq,
					e.SuccessesCreditedLocally, e.Successes)
			}
			if e.FallbackSpent > e.RetriesSpent {
				t.Errorf("seq %d: fallback_spent %d > retries_spent %d", r.Seq, e.FallbackSpent, e.RetriesSpent)
			}
			if e.RequestsCreditedLocally > e.Requests {
				t.Errorf("seq %d: requests_credited_locally %d > requests %d", r.Seq,
					e.RequestsCreditedLocally, e.Requests)
			}
			if e.RetriesAllowed > e.RetriesSpent {
				t.Errorf("seq %d: retries_allowed %d > retries_spent %d", r.Seq, e.RetriesAllowed, e.RetriesSpent)
			}
			if p, ok := last[e.Tenant]; ok {
				if e.Successes < p.Successes || e.SuccessesCreditedLocally < p.SuccessesCreditedLocally ||
					e.RetriesSpent < p.RetriesSpent || e.FallbackSpent < p.FallbackSpent ||
					e.TokensReceived < p.TokensReceived || e.TokensReturned < p.TokensReturned ||
					e.Requests < p.Requests || e.RequestsCreditedLocally < p.RequestsCreditedLocally ||
					e.ShadowDenied < p.ShadowDenied || e.RetriesAllowed < p.RetriesAllowed {
					t.Errorf("seq %d: a counter went backwards: %v after %v", r.Seq, e, p)
				}
			}
			last[e.Tenant] = e
		}
	}
}

func TestSuccessesInFallbackFundItsBucketOnceAndAreReportedAsCreditedLocally(t *testing.T) {
	// A share of 4 tokens that never refills; each success in fallback is worth half a token.
	h := newHarness(t, grantWithShare(5, 4, 0, 1000, 0.5))
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	// Two successes, then the server goes away: the failing requests carry them, so the server
	// may have credited them (a lost response): they must never fund the fallback bucket.
	b.RecordSuccess()
	b.RecordSuccess()
	h.stub.answer = unavailable
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	if got := h.stub.last(t).Tenants[0].Successes; got != 2 {
		t.Fatalf("the failing request carries %d successes, want 2", got)
	}
	stepUntilMode(t, h, b, ModeFallback, time.Minute)
	if got := takeAll(b); got != 4 {
		t.Fatalf("fallback gave %d tokens, want the share's capacity 4 and nothing for the 2 successes", got)
	}
	if got := b.Stats().SuccessesCreditedLocally; got != 0 {
		t.Fatalf("%d successes credited locally, want 0 (every one is in a request)", got)
	}

	// Six successes in fallback: 3 tokens at the next step, and they are counted as credited.
	for i := 0; i < 6; i++ {
		b.RecordSuccess()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got := takeAll(b); got != 3 {
		t.Fatalf("6 successes at 0.5 gave %d tokens, want 3", got)
	}
	if got := b.Stats().SuccessesCreditedLocally; got != 6 {
		t.Fatalf("%d successes credited locally, want 6", got)
	}
	// Credit never lifts the bucket past its capacity: 20 more successes fill it to 4, and the
	// 12 whose credit did not fit stay the server's to credit.
	for i := 0; i < 20; i++ {
		b.RecordSuccess()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got := takeAll(b); got != 4 {
		t.Fatalf("20 successes into an empty bucket of 4 gave %d tokens, want 4", got)
	}
	if got := b.Stats().SuccessesCreditedLocally; got != 6+8 {
		t.Fatalf("%d successes credited locally, want 14 (8 of the 20 fitted)", got)
	}

	// Back to leases: the request says which successes were credited locally, so the server
	// credits only 28 - 14 of them.
	h.stub.answer = grantWithShare(5, 4, 0, 1000, 0.5)
	stepUntilMode(t, h, b, ModeLease, 2*time.Second)
	through := h.stub.last(t).Tenants[0]
	if through.Successes != 28 || through.SuccessesCreditedLocally != 14 || through.FallbackSpent != 4+3+4 {
		t.Fatalf("the request that got through: successes %d credited locally %d fallback_spent %d, "+
			"want 28 14 11", through.Successes, through.SuccessesCreditedLocally, through.FallbackSpent)
	}
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	final := h.stub.last(t)
	if !final.Final || final.Tenants[0].SuccessesCreditedLocally != 14 {
		t.Fatalf("final request: %v", final)
	}
	serverRules(t, h.stub.sent())
}

func TestSuccessesAnyRequestCarriedNeverFundTheBucketAndLaterOnesDo(t *testing.T) {
	// A share below one token (capacity 0.5, cap 1): there is room for credit at entry.
	h := newHarness(t, grantWithShare(3, 0.5, 1e-6, 5000, 0.25))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	if got := takeAll(b); got != 3 {
		t.Fatalf("took %d of a lease of 3", got)
	}
	b.RecordSuccess()
	b.RecordSuccess()
	// The shard has no owner: the request carrying the 2 successes is answered without a grant
	// and the tenant, its lease spent, falls back once parked for a refresh period.
	h.stub.answer = func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		if req.Final {
			return &pb.SyncResponse{}, nil
		}
		return &pb.SyncResponse{Tenants: []*pb.TenantGrant{{Tenant: "a", Error: &pb.TenantError{
			Code: int32(codes.Unavailable), Message: "no owner"}}}}, nil
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got := h.stub.last(t).Tenants[0].Successes; got != 2 {
		t.Fatalf("the request carried %d successes, want 2", got)
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	if m := b.Stats().Mode; m != ModeFallback {
		t.Fatalf("mode %v, want fallback", m)
	}
	// Their credit (2 x 0.25 would make the 0.5 a whole token) is the server's.
	if got, s := takeAll(b), b.Stats(); got != 0 || s.SuccessesCreditedLocally != 0 {
		t.Fatalf("successes a request carried funded the bucket: %d tokens, %d credited", got,
			s.SuccessesCreditedLocally)
	}
	// Four successes no request carried: the bucket started empty (a spent lease falling back
	// early), and 4 x 0.25 is one whole token.
	for i := 0; i < 4; i++ {
		b.RecordSuccess()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got, s := takeAll(b), b.Stats(); got != 1 || s.SuccessesCreditedLocally != 4 {
		t.Fatalf("4 new successes: %d tokens, %d credited; want 1, 4", got, s.SuccessesCreditedLocally)
	}
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	if f := h.stub.last(t); !f.Final || f.Tenants[0].Successes != 6 || f.Tenants[0].SuccessesCreditedLocally != 4 {
		t.Fatalf("final request: %v", f)
	}
	serverRules(t, h.stub.sent())
}

func TestWithoutASuccessCreditFromTheServerFallbackIsFundedByRefillAlone(t *testing.T) {
	h := newHarness(t, grantWithShare(5, 2, 0, 1000, 0))
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	h.stub.answer = unavailable
	stepUntilMode(t, h, b, ModeFallback, time.Minute)
	if got := takeAll(b); got != 2 {
		t.Fatalf("fallback gave %d tokens, want the share's 2", got)
	}
	for i := 0; i < 100; i++ {
		b.RecordSuccess()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if got := takeAll(b); got != 0 {
		t.Fatalf("100 successes without a success credit gave %d tokens", got)
	}
	if got := b.Stats().SuccessesCreditedLocally; got != 0 {
		t.Fatalf("%d successes credited locally without a success credit", got)
	}
}

func TestTheFallbackBucketTakesTheSmallestSuccessCreditOfTheLastMinute(t *testing.T) {
	h := newHarness(t, grantWithShare(5, 4, 0, 1000, 0.5))
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	h.stub.answer = grantWithShare(5, 4, 0, 1000, 0.25)
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	h.stub.answer = grantWithShare(5, 4, 0, 1000, 1)
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	h.stub.answer = unavailable
	h.clock.Advance(300 * time.Millisecond)
	stepUntilMode(t, h, b, ModeFallback, time.Minute)
	if got := takeAll(b); got != 4 {
		t.Fatalf("fallback gave %d tokens, want 4", got)
	}
	for i := 0; i < 8; i++ {
		b.RecordSuccess()
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	// 0.25 per success (the smallest of 0.5, 0.25, 1): 8 successes are 2 tokens.
	if got := takeAll(b); got != 2 {
		t.Fatalf("8 successes gave %d tokens, want 2 (the smallest credit, 0.25)", got)
	}
}

// fallbackWithCreditSteps puts a tenant in fallback on a share of `credit` per success after an
// outage long enough for the Sync backoff to reach its top, spends the bucket, and returns how
// far away the step after that is.
func fallbackWithCreditSteps(t *testing.T, credit float64) time.Duration {
	h := newHarness(t, grantWithShare(5, 4, 0, 1000, credit))
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	h.stub.answer = unavailable
	stepUntilMode(t, h, b, ModeFallback, time.Minute)
	for h.ref.engine.main.failures < 8 { // the backoff is now 1 s
		h.clock.Set(h.ref.runOnce())
	}
	h.ref.runOnce()
	if b.Stats().Mode != ModeFallback {
		t.Fatalf("mode %v during the outage", b.Stats().Mode)
	}
	takeAll(b)
	now := h.clock.Now()
	return h.ref.runOnce().Sub(now)
}

func TestACreditFundedBucketThatIsNotFullStepsAtLeastEvery50ms(t *testing.T) {
	if d := fallbackWithCreditSteps(t, 0.5); d > creditStepInterval {
		t.Fatalf("a credit-funded bucket that is not full steps %v away, want at most %v", d, creditStepInterval)
	}
	// Without a credit nothing but the Sync backoff is due (the bucket never refills).
	if d := fallbackWithCreditSteps(t, 0); d <= creditStepInterval {
		t.Fatalf("a bucket without credit or refill steps %v away (want the Sync backoff)", d)
	}
}

func TestASpentLeaseFallsBackOnceTheServerHasBeenDownForARefreshPeriod(t *testing.T) {
	h := newHarness(t, grantWithShare(3, 2, 10, 5000, 0))
	b := h.tenant(t, "payments")
	t0 := h.clock.Now()
	h.ref.runOnce()
	h.stub.answer = unavailable
	if got := takeAll(b); got != 3 { // the lease is spent; it would last until t0 + 5 s
		t.Fatalf("took %d of a lease of 3", got)
	}
	// The first failures are a blip: no fallback yet, the spent lease denies.
	next := h.ref.runOnce()
	if b.Stats().Mode != ModeLease || b.TryAcquire() {
		t.Fatalf("mode %v right after the first failure, want the spent lease", b.Stats().Mode)
	}
	// Down for a refresh period (200 ms from the first failed attempt): fall back now, not at
	// the lease's expiry.
	for b.Stats().Mode != ModeFallback {
		if !next.Before(t0.Add(time.Second)) {
			t.Fatal("no fallback within a second of the outage")
		}
		h.clock.Set(next)
		next = h.ref.runOnce()
	}
	if d := h.clock.Now().Sub(t0); d < 200*time.Millisecond {
		t.Fatalf("fell back %v into the outage, before it lasted a refresh period", d)
	}
	// The bucket starts empty (the share of the burst went in the lease; a slow server is down
	// too): only the share's refill funds it, one token per 100 ms.
	if got := takeAll(b); got != 0 {
		t.Fatalf("an early fallback bucket gave %d tokens at once, want 0", got)
	}
	h.clock.Advance(100 * time.Millisecond)
	h.ref.runOnce()
	if got := takeAll(b); got != 1 {
		t.Fatalf("fallback gave %d tokens after 100 ms at 10/s, want 1", got)
	}
	// Back to leases when the server answers; the fallback spending is reported.
	h.stub.answer = grantWithShare(3, 2, 10, 5000, 0)
	stepUntilMode(t, h, b, ModeLease, 2*time.Second)
	if got, want := h.stub.last(t).Tenants[0].FallbackSpent, b.Stats().FallbackAllowed; got != want || got < 1 {
		t.Fatalf("fallback_spent %d, want %d (at least 1)", got, want)
	}
	serverRules(t, h.stub.sent())
}

// waitingStub fails the first attempt at once, as a refused connection does, and makes every
// later one wait out its deadline, as a WaitForReady call on a dead address does: the fake
// clock moves by the attempt's timeout (the real context deadline's remaining time, rounded up
// to the millisecond) and the attempt ends with DEADLINE_EXCEEDED.
type waitingStub struct {
	*fakeStub
	clock *FakeClock
	calls int
}

func (s *waitingStub) Sync(ctx context.Context, req *pb.SyncRequest, opts ...grpc.CallOption) (*pb.SyncResponse, error) {
	s.fakeStub.Sync(ctx, req, opts...)
	s.calls++
	if s.calls == 1 {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	if deadline, ok := ctx.Deadline(); ok {
		s.clock.Advance((time.Until(deadline) + time.Millisecond - 1).Truncate(time.Millisecond))
	}
	return nil, status.Error(codes.DeadlineExceeded, "waited for the channel")
}

// After one failed attempt the next ones wait for the channel to connect, each up to its
// deadline (SyncTimeout, 1 s). The server turns "down" a refresh period after the first
// failure, and the attempt waiting then is cut short for it: the spent lease falls back at that
// moment, not when the wait gives up.
func TestAnAttemptWaitingForTheServerIsCutShortWhenTheServerTurnsDown(t *testing.T) {
	h := newHarness(t, grantWithShare(3, 2, 10, 5000, 0), func(o *ClientOptions) {
		o.SyncTimeout = time.Second
	})
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	if got := takeAll(b); got != 3 {
		t.Fatalf("took %d of a lease of 3", got)
	}
	t0 := h.clock.Now()
	stub := &waitingStub{fakeStub: h.stub, clock: h.clock}
	h.ref.stub = stub
	stepUntilMode(t, h, b, ModeFallback, 3*time.Second)
	if stub.calls < 2 {
		t.Fatalf("%d Sync attempts: none waited for the channel", stub.calls)
	}
	if d := h.clock.Now().Sub(t0); d < 200*time.Millisecond || d > 250*time.Millisecond {
		t.Fatalf("fell back %v after the first failure, want between 200 and 250 ms (not when an "+
			"attempt waiting for the channel gave up)", d)
	}
}

func TestALeaseWithTokensLeftIsSpentWhileTheServerIsDown(t *testing.T) {
	h := newHarness(t, grantWithShare(10, 5, 0, 5000, 0))
	b := h.tenant(t, "payments")
	t0 := h.clock.Now()
	h.ref.runOnce()
	h.stub.answer = unavailable
	if !b.TryAcquire() {
		t.Fatal("denied with a lease")
	}
	next := h.ref.runOnce()
	for next.Before(t0.Add(2 * time.Second)) {
		h.clock.Set(next)
		next = h.ref.runOnce()
	}
	if s := h.ref.engine.stateFor(b, h.clock.Now()); s != down {
		t.Fatalf("server state %v after 2 s of failures, want down", s)
	}
	// Down for far more than a refresh period, but the lease still holds 9 tokens: no fallback
	// bucket on top of them.
	if m := b.Stats().Mode; m != ModeLease {
		t.Fatalf("mode %v with 9 leased tokens left", m)
	}
	if got := takeAll(b); got != 9 {
		t.Fatalf("took %d, want the 9 left in the lease", got)
	}
	if got := b.Stats().FallbackAllowed; got != 0 {
		t.Fatalf("fallback allowed %d", got)
	}
}

func TestOneLostResponseDoesNotOpenAFallbackBucket(t *testing.T) {
	h := newHarness(t, grantWithShare(2, 5, 0, 5000, 0))
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	if got := takeAll(b); got != 2 {
		t.Fatalf("took %d of a lease of 2", got)
	}
	h.stub.answer = unavailable
	h.clock.Advance(10 * time.Millisecond)
	next := h.ref.runOnce() // one failed attempt
	if h.ref.engine.main.failures != 1 {
		t.Fatalf("%d failed attempts, want 1", h.ref.engine.main.failures)
	}
	if m := b.Stats().Mode; m != ModeLease || b.TryAcquire() {
		t.Fatalf("one failed attempt opened a bucket: mode %v", m)
	}
	h.stub.answer = grantWithShare(0, 5, 0, 5000, 0) // answering again: the bucket is dry
	h.clock.Set(next)
	h.ref.runOnce()
	if m := b.Stats().Mode; m != ModeLease {
		t.Fatalf("mode %v after the server answered", m)
	}
	if got := takeAll(b); got != 0 {
		t.Fatalf("took %d after a grant of 0", got)
	}
	if s := b.Stats(); s.FallbackAllowed != 0 || h.stub.last(t).Tenants[0].FallbackSpent != 0 {
		t.Fatalf("fallback allowed %d after a blip", s.FallbackAllowed)
	}
}

func TestAnAnswerEndsTheRunOfFailedAttempts(t *testing.T) {
	h := newHarness(t, grantWithShare(2, 5, 0, 5000, 0))
	b := h.tenant(t, "payments")
	h.ref.runOnce()
	h.stub.answer = unavailable
	h.clock.Advance(10 * time.Millisecond)
	next := h.ref.runOnce() // a blip
	h.stub.answer = grantWithShare(0, 5, 0, 5000, 0)
	h.clock.Set(next)
	h.ref.runOnce() // answered: the lease is now empty
	takeAll(b)
	// Half a second later one attempt fails: a new run of failures, a blip, not "down".
	h.stub.answer = unavailable
	h.clock.Set(epoch.Add(510 * time.Millisecond))
	h.ref.runOnce()
	if f := h.ref.engine.main.failures; f != 1 {
		t.Fatalf("%d failed attempts in the run, want 1", f)
	}
	if s := h.ref.engine.stateFor(b, h.clock.Now()); s != unreachable {
		t.Fatalf("server state %v after one failure following an answer, want unreachable", s)
	}
	if m := b.Stats().Mode; m != ModeLease || b.TryAcquire() {
		t.Fatalf("mode %v: a blip after an answer opened a bucket", m)
	}
}

func TestAParkedTenantWithASpentLeaseFallsBackOnceParkedForARefreshPeriod(t *testing.T) {
	h := newHarness(t, grantWithShare(3, 2, 0, 5000, 0))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	if got := takeAll(b); got != 3 {
		t.Fatalf("took %d of a lease of 3", got)
	}
	// A live server says the shard has no owner that can grant: a failover, not a blip.
	h.stub.answer = func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		return &pb.SyncResponse{Tenants: []*pb.TenantGrant{{Tenant: "a", Error: &pb.TenantError{
			Code: int32(codes.Unavailable), Message: "no owner"}}}}, nil
	}
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	// Parked, not yet down: a shard without an owner for a moment opens no bucket.
	if m := b.Stats().Mode; m != ModeLease {
		t.Fatalf("mode %v right after the shard lost its owner, want lease", m)
	}
	h.clock.Advance(200 * time.Millisecond)
	h.ref.runOnce()
	if m := b.Stats().Mode; m != ModeFallback {
		t.Fatalf("mode %v for a tenant parked a refresh period with a spent lease, want fallback", m)
	}
	if got := takeAll(b); got != 0 {
		t.Fatalf("an early fallback bucket gave %d tokens at once, want 0 (it starts empty)", got)
	}
}

// ---- the bucket's credit math ----

func TestSuccessCreditFillsTheBucketUpToItsCapacityAndSaysHowManyFit(t *testing.T) {
	b := newFallbackBucket(bucketShape{capacity: 4, refillPerSecond: 0, successCredit: 0.5}, epoch, true)
	check := func(at time.Duration, held, successes, wantAdd, wantCredited uint64) {
		t.Helper()
		add, credited := refillS(b, epoch.Add(at), held, successes)
		if add != wantAdd || credited != wantCredited {
			t.Fatalf("refill(%v, held %d, %d successes) = %d tokens, %d credited; want %d, %d",
				at, held, successes, add, credited, wantAdd, wantCredited)
		}
	}
	check(0, 0, 10, 4, 0) // full: no room, none credited here
	// 3 of the 4 taken: room for 3 tokens = 6 successes, 3 arrive (1.5 tokens: one whole now).
	check(time.Second, 1, 3, 1, 3)
	// Room for 1.5 tokens (3 successes) of the 10: 2 whole tokens with the half already there.
	check(2*time.Second, 2, 10, 2, 3)
	check(3*time.Second, 4, 10, 0, 0) // full again
}

func TestNeverHandsOutMoreThanCapacityRefillAndTheCreditOfWhatItCredited(t *testing.T) {
	b := newFallbackBucket(bucketShape{capacity: 3, refillPerSecond: 0.7, successCredit: 0.1}, epoch, true)
	handed, _ := refillS(b, epoch, 0, 0)
	held := handed
	var creditedTotal uint64
	for ms := 1; ms <= 60000; ms += 37 {
		if held > 0 {
			held--
		}
		add, credited := refillS(b, epoch.Add(time.Duration(ms)*time.Millisecond), held, uint64(ms%7))
		creditedTotal += credited
		held += add
		handed += add
		if most := 3 + 0.7*float64(ms)/1000 + 0.1*float64(creditedTotal) + 1e-6; float64(handed) > most {
			t.Fatalf("at %d ms: handed out %d > %.3f", ms, handed, most)
		}
	}
	if creditedTotal == 0 {
		t.Fatal("no success was credited")
	}
	// And the credit is spent: more than refill alone could give.
	if float64(handed) <= 3+0.7*60 {
		t.Fatalf("handed out %d, no more than refill alone", handed)
	}
}

func TestAHostileSuccessCreditCreditsNothing(t *testing.T) {
	for _, credit := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -0.5, 1e300} {
		b := newFallbackBucket(bucketShape{capacity: 4, successCredit: credit}, epoch, true)
		refillS(b, epoch, 0, 0)
		if add, credited := refillS(b, epoch.Add(time.Second), 0, 1000); add != 0 || credited != 0 {
			t.Fatalf("success credit %v: %d tokens, %d credited", credit, add, credited)
		}
	}
}

func TestCreditStepsAreAtMost50msApartUntilTheBucketIsFull(t *testing.T) {
	// Refill 0.1/s: the next token of refill is 10 s away, the next credit step 50 ms.
	b := newFallbackBucket(bucketShape{capacity: 2, refillPerSecond: 0.1, successCredit: 0.5}, epoch, true)
	refillS(b, epoch, 0, 0)
	if got := b.nextTokenAt(); !got.Equal(farFuture) {
		t.Fatalf("a full bucket steps %v after its last step, want never", got.Sub(epoch))
	}
	refillS(b, epoch.Add(time.Second), 0, 0) // both taken
	if got := b.nextTokenAt(); !got.Equal(epoch.Add(time.Second + creditStepInterval)) {
		t.Fatalf("next step %v after the last, want %v", got.Sub(epoch.Add(time.Second)), creditStepInterval)
	}
	// No credit: only the refill's next token (0.1/s from an empty bucket: 10 s).
	n := newFallbackBucket(bucketShape{capacity: 2, refillPerSecond: 0.1}, epoch, true)
	refillS(n, epoch, 0, 0)
	refillS(n, epoch.Add(time.Second), 0, 0)
	if got := n.nextTokenAt().Sub(epoch.Add(time.Second)); got < 9*time.Second {
		t.Fatalf("a bucket without credit steps %v away, want its next token of refill", got)
	}
}

func TestSmallerShapeTakesTheSmallestSuccessCredit(t *testing.T) {
	r := recentSmallest{window: SafeShareMemory, start: farPast}
	r.note(bucketShape{4, 1, 0.5, 0}, epoch)
	r.note(bucketShape{2, 3, 0.25, 0}, epoch.Add(time.Second))
	r.note(bucketShape{5, 2, 1, 0}, epoch.Add(2*time.Second))
	if got := r.get(epoch.Add(3 * time.Second)); got == nil || *got != (bucketShape{2, 1, 0.25, 0}) {
		t.Fatalf("smallest of the minute: %+v, want {2 1 0.25}", got)
	}
}

// refillS is refill with `successes` to credit (and no request); returns how many were.
func refillS(b *fallbackBucket, at time.Time, held, successes uint64) (add, credited uint64) {
	add, credited, _ = refillWith(b, at, held, successes, 0)
	return add, credited
}

// refillWith is refill with `successes` and `requests` to credit; returns how many of each were.
func refillWith(b *fallbackBucket, at time.Time, held, successes, requests uint64) (add, creditedSuccesses, creditedRequests uint64) {
	s := &creditOffer{count: successes, into: &localCredit{}}
	r := &creditOffer{count: requests, into: &localCredit{}}
	add = b.refill(at, held, s, r)
	return add, s.credited, r.credited
}

func TestRequestCreditFillsTheBucketAfterTheSuccessesUpToItsCapacity(t *testing.T) {
	b := newFallbackBucket(bucketShape{capacity: 4, successCredit: 0.5, requestCredit: 0.2}, epoch, false)
	// Empty: 2 successes (1 token), then 20 requests (4 tokens) of which 15 fit (3 tokens).
	add, s, r := refillWith(b, epoch, 0, 2, 20)
	if add != 4 || s != 2 || r != 15 {
		t.Fatalf("refill = %d tokens, %d successes and %d requests credited; want 4, 2, 15", add, s, r)
	}
	// Full: nothing credited.
	if add, s, r := refillWith(b, epoch.Add(time.Second), 4, 3, 3); add != 0 || s != 0 || r != 0 {
		t.Fatalf("a full bucket: %d tokens, %d successes and %d requests credited", add, s, r)
	}
	// A request-funded bucket that is not full steps at most creditStepInterval apart.
	if got := b.nextTokenAt(); !got.Equal(farFuture) {
		t.Fatalf("a full bucket steps at %v", got.Sub(epoch))
	}
	refillWith(b, epoch.Add(2*time.Second), 0, 0, 0)
	if got := b.nextTokenAt(); !got.Equal(epoch.Add(2*time.Second + creditStepInterval)) {
		t.Fatalf("a request-funded bucket not full steps at %v", got.Sub(epoch))
	}
}

func TestLocalCreditOffersOnlyCountsNoRequestCarried(t *testing.T) {
	var c localCredit
	if o := c.offer(5); o.count != 5 {
		t.Fatalf("first offer %d, want 5", o.count)
	}
	if o := c.offer(5); o.count != 0 {
		t.Fatalf("an offer again of the same counts: %d, want 0", o.count)
	}
	c.carried(9) // a request carries 9: the server may credit all of them
	if o := c.offer(10); o.count != 1 {
		t.Fatalf("offer after a request carried 9 of 10: %d, want 1", o.count)
	}
}
