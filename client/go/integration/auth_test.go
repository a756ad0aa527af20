//go:build integration

package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

// Bearer credentials: the right token leases; a wrong one is refused by a server that answers,
// so the tenant is denied (no lease, and no fallback: fallback is only for an unreachable
// server).
func TestServerBearerTokenLeasesAndAWrongOneIsDeniedNotFallenBack(t *testing.T) {
	sum := sha256.Sum256([]byte("worker-secret"))
	policy := policyText("auth", 10, 0, 0, 30000) +
		fmt.Sprintf("credentials { name: \"worker\" token_sha256: %q tenants: \"auth\" }\n", hex.EncodeToString(sum[:]))
	s := startServer(t, policy)
	good := newClient(t, s.target(), func(o *retrybudget.ClientOptions) { o.BearerToken = "worker-secret" })
	gb := tenantOf(t, good, "auth")
	waitForLease(t, gb)
	if !gb.TryAcquire() {
		t.Fatal("no token with the right credential")
	}
	bad := newClient(t, s.target(), func(o *retrybudget.ClientOptions) {
		o.BearerToken = "wrong"
		o.Logger = quietLogger()
	})
	bb := tenantOf(t, bad, "auth")
	waitFor(t, 10*time.Second, "the refusal", func() bool { return bad.LastSyncError() != nil })
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 3; i++ {
		if st := bb.Stats(); st.Mode != retrybudget.ModeNoLease || bb.TryAcquire() || st.TokensReceived != 0 {
			t.Fatalf("a refused credential got mode %v / a token (%+v)", st.Mode, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := good.Close(); err != nil {
		t.Fatal(err)
	}
}
