package retrybudget

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Most owner addresses with a cached channel at once; a redirect to one more is not followed
// until a route without tenants is dropped (the tenant is handled as UNAVAILABLE).
const maxOwnerRoutes = 64

// Redirects a tenant follows without a grant in between; past it (a redirect loop, servers
// disagreeing during a takeover) the tenant is handled as UNAVAILABLE: the tokens left in its
// lease are spent, then fallback, asked again on the main target a refresh period later.
const maxRedirectHops = 4

// The refresher never sleeps longer than this in one go.
const maxIdleSleep = time.Minute

// gRPC may report a deadline a hair before the Clock reaches it.
const deadlineSlack = time.Millisecond

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

type pendingSync struct {
	request   *pb.SyncRequest
	tenants   []*TenantBudget // request.Tenants[i] belongs to tenants[i]
	firstSent time.Time
}

// syncRoute is one destination: the main target (address "") or one owner.
type syncRoute struct {
	address  string
	stub     pb.RetryBudgetServiceClient
	close    func()
	pending  *pendingSync // sent, no response yet
	lastSend time.Time
	retryAt  time.Time
	failures int // consecutive failed attempts
	// failingSince: the start of the first of those failed attempts (farFuture while
	// failures == 0).
	failingSince time.Time
	maxTenants   int // per request: the server's limit once it named one in a refusal
	state        serverState
}

func newRoute(address string, stub pb.RetryBudgetServiceClient, close func()) *syncRoute {
	return &syncRoute{address: address, stub: stub, close: close, lastSend: farPast,
		retryAt: farPast, failingSince: farFuture, maxTenants: maxTenantsPerClient}
}

// answered resets the run of failed attempts.
func (route *syncRoute) answered() {
	route.failures = 0
	route.failingSince = farFuture
}

// tenantRoute is a tenant that is not simply on the main route.
type tenantRoute struct {
	owner       string // "": the main target
	hops        int    // redirects since the last grant
	unavailable bool   // no owner could grant: unreachable until a grant
	// unavailableSince: since when (farFuture while not unavailable); down once a refresh
	// period old, so a shard without an owner for a moment (shards moving) is a blip.
	unavailableSince time.Time
}

type routeGroup struct {
	route   *syncRoute
	tenants []*TenantBudget
}

type syncOutcome int

const (
	outcomeDone          syncOutcome = iota // a new request was answered
	outcomeSplit                            // refused as a whole: smaller chunks, same tenants
	outcomeResentPending                    // an earlier request was resent and answered
	outcomeRetryLater                       // failed or cut short: retryAt is set
	outcomeRouteDropped                     // an owner failing for a refresh period
)

// refresher runs the leasing protocol: one Sync RPC for all the tenants of a client (one per
// owning server once a cluster has redirected some), on a schedule, on demand, and a final one
// at Close. A port of the C++ client's protocol (client/cpp), RPCs inside the step.
//
// The rules kept here (with TenantBudget) are the client rulebook's,
// client/conformance/RULES.md, by id; conformance_test.go runs the corpus that pins them
// through this refresher:
//   - Requests and seq: one-request-per-route, seq-new-request, resend-unchanged
//     (retryBackoff), abandon-after-refresh-period (abandoning is safe: counters are
//     cumulative, a later seq makes the old one stale, and a grant of the old one the server
//     applied is reclaimed through tokens_received), server-state-from-outcome (serverState;
//     down: unreachable for a refresh period), stale-dropped, grants-match-request,
//     lease-ends-at-first-send, min-sync-interval, first-sync-at-once (Tenant wakes the
//     refresher: workers are denied until the answer), next-sync-from-grant; low-water-wakes
//     and want-from-demand in TenantBudget.
//   - Deadlines and connections: sync-deadline (minFallbackStepWindow: a spent lease falls
//     back on time even while an attempt waits for the channel), cut-short-is-interrupted
//     (also an attempt a wake cancelled while it waited for a connection),
//     fail-fast-then-wait-for-ready (the backoff counts from the failed attempt's start).
//   - Refusals: request-refused-split (isRequestRefusal, tenantLimitIn), tenant-refused.
//   - Routing (a cluster): every rule above holds per route, the main target (address "") or
//     one owner, each with its own pending request, backoff, failures and server state; seq
//     grows across all routes. redirect-followed, redirect-hop-limit (maxRedirectHops),
//     owner-route-limit (maxOwnerRoutes), unavailable-parks, owner-unreachable-parks. Without a
//     redirect every tenant is on the main route.
//   - Leases, fallback and the ledger: in TenantBudget (step, applyGrant) and tenantLedger.
//   - final-sync: shutdown.
//
// Thread-safe. runOnce is the whole protocol step (tests call it with a FakeClock); start runs
// it on a goroutine that sleeps (on the Clock) until the next step is due or wake interrupts.
type refresher struct {
	opts     refresherOptions
	clock    Clock
	registry *tenantRegistry
	metrics  clientMetrics

	// mu is held for a whole step, its RPCs included: steps never overlap.
	mu          sync.Mutex
	seq         uint64
	main        *syncRoute
	owners      map[string]*syncRoute
	routed      map[*TenantBudget]*tenantRoute
	redirected  bool
	lastStatus  error
	shutDown    bool
	finalStatus error
	lastRefusal time.Time
	notLogged   uint64

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
	return &refresher{
		opts: opts, clock: clock, registry: reg, metrics: m,
		main:        newRoute("", stub, nil),
		owners:      map[string]*syncRoute{},
		routed:      map[*TenantBudget]*tenantRoute{},
		lastRefusal: farPast,
		wakeCh:      make(chan struct{}, 1),
		stopCh:      make(chan struct{}),
		loopDone:    make(chan struct{}),
	}
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

// runOnce is one step at clock.Now(): steps every tenant (ends expired leases, enters,
// refills or leaves fallback), sends the Sync attempts that are due (each bounded as the type
// comment says), steps the tenants again with their outcome, and updates the metrics.
// Returns when the next step is due; farFuture when nothing is scheduled.
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
	if r.shutDown {
		return farFuture
	}
	tenants := r.registry.snapshot()
	now := r.clock.Now()
	nextStep, leaseEnds := farFuture, farFuture
	for _, t := range tenants {
		nextStep = minTime(nextStep, t.step(now, r.stateForLocked(t, now)))
		leaseEnds = minTime(leaseEnds, t.leaseEndsAt())
	}
	// The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
	// expiry, a fallback step runs at most minFallbackStepWindow late, and a server unreachable
	// since an earlier attempt turns "down" on time (a spent lease then falls back at once, not
	// when an attempt waiting for the channel gives up a syncTimeout later).
	nextStep = minTime(nextStep, r.nextDownLocked(now))
	cut := minTime(leaseEnds, maxTime(nextStep, now.Add(minFallbackStepWindow)))
	if len(tenants) > 0 && len(r.routed) == 0 && len(r.owners) == 0 {
		if !r.syncDueLocked(r.main, tenants).After(now) {
			r.syncLocked(r.main, tenants, now, cut)
			now = r.clock.Now()
		}
	}
	if len(tenants) > 0 && (len(r.routed) > 0 || len(r.owners) > 0) {
		r.pruneRoutesLocked()
		// A redirected tenant goes to its owner in the same step: one more round per
		// redirect, at most maxRedirectHops + 1 rounds.
		for round := 0; round <= maxRedirectHops && now.Before(cut); round++ {
			r.redirected = false
			for _, g := range r.groupByRouteLocked(tenants) {
				if !now.Before(cut) {
					break
				}
				if r.syncDueLocked(g.route, g.tenants).After(now) {
					continue
				}
				r.syncLocked(g.route, g.tenants, now, cut)
				now = r.clock.Now()
			}
			if !r.redirected {
				break
			}
		}
	}
	// A response may carry a lease that already ended; a failed attempt sends tenants without
	// a lease into fallback now, not a step later.
	next := farFuture
	for _, g := range r.groupByRouteLocked(tenants) {
		next = minTime(next, r.syncDueLocked(g.route, g.tenants))
	}
	for _, t := range tenants {
		next = minTime(next, t.step(now, r.stateForLocked(t, now)))
	}
	next = minTime(next, r.nextDownLocked(now))
	r.updateMetricsLocked(tenants)
	return next
}

// stateOf is what `route` says of its server at `now`: down once it has been unreachable for
// a refresh period.
func (r *refresher) stateOf(route *syncRoute, now time.Time) serverState {
	if route.state == unreachable && now.Sub(route.failingSince) >= r.opts.policy.refreshPeriod {
		return down
	}
	return route.state
}

// nextDownLocked is the earliest time after `now` at which a route (unreachable since its
// failingSince) or a parked tenant (since its unavailableSince) turns down, a refresh period
// later; farFuture when none will. A step is due then, and a Sync attempt is cut short for it.
func (r *refresher) nextDownLocked(now time.Time) time.Time {
	next := farFuture
	consider := func(since time.Time) {
		if !since.Before(farFuture) {
			return
		}
		if at := addDur(since, r.opts.policy.refreshPeriod); at.After(now) {
			next = minTime(next, at)
		}
	}
	if r.main.state == unreachable {
		consider(r.main.failingSince)
	}
	for _, o := range r.owners {
		if o.state == unreachable {
			consider(o.failingSince)
		}
	}
	for _, tr := range r.routed {
		if tr.unavailable {
			consider(tr.unavailableSince)
		}
	}
	return next
}

// stateForLocked is what `t`'s route says of its server at `now`; down for a tenant parked
// because no owner can grant once it has been parked for a refresh period.
func (r *refresher) stateForLocked(t *TenantBudget, now time.Time) serverState {
	tr, ok := r.routed[t]
	if !ok {
		return r.stateOf(r.main, now)
	}
	if tr.unavailable {
		// A live server said the shard has no owner that can grant: a failover once it lasts.
		if now.Sub(tr.unavailableSince) >= r.opts.policy.refreshPeriod {
			return down
		}
		return unreachable
	}
	if tr.owner == "" {
		return r.stateOf(r.main, now)
	}
	if o, ok := r.owners[tr.owner]; ok {
		return r.stateOf(o, now)
	}
	return r.stateOf(r.main, now)
}

// groupByRouteLocked is the tenants of each route, the main route first, owners in the order
// their first tenant appears.
func (r *refresher) groupByRouteLocked(tenants []*TenantBudget) []routeGroup {
	groups := []routeGroup{{route: r.main}}
	if len(r.routed) == 0 {
		groups[0].tenants = tenants
		return groups
	}
	index := map[*syncRoute]int{}
	for _, t := range tenants {
		route := r.main
		if tr, ok := r.routed[t]; ok && tr.owner != "" {
			if o, ok := r.owners[tr.owner]; ok {
				route = o
			}
		}
		if route == r.main {
			groups[0].tenants = append(groups[0].tenants, t)
			continue
		}
		i, ok := index[route]
		if !ok {
			i = len(groups)
			index[route] = i
			groups = append(groups, routeGroup{route: route})
		}
		groups[i].tenants = append(groups[i].tenants, t)
	}
	return groups
}

// pruneRoutesLocked drops owner routes no tenant uses any more (and closes their channels).
func (r *refresher) pruneRoutesLocked() {
	used := map[string]bool{}
	for _, tr := range r.routed {
		if tr.owner != "" {
			used[tr.owner] = true
		}
	}
	for addr, o := range r.owners {
		if !used[addr] && o.pending == nil {
			if o.close != nil {
				o.close()
			}
			delete(r.owners, addr)
		}
	}
	for t, tr := range r.routed {
		if tr.owner == "" && tr.hops == 0 && !tr.unavailable {
			delete(r.routed, t)
		}
	}
}

func (r *refresher) routeOfLocked(t *TenantBudget) *tenantRoute {
	tr, ok := r.routed[t]
	if !ok {
		tr = &tenantRoute{}
		r.routed[t] = tr
	}
	return tr
}

func (r *refresher) redirectLocked(t *TenantBudget, owner string, received time.Time) {
	r.metrics.redirected()
	tr := r.routeOfLocked(t)
	tr.hops++
	if tr.hops > maxRedirectHops || r.opts.ownerStubs == nil {
		r.logRefusalLocked(received, fmt.Sprintf("tenant %q redirected %d times without a grant "+
			"(last to %s); treated as unavailable", t.name, tr.hops, owner))
		r.parkLocked(t, received)
		return
	}
	if _, ok := r.owners[owner]; !ok {
		if len(r.owners) >= maxOwnerRoutes {
			r.logRefusalLocked(received, fmt.Sprintf("tenant %q redirected to %s but %d owner "+
				"channels are open; treated as unavailable", t.name, owner, maxOwnerRoutes))
			r.parkLocked(t, received)
			return
		}
		stub, closeFn, err := r.opts.ownerStubs(owner)
		if err != nil || stub == nil {
			r.logRefusalLocked(received, fmt.Sprintf("tenant %q redirected to %q, which cannot be "+
				"dialled (%v); treated as unavailable", t.name, owner, err))
			r.parkLocked(t, received)
			return
		}
		r.owners[owner] = newRoute(owner, stub, closeFn)
	}
	tr.owner = owner
	tr.unavailable = false
	tr.unavailableSince = farFuture
	r.redirected = true
	t.syncAgainAt(farPast) // at once, on the owner's route
}

func (r *refresher) parkLocked(t *TenantBudget, received time.Time) {
	tr := r.routeOfLocked(t)
	tr.owner = ""
	tr.hops = 0
	if !tr.unavailable {
		tr.unavailableSince = received
	}
	tr.unavailable = true
	t.syncAgainAt(received.Add(r.opts.policy.refreshPeriod))
}

func (r *refresher) syncDueLocked(route *syncRoute, tenants []*TenantBudget) time.Time {
	if route.pending != nil {
		return route.retryAt
	}
	if len(tenants) == 0 {
		return farFuture
	}
	due, first := farFuture, false
	for _, t := range tenants {
		d, neverSynced := t.syncDueAt()
		due = minTime(due, d)
		first = first || neverSynced
	}
	if !due.Before(farFuture) {
		return due
	}
	// A new tenant's first Sync goes out at once, not after minSyncInterval: its workers are
	// denied until it is answered (first-sync-at-once). Once per tenant, at most
	// maxTenantsPerClient times.
	if first {
		return due
	}
	return maxTime(due, addDur(route.lastSend, r.opts.policy.minSyncInterval))
}

// syncLocked syncs `tenants` at `now` in requests of at most route.maxTenants tenants, ending
// no later than `cut`.
func (r *refresher) syncLocked(route *syncRoute, tenants []*TenantBudget, now, cut time.Time) {
	chunk := route.maxTenants
	done := 0
	for done < len(tenants) {
		sent := 0
		outcome := r.syncOnceLocked(route, tenants[done:], now, cut, &chunk, &sent)
		switch outcome {
		case outcomeRetryLater, outcomeRouteDropped, outcomeResentPending:
			return // (resent: the rest are due on their schedule)
		case outcomeDone:
			done += sent
		}
		now = r.clock.Now()
		if !now.Before(cut) {
			return
		}
	}
}

// isRequestRefusal: codes with which a server that read the request refuses it (too large, or
// an entry is invalid): an answer, not an outage.
func isRequestRefusal(c codes.Code) bool {
	return c == codes.InvalidArgument || c == codes.ResourceExhausted ||
		c == codes.FailedPrecondition || c == codes.OutOfRange
}

// tenantLimitIn is the tenant limit a refusal names ("... at most N ... request"), or 0.
func tenantLimitIn(message string) int {
	at := strings.Index(message, "at most ")
	if at < 0 || !strings.Contains(message[at:], "request") {
		return 0
	}
	limit := 0
	for _, c := range message[at+len("at most "):] {
		if c < '0' || c > '9' {
			break
		}
		limit = limit*10 + int(c-'0')
		if limit > 1<<20 {
			limit = 1 << 20
		}
	}
	return limit
}

func stateAfter(c codes.Code) serverState {
	switch c {
	case codes.OK:
		return answering
	case codes.Unauthenticated, codes.PermissionDenied:
		return refusing
	}
	return unreachable
}

func syncError(st *status.Status) error {
	if st.Code() == codes.OK {
		return nil
	}
	return fmt.Errorf("%s: Sync to the budget server failed: %s", codeName(st.Code()), st.Message())
}

func (r *refresher) syncOnceLocked(route *syncRoute, tenants []*TenantBudget, now, cut time.Time, chunk, sent *int) syncOutcome {
	p := r.opts.policy
	if route.pending != nil && now.Sub(route.pending.firstSent) >= p.refreshPeriod {
		// Failing for a whole refresh period: a new request (see the type comment).
		route.pending = nil
		if route.address != "" {
			// An owner that cannot be reached: its tenants go back to the main target (which
			// redirects them again once the shard has an owner), unreachable until a grant.
			r.logf("retrybudget: owner %s unreachable for a refresh period; its tenants go "+
				"back to the main target", route.address)
			for _, t := range tenants {
				tr := r.routeOfLocked(t)
				tr.owner = ""
				tr.hops = 0
				if !tr.unavailable {
					// Unreachable since the owner's first failure: down for a refresh period.
					tr.unavailableSince = route.failingSince
				}
				tr.unavailable = true
			}
			route.answered()
			route.state = answering
			return outcomeRouteDropped
		}
	}
	resend := route.pending != nil
	if !resend {
		// A new request: new seq, counters as of now. Kept until a response arrives, so a
		// retry resends exactly this message (the server then answers it the same way).
		n := *chunk
		if n < 1 {
			n = 1
		}
		if n > len(tenants) {
			n = len(tenants)
		}
		r.seq++
		pend := &pendingSync{request: &pb.SyncRequest{InstanceId: r.opts.instanceID, Seq: r.seq},
			firstSent: now}
		for _, t := range tenants[:n] {
			pend.request.Tenants = append(pend.request.Tenants, t.fillSync(now, p))
			pend.tenants = append(pend.tenants, t)
		}
		route.pending = pend
	}
	in := route.pending
	*sent = len(in.tenants)
	route.lastSend = now
	deadline := minTime(now.Add(r.opts.syncTimeout), cut)
	waitForReady := route.failures > 0
	resp, st, woken := r.callSync(route, in.request, deadline.Sub(now), waitForReady, true)
	received := r.clock.Now()
	r.lastStatus = syncError(st)
	cutShort := deadline.Before(now.Add(r.opts.syncTimeout)) && st.Code() == codes.DeadlineExceeded &&
		!received.Before(deadline.Add(-deadlineSlack))
	if cutShort || (woken && st.Code() == codes.Canceled) {
		// Interrupted for a duty: no verdict on the server, no backoff; the same request goes
		// out again. If the server applied it, the resend (same seq) gets the same answer.
		route.retryAt = received
		return outcomeRetryLater
	}
	if isRequestRefusal(st.Code()) {
		// The server answered and refuses this request as a whole; it applied nothing, so the
		// counters simply go in the next request.
		route.state = answering
		route.answered()
		refusedReq := route.pending
		route.pending = nil
		if size := len(refusedReq.tenants); size > 1 {
			if named := tenantLimitIn(st.Message()); named > 0 && named < size {
				route.maxTenants = named
				*chunk = named
			} else {
				*chunk = size / 2
			}
			r.logRefusalLocked(received, fmt.Sprintf("Sync seq %d with %d tenants refused; "+
				"splitting it into requests of %d: %v", refusedReq.request.Seq, size, *chunk, r.lastStatus))
			return outcomeSplit
		}
		refusedReq.tenants[0].applyRefusal(st.Code(), st.Message(), received, p)
		r.logRefusalLocked(received, fmt.Sprintf("Sync seq %d for tenant %q refused; the tenant "+
			"is denied: %v", refusedReq.request.Seq, refusedReq.tenants[0].name, r.lastStatus))
		return outcomeDone
	}
	route.state = stateAfter(st.Code())
	if st.Code() != codes.OK {
		if route.failures == 0 {
			route.failingSince = now
		}
		route.failures++
		// Counted from the attempt's start: one that waited out its deadline was its own
		// backoff.
		route.retryAt = maxTime(received, now.Add(retryBackoff(route.failures, p)))
		if route.failures == 1 {
			r.logf("retrybudget: Sync seq %d failed; retrying (tenants whose lease ends "+
				"meanwhile fall back): %v", in.request.Seq, r.lastStatus)
		}
		return outcomeRetryLater
	}
	if route.failures > 0 {
		r.logf("retrybudget: Sync seq %d succeeded after %d failed attempts", in.request.Seq,
			route.failures)
	}
	route.answered()
	route.pending = nil
	if resp.GetStale() {
		// The server applied a newer seq of this instance: nothing here was applied.
		r.logf("retrybudget: Sync seq %d answered as stale; ignored", in.request.Seq)
	} else {
		r.applyResponseLocked(in, resp, received)
	}
	if resend {
		return outcomeResentPending
	}
	return outcomeDone
}

func (r *refresher) logRefusalLocked(now time.Time, line string) {
	// At most one line a minute; the lines left out are counted in the next.
	if now.Sub(r.lastRefusal) < time.Minute {
		r.notLogged++
		return
	}
	r.logf("retrybudget: %s (%d more refusals since the last such line)", line, r.notLogged)
	r.lastRefusal = now
	r.notLogged = 0
}

func (r *refresher) applyResponseLocked(in *pendingSync, resp *pb.SyncResponse, received time.Time) {
	if len(resp.Tenants) != len(in.request.Tenants) {
		r.logf("retrybudget: Sync response has %d tenant entries for %d in the request",
			len(resp.Tenants), len(in.request.Tenants))
	}
	n := len(resp.Tenants)
	if len(in.request.Tenants) < n {
		n = len(in.request.Tenants)
	}
	for i := 0; i < n; i++ {
		g, sent, t := resp.Tenants[i], in.request.Tenants[i], in.tenants[i]
		if g.GetTenant() != sent.Tenant {
			// Not this tenant's answer: take nothing. A grant dropped here is never counted as
			// received, so the server reclaims it; the tenant asks again on its schedule.
			r.logf("retrybudget: Sync response entry %d is for tenant %q, not %q", i,
				g.GetTenant(), sent.Tenant)
			continue
		}
		if e := g.GetError(); e != nil {
			code := codes.Code(e.GetCode())
			switch {
			case code == codes.FailedPrecondition && e.GetOwner() != "":
				// Not this server's shard: nothing was applied; sync it with its owner.
				r.redirectLocked(t, e.GetOwner(), received)
				continue
			case code == codes.Unavailable && e.GetOwner() == "":
				// The shard has no owner that can grant now: the tokens left in the lease are
				// spent, then fallback (down: an empty lease falls back at once).
				r.parkLocked(t, received)
				continue
			case code != codes.OK:
				r.logf("retrybudget: budget server refused tenant %q (%s): %s", sent.Tenant,
					codeName(code), e.GetMessage())
				t.applyRefusal(code, e.GetMessage(), received, r.opts.policy)
				continue
			}
		}
		t.applyGrant(g, sent, in.firstSent, received, r.opts.policy)
		if tr, ok := r.routed[t]; ok {
			tr.hops = 0
			tr.unavailable = false
			tr.unavailableSince = farFuture
		}
	}
}

// attemptTimeoutKey is the context key of an attempt's timeout (a time.Duration).
type attemptTimeoutKey struct{}

// callSync sends one attempt with a deadline `timeout` from now (real time: it is gRPC's,
// never the injected Clock's) and counts it. With waitForReady and `cancellable`, wake may
// cancel it; woken is then true.
func (r *refresher) callSync(route *syncRoute, req *pb.SyncRequest, timeout time.Duration, waitForReady, cancellable bool) (*pb.SyncResponse, *status.Status, bool) {
	if timeout < 0 {
		timeout = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The timeout as the refresher computed it on its Clock: the conformance runner checks it
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
	resp, err := route.stub.Sync(ctx, req, grpc.WaitForReady(waitForReady))
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
	r.metrics.syncAttempted(st.Code() == codes.OK)
	if st.Code() != codes.OK {
		r.metrics.syncFailed(st.Code())
	}
	return resp, st, woken
}

func (r *refresher) updateMetricsLocked(tenants []*TenantBudget) {
	for _, t := range tenants {
		r.metrics.tenantUpdated(t.name, t.Stats())
	}
}

// shutdown stops the goroutine, then sends the final Sync (final=true, every counter, every
// unspent token returned, want 0) to every route that holds tenants, each request at most
// finalSyncAttempts times with the same seq, each bounded by syncTimeout. Returns the first
// failure of the final Sync (nil when there was nothing to report). Idempotent.
func (r *refresher) shutdown() error {
	r.stopLoop()
	r.registry.close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.shutDown {
		r.shutDown = true
		r.finalStatus = r.finalSyncLocked()
		for _, o := range r.owners {
			if o.close != nil {
				o.close()
			}
		}
	}
	return r.finalStatus
}

func (r *refresher) finalSyncLocked() error {
	tenants := r.registry.snapshot()
	r.main.pending = nil
	for _, o := range r.owners {
		o.pending = nil
	}
	if len(tenants) == 0 {
		return nil
	}
	var result error
	// Every server that holds tenants of this instance gets its final Sync.
	for _, g := range r.groupByRouteLocked(tenants) {
		if len(g.tenants) == 0 {
			continue
		}
		if err := r.finalSyncRouteLocked(g.route, g.tenants); err != nil && result == nil {
			result = err
		}
	}
	r.updateMetricsLocked(tenants)
	return result
}

func (r *refresher) finalSyncRouteLocked(route *syncRoute, tenants []*TenantBudget) error {
	now := r.clock.Now()
	entries := make([]*pb.TenantSync, len(tenants))
	for i, t := range tenants {
		entries[i] = t.fillFinal(now)
	}
	// In requests of at most route.maxTenants tenants (split further if the server refuses one
	// as a whole); only the last carries final=true: the server forgets the instance on it.
	chunk := route.maxTenants
	var result error
	for done := 0; done < len(entries); {
		n := chunk
		if n < 1 {
			n = 1
		}
		if n > len(entries)-done {
			n = len(entries) - done
		}
		// A new seq even if a request is still unanswered: if the server applied it, its grant
		// is reclaimed from our tokens_received; if not, these cumulative counters cover it.
		r.seq++
		req := &pb.SyncRequest{InstanceId: r.opts.instanceID, Seq: r.seq,
			Final: done+n == len(entries), Tenants: entries[done : done+n]}
		st := r.sendFinalLocked(route, req)
		if isRequestRefusal(st.Code()) && n > 1 {
			named := tenantLimitIn(st.Message())
			if named > 0 && named < n {
				route.maxTenants = named
				chunk = named
			} else {
				chunk = n / 2
			}
			continue
		}
		if st.Code() != codes.OK {
			result = r.lastStatus
			r.logf("retrybudget: final Sync failed; unspent tokens are forfeited: %v", r.lastStatus)
			if !isRequestRefusal(st.Code()) {
				break // unreachable: the rest would fail too
			}
		}
		done += n
	}
	return result
}

func (r *refresher) sendFinalLocked(route *syncRoute, req *pb.SyncRequest) *status.Status {
	// With the server answering, each attempt may wait for a connection being re-made; with
	// it known unreachable, fail fast rather than hold Close for 3 x syncTimeout.
	waitForReady := !route.state.isUnreachable()
	var st *status.Status
	for attempt := 1; attempt <= finalSyncAttempts; attempt++ {
		_, st, _ = r.callSync(route, req, r.opts.syncTimeout, waitForReady, false)
		r.lastStatus = syncError(st)
		if st.Code() == codes.OK || isRequestRefusal(st.Code()) || attempt == finalSyncAttempts {
			break
		}
		// Real time, as the attempts' deadlines: Close never waits on a test's FakeClock.
		time.Sleep(retryBackoff(attempt, r.opts.policy))
	}
	return st
}

func (r *refresher) logf(format string, args ...interface{}) {
	if r.opts.logger != nil {
		r.opts.logger.Printf(format, args...)
	}
}

// lastSeq is the seq of the last request built (0 before the first). For tests.
func (r *refresher) lastSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// lastSyncStatus is the error of the last Sync attempt (nil: it got a response).
func (r *refresher) lastSyncStatus() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastStatus
}

var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

// codeName is the canonical upper-case name of a gRPC code, as the C++ and Python clients
// print it (the `code` label of retry_budget_client_sync_errors_total).
func codeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "CODE_" + strconv.Itoa(int(c))
}
