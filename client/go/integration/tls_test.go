//go:build integration

package integration

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"google.golang.org/grpc/credentials"
)

// makeCerts writes a CA, a server certificate for 127.0.0.1 and a client certificate, made
// with openssl at test time.
func makeCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("openssl", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "server.ext"), []byte("subjectAltName=IP:127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rb-test-ca",
		"-keyout", "ca.key", "-out", "ca.pem")
	for _, who := range []string{"server", "client"} {
		run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN="+who, "-keyout", who+".key", "-out", who+".csr")
		args := []string{"x509", "-req", "-in", who + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
			"-CAcreateserial", "-days", "2", "-out", who + ".pem"}
		if who == "server" {
			args = append(args, "-extfile", "server.ext")
		}
		run(args...)
	}
	return dir
}

func tlsCreds(t *testing.T, dir string, withCert bool) credentials.TransportCredentials {
	t.Helper()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("ca.pem: %v", err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg)
}

func TestTLSMutualLeasesWithAClientCertificateOnly(t *testing.T) {
	dir := makeCerts(t)
	s := startServer(t, policyText("tls", 10, 0, 0, 30000),
		"--tls_cert="+filepath.Join(dir, "server.pem"), "--tls_key="+filepath.Join(dir, "server.key"),
		"--tls_client_ca="+filepath.Join(dir, "ca.pem"))
	c := newClient(t, s.target(), func(o *retrybudget.ClientOptions) {
		o.TransportCredentials = tlsCreds(t, dir, true)
	})
	b := tenantOf(t, c, "tls")
	waitForLease(t, b)
	if !b.TryAcquire() {
		t.Fatal("no token over mutual TLS")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Without a client certificate the handshake fails: never a lease; the client falls back
	// to its conservative bucket (it never reached the server), never fails open.
	bad := newClient(t, s.target(), func(o *retrybudget.ClientOptions) {
		o.TransportCredentials = tlsCreds(t, dir, false)
		o.Logger = quietLogger()
	})
	nb := tenantOf(t, bad, "tls")
	waitFor(t, 10*time.Second, "the failed handshake", func() bool { return bad.LastSyncError() != nil })
	time.Sleep(300 * time.Millisecond)
	if st := nb.Stats(); st.Mode == retrybudget.ModeLease || st.TokensReceived != 0 {
		t.Fatalf("a client without a certificate got a lease: %+v", st)
	}
	// Plaintext to a TLS server: no lease either.
	plain := newClient(t, s.target(), func(o *retrybudget.ClientOptions) { o.Logger = quietLogger() })
	pb := tenantOf(t, plain, "tls")
	waitFor(t, 10*time.Second, "the failed plaintext Sync", func() bool { return plain.LastSyncError() != nil })
	if pb.Stats().TokensReceived != 0 {
		t.Fatal("a plaintext client got tokens from a TLS server")
	}
	st := getBudgetTLS(t, s.target(), "tls", tlsCreds(t, dir, true))
	if st.RetriesTotal != 1 {
		t.Fatalf("server counted %d retries, want 1", st.RetriesTotal)
	}
}
