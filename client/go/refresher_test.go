package retrybudget

import (
	"context"
	"errors"
	"io"
	"log"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// fakeStub stands in for a RetryBudgetService stub in unit tests (the C++ tests' mock stub):
// it records every request and answers with `answer`.
type fakeStub struct {
	mu       sync.Mutex
	requests []*pb.SyncRequest
	answer   func(req *pb.SyncRequest) (*pb.SyncResponse, error)
}

func (f *fakeStub) Sync(ctx context.Context, req *pb.SyncRequest, _ ...grpc.CallOption) (*pb.SyncResponse, error) {
	f.mu.Lock()
	f.requests = append(f.requests, proto.Clone(req).(*pb.SyncRequest))
	answer := f.answer
	f.mu.Unlock()
	return answer(req)
}

func (f *fakeStub) sent() []*pb.SyncRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.SyncRequest(nil), f.requests...)
}

func (f *fakeStub) last(t *testing.T) *pb.SyncRequest {
	t.Helper()
	r := f.sent()
	if len(r) == 0 {
		t.Fatal("no Sync was sent")
	}
	return r[len(r)-1]
}

// grantAll answers every entry with `granted` tokens, a TTL and a safe share of 3 tokens
// refilling 1/s (fallback_test.go's grantWithShare with that share).
func grantAll(granted uint64, ttlMs int64) func(*pb.SyncRequest) (*pb.SyncResponse, error) {
	return grantWithShare(granted, 3, 1, ttlMs, 0)
}

func unavailable(*pb.SyncRequest) (*pb.SyncResponse, error) {
	return nil, status.Error(codes.Unavailable, "server down")
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type harness struct {
	clock  *FakeClock
	stub   *fakeStub
	owners map[string]*fakeStub
	client *Client
	ref    *refresher
}

func newHarness(t *testing.T, answer func(*pb.SyncRequest) (*pb.SyncResponse, error), edit ...func(*ClientOptions)) *harness {
	t.Helper()
	h := &harness{clock: NewFakeClock(epoch), stub: &fakeStub{answer: answer}, owners: map[string]*fakeStub{}}
	o := DefaultClientOptions()
	o.Clock = h.clock
	o.InstanceID = "test-instance"
	o.Logger = log.New(io.Discard, "", 0)
	o.SyncTimeout = 5 * time.Second // fake clock: real deadlines never cut a step short
	for _, e := range edit {
		e(&o)
	}
	o, err := validateAndDefault(o)
	if err != nil {
		t.Fatal(err)
	}
	owners := func(addr string) (pb.RetryBudgetServiceClient, func(), error) {
		if err := checkOwnerAddress(addr); err != nil {
			return nil, nil, err
		}
		s, ok := h.owners[addr]
		if !ok {
			return nil, nil, errors.New("no such owner in the test")
		}
		return s, func() {}, nil
	}
	h.client, err = newClient(o, h.stub, owners)
	if err != nil {
		t.Fatal(err)
	}
	h.ref = h.client.refresher
	return h
}

func (h *harness) tenant(t *testing.T, name string) *TenantBudget {
	t.Helper()
	b, err := h.client.Tenant(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func takeAll(b *TenantBudget) int {
	n := 0
	for b.TryAcquire() {
		n++
	}
	return n
}

func TestFirstSyncHasSeqOneAndGrantOpensLease(t *testing.T) {
	h := newHarness(t, grantAll(5, 1000))
	b := h.tenant(t, "t1")
	if b.TryAcquire() {
		t.Fatal("TryAcquire allowed before any lease")
	}
	h.ref.runOnce()
	req := h.stub.last(t)
	if req.Seq != 1 || req.InstanceId != "test-instance" || len(req.Tenants) != 1 || req.Tenants[0].Tenant != "t1" {
		t.Fatalf("first request: %v", req)
	}
	if req.Tenants[0].RetriesDenied != 1 || req.Tenants[0].Want == 0 {
		t.Fatalf("first request must carry the denial and a want: %v", req.Tenants[0])
	}
	if got := takeAll(b); got != 5 {
		t.Fatalf("took %d tokens of a grant of 5", got)
	}
	if s := b.Stats(); s.Mode != ModeLease || s.TokensReceived != 5 || s.RetriesAllowed != 5 {
		t.Fatalf("stats after spending the lease: %+v", s)
	}
}

func TestLeaseExpiresAtSendTimePlusTtlAndUnspentTokensAreReturned(t *testing.T) {
	h := newHarness(t, grantAll(10, 1000))
	b := h.tenant(t, "t1")
	h.ref.runOnce() // sent at epoch: the lease ends at epoch + 1 s
	for i := 0; i < 3; i++ {
		if !b.TryAcquire() {
			t.Fatal("denied with a lease")
		}
	}
	h.stub.answer = func(*pb.SyncRequest) (*pb.SyncResponse, error) {
		return &pb.SyncResponse{Tenants: []*pb.TenantGrant{{Tenant: "t1", Error: &pb.TenantError{
			Code: int32(codes.NotFound), Message: "held back by the test"}}}}, nil
	}
	h.clock.Set(epoch.Add(999 * time.Millisecond))
	if b.leaseEndsAt() != epoch.Add(time.Second) {
		t.Fatalf("lease ends at %v, want send time + TTL", b.leaseEndsAt())
	}
	h.clock.Set(epoch.Add(time.Second))
	h.ref.runOnce()
	if b.TryAcquire() {
		t.Fatal("a token was taken after the lease's expiry")
	}
	h.stub.answer = grantAll(0, 1000)
	h.clock.Advance(time.Second)
	h.ref.runOnce()
	last := h.stub.last(t).Tenants[0]
	if last.TokensReturned != 7 || last.RetriesSpent != 3 || last.TokensReceived != 10 {
		t.Fatalf("after expiry: returned %d spent %d received %d, want 7 3 10", last.TokensReturned,
			last.RetriesSpent, last.TokensReceived)
	}
}

func TestFailedSyncIsResentUnchangedWithTheSameSeq(t *testing.T) {
	h := newHarness(t, unavailable)
	b := h.tenant(t, "t1")
	b.RecordSuccess()
	h.ref.runOnce()
	first := h.stub.last(t)
	b.RecordSuccess() // must not change the resend
	h.clock.Advance(25 * time.Millisecond)
	h.stub.answer = grantAll(4, 1000)
	h.ref.runOnce()
	reqs := h.stub.sent()
	if len(reqs) != 2 || !proto.Equal(reqs[0], reqs[1]) || reqs[1].Seq != first.Seq {
		t.Fatalf("the resend differs from the failed request:\n%v\n%v", reqs[0], reqs[len(reqs)-1])
	}
	// The resend's grant applies; a new request then gets seq + 1 and the new success.
	if takeAll(b) != 4 {
		t.Fatal("the resend's grant was not applied")
	}
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	last := h.stub.last(t)
	if last.Seq != first.Seq+1 || last.Tenants[0].Successes != 2 {
		t.Fatalf("next request: seq %d successes %d", last.Seq, last.Tenants[0].Successes)
	}
}

func TestRequestFailingForARefreshPeriodIsAbandonedForANewSeq(t *testing.T) {
	h := newHarness(t, unavailable)
	h.tenant(t, "t1")
	h.ref.runOnce()
	for i := 0; i < 20; i++ {
		h.clock.Advance(50 * time.Millisecond)
		h.ref.runOnce()
	}
	seqs := map[uint64]bool{}
	for _, r := range h.stub.sent() {
		seqs[r.Seq] = true
	}
	if len(seqs) < 2 || !seqs[1] || !seqs[2] {
		t.Fatalf("seqs sent during an outage of 1 s: %v (want a new one per refresh period)", seqs)
	}
}

func TestUnreachableServerFallsBackToTheNeverReachedBucket(t *testing.T) {
	h := newHarness(t, unavailable, func(o *ClientOptions) {
		o.FallbackCapacity = 1
		o.FallbackRefillPerSecond = 0.1
	})
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	if s := b.Stats(); s.Mode != ModeFallback {
		t.Fatalf("mode %v after a failed Sync with no lease, want fallback", s.Mode)
	}
	if got := takeAll(b); got != 1 {
		t.Fatalf("fallback bucket of capacity 1 gave %d", got)
	}
	h.ref.runOnce() // the take from a full bucket woke the refresher: the refill starts now
	h.clock.Advance(9 * time.Second)
	h.ref.runOnce()
	if b.TryAcquire() {
		t.Fatal("a token before 10 s at 0.1/s")
	}
	h.clock.Advance(1100 * time.Millisecond)
	h.ref.runOnce()
	if got := takeAll(b); got != 1 {
		t.Fatalf("after 10 s at 0.1/s: %d tokens", got)
	}
	allowance := b.FallbackAllowance(h.clock.Now())
	if s := b.Stats(); float64(s.FallbackAllowed) > allowance || s.FallbackAllowed != 2 {
		t.Fatalf("fallback allowed %d, allowance %.2f", s.FallbackAllowed, allowance)
	}
	// Back: the next Sync reports the fallback spending and the lease replaces the bucket.
	h.stub.answer = grantAll(3, 1000)
	h.clock.Advance(time.Second)
	h.ref.runOnce()
	h.clock.Advance(time.Second)
	h.ref.runOnce()
	var reported *pb.TenantSync
	for _, r := range h.stub.sent() {
		reported = r.Tenants[0]
	}
	if b.Stats().Mode != ModeLease || reported.FallbackSpent != 2 || reported.RetriesSpent != 2 {
		t.Fatalf("after the server came back: mode %v, reported %v", b.Stats().Mode, reported)
	}
}

func TestLeaseInForceIsSpentFirstThenTheSafeShare(t *testing.T) {
	h := newHarness(t, grantAll(2, 1000))
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	h.stub.answer = unavailable
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	if b.Stats().Mode != ModeLease || takeAll(b) != 2 {
		t.Fatal("the lease in force must be spent while the server is unreachable")
	}
	h.clock.Set(epoch.Add(time.Second))
	h.ref.runOnce()
	// Safe share: capacity 3, 1 token/s.
	if s := b.Stats(); s.Mode != ModeFallback {
		t.Fatalf("mode %v after the lease expired with the server down", s.Mode)
	}
	if got := takeAll(b); got != 3 {
		t.Fatalf("safe-share bucket of capacity 3 gave %d", got)
	}
}

func TestDenyFallbackDeniesWhileUnreachable(t *testing.T) {
	h := newHarness(t, unavailable, func(o *ClientOptions) { o.Fallback = FallbackDeny })
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	if b.TryAcquire() || b.Stats().Mode != ModeDenyFallback {
		t.Fatalf("FallbackDeny allowed a retry or is in mode %v", b.Stats().Mode)
	}
}

func TestPermissionDeniedDeniesInsteadOfFallingBack(t *testing.T) {
	h := newHarness(t, func(*pb.SyncRequest) (*pb.SyncResponse, error) {
		return nil, status.Error(codes.PermissionDenied, "not yours")
	})
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	if b.TryAcquire() || b.Stats().Mode != ModeNoLease {
		t.Fatalf("a refusing server must mean deny, mode %v", b.Stats().Mode)
	}
}

// Hostile responses: clamp or refuse as the C++ client does, never fail open, never crash.
func TestHostileResponses(t *testing.T) {
	answer := func(f func(g *pb.TenantGrant, resp *pb.SyncResponse)) func(*pb.SyncRequest) (*pb.SyncResponse, error) {
		return func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
			g := &pb.TenantGrant{Tenant: req.Tenants[0].Tenant, Granted: 3, LeaseTtlMs: 1000, NextSyncMs: 100}
			resp := &pb.SyncResponse{Tenants: []*pb.TenantGrant{g}}
			f(g, resp)
			return resp, nil
		}
	}
	t.Run("huge grant is capped and reported as received", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) { g.Granted = math.MaxUint64 }))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		s := b.Stats()
		if uint64(s.TokensHeld) != maxLeaseTokens || s.TokensReceived != math.MaxUint64 {
			t.Fatalf("held %d received %d", s.TokensHeld, s.TokensReceived)
		}
	})
	t.Run("ttl <= 0 ends the lease at once", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) { g.LeaseTtlMs = -5 }))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		if b.TryAcquire() {
			t.Fatal("a lease with a negative TTL was spent")
		}
	})
	t.Run("huge ttl is read as 600 s", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) { g.LeaseTtlMs = math.MaxInt64 }))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		if got := b.leaseEndsAt(); got != epoch.Add(maxLeaseTTL) {
			t.Fatalf("lease ends at %v", got)
		}
	})
	t.Run("huge next_sync_ms is capped at the refresh period", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) { g.NextSyncMs = math.MaxInt64 }))
		h.tenant(t, "t1")
		if next := h.ref.runOnce(); next.After(epoch.Add(200 * time.Millisecond)) {
			t.Fatalf("next step at %v", next)
		}
	})
	t.Run("another tenant's name takes nothing", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) { g.Tenant = "other" }))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		if b.TryAcquire() || b.Stats().TokensReceived != 0 {
			t.Fatal("a grant for another tenant was taken")
		}
	})
	t.Run("extra and missing entries", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, r *pb.SyncResponse) {
			r.Tenants = append(r.Tenants, &pb.TenantGrant{Tenant: "t2", Granted: 100, LeaseTtlMs: 1000})
		}))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		if takeAll(b) != 3 {
			t.Fatal("the matching entry was not applied")
		}
		h2 := newHarness(t, func(*pb.SyncRequest) (*pb.SyncResponse, error) { return &pb.SyncResponse{}, nil })
		b2 := h2.tenant(t, "t1")
		h2.ref.runOnce()
		if b2.TryAcquire() {
			t.Fatal("a response without entries granted something")
		}
	})
	t.Run("stale response is ignored", func(t *testing.T) {
		h := newHarness(t, answer(func(_ *pb.TenantGrant, r *pb.SyncResponse) { r.Stale = true }))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		if b.TryAcquire() {
			t.Fatal("a stale response granted tokens")
		}
	})
	t.Run("NaN and negative safe shares give an empty fallback bucket", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) {
			g.Granted = 0
			g.SafeShare = &pb.SafeShare{Capacity: math.NaN(), RefillPerSecond: -4}
		}))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		h.stub.answer = unavailable
		h.clock.Advance(2 * time.Second)
		h.ref.runOnce()
		h.clock.Advance(10 * time.Second)
		h.ref.runOnce()
		if b.Stats().Mode != ModeFallback || b.TryAcquire() {
			t.Fatalf("a NaN safe share allowed a retry (mode %v)", b.Stats().Mode)
		}
	})
	t.Run("infinite safe share is capped", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) {
			g.Granted = 0
			g.SafeShare = &pb.SafeShare{Capacity: math.Inf(1), RefillPerSecond: math.Inf(1)}
		}))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		h.stub.answer = unavailable
		h.clock.Advance(2 * time.Second)
		h.ref.runOnce()
		if s := b.Stats(); s.Mode != ModeFallback || uint64(s.TokensHeld) > maxLeaseTokens {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("refused tenant is denied and names the error", func(t *testing.T) {
		h := newHarness(t, answer(func(g *pb.TenantGrant, _ *pb.SyncResponse) {
			g.Error = &pb.TenantError{Code: int32(codes.NotFound), Message: "strict server"}
		}))
		b := h.tenant(t, "t1")
		h.ref.runOnce()
		var te *TenantError
		if b.TryAcquire() || !errors.As(b.Stats().Err, &te) || te.Code != codes.NotFound {
			t.Fatalf("refusal: %v", b.Stats().Err)
		}
	})
}

func TestRequestRefusedAsAWholeIsSplitAtTheNamedLimit(t *testing.T) {
	h := newHarness(t, func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		if len(req.Tenants) > 2 {
			return nil, status.Errorf(codes.InvalidArgument, "%d tenants; at most 2 are allowed in one request", len(req.Tenants))
		}
		return grantAll(1, 1000)(req)
	})
	var bs []*TenantBudget
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		bs = append(bs, h.tenant(t, n))
	}
	h.ref.runOnce()
	for _, b := range bs {
		if !b.TryAcquire() {
			t.Fatalf("tenant %s got no grant after the split", b.name)
		}
	}
	if h.ref.engine.main.maxTenants != 2 {
		t.Fatalf("the named limit was not kept: %d", h.ref.engine.main.maxTenants)
	}
}

func ownerAnswer(owner string) func(*pb.SyncRequest) (*pb.SyncResponse, error) {
	return func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		resp := &pb.SyncResponse{}
		for _, e := range req.Tenants {
			resp.Tenants = append(resp.Tenants, &pb.TenantGrant{Tenant: e.Tenant, Error: &pb.TenantError{
				Code: int32(codes.FailedPrecondition), Message: "not mine", Owner: owner}})
		}
		return resp, nil
	}
}

func TestRedirectSyncsTheTenantWithItsOwnerInTheSameStep(t *testing.T) {
	h := newHarness(t, ownerAnswer("127.0.0.1:7002"))
	owner := &fakeStub{answer: grantAll(4, 1000)}
	h.owners["127.0.0.1:7002"] = owner
	a, b := h.tenant(t, "a"), h.tenant(t, "b")
	h.ref.runOnce()
	if len(owner.sent()) != 1 || len(owner.sent()[0].Tenants) != 2 {
		t.Fatalf("owner got %d requests (want one Sync for both tenants)", len(owner.sent()))
	}
	if owner.sent()[0].Seq <= h.stub.sent()[0].Seq {
		t.Fatal("seq must grow across routes")
	}
	if takeAll(a) != 4 || takeAll(b) != 4 {
		t.Fatal("the owner's grants were not applied")
	}
	// Later refreshes go to the owner only.
	before := len(h.stub.sent())
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	if len(h.stub.sent()) != before || len(owner.sent()) != 2 {
		t.Fatalf("main got %d more, owner %d in all", len(h.stub.sent())-before, len(owner.sent()))
	}
}

func TestRedirectLoopParksTheTenant(t *testing.T) {
	h := newHarness(t, ownerAnswer("127.0.0.1:7002"))
	h.owners["127.0.0.1:7002"] = &fakeStub{answer: ownerAnswer("127.0.0.1:7003")}
	h.owners["127.0.0.1:7003"] = &fakeStub{answer: ownerAnswer("127.0.0.1:7002")}
	b := h.tenant(t, "a")
	for i := 0; i < 10 && !(h.ref.engine.routed[b] != nil && h.ref.engine.routed[b].unavailable); i++ {
		h.ref.runOnce()
		h.clock.Advance(10 * time.Millisecond)
	}
	total := len(h.stub.sent()) + len(h.owners["127.0.0.1:7002"].sent()) + len(h.owners["127.0.0.1:7003"].sent())
	if total != maxRedirectHops+1 {
		t.Fatalf("%d Syncs before a redirect loop was parked, want %d", total, maxRedirectHops+1)
	}
	if !h.ref.engine.routed[b].unavailable ||
		h.ref.engine.stateFor(b, h.clock.Now().Add(h.ref.opts.policy.refreshPeriod)) != down {
		t.Fatal("a tenant in a redirect loop must be parked (down once a refresh period old)")
	}
	// Parked: lease to expiry, then fallback (never reached: capacity 1).
	h.ref.runOnce()
	if b.Stats().Mode != ModeFallback {
		t.Fatalf("parked tenant in mode %v", b.Stats().Mode)
	}
}

func TestGarbageOwnerAddressIsNeverDialled(t *testing.T) {
	for _, addr := range []string{"garbage", "http://x:1", "127.0.0.1:0", "127.0.0.1:99999", "a b:1", "ipv4:1.2.3.4:5"} {
		h := newHarness(t, ownerAnswer(addr))
		b := h.tenant(t, "a")
		h.ref.runOnce()
		if len(h.ref.engine.owners) != 0 || !h.ref.engine.routed[b].unavailable {
			t.Fatalf("owner %q: routes %d", addr, len(h.ref.engine.owners))
		}
	}
}

func TestUnavailableWithoutOwnerKeepsTheLeaseThenFallsBack(t *testing.T) {
	h := newHarness(t, grantAll(5, 1000))
	b := h.tenant(t, "a")
	h.ref.runOnce()
	h.stub.answer = func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		return &pb.SyncResponse{Tenants: []*pb.TenantGrant{{Tenant: "a", Error: &pb.TenantError{
			Code: int32(codes.Unavailable), Message: "no owner"}}}}, nil
	}
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	if !b.TryAcquire() {
		t.Fatal("the lease must be spent to its expiry")
	}
	h.clock.Set(epoch.Add(time.Second))
	h.ref.runOnce()
	if b.Stats().Mode != ModeFallback {
		t.Fatalf("mode %v after the lease of a shard without owner expired", b.Stats().Mode)
	}
}

func TestFinalSyncReturnsEveryUnspentToken(t *testing.T) {
	h := newHarness(t, grantAll(10, 5000))
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	b.TryAcquire()
	b.TryAcquire()
	b.RecordSuccess()
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	final := h.stub.last(t)
	e := final.Tenants[0]
	if !final.Final || e.Want != 0 || e.TokensReturned != 8 || e.RetriesSpent != 2 || e.Successes != 1 {
		t.Fatalf("final request: %v", final)
	}
	if b.TryAcquire() {
		t.Fatal("TryAcquire allowed after Close")
	}
	if _, err := h.client.Tenant("new"); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("new tenant after Close: %v", err)
	}
	if err := h.client.Close(); err != nil || len(h.stub.sent()) != 2 {
		t.Fatal("Close must be idempotent")
	}
}

func TestFinalSyncToEveryOwner(t *testing.T) {
	h := newHarness(t, func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		if req.Final {
			return &pb.SyncResponse{}, nil
		}
		return ownerAnswer("127.0.0.1:7002")(req)
	})
	owner := &fakeStub{answer: grantAll(3, 1000)}
	h.owners["127.0.0.1:7002"] = owner
	h.tenant(t, "a")
	h.ref.runOnce()
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	if f := owner.last(t); !f.Final || f.Tenants[0].TokensReturned != 3 {
		t.Fatalf("the owner's final Sync: %v", f)
	}
}

func TestFinalSyncFailureIsReported(t *testing.T) {
	h := newHarness(t, unavailable)
	h.tenant(t, "t1")
	err := h.client.Close()
	if err == nil || !strings.Contains(err.Error(), "UNAVAILABLE") {
		t.Fatalf("Close: %v", err)
	}
	if n := len(h.stub.sent()); n != finalSyncAttempts {
		t.Fatalf("%d final attempts", n)
	}
	reqs := h.stub.sent()
	if reqs[0].Seq != reqs[2].Seq {
		t.Fatal("final attempts must repeat the seq")
	}
}

func TestDryBucketIsNotAskedAgainBeforeItsRetryAfter(t *testing.T) {
	h := newHarness(t, func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		return &pb.SyncResponse{Tenants: []*pb.TenantGrant{{Tenant: "t1", Granted: 0, LeaseTtlMs: 1000,
			NextSyncMs: 150}}}, nil
	})
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	b.TryAcquire() // wakes: but the bucket is dry until +150 ms
	h.clock.Advance(10 * time.Millisecond)
	h.ref.runOnce()
	if n := len(h.stub.sent()); n != 1 {
		t.Fatalf("%d Syncs before the retry-after", n)
	}
	h.clock.Advance(150 * time.Millisecond)
	h.ref.runOnce()
	if n := len(h.stub.sent()); n != 2 {
		t.Fatalf("%d Syncs after the retry-after", n)
	}
}

func TestWantFollowsDemand(t *testing.T) {
	h := newHarness(t, grantAll(0, 1000))
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	for i := 0; i < 100; i++ {
		b.TryAcquire()
	}
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce()
	if w := h.stub.last(t).Tenants[0].Want; w < 10 {
		t.Fatalf("want %d after 100 denials", w)
	}
}

func TestOptionsErrorsNameTheFieldAndValue(t *testing.T) {
	cases := []struct {
		edit func(*ClientOptions)
		want string
	}{
		{func(o *ClientOptions) { o.Target = "" }, "options.Target"},
		{func(o *ClientOptions) { o.RefreshPeriod = 0 }, "options.RefreshPeriod is 0s"},
		{func(o *ClientOptions) { o.MinSyncInterval = time.Second }, "options.MinSyncInterval is 1s"},
		{func(o *ClientOptions) { o.SyncTimeout = -1 }, "options.SyncTimeout is -1ns"},
		{func(o *ClientOptions) { o.MaxReconnectBackoff = 2 * time.Hour }, "options.MaxReconnectBackoff is 2h0m0s"},
		{func(o *ClientOptions) { o.LeaseBurst = 2_000_000 }, "options.LeaseBurst is 2000000"},
		{func(o *ClientOptions) { o.Fallback = 7 }, "options.Fallback is 7"},
		{func(o *ClientOptions) { o.FallbackCapacity = math.NaN() }, "options.FallbackCapacity is NaN"},
		{func(o *ClientOptions) { o.FallbackRefillPerSecond = -1 }, "options.FallbackRefillPerSecond is -1"},
		{func(o *ClientOptions) { o.BearerToken = "a b" }, "options.BearerToken has character code 32"},
		{func(o *ClientOptions) { o.InstanceID = "\x01" }, `options.InstanceID is "\x01"`},
		{func(o *ClientOptions) { o.Target = "ipv4:1.2.3.4:99999" }, `options.Target "ipv4:1.2.3.4:99999"`},
		{func(o *ClientOptions) { o.Target = "ipv4:nothost:1" }, `options.Target "ipv4:nothost:1"`},
	}
	for _, c := range cases {
		o := DefaultClientOptions()
		c.edit(&o)
		_, err := NewClient(o)
		if err == nil || !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, err)
		}
	}
	if _, err := newHarness(t, unavailable).client.Tenant("bad name"); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("malformed tenant: %v", err)
	}
}

func TestTooManyTenants(t *testing.T) {
	h := newHarness(t, unavailable)
	for i := 0; i < maxTenantsPerClient; i++ {
		h.tenant(t, "t"+strings.Repeat("x", i%100)+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	if _, err := h.client.Tenant("one-more"); err == nil || !strings.Contains(err.Error(), "at most 256") {
		t.Fatalf("tenant 257: %v", err)
	}
}

// 32 goroutines race on one lease: exactly the granted tokens are taken, and the ledger's
// spending equals the takes.
func TestConcurrentTryAcquireTakesExactlyTheLease(t *testing.T) {
	h := newHarness(t, grantAll(1000, 60000))
	b := h.tenant(t, "t1")
	h.ref.runOnce()
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for i := 0; i < 100; i++ {
				if b.TryAcquire() {
					n++
				}
				b.RecordSuccess()
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	s := b.Stats()
	if total != 1000 || s.RetriesAllowed != 1000 || s.RetriesDenied != 2200 || s.Successes != 3200 {
		t.Fatalf("took %d; stats %+v", total, s)
	}
}

func TestLeaseWordNeverGoesNegative(t *testing.T) {
	l := newLease()
	if l.tryTake(1) != empty {
		t.Fatal("a closed word gave a token")
	}
	l.deposit(2, 1)
	if l.tryTake(1) != takenLow || l.tryTake(1) != taken || l.tryTake(1) != empty {
		t.Fatal("take sequence of a 2-token word with mark 1")
	}
	l.refund(1)
	if l.held() != 1 || l.withdrawAndClose() != 1 || l.open() {
		t.Fatal("refund / withdraw")
	}
	if l.deposit(maxLeaseTokens+10, 0) != maxLeaseTokens {
		t.Fatal("deposit is not capped")
	}
}

func TestLeaseTakeOfACostIsAllOrNothing(t *testing.T) {
	l := newLease()
	l.deposit(10, 2)
	if l.tryTake(11) != empty || l.held() != 10 {
		t.Fatalf("a take of 11 from 10 took something: %d held", l.held())
	}
	if l.tryTake(5) != taken || l.held() != 5 {
		t.Fatalf("a take of 5 from 10: %d held", l.held())
	}
	// 5 -> 1 jumps past the mark (2): reported low once.
	if l.tryTake(4) != takenLow || l.held() != 1 {
		t.Fatalf("a take crossing the mark: %d held", l.held())
	}
	if l.tryTake(1) != taken || l.tryTake(1) != empty {
		t.Fatal("below the mark: a take is not low again, and an empty word gives nothing")
	}
	l.refund(3)
	if l.tryTake(3) != takenLow || l.held() != 0 {
		t.Fatalf("refund of 3 then take of 3: %d held", l.held())
	}
}

func TestLeaseTakesOfACostNeverOverdrawUnderContention(t *testing.T) {
	l := newLease()
	l.deposit(1000, 0)
	var taken atomic.Uint64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(cost uint64) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				if l.tryTake(cost) != empty {
					taken.Add(cost)
				}
			}
		}(uint64(g%3 + 1))
	}
	wg.Wait()
	if taken.Load()+l.held() != 1000 || l.held() > 2 {
		t.Fatalf("took %d, %d left of 1000", taken.Load(), l.held())
	}
}

// A Sync still in flight when the lease ends is cut short at the expiry: no verdict on the
// server (no failure, no backoff, no fallback), the lease ends on time, and the same request
// (same seq) goes out again at once.
func TestSyncInFlightIsCutShortAtTheLeaseExpiryAndResentWithTheSameSeq(t *testing.T) {
	h := newHarness(t, grantAll(3, 100))
	b := h.tenant(t, "t1")
	h.ref.runOnce() // lease until epoch + 100 ms
	hang := func(ctx context.Context) {
		<-ctx.Done()                                   // the real deadline: 50 ms, to the expiry
		h.clock.Set(epoch.Add(100 * time.Millisecond)) // the fake clock reaches it too
	}
	h.stub.answer = func(*pb.SyncRequest) (*pb.SyncResponse, error) { return nil, nil }
	h.ref.stub = hangingStub{h.stub, hang}
	h.clock.Advance(50 * time.Millisecond)
	b.TryAcquire()
	b.TryAcquire() // low: a Sync is due now, and hangs
	h.ref.runOnce()
	if r := h.ref.engine.main; r.failures != 0 || r.state != answering || r.pending == nil {
		t.Fatalf("a cut-short attempt was judged: failures %d state %v pending %v", r.failures, r.state, r.pending != nil)
	}
	if b.Stats().Mode != ModeNoLease || b.TryAcquire() {
		t.Fatalf("the lease outlived its expiry (mode %v)", b.Stats().Mode)
	}
	seq := h.ref.engine.main.pending.request.Seq
	h.ref.stub = h.stub
	h.stub.answer = grantAll(2, 1000)
	h.ref.runOnce()
	if last := h.stub.last(t); last.Seq != seq {
		t.Fatalf("resent with seq %d, want %d", last.Seq, seq)
	}
	if !b.TryAcquire() {
		t.Fatal("the resend's grant was not applied")
	}
}

type hangingStub struct {
	*fakeStub
	hang func(ctx context.Context)
}

func (s hangingStub) Sync(ctx context.Context, req *pb.SyncRequest, opts ...grpc.CallOption) (*pb.SyncResponse, error) {
	s.fakeStub.Sync(ctx, req, opts...)
	s.hang(ctx)
	return nil, status.FromContextError(ctx.Err()).Err()
}

// A worker that finds the lease empty is refused at once and wakes the refresher: with the
// refresher's goroutine running, the grant arrives within a round trip, not a refresh period.
func TestDenialWakesTheRefresherGoroutine(t *testing.T) {
	stub := &fakeStub{answer: grantAll(0, 60000)}
	o := DefaultClientOptions()
	o.InstanceID = "wake"
	o.RefreshPeriod = time.Hour // nothing but a wake makes it sync again
	o.MinSyncInterval = 0
	o.Logger = log.New(io.Discard, "", 0)
	o, _ = validateAndDefault(o)
	c, err := newClient(o, stub, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.refresher.start()
	defer c.Close()
	b, _ := c.Tenant("t1")
	waitSent := func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for len(stub.sent()) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d Syncs sent, want %d", len(stub.sent()), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitSent(1) // the new tenant's first Sync (granted 0)
	stub.mu.Lock()
	stub.answer = grantAll(5, 60000)
	stub.mu.Unlock()
	if b.TryAcquire() {
		t.Fatal("allowed with an empty lease")
	}
	waitSent(2)
	deadline := time.Now().Add(10 * time.Second)
	for !b.TryAcquire() {
		if time.Now().After(deadline) {
			t.Fatal("no grant after the wake")
		}
		time.Sleep(time.Millisecond)
	}
}
