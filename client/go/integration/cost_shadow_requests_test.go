//go:build integration

package integration

import (
	"context"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
)

// Issue 36's client side against the real server: retries that cost more than one token,
// shadow mode from the tenant's policy, requests reported.

func TestServerACostOf5Takes5TokensFleetWide(t *testing.T) {
	s := startServer(t, policyText("costly", 20, 0, 0, 30000))
	var clients []*retrybudget.Client
	var budgets []*retrybudget.TenantBudget
	for i := 0; i < 2; i++ {
		c := newClient(t, s.target())
		b := tenantOf(t, c, "costly")
		waitForLease(t, b)
		clients, budgets = append(clients, c), append(budgets, b)
	}
	var allowed uint64
	end := time.Now().Add(time.Second)
	for time.Now().Before(end) {
		for _, b := range budgets {
			if b.TryAcquireN(5) {
				allowed++
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	var spent, counted uint64
	for i, c := range clients {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		st := budgets[i].Stats()
		spent += st.TokensSpent
		counted += st.RetriesAllowed
	}
	st := getBudget(t, s.target(), "costly")
	t.Logf("%d retries of cost 5 allowed; the server counts %d tokens, %d retries", allowed,
		st.RetriesTotal, st.RetriesAllowedTotal)
	if allowed == 0 || allowed*5 > 20 {
		t.Fatalf("%d retries of cost 5 from a bucket of 20 that never refills", allowed)
	}
	if counted != allowed || spent != 5*allowed {
		t.Fatalf("the clients count %d retries and %d tokens for %d retries of cost 5", counted, spent, allowed)
	}
	if st.RetriesTotal != 5*allowed || st.RetriesAllowedTotal != allowed {
		t.Fatalf("the server counts %d tokens and %d retries; want %d and %d", st.RetriesTotal,
			st.RetriesAllowedTotal, 5*allowed, allowed)
	}
}

func TestServerShadowTenantDeniesNothingAndCountsWouldBeDenials(t *testing.T) {
	s := startServer(t, `tenants { tenant: "dry-run" policy { capacity: 3 refill_per_second: 0 `+
		"lease_ttl_ms: 30000 mode: MODE_SHADOW } }\n")
	c := newClient(t, s.target())
	b := tenantOf(t, c, "dry-run")
	waitForLease(t, b)
	if !b.Shadow() {
		t.Fatal("the tenant's policy is MODE_SHADOW, the client enforces")
	}
	for i := 0; i < 20; i++ {
		if !b.TryAcquire() {
			t.Fatalf("retry %d denied in shadow mode", i+1)
		}
		time.Sleep(2 * time.Millisecond) // let the woken refresher ask for more
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	stats := b.Stats()
	st := getBudget(t, s.target(), "dry-run")
	t.Logf("20 retries: %d with tokens, %d would-be denials; server: %d tokens spent, %d "+
		"would-be denials, %d denials", stats.RetriesAllowed, stats.ShadowDenied, st.RetriesTotal,
		st.ShadowDeniedTotal, st.RetriesDeniedTotal)
	if stats.RetriesAllowed+stats.ShadowDenied != 20 || stats.RetriesAllowed > 3 || stats.RetriesDenied != 0 {
		t.Fatalf("stats %+v: want 20 = allowed (at most the bucket's 3) + would-be denials", stats)
	}
	if st.ShadowDeniedTotal != stats.ShadowDenied || st.RetriesDeniedTotal != 0 ||
		st.RetriesTotal != stats.TokensSpent {
		t.Fatalf("server: %d would-be denials, %d denials, %d tokens spent; the client: %d, 0, %d",
			st.ShadowDeniedTotal, st.RetriesDeniedTotal, st.RetriesTotal, stats.ShadowDenied, stats.TokensSpent)
	}
}

func TestServerRequestsAreReportedOncePerCall(t *testing.T) {
	s := startServer(t, policyText("requests", 10, 1, 0, 5000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "requests")
	// The server takes an instance's first report as its baseline: calls count from then on.
	waitForLease(t, b)
	for i := 0; i < 7; i++ {
		attempts := 0
		err := retrybudget.Do(context.Background(), b, func(ctx context.Context, a retrybudget.Attempt) error {
			attempts++
			return nil
		})
		if err != nil || attempts != 1 {
			t.Fatalf("call %d: %d attempts, %v", i+1, attempts, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if st := getBudget(t, s.target(), "requests"); st.RequestsTotal != 7 || st.SuccessesTotal != 7 {
		t.Fatalf("the server counts %d requests and %d successes for 7 calls", st.RequestsTotal, st.SuccessesTotal)
	}
}

func putPolicy(t *testing.T, address, tenant string, policy *pb.BudgetPolicy) {
	t.Helper()
	conn, err := grpc.Dial(address, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pb.NewBudgetAdminServiceClient(conn).PutPolicy(ctx,
		&pb.PutPolicyRequest{Tenant: tenant, Policy: policy}); err != nil {
		t.Fatalf("PutPolicy(%s, %v): %v", tenant, policy, err)
	}
}

func TestServerShadowModeSwitchedLiveIsFollowedWithoutARestart(t *testing.T) {
	s := startServer(t, policyText("switch", 2, 0, 0, 30000))
	c := newClient(t, s.target())
	b := tenantOf(t, c, "switch")
	waitForLease(t, b)
	if b.Shadow() {
		t.Fatal("an enforced tenant's client is in shadow mode")
	}
	policy := func(mode pb.Mode) *pb.BudgetPolicy {
		capacity, refill, ttl := 2.0, 0.0, int64(30000)
		return &pb.BudgetPolicy{Capacity: &capacity, RefillPerSecond: &refill, LeaseTtlMs: &ttl, Mode: mode}
	}
	putPolicy(t, s.target(), "switch", policy(pb.Mode_MODE_SHADOW))
	start := time.Now()
	waitFor(t, 10*time.Second, "the client to follow MODE_SHADOW", b.Shadow)
	t.Logf("shadow mode followed %v after PutPolicy", time.Since(start).Round(time.Millisecond))
	for i := 0; i < 10; i++ {
		if !b.TryAcquire() {
			t.Fatalf("retry %d denied in shadow mode", i+1)
		}
	}
	if st := b.Stats(); st.ShadowDenied == 0 || st.RetriesDenied != 0 {
		t.Fatalf("10 retries from a bucket of 2 in shadow mode: %+v", st)
	}
	putPolicy(t, s.target(), "switch", policy(pb.Mode_MODE_ENFORCE))
	waitFor(t, 10*time.Second, "the client to follow MODE_ENFORCE", func() bool { return !b.Shadow() })
	denied := false
	for i := 0; i < 10 && !denied; i++ {
		denied = !b.TryAcquire()
	}
	if !denied {
		t.Fatal("10 more retries from a bucket of 2, all allowed once enforced")
	}
}

// The windowed bound through the Go client: every request reported once, every retry counted,
// and no more retries than the floor's 5 tokens + 0.5 x 40 requests.
func TestServerWindowedTenantStaysWithinTheFloorAndItsRequestsDeposits(t *testing.T) {
	// A floor of 0.5 retries a second over a window of 10 s (5 tokens), and 0.5 a request.
	s := startServer(t, `tenants { tenant: "window" policy { retry_ratio: 0.5 `+
		"min_retries_per_second: 0.5 ttl_ms: 10000 } }\n")
	c := newClient(t, s.target())
	b := tenantOf(t, c, "window")
	waitForLease(t, b) // the first report is the baseline
	for i := 0; i < 40; i++ {
		b.RecordRequest()
	}
	var allowed uint64
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if b.TryAcquire() {
			allowed++
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := getBudget(t, s.target(), "window")
	t.Logf("floor 5 + 40 requests at 0.5: %d retries allowed; the server counts %d requests, "+
		"%d tokens spent, %.2f deposits in the window, %.2f tokens grantable", allowed,
		st.RequestsTotal, st.RetriesTotal, st.WindowDeposits, st.Tokens)
	if allowed > 5+20 || st.RequestsTotal != 40 || st.RetriesTotal != allowed {
		t.Fatalf("%d retries (at most 25); server: %d requests, %d tokens", allowed,
			st.RequestsTotal, st.RetriesTotal)
	}
}
