package retrybudget

import (
	"context"
	"sync"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The refresher never sleeps longer than this in one go.
const maxIdleSleep = time.Minute

// ownerStubFactory makes the stub of a server a cluster redirected to (HOST:PORT), with the
// main target's credentials and dial options; close releases its channel.
type ownerStubFactory func(address string) (stub pb.RetryBudgetServiceClient, close func(), err error)

type refresherOptions struct {
	logger      Logger
	instanceID  string
	policy      refreshPolicy
	syncTimeout time.Duration
	bearerToken string
	ownerStubs  ownerStubFactory // nil: redirects are not followed (UNAVAILABLE)
}

// ownerStub is the stub of one owner route and the release of its channel.
type ownerStub struct {
	stub  pb.RetryBudgetServiceClient
	close func()
}

// ownerStubs are the owners' stubs, made by the factory when the engine opens a route.
type ownerStubs struct {
	factory ownerStubFactory
	stubs   map[string]ownerStub
}

func (o *ownerStubs) open(address string) (bool, error) {
	stub, closeFn, err := o.factory(address)
	if err != nil || stub == nil {
		return false, err
	}
	o.stubs[address] = ownerStub{stub: stub, close: closeFn}
	return true, nil
}

func (o *ownerStubs) close(address string) {
	if s, ok := o.stubs[address]; ok && s.close != nil {
		s.close()
	}
	delete(o.stubs, address)
}

func (o *ownerStubs) closeAll() {
	for address := range o.stubs {
		o.close(address)
	}
}

// refresher drives the leasing protocol's engine (syncEngine, sync_engine.go: every decision
// and the rules it keeps) and does its I/O: one Sync RPC for all the tenants of a client (one
// per owning server once a cluster has redirected some), on a schedule, on demand, and a final
// one at Close. The driver of the C++ client's shape (client/cpp/refresher.cc): a goroutine
// that sleeps (on the Clock) until the engine's next step is due or wake interrupts, the RPC
// with its context deadline (real time: gRPC's, never the injected Clock's), wait-for-ready
// (a wake cancels an attempt waiting for the channel), and the owners' connections.
//
// Thread-safe. runOnce is one step (tests call it with a FakeClock; conformance_test.go drives
// it through a scripted stub: engine and driver together).
type refresher struct {
	opts    refresherOptions
	clock   Clock
	metrics clientMetrics
	stub    pb.RetryBudgetServiceClient // the main target
	owners  ownerStubs

	// mu is held for a whole step, its RPCs included: steps never overlap.
	mu          sync.Mutex
	engine      *syncEngine
	finalStatus error

	wakeMu       sync.Mutex
	wakePending  bool
	wakeCh       chan struct{}
	stopping     bool
	stopCh       chan struct{}
	waitingCall  context.CancelFunc // the WaitForReady attempt in progress
	waitingWoken bool

	shutdownMu sync.Mutex
	started    bool
	loopDone   chan struct{}
}

func newRefresher(opts refresherOptions, stub pb.RetryBudgetServiceClient, clock Clock, reg *tenantRegistry, m clientMetrics) *refresher {
	if m == nil {
		m = noMetrics{}
	}
	r := &refresher{
		opts: opts, clock: clock, metrics: m, stub: stub,
		owners:   ownerStubs{factory: opts.ownerStubs, stubs: map[string]ownerStub{}},
		wakeCh:   make(chan struct{}, 1),
		stopCh:   make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	var channels ownerChannels // nil: redirects are not followed
	if opts.ownerStubs != nil {
		channels = &r.owners
	}
	r.engine = newSyncEngine(syncEngineOptions{logger: opts.logger, instanceID: opts.instanceID,
		policy: opts.policy, syncTimeout: opts.syncTimeout}, reg, m, channels)
	return r
}

func (r *refresher) start() {
	r.shutdownMu.Lock()
	defer r.shutdownMu.Unlock()
	if r.started {
		return
	}
	r.started = true
	go r.loop()
}

// wake interrupts the refresher's sleep so that it re-plans at once. Cheap; any goroutine.
func (r *refresher) wake() {
	r.wakeMu.Lock()
	r.wakePending = true
	if r.waitingCall != nil && !r.waitingWoken {
		// A Sync waiting for the channel to connect would hold the wake to its deadline:
		// cancel it; the refresher steps and sends it again at once.
		r.waitingWoken = true
		r.waitingCall()
	}
	r.wakeMu.Unlock()
	select {
	case r.wakeCh <- struct{}{}:
	default:
	}
}

func (r *refresher) loop() {
	defer close(r.loopDone)
	for {
		next := r.runOnce()
		r.wakeMu.Lock()
		if r.stopping {
			r.wakeMu.Unlock()
			return
		}
		pending := r.wakePending
		r.wakeMu.Unlock()
		if pending {
			continue // woken while the step ran: plan again before sleeping
		}
		d := next.Sub(r.clock.Now())
		if d > maxIdleSleep {
			d = maxIdleSleep
		}
		if d > 0 {
			t := r.clock.NewTimer(d)
			select {
			case <-t.C():
			case <-r.wakeCh:
				t.Stop()
			case <-r.stopCh:
				t.Stop()
				return
			}
		}
	}
}

func (r *refresher) stopLoop() {
	r.wakeMu.Lock()
	if !r.stopping {
		r.stopping = true
		close(r.stopCh)
	}
	if r.waitingCall != nil {
		r.waitingCall()
	}
	r.wakeMu.Unlock()
	r.shutdownMu.Lock()
	started := r.started
	r.shutdownMu.Unlock()
	if started {
		<-r.loopDone
	}
}

// runOnce is one step at clock.Now(): the engine steps every tenant, the attempts it plans
// are sent (each bounded by the plan's deadline), and it says when the next step is due;
// farFuture when nothing is scheduled.
func (r *refresher) runOnce() time.Time {
	r.wakeMu.Lock()
	r.wakePending = false
	r.wakeMu.Unlock()
	select {
	case <-r.wakeCh:
	default:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.engine.shutDown {
		return farFuture
	}
	for plan := r.engine.BeginStep(r.clock.Now()); plan != nil; plan = r.engine.NextPlan(r.clock.Now()) {
		outcome := r.send(plan.address, plan.request, plan.timeout(), plan.waitForReady, true)
		r.engine.EndAttempt(plan, outcome, r.clock.Now())
	}
	return r.engine.EndStep(r.clock.Now())
}

// attemptTimeoutKey is the context key of an attempt's timeout (a time.Duration).
type attemptTimeoutKey struct{}

// send sends one attempt with a deadline `timeout` from now (real time: it is gRPC's, never
// the injected Clock's). With waitForReady and `cancellable`, wake may cancel it; the outcome
// is then woken.
func (r *refresher) send(address string, req *pb.SyncRequest, timeout time.Duration, waitForReady, cancellable bool) attemptOutcome {
	stub := r.stub
	if address != "" {
		s, ok := r.owners.stubs[address]
		if !ok {
			return attemptOutcome{st: status.New(codes.Unavailable, "no channel to "+address)}
		}
		stub = s.stub
	}
	if timeout < 0 {
		timeout = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The timeout as the engine computed it on its Clock: the conformance runner checks it
	// exactly (the context's deadline is real time).
	ctx = context.WithValue(ctx, attemptTimeoutKey{}, timeout)
	if r.opts.bearerToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.opts.bearerToken)
	}
	track := waitForReady && cancellable
	if track {
		r.wakeMu.Lock()
		r.waitingCall = cancel
		r.waitingWoken = false
		r.wakeMu.Unlock()
	}
	resp, err := stub.Sync(ctx, req, grpc.WaitForReady(waitForReady))
	woken := false
	if track {
		r.wakeMu.Lock()
		r.waitingCall = nil
		woken = r.waitingWoken
		r.wakeMu.Unlock()
	}
	st := status.Convert(err)
	if err == nil && resp == nil {
		st = status.New(codes.Internal, "empty response")
	}
	return attemptOutcome{st: st, response: resp, woken: woken}
}

// shutdown stops the goroutine, then sends the engine's final Sync (final-sync: every route
// that holds tenants, each request at most finalSyncAttempts times with the same seq, each
// bounded by syncTimeout) and closes the owners' channels. Returns the first failure of the
// final Sync (nil when there was nothing to report). Idempotent.
func (r *refresher) shutdown() error {
	r.stopLoop()
	r.engine.registry.close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.engine.shutDown {
		r.finalStatus = r.finalSyncLocked()
		r.owners.closeAll()
	}
	return r.finalStatus
}

func (r *refresher) finalSyncLocked() error {
	r.engine.BeginFinal()
	for plan := r.engine.NextFinal(r.clock.Now()); plan != nil; plan = r.engine.NextFinal(r.clock.Now()) {
		for attempt := 1; ; attempt++ {
			outcome := r.send(plan.address, plan.request, plan.timeout, plan.waitForReady, false)
			delay, again := r.engine.EndFinalAttempt(outcome, attempt)
			if !again {
				break
			}
			// Real time, as the attempts' deadlines: Close never waits on a test's FakeClock.
			time.Sleep(delay)
		}
	}
	return r.engine.FinishFinal()
}

// lastSeq is the seq of the last request built (0 before the first). For tests.
func (r *refresher) lastSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.engine.seq
}

// lastSyncStatus is the error of the last Sync attempt (nil: it got a response).
func (r *refresher) lastSyncStatus() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.engine.lastStatus
}
