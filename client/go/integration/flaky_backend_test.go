//go:build integration

package integration

import (
	"context"
	"math/rand"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/retry-budget/retry-budget/client/go/flakypb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// flakyBackend is a real gRPC FlakyEcho server (examples/flaky_backend/flaky.proto) in Go on
// 127.0.0.1:0: it fails with UNAVAILABLE with a probability (optionally with a
// grpc-retry-pushback-ms trailer) and records, per x-idempotency-key, every attempt's
// grpc-previous-rpc-attempts header and arrival time.
type flakyBackend struct {
	flakypb.UnimplementedFlakyEchoServer
	address    string
	server     *grpc.Server
	mu         sync.Mutex
	rng        *rand.Rand
	failRate   float64
	pushbackMs string // "" : no trailer
	attempts   map[string][]attemptSeen
	succeeded  map[string]bool
}

type attemptSeen struct {
	previous string // the header's value, "" when absent
	at       time.Time
}

func startFlakyBackend(t *testing.T, failRate float64, seed int64) *flakyBackend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyBackend{address: lis.Addr().String(), server: grpc.NewServer(),
		rng: rand.New(rand.NewSource(seed)), failRate: failRate,
		attempts: map[string][]attemptSeen{}, succeeded: map[string]bool{}}
	flakypb.RegisterFlakyEchoServer(f.server, f)
	go f.server.Serve(lis)
	t.Cleanup(f.server.Stop)
	return f
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (f *flakyBackend) Echo(ctx context.Context, req *flakypb.EchoRequest) (*flakypb.EchoReply, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key := first(md, "x-idempotency-key")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts[key] = append(f.attempts[key], attemptSeen{previous: first(md, "grpc-previous-rpc-attempts"), at: time.Now()})
	if f.rng.Float64() < f.failRate {
		if f.pushbackMs != "" {
			grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", f.pushbackMs))
		}
		return nil, status.Error(codes.Unavailable, "flaky backend: failed on purpose")
	}
	dup := f.succeeded[key]
	f.succeeded[key] = true
	return &flakypb.EchoReply{Message: req.Message, AttemptsSeen: uint32(len(f.attempts[key])), Duplicate: dup}, nil
}

func (f *flakyBackend) set(failRate float64, pushbackMs string) {
	f.mu.Lock()
	f.failRate, f.pushbackMs = failRate, pushbackMs
	f.mu.Unlock()
}

// checkHeaders: every key's attempts carry no previous-attempts header first, then 1, 2, ...
func (f *flakyBackend) checkHeaders(t *testing.T) (attempts int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, seen := range f.attempts {
		if len(key) != 32 {
			t.Fatalf("idempotency key %q", key)
		}
		for i, a := range seen {
			want := ""
			if i > 0 {
				want = strconv.Itoa(i)
			}
			if a.previous != want {
				t.Fatalf("key %s attempt %d: grpc-previous-rpc-attempts %q, want %q", key, i+1, a.previous, want)
			}
		}
		attempts += len(seen)
	}
	return attempts
}
