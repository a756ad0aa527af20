// Command go_example_worker calls the flaky backend (examples/flaky_backend) through
// retrybudget.UnaryClientInterceptor, paying every retry from the fleet's shared budget:
// the C++ flaky-worker and examples/python_worker.py, in Go. Workers of every language on one
// tenant share one budget.
//
//	retry-budget-server --listen=127.0.0.1:50051 &
//	flaky-backend --address=127.0.0.1:50061 --failure_probability=0.4 &
//	build/client/go/bin/go_example_worker --budget_server=127.0.0.1:50051 \
//	    --backend=127.0.0.1:50061 --calls=200
//
// Each logical call's first attempt is free, every retry takes a token; a denied retry fails
// the call at once (errors.Is(err, retrybudget.ErrBudgetExhausted)). Ctrl-C cancels the call
// in flight, its RPC or its backoff, at once (a token taken for the retry is refunded).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"github.com/retry-budget/retry-budget/client/go/flakypb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

func main() {
	budgetServer := flag.String("budget_server", "127.0.0.1:50051", "budget server target")
	backend := flag.String("backend", "127.0.0.1:50061", "flaky backend address")
	tenant := flag.String("tenant", "flaky-echo", "tenant")
	calls := flag.Int("calls", 100, "logical calls")
	interval := flag.Duration("interval", 10*time.Millisecond, "pause between calls")
	deadline := flag.Duration("deadline", 2*time.Second, "deadline of one logical call")
	maxAttempts := flag.Int("max_attempts", 4, "attempts per call, the first included")
	flag.Parse()
	if err := run(*budgetServer, *backend, *tenant, *calls, *interval, *deadline, *maxAttempts); err != nil {
		fmt.Fprintln(os.Stderr, "go_example_worker:", err)
		os.Exit(1)
	}
}

func run(budgetServer, backend, tenant string, calls int, interval, deadline time.Duration, maxAttempts int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	opts := retrybudget.DefaultClientOptions()
	opts.Target = budgetServer
	client, err := retrybudget.NewClient(opts)
	if err != nil {
		return err
	}
	defer client.Close() // the final Sync: reports everything, returns unspent tokens
	budget, err := client.Tenant(tenant)
	if err != nil {
		return err
	}
	conn, err := grpc.Dial(backend, grpc.WithInsecure(), grpc.WithUnaryInterceptor(
		retrybudget.UnaryClientInterceptor(budget, retrybudget.WithMaxAttempts(maxAttempts),
			retrybudget.WithBackoff(20*time.Millisecond, 500*time.Millisecond, 2))))
	if err != nil {
		return err
	}
	defer conn.Close()
	echo := flakypb.NewFlakyEchoClient(conn)

	var ok, failed, exhausted, cancelled int
	for i := 0; i < calls && ctx.Err() == nil; i++ {
		callCtx, cancel := context.WithTimeout(ctx, deadline)
		_, err := echo.Echo(callCtx, &flakypb.EchoRequest{Message: fmt.Sprintf("call %d", i)})
		cancel()
		switch {
		case err == nil:
			ok++
		case errors.Is(err, retrybudget.ErrBudgetExhausted):
			exhausted++
			fmt.Printf("call %d: %v [budget exhausted]\n", i, status.Convert(err).Message())
		case ctx.Err() != nil:
			cancelled++
		default:
			failed++
		}
		time.Sleep(interval)
	}
	s := budget.Stats()
	fmt.Printf("go_example_worker: ok=%d failed=%d budget_exhausted=%d cancelled=%d | budget: "+
		"allowed=%d denied=%d fallback=%d successes=%d mode=%v\n", ok, failed, exhausted, cancelled,
		s.RetriesAllowed, s.RetriesDenied, s.FallbackAllowed, s.Successes, s.Mode)
	return nil
}
