package retrybudget

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Attempt is what one attempt of a logical call is told about itself.
type Attempt struct {
	// Number is 1 for the first attempt, 2 for the first retry, ...
	Number int
	// IdempotencyKey is the same for every attempt of one logical call: pass it to the server
	// as the dedup key.
	IdempotencyKey string
}

// PreviousAttempts is the number of attempts made before this one.
func (a Attempt) PreviousAttempts() int { return a.Number - 1 }

// RetryOption configures Do and UnaryClientInterceptor.
type RetryOption func(*retryConfig)

type retryConfig struct {
	maxAttempts       int
	initialBackoff    time.Duration
	maxBackoff        time.Duration
	multiplier        float64
	perAttemptTimeout time.Duration // 0: only the overall deadline
	retryable         func(error) bool
	cost              func(error) int // the cost of the retry after an attempt failed with err
	idempotencyKey    string
	clock             Clock
	random            func() float64
	err               error // the first bad option
}

// WithMaxAttempts: most attempts of one logical call, the first included (1: never retry).
// Default 4; >= 1.
func WithMaxAttempts(n int) RetryOption {
	return func(c *retryConfig) {
		if n < 1 {
			c.fail(invalidf("WithMaxAttempts(%d): it must be >= 1", n))
		}
		c.maxAttempts = n
	}
}

// WithBackoff: the backoff before retry k is uniform in
// [0, min(max, initial * multiplier^(k-1))) (full jitter). Default 50 ms, 5 s, 2.
func WithBackoff(initial, max time.Duration, multiplier float64) RetryOption {
	return func(c *retryConfig) {
		switch {
		case initial < 0:
			c.fail(invalidf("WithBackoff: initial is %v; it must be >= 0", initial))
		case max < initial:
			c.fail(invalidf("WithBackoff: max is %v; it must be >= initial (%v)", max, initial))
		case math.IsNaN(multiplier) || math.IsInf(multiplier, 0) || multiplier < 1:
			c.fail(invalidf("WithBackoff: multiplier is %v; it must be finite and >= 1", multiplier))
		}
		c.initialBackoff, c.maxBackoff, c.multiplier = initial, max, multiplier
	}
}

// WithPerAttemptTimeout: each attempt's context ends at min(overall deadline, attempt start +
// d). Default: only the overall deadline; d > 0.
func WithPerAttemptTimeout(d time.Duration) RetryOption {
	return func(c *retryConfig) {
		if d <= 0 {
			c.fail(invalidf("WithPerAttemptTimeout(%v): it must be > 0", d))
		}
		c.perAttemptTimeout = d
	}
}

// WithRetryable replaces the classification of errors (DefaultRetryable). An error that is
// ErrBudgetExhausted is never retried, whatever this says: stacked retry layers must not
// multiply.
func WithRetryable(f func(error) bool) RetryOption {
	return func(c *retryConfig) {
		if f == nil {
			c.fail(invalidf("WithRetryable(nil)"))
		}
		c.retryable = f
	}
}

// WithCost: every retry costs `cost` tokens (TryAcquireN(cost)) instead of 1. In [1, MaxCost].
func WithCost(cost int) RetryOption {
	return func(c *retryConfig) {
		if cost < 1 || cost > MaxCost {
			c.fail(invalidf("WithCost(%d): cost must be in [1, %d]", cost, MaxCost))
		}
		c.cost = func(error) int { return cost }
	}
}

// WithCostFunc prices each retry from the error of the attempt it follows (the last
// attempt's error as Do's fn returned it, a Pushback unwrapped): TryAcquireN(f(err)), and
// RefundN with the same cost if the retry is then not sent. A cost outside [1, MaxCost] is
// denied (the call ends with ErrBudgetExhausted, the cost named in its message). AWS SDKs'
// retry quota is
//
//	retrybudget.WithCostFunc(func(err error) int {
//		if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
//			return 10 // a timeout
//		}
//		return 5 // any other retryable error
//	})
//
// and an LLM call may price a retry by its request's size. Default: every retry costs 1.
func WithCostFunc(f func(err error) int) RetryOption {
	return func(c *retryConfig) {
		if f == nil {
			c.fail(invalidf("WithCostFunc(nil)"))
		}
		c.cost = f
	}
}

// WithIdempotencyKey sets the call's dedup key (default: a fresh random 128-bit key): 1-256
// printable ASCII characters without spaces (it travels as gRPC metadata).
func WithIdempotencyKey(key string) RetryOption {
	return func(c *retryConfig) {
		if key == "" || len(key) > 256 || !printableASCII(key, false) {
			c.fail(invalidf("WithIdempotencyKey(%q): expected 1-256 printable ASCII characters without spaces", key))
		}
		c.idempotencyKey = key
	}
}

// WithClock sets the clock the backoffs wait on (default RealClock()). Deadlines stay those
// of the context (real time).
func WithClock(clock Clock) RetryOption {
	return func(c *retryConfig) {
		if clock == nil {
			c.fail(invalidf("WithClock(nil)"))
		}
		c.clock = clock
	}
}

// WithRandom sets the jitter source (values in [0, 1); others are clamped).
func WithRandom(f func() float64) RetryOption {
	return func(c *retryConfig) {
		if f == nil {
			c.fail(invalidf("WithRandom(nil)"))
		}
		c.random = f
	}
}

func (c *retryConfig) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

var (
	randMu  sync.Mutex
	randSrc = mrand.New(mrand.NewSource(time.Now().UnixNano()))
)

func defaultRandom() float64 {
	randMu.Lock()
	defer randMu.Unlock()
	return randSrc.Float64()
}

func newRetryConfig(opts []RetryOption) retryConfig {
	c := retryConfig{maxAttempts: 4, initialBackoff: 50 * time.Millisecond, maxBackoff: 5 * time.Second,
		multiplier: 2, retryable: DefaultRetryable, cost: func(error) int { return 1 },
		clock: RealClock(), random: defaultRandom}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// NewIdempotencyKey is a fresh random 128-bit key as 32 lowercase hex characters.
func NewIdempotencyKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("retrybudget: no randomness for an idempotency key: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// DefaultRetryable: gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED and DEADLINE_EXCEEDED (the
// C++ RetryPolicy's retryable_codes), context.DeadlineExceeded (an attempt's own timeout),
// and net.Error timeouts and connection errors.
func DefaultRetryable(err error) bool {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		switch s.Code() {
		case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded:
			return true
		}
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe)
}

// readyBudget is a Budget that tells when it has its first answer (*TenantBudget does).
type readyBudget interface {
	Ready() <-chan struct{}
}

// FirstAnswerWait is the longest Do waits for a new tenant's first answer when its backoff is
// shorter (the default SyncTimeout: by then the first Sync got a lease, a refusal, or failed
// and the fallback applies). A longer backoff is waited for whole, as always.
const FirstAnswerWait = time.Second

// waitReadyWithin waits for rb's first answer for at most max(wait, FirstAnswerWait) on the
// clock; returns what is left of `wait` (0 if it all passed), or ctx.Err() when ctx (its
// deadline included) ended first.
func waitReadyWithin(ctx context.Context, c *retryConfig, rb readyBudget, wait time.Duration) (time.Duration, error) {
	ready := rb.Ready()
	select {
	case <-ready:
		return wait, nil
	default:
	}
	start := c.clock.Now()
	bound := wait
	if bound < FirstAnswerWait {
		bound = FirstAnswerWait
	}
	t := c.clock.NewTimer(bound)
	defer t.Stop()
	select {
	case <-ready:
		if left := wait - c.clock.Now().Sub(start); left > 0 {
			return left, nil
		}
		return 0, nil
	case <-t.C():
		return 0, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// computeBackoff is the full-jitter backoff before retry `retry` (1 = the first retry).
func computeBackoff(c *retryConfig, retry int, r float64) time.Duration {
	ceiling := c.maxBackoff
	if s := c.initialBackoff.Seconds() * math.Pow(c.multiplier, float64(retry-1)); s < c.maxBackoff.Seconds() {
		ceiling = time.Duration(s * 1e9)
	}
	if !(r > 0) {
		r = 0
	}
	if r >= 1 {
		r = math.Nextafter(1, 0)
	}
	d := time.Duration(float64(ceiling) * r)
	if d >= ceiling && ceiling > 0 {
		d = ceiling - 1
	}
	return d
}

// Pushback wraps err with the server's requested delay before the next attempt (gRPC's
// `grpc-retry-pushback-ms`): d >= 0 replaces the computed backoff (the retry still needs a
// token and must start before the deadline); d < 0 means "do not retry". Return it from the
// function given to Do.
func Pushback(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &pushbackError{err: err, delay: d}
}

type pushbackError struct {
	err   error
	delay time.Duration
}

func (p *pushbackError) Error() string { return p.err.Error() }
func (p *pushbackError) Unwrap() error { return p.err }

// GRPCStatus keeps status.Code and status.FromError working through the wrapper.
func (p *pushbackError) GRPCStatus() *status.Status { return status.Convert(p.err) }

// CallError is what Do returns when the budget, the context or the deadline ended the call
// (rather than the operation's own error): errors.Is(err, ErrBudgetExhausted),
// errors.Is(err, context.Canceled) or errors.Is(err, context.DeadlineExceeded) tell which,
// and errors.As / errors.Unwrap reach Last, the last attempt's error (nil if none ran).
type CallError struct {
	Reason   error // ErrBudgetExhausted, context.Canceled or context.DeadlineExceeded
	Last     error
	Attempts int
	detail   string
}

func (e *CallError) Error() string {
	msg := fmt.Sprintf("retrybudget: %v", e.Reason)
	if e.detail != "" {
		msg += " " + e.detail
	}
	if e.Last != nil {
		msg += ": last error: " + e.Last.Error()
	}
	return msg
}

// Unwrap is the last attempt's error.
func (e *CallError) Unwrap() error { return e.Last }

// Is matches the Reason.
func (e *CallError) Is(target error) bool { return errors.Is(e.Reason, target) }

// GRPCStatus: a call the budget or the context ended keeps the last attempt's status
// (budget) or the context's code, so gRPC callers of the interceptor see a gRPC status.
func (e *CallError) GRPCStatus() *status.Status {
	switch {
	case e.Reason == ErrBudgetExhausted && e.Last != nil:
		s := status.Convert(e.Last)
		return status.New(s.Code(), e.Error())
	case errors.Is(e.Reason, context.Canceled):
		return status.New(codes.Canceled, e.Error())
	case errors.Is(e.Reason, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, e.Error())
	}
	return status.New(codes.Unknown, e.Error())
}

// Do runs fn and retries it when it fails with a retryable error, each retry only when
// budget.TryAcquireN allows (one token per retry, or the cost WithCost / WithCostFunc set).
// What one logical call does:
//   - RecordRequest once, before the first attempt (unless ctx is already done).
//   - The first attempt is always sent (unless ctx is already done); the budget decides
//     every retry.
//   - After a failed attempt, in this order: ctx done? (return at once) -> retryable
//     (DefaultRetryable or WithRetryable; never an error that is already ErrBudgetExhausted:
//     stacked layers must not multiply)? -> attempts left? -> pushback < 0 (do not retry)? ->
//     backoff (the pushback, or full jitter) -> would the backoff end at or after ctx's
//     deadline? (a CallError with context.DeadlineExceeded now, no token taken) ->
//     a budget without its first answer yet (a *TenantBudget whose Ready is still open: a
//     new client) is waited for during the backoff, or up to FirstAnswerWait if the backoff
//     is shorter (ended by ctx or its deadline: a CallError with ctx.Err(), no token taken)
//     -> TryAcquireN(cost of the last error) (denied: a CallError with ErrBudgetExhausted
//     wrapping the last error) -> the rest of the backoff raced against ctx.Done()
//     (cancelled: RefundN(the same cost) and a CallError with ctx.Err() returned at once) ->
//     the next attempt.
//   - Each attempt gets ctx (with WithPerAttemptTimeout, a child with its own deadline).
//   - A call that succeeds, at any attempt, calls RecordSuccess exactly once.
//   - Every attempt sees the same IdempotencyKey.
//
// Returns nil, the operation's last error unchanged (not retryable, or no attempts left), a
// *CallError, or an ErrInvalidOptions error for a bad option (no attempt made). Starts no
// goroutine; safe for concurrent use.
func Do(ctx context.Context, budget Budget, fn func(ctx context.Context, attempt Attempt) error, opts ...RetryOption) error {
	c := newRetryConfig(opts)
	if c.err != nil {
		return c.err
	}
	if budget == nil || fn == nil {
		return invalidf("Do: budget and fn must not be nil")
	}
	key := c.idempotencyKey
	if key == "" {
		key = NewIdempotencyKey()
	}
	deadline, hasDeadline := ctx.Deadline()
	if ctx.Err() == nil {
		budget.RecordRequest()
	}
	var last error
	for number := 1; ; number++ {
		if err := ctx.Err(); err != nil {
			return &CallError{Reason: err, Last: last, Attempts: number - 1,
				detail: fmt.Sprintf("before attempt %d", number)}
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if c.perAttemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, c.perAttemptTimeout)
		}
		err := fn(actx, Attempt{Number: number, IdempotencyKey: key})
		cancel()
		if err == nil {
			budget.RecordSuccess()
			return nil
		}
		var pushback *pushbackError
		hasPushback := errors.As(err, &pushback)
		if hasPushback {
			last = pushback.err
		} else {
			last = err
		}
		if cerr := ctx.Err(); cerr != nil {
			return &CallError{Reason: cerr, Last: last, Attempts: number,
				detail: fmt.Sprintf("during attempt %d", number)}
		}
		if errors.Is(last, ErrBudgetExhausted) || !c.retryable(last) {
			return last
		}
		// An attempt's own timeout is worth retrying; the overall deadline running out is not.
		if hasDeadline && !time.Now().Before(deadline) &&
			(status.Code(last) == codes.DeadlineExceeded || errors.Is(last, context.DeadlineExceeded)) {
			return last
		}
		if number >= c.maxAttempts {
			return last
		}
		if hasPushback && pushback.delay < 0 {
			return last
		}
		// Decide the wait before asking for a token: a retry that cannot start before the
		// deadline must not spend one.
		var wait time.Duration
		if hasPushback {
			wait = pushback.delay
		} else {
			wait = computeBackoff(&c, number, c.random())
		}
		if hasDeadline && !time.Now().Add(wait).Before(deadline) {
			return &CallError{Reason: context.DeadlineExceeded, Last: last, Attempts: number,
				detail: fmt.Sprintf("a backoff of %v after attempt %d would end at or after the deadline (%v left)",
					wait, number, time.Until(deadline).Round(time.Millisecond))}
		}
		if rb, ok := budget.(readyBudget); ok {
			// A tenant without its first answer yet denies every retry: wait for the answer
			// during the backoff, which is slept anyway (what is left of it is slept after),
			// or up to FirstAnswerWait when the backoff is shorter; ctx (and its deadline)
			// ends the wait.
			left, err := waitReadyWithin(ctx, &c, rb, wait)
			if err != nil {
				return &CallError{Reason: err, Last: last, Attempts: number,
					detail: fmt.Sprintf("during the backoff before attempt %d", number+1)}
			}
			wait = left
		}
		cost := c.cost(last)
		if !budget.TryAcquireN(cost) {
			detail := fmt.Sprintf("after %d attempt(s)", number)
			if cost < 1 || cost > MaxCost {
				detail += fmt.Sprintf(" (the retry's cost %d is outside [1, %d])", cost, MaxCost)
			} else if cost != 1 {
				detail += fmt.Sprintf(" (a retry of cost %d)", cost)
			}
			return &CallError{Reason: ErrBudgetExhausted, Last: last, Attempts: number,
				detail: detail}
		}
		if wait > 0 {
			t := c.clock.NewTimer(wait)
			select {
			case <-t.C():
			case <-ctx.Done():
				t.Stop()
				budget.RefundN(cost) // the retry is never sent
				return &CallError{Reason: ctx.Err(), Last: last, Attempts: number,
					detail: fmt.Sprintf("during the backoff before attempt %d", number+1)}
			}
		}
	}
}
