//go:build integration

package integration

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var errBackend = status.Error(codes.Unavailable, "backend down")

// A context cancelled during the backoff returns at once and refunds the token, with no
// goroutine left behind; the server then counts no retry.
func TestRetryCancelledDuringBackoffReturnsAtOnceAndRefunds(t *testing.T) {
	s := startServer(t, policyText("cancel", 10, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "cancel")
	waitForLease(t, b)
	runtime.GC()
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	attempted := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() {
		done <- retrybudget.Do(ctx, b, func(ctx context.Context, a retrybudget.Attempt) error {
			attempted <- struct{}{}
			return errBackend
		}, retrybudget.WithBackoff(time.Hour, time.Hour, 1), retrybudget.WithRandom(func() float64 { return 0.5 }))
	}()
	<-attempted
	waitFor(t, 5*time.Second, "the token for the retry", func() bool { return b.Stats().RetriesAllowed == 1 })
	start := time.Now()
	cancel()
	err := <-done
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Do returned %v after the cancel", took)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errBackend) {
		t.Fatalf("err %v", err)
	}
	if st := b.Stats(); st.Refunds != 1 || st.RetriesAllowed != 0 {
		t.Fatalf("refunds %d allowed %d", st.Refunds, st.RetriesAllowed)
	}
	waitFor(t, 5*time.Second, "the goroutines to settle", func() bool { return runtime.NumGoroutine() <= before })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The token went back into the lease. If a Sync reported the take before the refund,
	// the server keeps counting it (cumulative counters never go back: the safe direction);
	// otherwise it counts nothing. Never more.
	if st := getBudget(t, s.target(), "cancel"); st.RetriesTotal > 1 {
		t.Fatalf("the server counted %d retries for one cancelled backoff", st.RetriesTotal)
	}
}

func TestRetryDeadlineShorterThanTheBackoffSpendsNoToken(t *testing.T) {
	s := startServer(t, policyText("deadline", 10, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "deadline")
	waitForLease(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	calls := 0
	start := time.Now()
	err := retrybudget.Do(ctx, b, func(ctx context.Context, a retrybudget.Attempt) error {
		calls++
		return errBackend
	}, retrybudget.WithBackoff(20*time.Second, 20*time.Second, 1), retrybudget.WithRandom(func() float64 { return 0.5 }))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errBackend) || calls != 1 {
		t.Fatalf("err %v calls %d", err, calls)
	}
	// It returns at once, not at the deadline nor after the 10 s backoff.
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Do waited %v for a backoff that could not end before the deadline", took)
	}
	if b.Stats().RetriesAllowed != 0 {
		t.Fatal("a token was spent on a retry that could not start before the deadline")
	}
}

func TestRetryBudgetExhaustedAgainstTheRealServer(t *testing.T) {
	s := startServer(t, policyText("exhaust", 5, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "exhaust")
	waitForLease(t, b)
	var exhausted, calls int
	for i := 0; i < 20; i++ {
		calls++
		err := retrybudget.Do(context.Background(), b, func(ctx context.Context, a retrybudget.Attempt) error {
			return errBackend
		}, retrybudget.WithBackoff(0, 0, 1), retrybudget.WithMaxAttempts(3))
		if errors.Is(err, retrybudget.ErrBudgetExhausted) {
			exhausted++
			var ce *retrybudget.CallError
			if !errors.As(err, &ce) || !errors.Is(err, errBackend) {
				t.Fatalf("budget exhausted without the last error: %v", err)
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := getBudget(t, s.target(), "exhaust")
	if exhausted == 0 || st.RetriesTotal != b.Stats().RetriesAllowed || st.RetriesTotal > 5 {
		t.Fatalf("exhausted %d of %d calls; server retries %d, client %d", exhausted, calls, st.RetriesTotal, b.Stats().RetriesAllowed)
	}
}
