package retrybudget

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The time from creating a tenant handle to its first lease, over b.N fresh clients (a new
// channel each) against a real server on loopback, the median and p99 reported:
//
//	RETRY_BUDGET_SERVER_BIN=build/server/retry-budget-server \
//	  build/client/go/bin/retrybudget_bench.test -test.run '^$' -test.bench FirstLease \
//	  -test.benchtime 200x
//
// handle_to_lease: Tenant() -> Ready closed with a lease; new_client_to_lease: the same from
// just before NewClient (the channel's connection set-up included). Skipped without the
// server binary.
func BenchmarkFirstLease(b *testing.B) {
	bin := os.Getenv("RETRY_BUDGET_SERVER_BIN")
	if bin == "" {
		b.Skip("RETRY_BUDGET_SERVER_BIN is not set")
	}
	dir := b.TempDir()
	portFile := filepath.Join(dir, "port")
	cmd := exec.Command(bin, "--listen=127.0.0.1:0", "--port_file="+portFile, "--metrics_listen=",
		"--data_dir="+dir)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	port := 0
	for i := 0; i < 2000 && port == 0; i++ {
		if s, err := os.ReadFile(portFile); err == nil {
			port, _ = strconv.Atoi(strings.TrimSpace(string(s)))
		}
		if port == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if port == 0 {
		b.Fatal("the server wrote no port file")
	}
	var handle, whole []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		o := DefaultClientOptions()
		o.Target = fmt.Sprintf("127.0.0.1:%d", port)
		o.Logger = log.New(io.Discard, "", 0)
		c, err := NewClient(o)
		if err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		t, err := c.Tenant(fmt.Sprintf("bench-%d", i%50))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = t.WaitReady(ctx)
		cancel()
		leased := time.Now()
		if err != nil || t.Stats().Mode != ModeLease {
			b.Fatalf("client %d: WaitReady %v, mode %v", i, err, t.Stats().Mode)
		}
		handle = append(handle, leased.Sub(created))
		whole = append(whole, leased.Sub(start))
		c.Close()
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"handle_to_lease", handle}, {"new_client_to_lease", whole}} {
		sort.Slice(m.d, func(i, j int) bool { return m.d[i] < m.d[j] })
		b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds())/1000, m.name+"_median_ms")
		b.ReportMetric(float64(m.d[(len(m.d)*99)/100].Microseconds())/1000, m.name+"_p99_ms")
	}
}
