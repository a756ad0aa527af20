//go:build integration

package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"github.com/retry-budget/retry-budget/client/go/backoffbudget"
	"google.golang.org/grpc"
)

// A new client whose very first action is a call that fails once then succeeds gets its
// success: Do waits for the tenant's first answer during the backoff it sleeps anyway (or up
// to FirstAnswerWait when the backoff is shorter).
func TestRetryTheFirstCallOfANewClientThatFailsOnceSucceeds(t *testing.T) {
	s := startServer(t, policyText("first", 10, 0, 0, 30000))
	for i := 0; i < 5; i++ {
		c := newClient(t, s.target())
		b := tenantOf(t, c, "first")
		attempts := 0
		err := retrybudget.Do(context.Background(), b, func(ctx context.Context, a retrybudget.Attempt) error {
			attempts = a.Number
			if a.Number == 1 {
				return errBackend
			}
			return nil
		}) // the default backoff: up to 50 ms, full jitter (the first answer may come later)
		if err != nil || attempts != 2 {
			t.Fatalf("client %d: Do returned %v after %d attempts, want success at the second", i, err, attempts)
		}
		if st := b.Stats(); st.RetriesAllowed != 1 || st.RetriesDenied != 0 || st.Successes != 1 {
			t.Fatalf("client %d: stats %+v", i, st)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st := getBudget(t, s.target(), "first"); st.RetriesTotal != 5 || st.RetriesDeniedTotal != 0 {
		t.Fatalf("the server counted %d retries and %d denials, want 5 and 0", st.RetriesTotal, st.RetriesDeniedTotal)
	}
}

// The same through the interceptor: a new client's first unary call that fails once with
// UNAVAILABLE succeeds at its second attempt.
func TestInterceptorTheFirstCallOfANewClientThatFailsOnceSucceeds(t *testing.T) {
	s := startServer(t, policyText("first-grpc", 10, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "first-grpc")
	attempts := 0
	invoker := func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		opts ...grpc.CallOption) error {
		attempts++
		if attempts == 1 {
			return errBackend
		}
		return nil
	}
	err := retrybudget.UnaryClientInterceptor(b)(context.Background(), "/echo.FlakyEcho/Echo", nil, nil, nil, invoker)
	if err != nil || attempts != 2 {
		t.Fatalf("the interceptor returned %v after %d attempts, want success at the second", err, attempts)
	}
	if st := b.Stats(); st.RetriesAllowed != 1 || st.RetriesDenied != 0 || st.Successes != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// WaitReady returns once the first lease is in force; TryAcquire then takes a token at once.
func TestRetryWaitReadyReturnsWithTheFirstLease(t *testing.T) {
	s := startServer(t, policyText("ready", 10, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "ready")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Stats().Mode != retrybudget.ModeLease || !b.TryAcquire() {
		t.Fatalf("after WaitReady: %+v", b.Stats())
	}
}

// A cancelled backoff's token is back in the server's bucket even when a Sync reported its
// take before the refund: the client reports it as refunded and returns it; the server's
// retries_total counts no retry, and the client's stats add up.
func TestRetryACancelledBackoffsTokenIsBackInTheServersBucket(t *testing.T) {
	s := startServer(t, policyText("refund", 10, 0, 0, 30000))
	p := startProxy(t, s.target())
	c := newClient(t, p.address)
	b := tenantOf(t, c, "refund")
	waitForLease(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- retrybudget.Do(ctx, b, func(ctx context.Context, a retrybudget.Attempt) error {
			return errBackend
		}, retrybudget.WithBackoff(time.Hour, time.Hour, 1), retrybudget.WithRandom(func() float64 { return 0.5 }))
	}()
	waitFor(t, 10*time.Second, "a Sync that reports the retry's token as spent", func() bool {
		for _, r := range p.seen() {
			for _, e := range r.Tenants {
				if e.Tenant == "refund" && e.RetriesSpent == 1 {
					return true
				}
			}
		}
		return false
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := b.Stats()
	if st.RetriesAllowed != 0 || st.Refunds != 1 || st.TokensHeld != 0 ||
		st.TokensReceived != st.RetriesAllowed+st.TokensReturned+uint64(st.TokensHeld) {
		t.Fatalf("the client's stats do not add up: %+v", st)
	}
	final := p.seen()[len(p.seen())-1].Tenants[0]
	if !p.seen()[len(p.seen())-1].Final || final.RetriesSpent != 1 || final.RetriesRefunded != 1 ||
		final.TokensReturned != final.TokensReceived {
		t.Fatalf("final report: %v", final)
	}
	server := getBudget(t, s.target(), "refund")
	t.Logf("server: tokens %.2f retries_total %d refunded_total %d returned_total %d granted_total %d",
		server.Tokens, server.RetriesTotal, server.RefundedTotal, server.ReturnedTotal, server.GrantedTotal)
	if server.RetriesTotal != 0 || server.RefundedTotal != 1 || server.Tokens < 10-1e-9 {
		t.Fatalf("the server kept the refunded token: tokens %.2f of 10, retries_total %d, refunded_total %d",
			server.Tokens, server.RetriesTotal, server.RefundedTotal)
	}
}

// backoffbudget over a real server: the first call of a new client that fails once succeeds;
// a cancelled backoff's token is refunded; a call that keeps failing stops when the budget
// says no; the server counts every retry sent and no more.
func TestRetryBackoffBudgetAgainstTheRealServer(t *testing.T) {
	s := startServer(t, policyText("cenkalti", 3, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "cenkalti")
	ctx := context.Background()
	calls := 0
	err := backoffbudget.Retry(ctx, b, backoff.NewConstantBackOff(500*time.Millisecond), func() error {
		calls++
		if calls == 1 {
			return errBackend
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("first call of a new client: %v after %d calls", err, calls)
	}
	// Cancelled during its backoff: the token is refunded.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	err = backoffbudget.Retry(cctx, b, backoff.NewConstantBackOff(time.Hour), func() error { return errBackend })
	if st := b.Stats(); !errors.Is(err, context.Canceled) || st.Refunds != 1 || st.RetriesAllowed != 1 {
		t.Fatalf("a cancelled call: %v, stats %+v (want the token refunded)", err, st)
	}
	// Keeps failing: stops when the budget says no.
	calls = 0
	err = backoffbudget.Retry(ctx, b, backoff.WithMaxRetries(backoff.NewConstantBackOff(time.Millisecond), 100),
		func() error {
			calls++
			return errBackend
		})
	if !errors.Is(err, retrybudget.ErrBudgetExhausted) || !errors.Is(err, errBackend) {
		t.Fatalf("a failing call: %v, want ErrBudgetExhausted wrapping the last error", err)
	}
	st := b.Stats()
	// At most the 2 tokens left of 3 (fewer if the lease in hand ran dry first).
	if calls < 1 || calls > 3 || st.RetriesAllowed != uint64(calls) || st.RetriesDenied < 1 {
		t.Fatalf("a failing call made %d attempts with 2 tokens left of 3, stats %+v", calls, st)
	}
	sent := st.RetriesAllowed
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	server := getBudget(t, s.target(), "cenkalti")
	if server.RetriesTotal != sent || server.SuccessesTotal != 1 {
		t.Fatalf("the server counted %d retries and %d successes; the program sent %d retries and had 1 success",
			server.RetriesTotal, server.SuccessesTotal, sent)
	}
}
