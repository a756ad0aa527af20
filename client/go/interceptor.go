package retrybudget

import (
	"context"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

const (
	// IdempotencyKeyHeader carries the logical call's dedup key on every attempt.
	IdempotencyKeyHeader = "x-idempotency-key"
	// PreviousAttemptsHeader is the number of attempts before this one, on retries only
	// (absent on the first attempt), as gRPC's own retries send it (gRFC A6).
	PreviousAttemptsHeader = "grpc-previous-rpc-attempts"
	// RetryPushbackHeader is the server's trailer asking for a delay before the next attempt.
	RetryPushbackHeader = "grpc-retry-pushback-ms"
)

// ParseRetryPushback reads `grpc-retry-pushback-ms` from trailers: ok false when absent; the
// delay when it is a non-negative integer; a negative delay ("do not retry", gRFC A6) when it
// is negative or unparsable. Only the first value counts.
func ParseRetryPushback(trailer metadata.MD) (time.Duration, bool) {
	v := trailer.Get(RetryPushbackHeader)
	if len(v) == 0 {
		return 0, false
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
	if err != nil || ms < 0 {
		return -time.Millisecond, true
	}
	if ms > int64(time.Hour/time.Millisecond) {
		ms = int64(time.Hour / time.Millisecond)
	}
	return time.Duration(ms) * time.Millisecond, true
}

// UnaryClientInterceptor retries a unary call through Do: only when the budget allows, with
// the same `x-idempotency-key` on every attempt, `grpc-previous-rpc-attempts` on retries,
// the server's `grpc-retry-pushback-ms` honoured, codes classified as the C++ RetryUnary()
// (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED while the call's deadline has
// time left), the request recorded once per call (RecordRequest), every retry priced by
// WithCost / WithCostFunc (default 1 token), and a success recorded. The call's context
// cancels every wait. A call the
// budget denied fails with the last attempt's code and errors.Is(err, ErrBudgetExhausted).
//
//	conn, err := grpc.Dial(target, grpc.WithInsecure(),
//		grpc.WithUnaryInterceptor(retrybudget.UnaryClientInterceptor(budget)))
//
// Keep gRPC's own retries off on such a channel (grpc-go's default): they would be a second,
// budget-blind retry layer. Bad options make every call fail with the ErrInvalidOptions error.
func UnaryClientInterceptor(budget Budget, opts ...RetryOption) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		return Do(ctx, budget, func(ctx context.Context, a Attempt) error {
			md := []string{IdempotencyKeyHeader, a.IdempotencyKey}
			if a.PreviousAttempts() > 0 {
				md = append(md, PreviousAttemptsHeader, strconv.Itoa(a.PreviousAttempts()))
			}
			actx := metadata.AppendToOutgoingContext(ctx, md...)
			var trailer metadata.MD
			err := invoker(actx, method, req, reply, cc, append(callOpts, grpc.Trailer(&trailer))...)
			if err == nil {
				return nil
			}
			if d, ok := ParseRetryPushback(trailer); ok {
				return Pushback(err, d)
			}
			return err
		}, opts...)
	}
}
