package retrybudget

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc/codes"
)

// failOnce fails the first attempt with UNAVAILABLE and succeeds after.
func failOnce(attempts *int) func(context.Context, Attempt) error {
	return func(ctx context.Context, a Attempt) error {
		*attempts = a.Number
		if a.Number == 1 {
			return errUnavailable
		}
		return nil
	}
}

// doAsync runs Do on a goroutine with a 100 ms backoff (50 ms with noJitter) on the harness's
// clock; returns its result channel once Do's first wait is on the clock.
func doAsync(t *testing.T, h *harness, ctx context.Context, b *TenantBudget, attempts *int) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- Do(ctx, b, failOnce(attempts), WithClock(h.clock), WithRandom(noJitter),
			WithBackoff(100*time.Millisecond, 100*time.Millisecond, 1))
	}()
	waitForTimer(t, h.clock)
	return done
}

func waitForTimer(t *testing.T, clock *FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for clock.Timers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Do never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDoWaitsForTheFirstAnswerWithinTheBackoff(t *testing.T) {
	h := newHarness(t, grantAll(5, 60000))
	b := h.tenant(t, "t1")
	attempts := 0
	done := doAsync(t, h, context.Background(), b, &attempts)
	select {
	case err := <-done:
		t.Fatalf("Do returned %v before the tenant's first answer", err)
	default:
	}
	h.clock.Advance(20 * time.Millisecond)
	h.ref.runOnce() // the first grant: Ready closes, Do takes a token
	select {
	case <-b.Ready():
	default:
		t.Fatal("Ready still open after a grant")
	}
	// Do took its token (its wait for the answer is over), then waits the 30 ms left.
	for deadline := time.Now().Add(10 * time.Second); b.Stats().RetriesAllowed == 0; {
		if time.Now().After(deadline) {
			t.Fatal("Do took no token after the first grant")
		}
		time.Sleep(time.Millisecond)
	}
	waitForTimer(t, h.clock)
	h.clock.Advance(30 * time.Millisecond)
	if err := <-done; err != nil || attempts != 2 {
		t.Fatalf("Do: %v after %d attempts, want success at the second", err, attempts)
	}
	if s := b.Stats(); s.RetriesAllowed != 1 || s.RetriesDenied != 0 || s.Successes != 1 {
		t.Fatalf("stats: %+v, want 1 retry allowed, none denied, 1 success", s)
	}
}

func TestDoWithoutAnAnswerWithinFirstAnswerWaitIsDenied(t *testing.T) {
	h := newHarness(t, grantAll(5, 60000))
	b := h.tenant(t, "t1")
	attempts := 0
	done := doAsync(t, h, context.Background(), b, &attempts)
	h.clock.Advance(FirstAnswerWait - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Do returned %v before FirstAnswerWait (its backoff is 50 ms)", err)
	case <-time.After(20 * time.Millisecond):
	}
	h.clock.Advance(time.Millisecond)
	if err := <-done; !errors.Is(err, ErrBudgetExhausted) || attempts != 1 {
		t.Fatalf("Do: %v after %d attempts, want ErrBudgetExhausted after 1", err, attempts)
	}
	if s := b.Stats(); s.RetriesDenied != 1 {
		t.Fatalf("stats: %+v, want the denial counted", s)
	}
}

func TestDoWaitingForTheFirstAnswerIsCancelledByCtx(t *testing.T) {
	h := newHarness(t, grantAll(5, 60000))
	b := h.tenant(t, "t1")
	ctx, cancel := context.WithCancel(context.Background())
	attempts := 0
	done := doAsync(t, h, ctx, b, &attempts)
	cancel()
	err := <-done
	var ce *CallError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Attempts != 1 {
		t.Fatalf("Do: %v, want a CallError with context.Canceled after 1 attempt", err)
	}
	if s := b.Stats(); s.RetriesDenied != 0 || s.RetriesAllowed != 0 || s.Refunds != 0 {
		t.Fatalf("stats: %+v, want no token asked for", s)
	}
}

func TestDoOnAnUnreachableServerTakesTheFallbackBucketsToken(t *testing.T) {
	h := newHarness(t, unavailable, func(o *ClientOptions) { o.FallbackCapacity = 1 })
	b := h.tenant(t, "t1")
	attempts := 0
	done := doAsync(t, h, context.Background(), b, &attempts)
	h.ref.runOnce() // the Sync fails: the fallback bucket opens, Ready closes
	for deadline := time.Now().Add(10 * time.Second); b.Stats().FallbackAllowed == 0; {
		if time.Now().After(deadline) {
			t.Fatal("Do took no fallback token")
		}
		time.Sleep(time.Millisecond)
	}
	waitForTimer(t, h.clock)
	h.clock.Advance(50 * time.Millisecond)
	if err := <-done; err != nil || attempts != 2 {
		t.Fatalf("Do: %v after %d attempts", err, attempts)
	}
	if s := b.Stats(); s.Mode != ModeFallback || s.FallbackAllowed != 1 {
		t.Fatalf("stats: %+v, want the retry from the fallback bucket", s)
	}
}

func TestDoOnAnUnreachableServerWithDenyFallbackIsDenied(t *testing.T) {
	h := newHarness(t, unavailable, func(o *ClientOptions) { o.Fallback = FallbackDeny })
	b := h.tenant(t, "t1")
	attempts := 0
	done := doAsync(t, h, context.Background(), b, &attempts)
	h.ref.runOnce()
	if err := <-done; !errors.Is(err, ErrBudgetExhausted) {
		t.Fatalf("Do: %v, want ErrBudgetExhausted (FallbackDeny never fails open)", err)
	}
	if err := b.WaitReady(context.Background()); err != nil || b.Stats().Mode != ModeDenyFallback {
		t.Fatalf("WaitReady: %v, mode %v", err, b.Stats().Mode)
	}
}

func TestWaitReady(t *testing.T) {
	h := newHarness(t, func(req *pb.SyncRequest) (*pb.SyncResponse, error) {
		resp := &pb.SyncResponse{}
		for _, e := range req.Tenants {
			g := &pb.TenantGrant{Tenant: e.Tenant, Granted: 3, LeaseTtlMs: 60000, NextSyncMs: 200}
			if e.Tenant == "refused" {
				g = &pb.TenantGrant{Tenant: e.Tenant, Error: &pb.TenantError{
					Code: int32(codes.PermissionDenied), Message: "not yours"}}
			}
			resp.Tenants = append(resp.Tenants, g)
		}
		return resp, nil
	})
	ok, refused := h.tenant(t, "ok"), h.tenant(t, "refused")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ok.WaitReady(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady before any answer, ctx cancelled: %v", err)
	}
	if ok.TryAcquire() {
		t.Fatal("TryAcquire allowed before the first answer")
	}
	h.ref.runOnce()
	if err := ok.WaitReady(context.Background()); err != nil || ok.Stats().Mode != ModeLease {
		t.Fatalf("WaitReady after a grant: %v, mode %v", err, ok.Stats().Mode)
	}
	var te *TenantError
	if err := refused.WaitReady(context.Background()); !errors.As(err, &te) || te.Code != codes.PermissionDenied {
		t.Fatalf("WaitReady of a refused tenant: %v", err)
	}
	late := h.tenant(t, "late")
	if err := h.client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := late.WaitReady(context.Background()); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("WaitReady after Close: %v", err)
	}
}

func TestDoWaitsPastAShortBackoffForTheFirstAnswer(t *testing.T) {
	h := newHarness(t, grantAll(5, 60000))
	b := h.tenant(t, "t1")
	attempts := 0
	done := doAsync(t, h, context.Background(), b, &attempts) // a 50 ms backoff
	h.clock.Advance(300 * time.Millisecond)
	h.ref.runOnce() // the first answer, 300 ms in: nothing is left of the backoff
	if err := <-done; err != nil || attempts != 2 {
		t.Fatalf("Do: %v after %d attempts, want success at the second", err, attempts)
	}
}

func TestDoWaitingForTheFirstAnswerEndsAtTheDeadline(t *testing.T) {
	h := newHarness(t, grantAll(5, 60000))
	b := h.tenant(t, "t1")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	attempts := 0
	err := Do(ctx, b, failOnce(&attempts), WithClock(h.clock), WithRandom(noJitter),
		WithBackoff(2*time.Millisecond, 2*time.Millisecond, 1))
	var ce *CallError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ce) || attempts != 1 {
		t.Fatalf("Do: %v after %d attempts, want a CallError with DeadlineExceeded", err, attempts)
	}
	if s := b.Stats(); s.RetriesDenied != 0 || s.RetriesAllowed != 0 {
		t.Fatalf("stats %+v: no token may be asked for", s)
	}
}
