//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

// clusterUnderTest drives the lead's cluster-under-test binary (RETRY_BUDGET_CLUSTER_BIN): a
// real 3-node etcd cluster and real retry-budget servers in cluster mode, commands on stdin,
// one JSON line per answer on stdout.
type clusterUnderTest struct {
	t       *testing.T
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	Target  string `json:"target"`
	Servers []struct {
		Index   int    `json:"index"`
		Address string `json:"address"`
	} `json:"servers"`
}

func startCluster(t *testing.T, policy string) *clusterUnderTest {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.textproto")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &clusterUnderTest{t: t, lines: make(chan string, 16)}
	c.cmd = exec.Command(binary(t, "RETRY_BUDGET_CLUSTER_BIN"), "--server-bin="+binary(t, "RETRY_BUDGET_SERVER_BIN"),
		"--servers=3", "--shards=8", "--etcd-lease-ttl=2s", "--policy="+path)
	c.cmd.Stderr = os.Stderr
	c.stdin, _ = c.cmd.StdinPipe()
	stdout, _ := c.cmd.StdoutPipe()
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(c.lines)
				return
			}
			c.lines <- line
		}
	}()
	t.Cleanup(func() {
		io.WriteString(c.stdin, "quit\n")
		c.stdin.Close()
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			c.cmd.Process.Kill()
		}
	})
	if err := json.Unmarshal([]byte(c.read(90*time.Second)), c); err != nil || c.Target == "" {
		t.Fatalf("the cluster's first line: %v", err)
	}
	return c
}

func (c *clusterUnderTest) read(timeout time.Duration) string {
	c.t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.t.Fatal("cluster-under-test exited")
		}
		return line
	case <-time.After(timeout):
		c.t.Fatalf("cluster-under-test said nothing for %v", timeout)
	}
	return ""
}

type clusterAnswer struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error"`
	Index   int    `json:"index"`
	Address string `json:"address"`
}

func (c *clusterUnderTest) do(command string) clusterAnswer {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, command+"\n"); err != nil {
		c.t.Fatal(err)
	}
	var a clusterAnswer
	if err := json.Unmarshal([]byte(c.read(60*time.Second)), &a); err != nil || !a.OK {
		c.t.Fatalf("%s: %v %s", command, err, a.Error)
	}
	return a
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A Go client with the cluster's ipv4: target leases every tenant from its owner (redirects
// followed), keeps within the budget through a kill -9 of a tenant's owner, and leases that
// tenant again from its new owner.
func TestClusterRedirectsToOwnersAndSurvivesAKillOfOne(t *testing.T) {
	const capacity, refill, credit = 20.0, 5.0, 0.1
	var policy strings.Builder
	tenants := []string{"c0", "c1", "c2", "c3", "c4", "c5"}
	for _, name := range tenants {
		policy.WriteString(policyText(name, capacity, refill, credit, 1000))
	}
	cl := startCluster(t, policy.String())
	started := time.Now()
	reg := prometheus.NewRegistry()
	client := newClient(t, cl.Target, func(o *retrybudget.ClientOptions) {
		o.MetricsRegistry = reg
		o.Logger = quietLogger()
	})
	budgets := map[string]*retrybudget.TenantBudget{}
	for _, name := range tenants {
		budgets[name] = tenantOf(t, client, name)
	}
	for _, b := range budgets {
		waitForLease(t, b)
	}
	if n := counterValue(t, reg, "retry_budget_client_redirects_total"); n == 0 {
		t.Fatal("no redirect was followed: every tenant cannot be owned by the first server asked")
	}
	owners := map[string]bool{}
	for _, name := range tenants {
		owners[cl.do("owner "+name).Address] = true
	}
	t.Logf("6 tenants on %d owners", len(owners))

	var stop atomic.Bool
	var wg sync.WaitGroup
	successes := map[string]*atomic.Uint64{}
	for _, name := range tenants {
		successes[name] = &atomic.Uint64{}
		wg.Add(1)
		go func(b *retrybudget.TenantBudget, s *atomic.Uint64) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				b.TryAcquire()
				if i%3 == 0 {
					b.RecordSuccess()
					s.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}(budgets[name], successes[name])
	}
	time.Sleep(time.Second)
	victim := cl.do("owner c0")
	received := budgets["c0"].Stats().TokensReceived
	cl.do(fmt.Sprintf("kill %d", victim.Index))
	killed := time.Now()
	waitFor(t, 30*time.Second, "c0 leased from its new owner", func() bool {
		s := budgets["c0"].Stats()
		return s.Mode == retrybudget.ModeLease && s.TokensReceived > received && time.Since(killed) > 100*time.Millisecond
	})
	t.Logf("c0 leased again %.2f s after the kill of its owner (server %d)", time.Since(killed).Seconds(), victim.Index)
	newOwner := cl.do("owner c0")
	if newOwner.Address == victim.Address {
		t.Fatalf("c0 still owned by the killed server %s", victim.Address)
	}
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	allowances := map[string]float64{}
	for name, b := range budgets {
		allowances[name] = b.FallbackAllowance(time.Now())
	}
	if err := client.Close(); err != nil {
		t.Fatalf("final Sync: %v", err)
	}
	elapsed := time.Since(started)
	for _, name := range tenants {
		s := budgets[name].Stats()
		if s.TokensHeld != 0 {
			t.Fatalf("%s holds %d tokens after Close", name, s.TokensHeld)
		}
		// The invariant, counting what this process really spent.
		checkBound(t, s.RetriesAllowed, capacity, refill, credit, elapsed, successes[name].Load(), allowances[name])
		// The fallback bucket's share (capacity + refill) and the credit of the successes it
		// credited (success-funded fallback).
		if s.SuccessesCreditedLocally > s.Successes {
			t.Fatalf("%s: %d successes credited locally of %d", name, s.SuccessesCreditedLocally, s.Successes)
		}
		if most := allowances[name] + credit*float64(s.SuccessesCreditedLocally); float64(s.FallbackAllowed) > most {
			t.Fatalf("%s: fallback allowed %d over its allowance %.2f + the credit of %d successes", name,
				s.FallbackAllowed, allowances[name], s.SuccessesCreditedLocally)
		}
		// The owner's own totals never exceed what was spent.
		st := getBudget(t, cl.do("owner "+name).Address, name)
		if st.RetriesTotal > s.RetriesAllowed || st.SuccessesTotal > s.Successes {
			t.Fatalf("%s: the owner counted %d retries / %d successes, the client %d / %d", name,
				st.RetriesTotal, st.SuccessesTotal, s.RetriesAllowed, s.Successes)
		}
	}
}
