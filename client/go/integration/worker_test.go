//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

type workerLine struct {
	Calls                       int64   `json:"calls"`
	Attempts                    int64   `json:"attempts"`
	Successes                   int64   `json:"successes"`
	Failures                    int64   `json:"failures"`
	RetriesAllowed              int64   `json:"retries_allowed"`
	RetriesDenied               int64   `json:"retries_denied"`
	LibRetriesAllowed           uint64  `json:"lib_retries_allowed"`
	LibFallbackAllowed          uint64  `json:"lib_fallback_allowed"`
	LibTokensHeld               int64   `json:"lib_tokens_held"`
	LibSuccessesCreditedLocally uint64  `json:"lib_successes_credited_locally"`
	FallbackAllowance           float64 `json:"fallback_allowance"`
	SawFallback                 bool    `json:"saw_fallback"`
	LeaseAfterFallback          bool    `json:"lease_after_fallback"`
	ShutdownStatus              string  `json:"shutdown_status"`
	MaxTryAcquireMs             float64 `json:"max_try_acquire_ms"`
}

// runWorker starts the fleet worker, waits for "ready", sends `input` and returns its stdout.
func runWorker(t *testing.T, input string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary(t, "RETRY_BUDGET_GO_WORKER"), args...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	line, err := r.ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("first line %q (%v), want ready", line, err)
	}
	io.WriteString(stdin, input)
	stdin.Close()
	rest, _ := io.ReadAll(r)
	err = cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(rest), code
}

func TestWorkerFleetProtocolCountsWhatTheServerCounts(t *testing.T) {
	const tenant = "fleet"
	s := startServer(t, policyText(tenant, 30, 10, 0.1, 2000))
	out, code := runWorker(t, "go\n", "--server="+s.target(), "--tenant="+tenant, "--threads=4",
		"--duration=1.5", "--failure-rate=0.5", "--call-latency=0.001", "--seed=3")
	if code != 0 {
		t.Fatalf("exit %d, output %q", code, out)
	}
	var w workerLine
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &w); err != nil {
		t.Fatalf("not one JSON line: %q (%v)", out, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &fields); err != nil {
		t.Fatalf("not one JSON object: %q (%v)", out, err)
	}
	for _, f := range []string{"calls", "attempts", "successes", "failures", "retries_allowed",
		"retries_denied", "lib_retries_allowed", "lib_fallback_allowed", "lib_tokens_held",
		"lib_successes_credited_locally", "fallback_allowance", "saw_fallback",
		"lease_after_fallback", "shutdown_status", "max_try_acquire_ms"} {
		if _, ok := fields[f]; !ok {
			t.Fatalf("field %q missing from %s", f, out)
		}
	}
	// Of the successes, those credited to a fallback bucket (none unless it fell back).
	if w.LibSuccessesCreditedLocally > uint64(w.Successes) {
		t.Fatalf("credited locally %d > successes %d", w.LibSuccessesCreditedLocally, w.Successes)
	}
	t.Logf("worker: %s", strings.TrimSpace(out))
	st := getBudget(t, s.target(), tenant)
	if w.ShutdownStatus != "OK" || w.LibTokensHeld != 0 || uint64(w.RetriesAllowed) != w.LibRetriesAllowed ||
		st.RetriesTotal != w.LibRetriesAllowed || st.SuccessesTotal != uint64(w.Successes) {
		t.Fatalf("worker %+v; server retries %d successes %d", w, st.RetriesTotal, st.SuccessesTotal)
	}
	// A call fails when its retry is denied, or (at most one a thread) when the run ends.
	if w.Calls != w.Successes+w.Failures || w.Attempts != w.Calls+w.RetriesAllowed ||
		w.RetriesDenied > w.Failures || w.Failures > w.RetriesDenied+4 {
		t.Fatalf("inconsistent counts: %+v", w)
	}
	checkBound(t, st.RetriesTotal, 30, 10, 0.1, time.Since(s.started), st.SuccessesTotal, 0)
}

func TestWorkerExitsWith3WithoutGo(t *testing.T) {
	if _, code := runWorker(t, "stop\n", "--server=127.0.0.1:1"); code != 3 {
		t.Fatalf("exit %d, want 3", code)
	}
}

func TestWorkerExampleAgainstAFlakyBackend(t *testing.T) {
	const tenant = "flaky-echo"
	s := startServer(t, policyText(tenant, 15, 0, 0.1, 5000))
	backend := startFlakyBackend(t, 0.5, 11)
	cmd := exec.Command(binary(t, "RETRY_BUDGET_GO_EXAMPLE"), "--budget_server="+s.target(),
		"--backend="+backend.address, "--calls=120", "--interval=1ms")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := regexp.MustCompile(`ok=(\d+) failed=(\d+) budget_exhausted=(\d+) .*allowed=(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no summary line in\n%s", out)
	}
	ok, _ := strconv.Atoi(m[1])
	exhausted, _ := strconv.Atoi(m[3])
	allowed, _ := strconv.ParseUint(m[4], 10, 64)
	st := getBudget(t, s.target(), tenant)
	t.Logf("%s", m[0])
	if exhausted == 0 || st.RetriesTotal != allowed || st.SuccessesTotal != uint64(ok) {
		t.Fatal(fmt.Sprintf("example: %s; server retries %d successes %d", m[0], st.RetriesTotal, st.SuccessesTotal))
	}
	backend.checkHeaders(t)
}
