package retrybudget

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// countingBudget is a Budget with `tokens` tokens that counts what it was asked.
type countingBudget struct {
	tokens    atomic.Int64
	acquired  atomic.Int64
	denied    atomic.Int64
	refunds   atomic.Int64
	successes atomic.Int64
	requests  atomic.Int64
	costs     []int // of every TryAcquireN, in order (not for concurrent use)
	refunded  []int // of every RefundN
}

func newCountingBudget(tokens int64) *countingBudget {
	b := &countingBudget{}
	b.tokens.Store(tokens)
	return b
}

func (b *countingBudget) TryAcquire() bool { return b.TryAcquireN(1) }
func (b *countingBudget) TryAcquireN(cost int) bool {
	b.costs = append(b.costs, cost)
	if cost < 1 || cost > MaxCost {
		b.denied.Add(1)
		return false
	}
	if b.tokens.Add(-int64(cost)) < 0 {
		b.tokens.Add(int64(cost))
		b.denied.Add(1)
		return false
	}
	b.acquired.Add(1)
	return true
}
func (b *countingBudget) Refund() { b.RefundN(1) }
func (b *countingBudget) RefundN(cost int) {
	b.refunded = append(b.refunded, cost)
	b.tokens.Add(int64(cost))
	b.refunds.Add(1)
}
func (b *countingBudget) RecordSuccess() { b.successes.Add(1) }
func (b *countingBudget) RecordRequest() { b.requests.Add(1) }

var errUnavailable = status.Error(codes.Unavailable, "backend down")

func noJitter() float64 { return 0.5 }

func TestDoRetriesUntilSuccessWithOneKeyAndRecordsOneSuccess(t *testing.T) {
	b := newCountingBudget(10)
	var keys []string
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
		keys = append(keys, a.IdempotencyKey)
		if a.Number < 3 {
			return errUnavailable
		}
		return nil
	}, WithBackoff(0, 0, 1))
	if err != nil || len(keys) != 3 || keys[0] != keys[2] || len(keys[0]) != 32 {
		t.Fatalf("err %v keys %v", err, keys)
	}
	if b.acquired.Load() != 2 || b.successes.Load() != 1 {
		t.Fatalf("acquired %d successes %d", b.acquired.Load(), b.successes.Load())
	}
}

func TestDoBudgetExhaustedWrapsTheLastError(t *testing.T) {
	b := newCountingBudget(1)
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
		return errUnavailable
	}, WithBackoff(0, 0, 1), WithMaxAttempts(10))
	if !errors.Is(err, ErrBudgetExhausted) {
		t.Fatalf("err %v is not ErrBudgetExhausted", err)
	}
	var ce *CallError
	if !errors.As(err, &ce) || ce.Attempts != 2 || ce.Last != errUnavailable {
		t.Fatalf("CallError %+v", ce)
	}
	if status.Code(err) != codes.Unavailable || !errors.Is(err, errUnavailable) {
		t.Fatalf("the last error is not reachable: %v", err)
	}
	// A budget-exhausted error from an inner layer is never retried.
	calls := 0
	err2 := Do(context.Background(), newCountingBudget(10), func(ctx context.Context, a Attempt) error {
		calls++
		return err
	}, WithBackoff(0, 0, 1))
	if calls != 1 || !errors.Is(err2, ErrBudgetExhausted) {
		t.Fatalf("stacked layer retried: %d calls", calls)
	}
}

func TestDoReturnsNonRetryableErrorsUnchanged(t *testing.T) {
	b := newCountingBudget(10)
	perm := status.Error(codes.InvalidArgument, "bad request")
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error { return perm })
	if err != perm || b.acquired.Load() != 0 {
		t.Fatalf("err %v acquired %d", err, b.acquired.Load())
	}
	plain := errors.New("plain")
	if err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error { return plain }); err != plain {
		t.Fatalf("plain error: %v", err)
	}
}

func TestDoMaxAttempts(t *testing.T) {
	b := newCountingBudget(10)
	calls := 0
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
		calls++
		return errUnavailable
	}, WithMaxAttempts(3), WithBackoff(0, 0, 1))
	if err != errUnavailable || calls != 3 || b.acquired.Load() != 2 {
		t.Fatalf("err %v calls %d acquired %d", err, calls, b.acquired.Load())
	}
}

// A context cancelled during the backoff returns at once, refunds the token and leaves no
// goroutine behind.
func TestDoCancelledDuringBackoffRefundsTheToken(t *testing.T) {
	clock := NewFakeClock(epoch)
	b := newCountingBudget(5)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Do(ctx, b, func(ctx context.Context, a Attempt) error { return errUnavailable },
			WithClock(clock), WithBackoff(time.Hour, time.Hour, 1), WithRandom(noJitter))
	}()
	for clock.Timers() == 0 { // the backoff is waiting (the fake clock never reaches it)
		runtime.Gosched()
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not return after its context was cancelled")
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errUnavailable) {
		t.Fatalf("err %v", err)
	}
	if b.acquired.Load() != 1 || b.refunds.Load() != 1 || b.tokens.Load() != 5 {
		t.Fatalf("acquired %d refunds %d tokens %d", b.acquired.Load(), b.refunds.Load(), b.tokens.Load())
	}
	if clock.Timers() != 0 {
		t.Fatal("the backoff timer was left behind")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after Do returned, %d before", n, before)
	}
}

func TestDoDeadlineShorterThanTheBackoffTakesNoToken(t *testing.T) {
	b := newCountingBudget(5)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Do(ctx, b, func(ctx context.Context, a Attempt) error { return errUnavailable },
		WithBackoff(time.Hour, time.Hour, 1), WithRandom(noJitter))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errUnavailable) {
		t.Fatalf("err %v", err)
	}
	if time.Since(start) > 400*time.Millisecond && b.acquired.Load() != 0 {
		t.Fatal("waited for the backoff")
	}
	if b.acquired.Load() != 0 || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a token was taken for a retry that could not start: %d (%v)", b.acquired.Load(), err)
	}
}

func TestDoContextDoneBeforeTheFirstAttempt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	err := Do(ctx, newCountingBudget(1), func(ctx context.Context, a Attempt) error { calls++; return nil })
	if calls != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("calls %d err %v", calls, err)
	}
}

func TestDoHonoursPushback(t *testing.T) {
	clock := NewFakeClock(epoch)
	b := newCountingBudget(5)
	done := make(chan error, 1)
	go func() {
		done <- Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
			if a.Number == 1 {
				return Pushback(errUnavailable, 700*time.Millisecond)
			}
			return nil
		}, WithClock(clock), WithBackoff(0, 0, 1))
	}()
	for clock.Timers() == 0 {
		runtime.Gosched()
	}
	clock.Advance(699 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("the retry started before the pushback")
	case <-time.After(20 * time.Millisecond):
	}
	clock.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A negative pushback means "do not retry".
	calls := 0
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
		calls++
		return Pushback(errUnavailable, -1)
	})
	if calls != 1 || err != errUnavailable {
		t.Fatalf("negative pushback: calls %d err %v", calls, err)
	}
}

func TestDoPerAttemptTimeoutIsRetried(t *testing.T) {
	b := newCountingBudget(5)
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
		if a.Number == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, WithPerAttemptTimeout(10*time.Millisecond), WithBackoff(0, 0, 1))
	if err != nil || b.acquired.Load() != 1 {
		t.Fatalf("err %v acquired %d", err, b.acquired.Load())
	}
}

func TestDoBadOptionsNameTheOption(t *testing.T) {
	for _, c := range []struct {
		opt  RetryOption
		want string
	}{
		{WithMaxAttempts(0), "WithMaxAttempts(0)"},
		{WithBackoff(-1, 0, 1), "initial is -1ns"},
		{WithBackoff(2, 1, 1), "max is 1ns"},
		{WithBackoff(0, 0, 0.5), "multiplier is 0.5"},
		{WithPerAttemptTimeout(0), "WithPerAttemptTimeout(0s)"},
		{WithIdempotencyKey("a\nb"), `WithIdempotencyKey("a\nb")`},
		{WithCost(0), "WithCost(0): cost must be in [1, 1000000]"},
		{WithCost(MaxCost + 1), "WithCost(1000001)"},
		{WithCostFunc(nil), "WithCostFunc(nil)"},
	} {
		calls := 0
		err := Do(context.Background(), newCountingBudget(1), func(context.Context, Attempt) error { calls++; return nil }, c.opt)
		if calls != 0 || !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want %q, got %v (calls %d)", c.want, err, calls)
		}
	}
}

func TestComputeBackoffIsFullJitterBelowTheCeiling(t *testing.T) {
	c := newRetryConfig([]RetryOption{WithBackoff(100*time.Millisecond, time.Second, 2)})
	if d := computeBackoff(&c, 3, 0.999999999999); d >= 400*time.Millisecond || d < 399*time.Millisecond {
		t.Fatalf("retry 3 near the top: %v", d)
	}
	if d := computeBackoff(&c, 50, 0.5); d != 500*time.Millisecond {
		t.Fatalf("capped ceiling: %v", d)
	}
	if d := computeBackoff(&c, 1, -3); d != 0 {
		t.Fatalf("clamped jitter: %v", d)
	}
}

func TestParseRetryPushback(t *testing.T) {
	if _, ok := ParseRetryPushback(metadata.MD{}); ok {
		t.Fatal("absent header")
	}
	if d, _ := ParseRetryPushback(metadata.Pairs(RetryPushbackHeader, "250")); d != 250*time.Millisecond {
		t.Fatalf("250: %v", d)
	}
	for _, v := range []string{"-1", "soon", ""} {
		if d, ok := ParseRetryPushback(metadata.Pairs(RetryPushbackHeader, v)); !ok || d >= 0 {
			t.Fatalf("%q: %v %v", v, d, ok)
		}
	}
}

func TestDoRecordsOneRequestPerCallAndPricesEachRetryByTheErrorBeforeIt(t *testing.T) {
	b := newCountingBudget(100)
	timeout := status.Error(codes.DeadlineExceeded, "attempt timed out")
	aws := WithCostFunc(func(err error) int {
		if status.Code(err) == codes.DeadlineExceeded {
			return 10
		}
		return 5
	})
	err := Do(context.Background(), b, func(ctx context.Context, a Attempt) error {
		switch a.Number {
		case 1:
			return errUnavailable
		case 2:
			return timeout
		}
		return nil
	}, WithBackoff(0, 0, 1), aws)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.costs) != 2 || b.costs[0] != 5 || b.costs[1] != 10 || b.tokens.Load() != 85 {
		t.Fatalf("costs %v, %d tokens left of 100; want [5 10], 85", b.costs, b.tokens.Load())
	}
	if b.requests.Load() != 1 || b.successes.Load() != 1 {
		t.Fatalf("%d requests, %d successes recorded; want 1 and 1", b.requests.Load(), b.successes.Load())
	}
	// A call that fails without retrying records its request too; one whose context is done
	// before the first attempt records none.
	_ = Do(context.Background(), b, func(context.Context, Attempt) error { return errors.New("permanent") })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = Do(ctx, b, func(context.Context, Attempt) error { return nil })
	if b.requests.Load() != 2 {
		t.Fatalf("%d requests recorded, want 2", b.requests.Load())
	}
}

func TestDoWithCostTakesThatManyTokensAndADenialNamesTheCost(t *testing.T) {
	b := newCountingBudget(12)
	err := Do(context.Background(), b, func(context.Context, Attempt) error { return errUnavailable },
		WithBackoff(0, 0, 1), WithMaxAttempts(10), WithCost(5))
	var ce *CallError
	if !errors.As(err, &ce) || !errors.Is(err, ErrBudgetExhausted) || ce.Attempts != 3 {
		t.Fatalf("err %v: want ErrBudgetExhausted after 3 attempts (2 retries of 5 from 12)", err)
	}
	if !strings.Contains(err.Error(), "a retry of cost 5") || b.tokens.Load() != 2 {
		t.Fatalf("err %q, %d tokens left; want the cost named and 2 left", err, b.tokens.Load())
	}
	// A price outside [1, MaxCost] is denied, named, and takes nothing.
	b = newCountingBudget(12)
	err = Do(context.Background(), b, func(context.Context, Attempt) error { return errUnavailable },
		WithBackoff(0, 0, 1), WithCostFunc(func(error) int { return 0 }))
	if !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "cost 0 is outside [1, 1000000]") ||
		b.tokens.Load() != 12 {
		t.Fatalf("err %v, %d tokens left", err, b.tokens.Load())
	}
}

func TestDoCancelledDuringBackoffRefundsTheCostItTook(t *testing.T) {
	clock := NewFakeClock(epoch)
	b := newCountingBudget(10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Do(ctx, b, func(ctx context.Context, a Attempt) error { return errUnavailable },
			WithClock(clock), WithBackoff(time.Hour, time.Hour, 1), WithRandom(noJitter), WithCost(7))
	}()
	for clock.Timers() == 0 {
		runtime.Gosched()
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if len(b.refunded) != 1 || b.refunded[0] != 7 || b.tokens.Load() != 10 {
		t.Fatalf("refunded %v, %d tokens; want [7] and all 10 back", b.refunded, b.tokens.Load())
	}
}

func TestInterceptorRecordsTheRequestOnceAndPricesEveryRetry(t *testing.T) {
	b := newCountingBudget(100)
	var previous []string
	invoker := func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		opts ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		previous = append(previous, strings.Join(md.Get(PreviousAttemptsHeader), ","))
		if len(previous) < 3 {
			return errUnavailable
		}
		return nil
	}
	call := UnaryClientInterceptor(b, WithBackoff(0, 0, 1), WithCost(5))
	if err := call(context.Background(), "/x.Y/Z", nil, nil, nil, invoker); err != nil {
		t.Fatal(err)
	}
	if b.requests.Load() != 1 || b.successes.Load() != 1 || len(b.costs) != 2 || b.costs[0] != 5 ||
		b.costs[1] != 5 || b.tokens.Load() != 90 {
		t.Fatalf("requests %d, successes %d, costs %v, tokens %d", b.requests.Load(),
			b.successes.Load(), b.costs, b.tokens.Load())
	}
	if strings.Join(previous, "|") != "|1|2" {
		t.Fatalf("grpc-previous-rpc-attempts per attempt: %q", previous)
	}
}
