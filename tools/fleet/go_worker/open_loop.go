package main

// The open-loop mode of go_worker (--backend=TARGET): a worker of bench/metastable.py's fleet
// (docs/BENCHMARKS.md 13), speaking the protocol of bench/metastable_worker.cc with the fleet
// strategy and immediate resends:
//
//	go_worker --backend=TARGET --server=BUDGET --tenant=T --rate=R --phase=P --epoch-ms=E
//	          --duration=SECONDS --timeout-ms=MS --max-attempts=N
//
// It waits for the tenant's first answer (WaitReady), prints {"ready":true}, then from the
// epoch for DURATION starts R logical calls per second (one every 1/R s, shifted by P of an
// interval), whatever happened to earlier ones. A call is attempts of the backend's Work RPC,
// each with a deadline of MS; a failed attempt is resent at once while attempts remain and
// TryAcquire allows (a denied resend ends the call as failed); a success calls RecordSuccess.
// One JSON line per second of the run ({"t":T,"offered","ok","failed","attempts","retries",
// "denied"}, printed once the second is 2 s old), then {"totals":{...}}. Closing stdin stops
// the calls early. The Work request is encoded by hand (field 1, attempt, a varint): the worker
// needs no generated code of bench/metastable.proto, and ignores the response's content.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

const workMethod = "/retrybudget.bench.MetastableBackend/Work"

// rawCodec sends and receives the bytes as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

type olRow struct{ offered, ok, failed, attempts, retries, denied int64 }

func (r olRow) fields() string {
	return fmt.Sprintf(`"offered":%d,"ok":%d,"failed":%d,"attempts":%d,"retries":%d,"denied":%d`,
		r.offered, r.ok, r.failed, r.attempts, r.retries, r.denied)
}

type olRows struct {
	mu     sync.Mutex
	epoch  time.Time
	rows   map[int64]*olRow
	totals olRow
}

func (r *olRows) add(f func(*olRow)) {
	t := int64(time.Since(r.epoch) / time.Second)
	if time.Now().Before(r.epoch) {
		t = -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	row := r.rows[t]
	if row == nil {
		row = &olRow{}
		r.rows[t] = row
	}
	f(row)
	f(&r.totals)
}

func (r *olRows) printBefore(before int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []int64
	for t := range r.rows {
		if t < before {
			keys = append(keys, t)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, t := range keys {
		fmt.Printf("{\"t\":%d,%s}\n", t, r.rows[t].fields())
		delete(r.rows, t)
	}
}

type openLoopArgs struct {
	backend, server, tenant         string
	rate, phase, duration           float64
	epochMs, timeoutMs, maxAttempts int64
}

func olCall(conn *grpc.ClientConn, budget *retrybudget.TenantBudget, rows *olRows, a openLoopArgs) {
	for attempt := int64(1); ; attempt++ {
		retry := attempt > 1
		rows.add(func(r *olRow) {
			r.attempts++
			if retry {
				r.retries++
			}
		})
		req := binary.AppendUvarint([]byte{0x08}, uint64(attempt))
		var resp []byte
		ctx, cancel := context.WithTimeout(context.Background(),
			time.Duration(a.timeoutMs)*time.Millisecond)
		err := conn.Invoke(ctx, workMethod, &req, &resp, grpc.ForceCodec(rawCodec{}))
		cancel()
		if err == nil {
			budget.RecordSuccess()
			rows.add(func(r *olRow) { r.ok++ })
			return
		}
		if attempt >= a.maxAttempts {
			rows.add(func(r *olRow) { r.failed++ })
			return
		}
		if !budget.TryAcquire() {
			rows.add(func(r *olRow) { r.denied++; r.failed++ })
			return
		}
	}
}

func runOpenLoop(a openLoopArgs) int {
	if a.rate <= 0 || a.timeoutMs < 1 || a.maxAttempts < 1 || a.phase < 0 || a.phase >= 1 {
		fmt.Fprintf(os.Stderr, "go_worker: --rate=%g --timeout-ms=%d --max-attempts=%d "+
			"--phase=%g: need rate > 0, timeout >= 1, attempts >= 1, phase in [0, 1)\n",
			a.rate, a.timeoutMs, a.maxAttempts, a.phase)
		return 2
	}
	opts := retrybudget.DefaultClientOptions()
	opts.Target = a.server
	client, err := retrybudget.NewClient(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	budget, err := client.Tenant(a.tenant)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = budget.WaitReady(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_worker: the budget's first answer:", err)
		return 1
	}
	conn, err := grpc.Dial(a.backend, grpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer conn.Close()
	epoch := time.UnixMilli(a.epochMs)
	rows := &olRows{epoch: epoch, rows: map[int64]*olRow{}}
	fmt.Println(`{"ready":true}`)

	var stop atomic.Bool
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop.Store(true)
	}()
	done := make(chan struct{})
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				rows.printBefore(int64(time.Since(epoch)/time.Second) - 2)
			}
		}
	}()
	interval := time.Duration(float64(time.Second) / a.rate)
	first := epoch.Add(time.Duration(a.phase * float64(interval)))
	end := epoch.Add(time.Duration(a.duration * float64(time.Second)))
	var wg sync.WaitGroup
	for i := int64(0); ; i++ {
		at := first.Add(time.Duration(i) * interval)
		if !at.Before(end) || stop.Load() {
			break
		}
		time.Sleep(time.Until(at))
		rows.add(func(r *olRow) { r.offered++ })
		wg.Add(1)
		go func() {
			defer wg.Done()
			olCall(conn, budget, rows, a)
		}()
	}
	wg.Wait()
	close(done)
	<-printed
	rows.printBefore(1 << 62)
	rows.mu.Lock()
	fmt.Printf("{\"totals\":{%s}}\n", rows.totals.fields())
	rows.mu.Unlock()
	_ = client.Close()
	return 0
}
