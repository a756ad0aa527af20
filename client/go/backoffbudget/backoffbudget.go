// Package backoffbudget puts github.com/cenkalti/backoff/v4's retry loop under a retry budget:
// BackOff is a backoff.BackOff whose every retry needs a token of the budget, and that stops
// the loop (backoff.Stop) when the budget says no. It keeps the budget's rules:
//
//   - the first attempt is free: backoff.Retry calls the operation before any NextBackOff;
//   - one token per retry (or the cost WithCost prices it at): each NextBackOff (one per
//     failed attempt) takes it, or stops;
//   - a retry never sent gives its token back: a token taken for a retry whose backoff was
//     cancelled (the context of backoff.WithContext done) is refunded by Done;
//   - a request is recorded once per logical call, before its first attempt, and a success
//     once per logical call that succeeds (the operation wrapped by Operation).
//
// A tenant without its first answer yet (a new client) is waited for during the backoff, or up
// to retrybudget.FirstAnswerWait when the backoff is shorter, as retrybudget.Do does. The simplest use is Retry, which does all of it:
//
//	err := backoffbudget.Retry(ctx, tenant, backoff.NewExponentialBackOff(), func() error {
//		return callTheBackend(ctx)
//	})
//	if errors.Is(err, retrybudget.ErrBudgetExhausted) { /* the budget said no */ }
//
// By hand (a Notify, a Timer, backoff.WithMaxRetries around the adapter, ...):
//
//	b := backoffbudget.New(ctx, tenant, backoff.NewExponentialBackOff())
//	err := backoff.Retry(b.Operation(op), backoff.WithContext(b, ctx))
//	err = b.Done(err) // refunds a retry never sent; a denial becomes ErrBudgetExhausted
//
// The package is separate so that retrybudget itself does not depend on cenkalti/backoff.
package backoffbudget

import (
	"context"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	retrybudget "github.com/retry-budget/retry-budget/client/go"
)

// BackOff is a backoff.BackOff granting each retry from a retry budget. One BackOff serves one
// logical call at a time (backoff.Retry calls Reset at its start); safe for concurrent use.
type BackOff struct {
	ctx    context.Context
	budget retrybudget.Budget
	inner  backoff.BackOff

	cost func(err error) int // nil: every retry costs 1

	mu          sync.Mutex
	pending     bool  // tokens were taken for a retry not sent yet
	pendingCost int   // how many
	denied      bool  // the budget said no in this call
	attempts    int   // attempts of this call the operation wrapper saw
	lastErr     error // the last attempt's error, as op returned it
}

// Option configures New and Retry.
type Option func(*BackOff)

// WithCost prices each retry from the error of the attempt before it (as op returned it):
// NextBackOff takes cost(err) tokens (retrybudget.TryAcquireN), and a retry never sent
// refunds the same cost. AWS's shape, 5 tokens for a retryable error and 10 for a timeout, is
// in client/go/README.md. A cost outside [1, retrybudget.MaxCost] is denied. Default: 1.
func WithCost(cost func(err error) int) Option {
	return func(b *BackOff) { b.cost = cost }
}

// New makes the adapter: the delays come from inner (its Stop ends the loop as usual), the
// permission for each retry from budget. ctx bounds the wait for a new tenant's first answer;
// give the loop the same one (backoff.WithContext) so that a cancelled call stops sleeping.
func New(ctx context.Context, budget retrybudget.Budget, inner backoff.BackOff, opts ...Option) *BackOff {
	b := &BackOff{ctx: ctx, budget: budget, inner: inner}
	for _, o := range opts {
		o(b)
	}
	return b
}

type readyBudget interface{ Ready() <-chan struct{} }

// NextBackOff is the delay before the next retry, with its token taken; backoff.Stop when
// inner stops or the budget denies (Denied then reports it). A budget without its first answer
// yet is waited for during the delay, or up to retrybudget.FirstAnswerWait if the delay is
// shorter (what is left of the delay is returned); ctx ends that wait (Stop, no token taken).
func (b *BackOff) NextBackOff() time.Duration {
	d := b.inner.NextBackOff()
	if d == backoff.Stop {
		return backoff.Stop
	}
	if rb, ok := b.budget.(readyBudget); ok {
		select {
		case <-rb.Ready():
		default:
			start := time.Now()
			bound := d
			if bound < retrybudget.FirstAnswerWait {
				bound = retrybudget.FirstAnswerWait
			}
			t := time.NewTimer(bound)
			select {
			case <-rb.Ready():
				d -= time.Since(start)
				if d < 0 {
					d = 0
				}
			case <-t.C:
				d = 0
			case <-b.ctx.Done():
				t.Stop()
				return backoff.Stop // the loop returns ctx.Err(); no token taken
			}
			t.Stop()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending {
		// The previous token's retry never ran (a loop that asks twice): one token per retry.
		return d
	}
	cost := 1
	if b.cost != nil {
		cost = b.cost(b.lastErr)
	}
	if !b.budget.TryAcquireN(cost) {
		b.denied = true
		return backoff.Stop
	}
	b.pending, b.pendingCost = true, cost
	return d
}

// Reset starts a new logical call: inner is reset and a token of a retry never sent is
// refunded.
func (b *BackOff) Reset() {
	b.inner.Reset()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refundLocked()
	b.denied = false
	b.attempts = 0
	b.lastErr = nil
}

func (b *BackOff) refundLocked() {
	if b.pending {
		b.pending = false
		b.budget.RefundN(b.pendingCost)
	}
}

// Operation wraps op: the first call records the request (RecordRequest), each call after
// the first uses the token NextBackOff took, and a success is recorded in the budget.
func (b *BackOff) Operation(op backoff.Operation) backoff.Operation {
	return func() error {
		b.mu.Lock()
		b.pending = false
		b.attempts++
		first := b.attempts == 1
		b.mu.Unlock()
		if first {
			b.budget.RecordRequest()
		}
		err := op()
		if err == nil {
			b.budget.RecordSuccess()
		}
		b.mu.Lock()
		b.lastErr = err
		b.mu.Unlock()
		return err
	}
}

// Denied reports whether the budget ended the current call.
func (b *BackOff) Denied() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.denied
}

// Done ends the call whose result is err (what backoff.Retry returned): refunds the token of a
// retry never sent (its backoff was cancelled) and, when the budget ended the call, returns a
// *retrybudget.CallError with errors.Is(err, retrybudget.ErrBudgetExhausted) wrapping err;
// otherwise err unchanged.
func (b *BackOff) Done(err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refundLocked()
	if b.denied && err != nil {
		return &retrybudget.CallError{Reason: retrybudget.ErrBudgetExhausted, Last: err,
			Attempts: b.attempts}
	}
	return err
}

// Retry runs op with backoff.Retry under the budget: delays from inner, every retry with a
// token, stopped by ctx (a token taken for a retry never sent is refunded), a success
// recorded. Returns nil, op's last error (permanent, or inner stopped), ctx.Err(), or a
// *retrybudget.CallError matching retrybudget.ErrBudgetExhausted when the budget said no.
func Retry(ctx context.Context, budget retrybudget.Budget, inner backoff.BackOff, op backoff.Operation, opts ...Option) error {
	b := New(ctx, budget, inner, opts...)
	return b.Done(backoff.Retry(b.Operation(op), backoff.WithContext(b, ctx)))
}
