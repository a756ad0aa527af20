// Package retrybudget is the Go client of retry-budget: a fleet-wide retry budget. One
// Client per worker process leases retry tokens for every tenant the process uses from the
// budget server (one Sync RPC for all of them, from one refresher goroutine) and reports
// successes and requests; TenantBudget.TryAcquire (TryAcquireN for a retry that costs more
// than one token), RecordSuccess and RecordRequest, the hot path, only touch atomics. A tenant
// whose policy is a dry run (shadow mode) allows every retry and counts those it would deny.
//
//	opts := retrybudget.DefaultClientOptions()
//	opts.Target = "127.0.0.1:50051"
//	client, err := retrybudget.NewClient(opts)
//	if err != nil { return err }
//	defer client.Close() // the final Sync: reports everything, returns unspent tokens
//	budget, err := client.Tenant("payments-db")
//	...
//	err = retrybudget.Do(ctx, budget, func(ctx context.Context, a retrybudget.Attempt) error {
//		return callBackend(ctx, a.IdempotencyKey)
//	})
//	if errors.Is(err, retrybudget.ErrBudgetExhausted) { /* a retry was denied: fail now */ }
//
// The semantics are those of the C++ client (client/ in the repository) and docs/DESIGN.md:
// cumulative counters and a per-instance seq in every Sync, a failed Sync resent unchanged,
// leases ending at send time + TTL, lease sizing from demand, a final Sync on Close, fallback
// to the server's safe share when it is unreachable (never fail open), and routing of each
// tenant to its shard's owner in a cluster.
package retrybudget
