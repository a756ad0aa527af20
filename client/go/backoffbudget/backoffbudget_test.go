package backoffbudget

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

// fakeBudget has `tokens` tokens and counts what it was asked; ready (if not nil) is its
// Ready channel.
type fakeBudget struct {
	mu                                         sync.Mutex
	tokens, taken, denied, refunds, succ, reqs int
	ready                                      chan struct{}
}

func (b *fakeBudget) TryAcquire() bool { return b.TryAcquireN(1) }
func (b *fakeBudget) TryAcquireN(cost int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < cost {
		b.denied++
		return false
	}
	b.tokens -= cost
	b.taken++
	return true
}
func (b *fakeBudget) Refund()          { b.RefundN(1) }
func (b *fakeBudget) RefundN(cost int) { b.mu.Lock(); b.tokens += cost; b.refunds++; b.mu.Unlock() }
func (b *fakeBudget) RecordSuccess()   { b.mu.Lock(); b.succ++; b.mu.Unlock() }
func (b *fakeBudget) RecordRequest()   { b.mu.Lock(); b.reqs++; b.mu.Unlock() }

type readyFakeBudget struct{ *fakeBudget }

func (b readyFakeBudget) Ready() <-chan struct{} { return b.ready }

var errDown = errors.New("backend down")

func TestEachRetryTakesOneTokenAndASuccessIsRecordedOnce(t *testing.T) {
	b := &fakeBudget{tokens: 10}
	calls := 0
	err := Retry(context.Background(), b, &backoff.ZeroBackOff{}, func() error {
		calls++
		if calls < 4 {
			return errDown
		}
		return nil
	})
	if err != nil || calls != 4 || b.taken != 3 || b.succ != 1 || b.refunds != 0 || b.reqs != 1 {
		t.Fatalf("err %v, calls %d, taken %d, successes %d, refunds %d, requests %d", err, calls,
			b.taken, b.succ, b.refunds, b.reqs)
	}
}

func TestTheFirstAttemptIsFreeAndADenialStopsTheLoop(t *testing.T) {
	b := &fakeBudget{tokens: 1}
	calls := 0
	err := Retry(context.Background(), b, &backoff.ZeroBackOff{}, func() error {
		calls++
		return errDown
	})
	if !errors.Is(err, retrybudget.ErrBudgetExhausted) || !errors.Is(err, errDown) {
		t.Fatalf("err %v: want ErrBudgetExhausted wrapping the last error", err)
	}
	if calls != 2 || b.taken != 1 || b.denied != 1 || b.succ != 0 {
		t.Fatalf("calls %d taken %d denied %d successes %d", calls, b.taken, b.denied, b.succ)
	}
	// With no token at all, the first attempt still runs.
	empty := &fakeBudget{}
	calls = 0
	if err := Retry(context.Background(), empty, &backoff.ZeroBackOff{}, func() error {
		calls++
		return nil
	}); err != nil || calls != 1 || empty.succ != 1 {
		t.Fatalf("a first attempt with an empty budget: err %v calls %d", err, calls)
	}
}

func TestPermanentErrorsAndInnerStopTakeNoToken(t *testing.T) {
	b := &fakeBudget{tokens: 5}
	err := Retry(context.Background(), b, &backoff.ZeroBackOff{}, func() error {
		return backoff.Permanent(errDown)
	})
	if err != errDown || b.taken != 0 {
		t.Fatalf("permanent: err %v taken %d", err, b.taken)
	}
	calls := 0
	err = Retry(context.Background(), b, backoff.WithMaxRetries(&backoff.ZeroBackOff{}, 2), func() error {
		calls++
		return errDown
	})
	if err != errDown || calls != 3 || b.taken != 2 || errors.Is(err, retrybudget.ErrBudgetExhausted) {
		t.Fatalf("inner stop: err %v calls %d taken %d", err, calls, b.taken)
	}
}

func TestACancelledBackoffRefundsItsToken(t *testing.T) {
	b := &fakeBudget{tokens: 5}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Retry(ctx, b, backoff.NewConstantBackOff(time.Hour), func() error {
		calls++
		go func() {
			time.Sleep(10 * time.Millisecond)
			cancel()
		}()
		return errDown
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("err %v calls %d: want context.Canceled after one attempt", err, calls)
	}
	if b.taken != 1 || b.refunds != 1 || b.tokens != 5 {
		t.Fatalf("taken %d refunds %d tokens %d: the token of the retry never sent is refunded", b.taken, b.refunds, b.tokens)
	}
}

func TestANewTenantsFirstAnswerIsWaitedForWithinTheBackoff(t *testing.T) {
	b := &fakeBudget{ready: make(chan struct{})}
	rb := readyFakeBudget{b}
	calls := 0
	go func() {
		time.Sleep(20 * time.Millisecond)
		b.mu.Lock()
		b.tokens = 3 // the first lease
		b.mu.Unlock()
		close(b.ready)
	}()
	err := Retry(context.Background(), rb, backoff.NewConstantBackOff(200*time.Millisecond), func() error {
		calls++
		if calls == 1 {
			return errDown
		}
		return nil
	})
	if err != nil || calls != 2 || b.taken != 1 || b.denied != 0 {
		t.Fatalf("err %v calls %d taken %d denied %d", err, calls, b.taken, b.denied)
	}
	// Cancelled while waiting for the first answer: no token asked for.
	b2 := &fakeBudget{ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	err = Retry(ctx, readyFakeBudget{b2}, backoff.NewConstantBackOff(time.Hour), func() error { return errDown })
	if !errors.Is(err, context.Canceled) || b2.denied != 0 || b2.taken != 0 {
		t.Fatalf("err %v denied %d taken %d", err, b2.denied, b2.taken)
	}
}

func TestWithCostPricesEachRetryFromTheErrorBeforeItAndRefundsTheSameCost(t *testing.T) {
	b := &fakeBudget{tokens: 20}
	errTimeout := errors.New("timeout")
	cost := WithCost(func(err error) int {
		if err == errTimeout {
			return 10
		}
		return 5
	})
	calls := 0
	err := Retry(context.Background(), b, &backoff.ZeroBackOff{}, func() error {
		calls++
		switch calls {
		case 1:
			return errDown
		case 2:
			return errTimeout
		}
		return nil
	}, cost)
	if err != nil || b.tokens != 5 || b.taken != 2 || b.reqs != 1 {
		t.Fatalf("err %v, %d tokens left of 20 (want 5: 5 + 10 taken), %d taken, %d requests", err,
			b.tokens, b.taken, b.reqs)
	}
	// A retry never sent gives its cost back.
	b = &fakeBudget{tokens: 20}
	ctx, cancel := context.WithCancel(context.Background())
	bo := New(ctx, b, backoff.NewConstantBackOff(time.Hour), cost)
	_ = bo.Operation(func() error { return errTimeout })()
	if d := bo.NextBackOff(); d != time.Hour || b.tokens != 10 {
		t.Fatalf("NextBackOff %v with %d tokens left; want 1h and 10", d, b.tokens)
	}
	cancel()
	_ = bo.Done(context.Canceled)
	if b.tokens != 20 || b.refunds != 1 {
		t.Fatalf("after Done: %d tokens, %d refunds; want 20 and 1", b.tokens, b.refunds)
	}
}
