package retrybudget

import (
	"sync"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
)

// Client is one process's client of the budget server: one refresher goroutine syncing every
// tenant of the process. Thread-safe. Close sends the final Sync.
type Client struct {
	opts      ClientOptions
	conn      *grpc.ClientConn // nil for a client made on a given stub (tests)
	tenants   *tenantRegistry
	refresher *refresher

	closeOnce sync.Once
	closeErr  error
}

// NewClient creates a client with its own channel to opts.Target and starts the refresher.
// It does not wait for the server: until a lease arrives TryAcquire denies. Bad options
// return an error (errors.Is(err, ErrInvalidOptions)) naming the field and its value.
func NewClient(opts ClientOptions) (*Client, error) {
	o, err := validateAndDefault(opts)
	if err != nil {
		return nil, err
	}
	conn, err := dialTarget(o.Target, o, true)
	if err != nil {
		return nil, err
	}
	owners := func(address string) (pb.RetryBudgetServiceClient, func(), error) {
		if err := checkOwnerAddress(address); err != nil {
			return nil, nil, err
		}
		c, err := dialTarget(address, o, false)
		if err != nil {
			return nil, nil, err
		}
		return pb.NewRetryBudgetServiceClient(c), func() { c.Close() }, nil
	}
	c, err := newClient(o, pb.NewRetryBudgetServiceClient(conn), owners)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.conn = conn
	c.refresher.start()
	return c, nil
}

// newClient builds a client over `stub` without starting its refresher; `o` is validated.
func newClient(o ClientOptions, stub pb.RetryBudgetServiceClient, owners ownerStubFactory) (*Client, error) {
	var m clientMetrics
	if o.MetricsRegistry != nil {
		pm, err := newPromMetrics(o.MetricsRegistry)
		if err != nil {
			return nil, err
		}
		m = pm
	}
	c := &Client{opts: o}
	var ref *refresher
	c.tenants = newTenantRegistry(o.Clock, func() { ref.wake() },
		fallbackConfig{mode: o.Fallback, neverReached: bucketShape{capacity: o.FallbackCapacity,
			refillPerSecond: o.FallbackRefillPerSecond}}, o.Logger)
	ref = newRefresher(refresherOptions{
		logger:      o.Logger,
		instanceID:  o.InstanceID,
		policy:      refreshPolicy{o.RefreshPeriod, o.MinSyncInterval, o.LeaseBurst},
		syncTimeout: o.SyncTimeout,
		bearerToken: o.BearerToken,
		ownerStubs:  owners,
	}, stub, o.Clock, c.tenants, m)
	c.refresher = ref
	return c, nil
}

// Tenant is the handle for `name` (created on first call; later calls return the same
// pointer). Errors: ErrInvalidOptions for a malformed name or past 256 tenants (one Sync
// carries at most 256), ErrClientClosed for a new tenant after Close. Takes a lock: keep the
// handle instead of calling this per retry.
func (c *Client) Tenant(name string) (*TenantBudget, error) { return c.tenants.getOrCreate(name) }

// InstanceID is the id this client syncs as.
func (c *Client) InstanceID() string { return c.opts.InstanceID }

// LastSyncError is the error of the last Sync attempt; nil when it got a response (or none
// was made).
func (c *Client) LastSyncError() error { return c.refresher.lastSyncStatus() }

// Close reports everything and returns every unspent token now (the final Sync, to every
// server holding tenants of this client, at most 3 attempts with the same seq, each bounded
// by SyncTimeout), then stops the refresher and closes the channels; afterwards TryAcquire
// denies (a tenant in shadow mode allows, with no token, as it allows every would-be denial).
// Returns the final Sync's error (nil when it got a response or there was nothing to report).
// Idempotent: later calls return the first result.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.refresher.shutdown()
		if c.conn != nil {
			c.conn.Close()
		}
	})
	return c.closeErr
}
