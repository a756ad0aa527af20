//go:build integration

// Package integration holds the Go client's tests against real parts (build tag
// `integration`: CTest's go_*_test, client/go/integration/CMakeLists.txt): the real
// retry-budget-server (RETRY_BUDGET_SERVER_BIN) on 127.0.0.1 port 0, a real cluster
// (RETRY_BUDGET_CLUSTER_BIN, cluster-under-test), real gRPC proxies and backends written in Go,
// and the Go worker programs. Every count-based test checks what was really spent against the
// server's own totals (GetBudget) or the bound initial + refill * elapsed + credit * successes.
package integration

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func binary(t *testing.T, env string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set (run the tests through CTest)", env)
	}
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("%s=%q is not an executable", env, path)
	}
	return path
}

// serverProcess is one real retry-budget-server child on 127.0.0.1: port 0 at first (read
// from --port_file), the same port on restart, one data directory (a restart keeps the
// buckets).
type serverProcess struct {
	t       *testing.T
	bin     string
	dir     string
	args    []string
	port    int
	cmd     *exec.Cmd
	started time.Time
}

func startServer(t *testing.T, policy string, args ...string) *serverProcess {
	t.Helper()
	s := &serverProcess{t: t, bin: binary(t, "RETRY_BUDGET_SERVER_BIN"), dir: t.TempDir()}
	if policy != "" {
		path := filepath.Join(s.dir, "policy.textproto")
		if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		s.args = append(s.args, "--policy="+path)
	}
	s.args = append(s.args, args...)
	if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.started = time.Now()
	if err := s.spawn("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	return s
}

func (s *serverProcess) target() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *serverProcess) spawn(listen string) error {
	portFile := filepath.Join(s.dir, "port")
	os.Remove(portFile)
	out, err := os.OpenFile(filepath.Join(s.dir, "output"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	argv := append([]string{"--listen=" + listen, "--port_file=" + portFile, "--metrics_listen=",
		"--data_dir=" + filepath.Join(s.dir, "data")}, s.args...)
	cmd := exec.Command(s.bin, argv...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("the server exited (%v); output:\n%s", err, s.output())
		default:
		}
		if b, err := os.ReadFile(portFile); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 {
				s.port = p
				s.cmd = cmd
				go func() { <-exited }()
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	return fmt.Errorf("the server wrote no port file; output:\n%s", s.output())
}

func (s *serverProcess) output() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "output"))
	return string(b)
}

// kill is kill -9.
func (s *serverProcess) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGKILL)
		for i := 0; i < 500 && syscall.Kill(s.cmd.Process.Pid, 0) == nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		s.cmd = nil
	}
}

// restart starts it again on the same port (retried while the old socket is still held).
func (s *serverProcess) restart() {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := s.spawn(s.target())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getBudget(t *testing.T, address, tenant string) *pb.BudgetStatus {
	t.Helper()
	return getBudgetWith(t, address, tenant, grpc.WithInsecure())
}

func getBudgetTLS(t *testing.T, address, tenant string, creds credentials.TransportCredentials) *pb.BudgetStatus {
	t.Helper()
	return getBudgetWith(t, address, tenant, grpc.WithTransportCredentials(creds))
}

func getBudgetWith(t *testing.T, address, tenant string, dial grpc.DialOption) *pb.BudgetStatus {
	t.Helper()
	conn, err := grpc.Dial(address, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewBudgetAdminServiceClient(conn).GetBudget(ctx, &pb.GetBudgetRequest{Tenant: tenant})
	if err != nil {
		t.Fatalf("GetBudget(%s) at %s: %v", tenant, address, err)
	}
	return resp.Budget
}

func policyText(tenant string, capacity, refill, credit float64, ttlMs int) string {
	return fmt.Sprintf("tenants { tenant: %q policy { capacity: %g refill_per_second: %g "+
		"success_credit: %g lease_ttl_ms: %d } }\n", tenant, capacity, refill, credit, ttlMs)
}

// checkBound asserts spent <= initial + refill * elapsed + credit * successes + extra
// (extra: the fallback allowance of the run's outages).
func checkBound(t *testing.T, spent uint64, initial, refill, credit float64, elapsed time.Duration, successes uint64, extra float64) {
	t.Helper()
	bound := initial + refill*elapsed.Seconds() + credit*float64(successes) + extra
	t.Logf("spent %d <= bound %.2f (initial %g + refill %g * %.2f s + credit %g * %d successes + %.2f)",
		spent, bound, initial, refill, elapsed.Seconds(), credit, successes, extra)
	if float64(spent) > bound+1e-9 {
		t.Fatalf("spent %d retries, over the bound %.2f", spent, bound)
	}
}

func quietLogger() retrybudget.Logger { return log.New(io.Discard, "", 0) }

func newClient(t *testing.T, target string, edit ...func(*retrybudget.ClientOptions)) *retrybudget.Client {
	t.Helper()
	o := retrybudget.DefaultClientOptions()
	o.Target = target
	for _, e := range edit {
		e(&o)
	}
	c, err := retrybudget.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tenantOf(t *testing.T, c *retrybudget.Client, name string) *retrybudget.TenantBudget {
	t.Helper()
	b, err := c.Tenant(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitForLease(t *testing.T, b *retrybudget.TenantBudget) {
	t.Helper()
	waitFor(t, 15*time.Second, "a lease", func() bool { return b.Stats().Mode == retrybudget.ModeLease })
}

// syncProxy is a real gRPC server for RetryBudgetService.Sync on 127.0.0.1:0 that forwards
// every request to the real server and, on demand, loses the response (the server applied the
// request; the client gets UNAVAILABLE) or is down (UNAVAILABLE without forwarding). It records
// every request it saw. (tests/python/sync_proxy.py, in Go.)
type syncProxy struct {
	pb.UnimplementedRetryBudgetServiceServer
	upstream pb.RetryBudgetServiceClient
	conn     *grpc.ClientConn
	server   *grpc.Server
	address  string

	mu       sync.Mutex
	requests []*pb.SyncRequest
	dropNext int
	dropped  []*pb.SyncRequest
	down     bool
}

func startProxy(t *testing.T, upstream string) *syncProxy {
	t.Helper()
	conn, err := grpc.Dial(upstream, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &syncProxy{upstream: pb.NewRetryBudgetServiceClient(conn), conn: conn,
		server: grpc.NewServer(), address: lis.Addr().String()}
	pb.RegisterRetryBudgetServiceServer(p.server, p)
	go p.server.Serve(lis)
	t.Cleanup(func() { p.server.Stop(); conn.Close() })
	return p
}

func (p *syncProxy) Sync(ctx context.Context, req *pb.SyncRequest) (*pb.SyncResponse, error) {
	p.mu.Lock()
	p.requests = append(p.requests, proto.Clone(req).(*pb.SyncRequest))
	if p.down {
		p.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "the test proxy is down")
	}
	drop := p.dropNext > 0 && !req.Final
	if drop {
		p.dropNext--
		p.dropped = append(p.dropped, proto.Clone(req).(*pb.SyncRequest))
	}
	p.mu.Unlock()
	resp, err := p.upstream.Sync(ctx, req)
	if drop {
		return nil, status.Error(codes.Unavailable, "response lost by the test proxy")
	}
	return resp, err
}

func (p *syncProxy) seen() []*pb.SyncRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*pb.SyncRequest(nil), p.requests...)
}

func (p *syncProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}
