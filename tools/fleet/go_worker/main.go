// Command go_worker is the Go worker of tools/fleet/mixed_fleet.py: the protocol every
// language's worker follows (mixed_fleet.py's run_worker is the reference):
//
//	go_worker --server=TARGET --tenant=T --threads=N --duration=SECONDS --failure-rate=F
//	          --call-latency=SECONDS --seed=K [--timeline-slice=SECONDS] [--retry-cost=N]
//	          [--call-interval=SECONDS] [--max-attempts=N]
//
// It prints "ready", waits for the start signal on stdin: "go ORIGIN" (the fleet's start,
// CLOCK_MONOTONIC microseconds: its timelines count from there, tools/fleet/start_signal.h) or a
// bare "go" (from now); anything else: exit 3. Then it creates
// its client (default options), waits for the tenant's first answer (at most 3 s), runs N concurrent loops for DURATION (a logical call is
// attempts to a simulated backend that sleeps CALL_LATENCY and fails with probability F, its
// request recorded (RecordRequest) before the first; a failed attempt is retried only when
// TryAcquireN(N) allows, N = --retry-cost tokens (default 1); a denied retry ends the call as
// failed; a call ends failed after --max-attempts attempts (0, the default: no cap) or at the end
// of the run; a success calls RecordSuccess; with --call-interval each loop starts a call every that
// many seconds, paced, instead of back to back), polls the tenant's mode every 10 ms, closes
// the client (the final Sync) and prints one JSON line of counts (with its timelines: calls,
// retries, denied retries and successes per --timeline-slice, default 0.1 s, by the call's
// start; requests and tokens per slice when recorded / taken); exit 0.
//
// With --backend=TARGET it is instead an open-loop worker of bench/metastable.py's fleet,
// calling a real backend: see open_loop.go.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

type counts struct {
	Calls          int64 `json:"calls"`
	Attempts       int64 `json:"attempts"`
	Successes      int64 `json:"successes"`
	Failures       int64 `json:"failures"`
	RetriesAllowed int64 `json:"retries_allowed"`
	RetriesDenied  int64 `json:"retries_denied"`
	Requests       int64 `json:"requests"`
	TokensSpent    int64 `json:"tokens_spent"`
}

type report struct {
	counts
	LibRetriesAllowed  uint64 `json:"lib_retries_allowed"`
	LibFallbackAllowed uint64 `json:"lib_fallback_allowed"`
	LibTokensHeld      int64  `json:"lib_tokens_held"`
	// Of the successes, those whose credit went into this process's fallback bucket
	// (TenantStats.SuccessesCreditedLocally; the server credits the others).
	LibSuccessesCreditedLocally uint64  `json:"lib_successes_credited_locally"`
	LibRequests                 uint64  `json:"lib_requests"`
	LibShadowDenied             uint64  `json:"lib_shadow_denied"`
	FallbackAllowance           float64 `json:"fallback_allowance"`
	SawFallback                 bool    `json:"saw_fallback"`
	LeaseAfterFallback          bool    `json:"lease_after_fallback"`
	ShutdownStatus              string  `json:"shutdown_status"`
	MaxTryAcquireMs             float64 `json:"max_try_acquire_ms"`
	// Per slice of --timeline-slice seconds from the start signal's origin, by the call's start.
	TimelineSliceSeconds float64 `json:"timeline_slice_seconds"`
	TimelineOriginUs     int64   `json:"timeline_origin_us"`
	CallsTimeline        []int64 `json:"calls_timeline"`
	RetriesTimeline      []int64 `json:"retries_timeline"`
	DeniedTimeline       []int64 `json:"denied_timeline"`
	SuccessesTimeline    []int64 `json:"successes_timeline"`
	// Per slice, when the request was recorded / the tokens taken (the windowed bound).
	RequestsTimeline []int64 `json:"requests_timeline"`
	TokensTimeline   []int64 `json:"tokens_timeline"`
	// When the tenant's mode changed (enforce <-> shadow), ms from the origin, as polled.
	ModeChangesMs []int64 `json:"mode_changes_ms"`
}

// countAt adds n to the slice of *timeline holding the instant `since` after the origin.
func countAt(timeline *[]int64, since, width time.Duration, n int64) {
	i := 0
	if since > 0 {
		i = int(since / width)
	}
	for len(*timeline) <= i {
		*timeline = append(*timeline, 0)
	}
	(*timeline)[i] += n
}

// addInto adds b into *a slice by slice.
func addInto(a *[]int64, b []int64) {
	for len(*a) < len(b) {
		*a = append(*a, 0)
	}
	for i, v := range b {
		(*a)[i] += v
	}
}

// timelines counts calls, retries sent, retries denied and successes per slice.
type timelines struct {
	calls, retries, denied, successes []int64
}

func newTimelines(slices int) timelines {
	return timelines{make([]int64, slices), make([]int64, slices), make([]int64, slices),
		make([]int64, slices)}
}

func (t *timelines) add(o timelines) {
	for i := range t.calls {
		t.calls[i] += o.calls[i]
		t.retries[i] += o.retries[i]
		t.denied[i] += o.denied[i]
		t.successes[i] += o.successes[i]
	}
}

// trimmed drops the slices past the last call.
func (t timelines) trimmed() timelines {
	n := len(t.calls)
	for n > 0 && t.calls[n-1] == 0 {
		n--
	}
	return timelines{t.calls[:n], t.retries[:n], t.denied[:n], t.successes[:n]}
}

func main() {
	server := flag.String("server", "127.0.0.1:50051", "budget server target")
	tenant := flag.String("tenant", "fleet", "tenant")
	threads := flag.Int("threads", 4, "concurrent loops")
	duration := flag.Float64("duration", 5, "seconds of load")
	failureRate := flag.Float64("failure-rate", 0.5, "probability that an attempt fails")
	callLatency := flag.Float64("call-latency", 0.001, "seconds per attempt")
	seed := flag.Int64("seed", 1, "random seed")
	slice := flag.Float64("timeline-slice", 0.1, "seconds per slice of the timelines")
	retryCost := flag.Int("retry-cost", 1, "tokens per retry, [1, 1000000]")
	callInterval := flag.Float64("call-interval", 0, "seconds between a loop's call starts (0: back to back)")
	// The open-loop mode (open_loop.go): bench/metastable.py's fleet.
	backend := flag.String("backend", "", "open loop: the metastable backend's target")
	rate := flag.Float64("rate", 10, "open loop: logical calls per second")
	phase := flag.Float64("phase", 0, "open loop: shift of the call times, in [0, 1) of an interval")
	epochMs := flag.Int64("epoch-ms", 0, "open loop: time 0 of the run, Unix milliseconds")
	timeoutMs := flag.Int64("timeout-ms", 1000, "open loop: deadline of one attempt")
	maxAttempts := flag.Int64("max-attempts", 0, "attempts per call, 0: no cap (open loop: default 5)")
	flag.Parse()
	if *backend != "" {
		os.Exit(runOpenLoop(openLoopArgs{backend: *backend, server: *server, tenant: *tenant,
			rate: *rate, phase: *phase, duration: *duration, epochMs: *epochMs,
			timeoutMs: *timeoutMs, maxAttempts: openLoopAttempts(*maxAttempts)}))
	}
	if *slice <= 0 {
		fmt.Fprintf(os.Stderr, "go_worker: --timeline-slice is %g; it must be > 0\n", *slice)
		os.Exit(2)
	}
	if *retryCost < 1 || *retryCost > 1000000 {
		fmt.Fprintf(os.Stderr, "go_worker: --retry-cost is %d; it must be in [1, 1000000]\n", *retryCost)
		os.Exit(2)
	}
	if *callInterval < 0 {
		fmt.Fprintf(os.Stderr, "go_worker: --call-interval is %g; it must be >= 0\n", *callInterval)
		os.Exit(2)
	}
	os.Exit(run(workerArgs{server: *server, tenant: *tenant, threads: *threads,
		duration: *duration, failureRate: *failureRate, callLatency: *callLatency, seed: *seed,
		slice: *slice, retryCost: *retryCost, callInterval: *callInterval,
		maxAttempts: *maxAttempts}))
}

// monotonicNow reads CLOCK_MONOTONIC, the clock of the start signal's origin (time.Now's
// monotonic reading is on the same clock but relative to the process's start).
func monotonicNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// startSignalOrigin is the timelines' origin a start signal gives a worker that read it at
// now: the line's for "go MICROSECONDS", now for a bare "go"; false for anything else or an
// origin after now.
func startSignalOrigin(line string, now time.Duration) (time.Duration, bool) {
	if line == "go" {
		return now, true
	}
	rest := strings.TrimPrefix(line, "go ")
	us, err := strconv.ParseInt(rest, 10, 64)
	if rest == line || err != nil || us < 0 || us > int64(now/time.Microsecond) {
		return 0, false
	}
	return time.Duration(us) * time.Microsecond, true
}

// workerArgs are the worker protocol's flags.
type workerArgs struct {
	server, tenant                            string
	threads                                   int
	duration, failureRate, callLatency, slice float64
	seed                                      int64
	retryCost                                 int
	callInterval                              float64
	maxAttempts                               int64
}

// openLoopAttempts is the open loop's attempts per call: 5 unless given.
func openLoopAttempts(n int64) int64 {
	if n == 0 {
		return 5
	}
	return n
}

func run(a workerArgs) int {
	server, tenant, threads, duration, failureRate, callLatency, seed, slice :=
		a.server, a.tenant, a.threads, a.duration, a.failureRate, a.callLatency, a.seed, a.slice
	interval := time.Duration(a.callInterval * float64(time.Second))
	fmt.Println("ready")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	line = strings.TrimSpace(line)
	origin, ok := startSignalOrigin(line, monotonicNow())
	if !ok {
		fmt.Fprintf(os.Stderr, "go_worker: bad start signal %q (want \"go\" or \"go "+
			"<CLOCK_MONOTONIC microseconds, not after now>\")\n", line)
		return 3
	}
	opts := retrybudget.DefaultClientOptions()
	opts.Target = server
	client, err := retrybudget.NewClient(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	budget, err := client.Tenant(tenant)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Calls start once the tenant's first answer is in (as the fleet tool's C++ workers do): a
	// client is in enforce mode and has no lease until then, and what it counts before it is the
	// server's baseline. Bounded, so a server that is down does not hold the run.
	readyCtx, cancelReady := context.WithTimeout(context.Background(), 3*time.Second)
	_ = budget.WaitReady(readyCtx)
	cancelReady()
	// The fallback allowance is on the client's clock (the real one here).
	clock := retrybudget.RealClock()
	begin := time.Now()
	end := begin.Add(time.Duration(duration * float64(time.Second)))
	latency := time.Duration(callLatency * float64(time.Second))
	// The timelines count from the start signal's origin (the fleet's start), however late this
	// worker began.
	sliceWidth := time.Duration(slice * float64(time.Second))
	slices := int((monotonicNow()-origin+end.Sub(begin))/sliceWidth) + 2
	all := newTimelines(slices)

	var mu sync.Mutex
	var total counts
	var requestsAt, tokensAt []int64
	var maxTry time.Duration
	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			var c counts
			var longest time.Duration
			mine := newTimelines(slices)
			var myRequests, myTokens []int64
			for k := 0; ; k++ {
				if interval > 0 {
					time.Sleep(time.Until(begin.Add(time.Duration(k) * interval)))
				}
				now := time.Now()
				if !now.Before(end) {
					break
				}
				i := int((monotonicNow() - origin) / sliceWidth)
				if i >= slices { // not reached: now < end
					i = slices - 1
				}
				c.Calls++
				mine.calls[i]++
				budget.RecordRequest()
				c.Requests++
				countAt(&myRequests, monotonicNow()-origin, sliceWidth, 1)
				for attempt := int64(1); ; attempt++ {
					c.Attempts++
					if latency > 0 {
						time.Sleep(latency)
					}
					if rng.Float64() >= failureRate {
						budget.RecordSuccess()
						c.Successes++
						mine.successes[i]++
						break
					}
					if (a.maxAttempts > 0 && attempt >= a.maxAttempts) || !time.Now().Before(end) {
						c.Failures++
						break
					}
					start := time.Now()
					allowed := budget.TryAcquireN(a.retryCost)
					if d := time.Since(start); d > longest {
						longest = d
					}
					if !allowed {
						c.RetriesDenied++
						c.Failures++
						mine.denied[i]++
						break
					}
					c.RetriesAllowed++
					c.TokensSpent += int64(a.retryCost)
					mine.retries[i]++
					countAt(&myTokens, monotonicNow()-origin, sliceWidth, int64(a.retryCost))
				}
			}
			mu.Lock()
			all.add(mine)
			addInto(&requestsAt, myRequests)
			addInto(&tokensAt, myTokens)
			total.Calls += c.Calls
			total.Attempts += c.Attempts
			total.Successes += c.Successes
			total.Failures += c.Failures
			total.RetriesAllowed += c.RetriesAllowed
			total.RetriesDenied += c.RetriesDenied
			total.Requests += c.Requests
			total.TokensSpent += c.TokensSpent
			if longest > maxTry {
				maxTry = longest
			}
			mu.Unlock()
		}(seed*1000 + int64(i))
	}

	// Lease -> fallback -> lease, as seen by polling the mode.
	var sawFallback, leaseAfter, shadow bool
	// When this client's tenant changed mode (enforce <-> shadow), ms from the origin, as polled.
	modeChanges := []int64{}
	done := make(chan struct{})
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			stats := budget.Stats()
			if stats.Shadow != shadow {
				shadow = stats.Shadow
				modeChanges = append(modeChanges, int64((monotonicNow()-origin)/time.Millisecond))
			}
			switch stats.Mode {
			case retrybudget.ModeFallback, retrybudget.ModeDenyFallback:
				sawFallback = true
			case retrybudget.ModeLease:
				if sawFallback {
					leaseAfter = true
				}
			}
		}
	}()
	wg.Wait()
	close(done)
	<-monitorDone

	shutdown := "OK"
	if err := client.Close(); err != nil {
		shutdown = err.Error()
	}
	stats := budget.Stats()
	t := all.trimmed()
	out, _ := json.Marshal(report{
		counts:                      total,
		LibRetriesAllowed:           stats.RetriesAllowed,
		LibFallbackAllowed:          stats.FallbackAllowed,
		LibTokensHeld:               stats.TokensHeld,
		LibSuccessesCreditedLocally: stats.SuccessesCreditedLocally,
		LibRequests:                 stats.Requests,
		LibShadowDenied:             stats.ShadowDenied,
		FallbackAllowance:           budget.FallbackAllowance(clock.Now()),
		SawFallback:                 sawFallback,
		LeaseAfterFallback:          leaseAfter,
		ShutdownStatus:              shutdown,
		MaxTryAcquireMs:             float64(maxTry) / float64(time.Millisecond),
		TimelineSliceSeconds:        slice,
		TimelineOriginUs:            int64(origin / time.Microsecond),
		CallsTimeline:               t.calls,
		RetriesTimeline:             t.retries,
		DeniedTimeline:              t.denied,
		SuccessesTimeline:           t.successes,
		RequestsTimeline:            nonNil(requestsAt),
		TokensTimeline:              nonNil(tokensAt),
		ModeChangesMs:               modeChanges,
	})
	fmt.Println(string(out))
	return 0
}

// nonNil is t, or an empty slice (JSON [] rather than null).
func nonNil(t []int64) []int64 {
	if t == nil {
		return []int64{}
	}
	return t
}
