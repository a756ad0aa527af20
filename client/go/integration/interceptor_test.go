//go:build integration

package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"github.com/retry-budget/retry-budget/client/go/flakypb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func dialWithBudget(t *testing.T, address string, b retrybudget.Budget, opts ...retrybudget.RetryOption) flakypb.FlakyEchoClient {
	t.Helper()
	conn, err := grpc.Dial(address, grpc.WithInsecure(), grpc.WithDisableRetry(),
		grpc.WithUnaryInterceptor(retrybudget.UnaryClientInterceptor(b, opts...)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return flakypb.NewFlakyEchoClient(conn)
}

// The interceptor against a real flaky gRPC backend: retries only with a token, one key per
// logical call, grpc-previous-rpc-attempts on retries, successes recorded, and the spending
// equal to the server's count.
func TestInterceptorRetriesAFlakyBackendWithinTheBudget(t *testing.T) {
	const tenant = "echo"
	s := startServer(t, policyText(tenant, 20, 0, 0.1, 5000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, tenant)
	waitForLease(t, b)
	backend := startFlakyBackend(t, 0.5, 7)
	echo := dialWithBudget(t, backend.address, b, retrybudget.WithMaxAttempts(4),
		retrybudget.WithBackoff(time.Millisecond, 5*time.Millisecond, 2))
	var ok, exhausted, failed int
	for i := 0; i < 200; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		reply, err := echo.Echo(ctx, &flakypb.EchoRequest{Message: "hi"})
		cancel()
		switch {
		case err == nil:
			ok++
			if reply.Duplicate || reply.Message != "hi" {
				t.Fatalf("reply %v", reply)
			}
		case errors.Is(err, retrybudget.ErrBudgetExhausted):
			exhausted++
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("a budget-exhausted call has code %v, want the last attempt's UNAVAILABLE", status.Code(err))
			}
		default:
			failed++
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("unexpected error %v", err)
			}
		}
	}
	attempts := backend.checkHeaders(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	stats := b.Stats()
	st := getBudget(t, s.target(), tenant)
	t.Logf("ok %d exhausted %d failed %d attempts %d; library allowed %d successes %d; server retries %d",
		ok, exhausted, failed, attempts, stats.RetriesAllowed, stats.Successes, st.RetriesTotal)
	if attempts != 200+int(stats.RetriesAllowed) {
		t.Fatalf("%d attempts reached the backend for 200 calls and %d retries allowed", attempts, stats.RetriesAllowed)
	}
	if stats.Successes != uint64(ok) || st.SuccessesTotal != uint64(ok) || st.RetriesTotal != stats.RetriesAllowed {
		t.Fatalf("successes %d/%d (calls ok %d), retries server %d client %d", stats.Successes,
			st.SuccessesTotal, ok, st.RetriesTotal, stats.RetriesAllowed)
	}
	if exhausted == 0 {
		t.Fatal("a 50% failure rate on a bucket of 20 must exhaust the budget")
	}
	checkBound(t, st.RetriesTotal, 20, 0, 0.1, time.Since(s.started), st.SuccessesTotal, 0)
}

func TestInterceptorHonoursPushback(t *testing.T) {
	s := startServer(t, policyText("push", 50, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "push")
	waitForLease(t, b)
	backend := startFlakyBackend(t, 1, 1)
	backend.set(1, "150")
	echo := dialWithBudget(t, backend.address, b, retrybudget.WithMaxAttempts(3),
		retrybudget.WithBackoff(0, 0, 1))
	if _, err := echo.Echo(context.Background(), &flakypb.EchoRequest{Message: "x"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("err %v", err)
	}
	backend.mu.Lock()
	for _, seen := range backend.attempts {
		if len(seen) != 3 {
			t.Fatalf("%d attempts, want 3", len(seen))
		}
		for i := 1; i < len(seen); i++ {
			if gap := seen[i].at.Sub(seen[i-1].at); gap < 150*time.Millisecond {
				t.Fatalf("retry %d came %v after the previous attempt; the pushback asked for 150 ms", i, gap)
			}
		}
	}
	backend.mu.Unlock()
	// A negative pushback: never retried, no token spent.
	backend.set(1, "-1")
	before := b.Stats().RetriesAllowed
	if _, err := echo.Echo(context.Background(), &flakypb.EchoRequest{Message: "y"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("err %v", err)
	}
	if b.Stats().RetriesAllowed != before {
		t.Fatal("a negative pushback was retried")
	}
}

func TestInterceptorCancelStopsTheBackoffAndRefunds(t *testing.T) {
	s := startServer(t, policyText("icancel", 50, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "icancel")
	waitForLease(t, b)
	backend := startFlakyBackend(t, 1, 1)
	echo := dialWithBudget(t, backend.address, b, retrybudget.WithBackoff(time.Hour, time.Hour, 1))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		waitFor(t, 5*time.Second, "the retry's token", func() bool { return b.Stats().RetriesAllowed == 1 })
		cancel()
	}()
	start := time.Now()
	_, err := echo.Echo(ctx, &flakypb.EchoRequest{Message: "z"})
	if status.Code(err) != codes.Canceled || !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
	if st := b.Stats(); st.Refunds != 1 || st.RetriesAllowed != 0 {
		t.Fatalf("refunds %d allowed %d", st.Refunds, st.RetriesAllowed)
	}
}

// Retries priced at 5 tokens through the interceptor: the server counts 5 tokens a retry, one
// request a call, and the bucket of 30 pays for 6 retries at most.
func TestInterceptorRetriesOfCost5Take5TokensEach(t *testing.T) {
	const tenant = "echo-cost"
	s := startServer(t, policyText(tenant, 30, 0, 0, 5000))
	// Leases of 10 tokens on top of the demand: two retries' worth from the start.
	c := newClient(t, s.target(), func(o *retrybudget.ClientOptions) { o.LeaseBurst = 10 })
	b := tenantOf(t, c, tenant)
	waitForLease(t, b)
	backend := startFlakyBackend(t, 0.5, 11)
	echo := dialWithBudget(t, backend.address, b, retrybudget.WithMaxAttempts(4),
		retrybudget.WithBackoff(time.Millisecond, 5*time.Millisecond, 2), retrybudget.WithCost(5))
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = echo.Echo(ctx, &flakypb.EchoRequest{Message: "hi"})
		cancel()
	}
	attempts := backend.checkHeaders(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	stats := b.Stats()
	st := getBudget(t, s.target(), tenant)
	t.Logf("100 calls, %d attempts; %d retries of cost 5; server: %d tokens, %d retries, %d requests",
		attempts, stats.RetriesAllowed, st.RetriesTotal, st.RetriesAllowedTotal, st.RequestsTotal)
	if attempts != 100+int(stats.RetriesAllowed) || stats.RetriesAllowed < 2 || stats.RetriesAllowed > 6 {
		t.Fatalf("%d attempts for 100 calls and %d retries of cost 5 from a bucket of 30", attempts,
			stats.RetriesAllowed)
	}
	if st.RetriesTotal != 5*stats.RetriesAllowed || st.RetriesAllowedTotal != stats.RetriesAllowed ||
		st.RequestsTotal != 100 {
		t.Fatalf("server: %d tokens, %d retries, %d requests; want %d, %d, 100", st.RetriesTotal,
			st.RetriesAllowedTotal, st.RequestsTotal, 5*stats.RetriesAllowed, stats.RetriesAllowed)
	}
}
