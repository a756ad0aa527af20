package retrybudget

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The leasing protocol of one client without its transport and without a clock of its own:
// given the time, the tenants (their events reach it through tenantRegistry and TenantBudget)
// and the server's answers, it says what to send and when to wake. The same shape as the C++,
// JS and Python clients' engines (client/cpp/sync_engine.h, client/js/src/sync-engine.js,
// client/python/retrybudget/_sync_engine.py). The refresher (refresher.go) drives it from its
// goroutine and does the I/O:
//
//	plan := engine.BeginStep(clock.Now())
//	for plan != nil { // one attempt per route (and request) due
//		engine.EndAttempt(plan, send(plan), clock.Now())
//		plan = engine.NextPlan(clock.Now())
//	}
//	next := engine.EndStep(clock.Now()) // when to wake
//
// and at shutdown BeginFinal / NextFinal / EndFinalAttempt / FinishFinal.
//
// The rules kept here (with TenantBudget) are the client rulebook's,
// client/conformance/RULES.md, by id; conformance_test.go runs the corpus that pins them
// through this engine and the refresher:
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
//     (also an attempt a wake cancelled while it waited for a connection:
//     attemptOutcome.woken), fail-fast-then-wait-for-ready (syncPlan.waitForReady; the backoff
//     counts from the failed attempt's start).
//   - Refusals: request-refused-split (isRequestRefusal, tenantLimitIn), tenant-refused.
//   - Routing (a cluster): every rule above holds per route, the main target (address "") or
//     one owner, each with its own pending request, backoff, failures and server state; seq
//     grows across all routes. redirect-followed, redirect-hop-limit (maxRedirectHops),
//     owner-route-limit (maxOwnerRoutes), unavailable-parks, owner-unreachable-parks. Without a
//     redirect every tenant is on the main route.
//   - Leases, fallback and the ledger: in TenantBudget (step, applyGrant) and tenantLedger.
//   - final-sync: BeginFinal .. FinishFinal.

// Most owner addresses with a route (and a channel) at once; a redirect to one more is not
// followed until a route without tenants is dropped (the tenant is handled as UNAVAILABLE).
const maxOwnerRoutes = 64

// Redirects a tenant follows without a grant in between; past it (a redirect loop, servers
// disagreeing during a takeover) the tenant is handled as UNAVAILABLE: the tokens left in its
// lease are spent, then fallback, asked again on the main target a refresh period later.
const maxRedirectHops = 4

// gRPC may report a deadline a hair before the Clock reaches it.
const deadlineSlack = time.Millisecond

// ownerChannels are the channels to owners, kept by the driver; called by the engine only,
// from the engine's caller.
type ownerChannels interface {
	// open makes the channel of a route a redirect to `address` starts; false (and why, if
	// known) when it cannot: the redirect is not followed.
	open(address string) (bool, error)
	// close releases the channel of a dropped route (no tenant uses it any more).
	close(address string)
}

type syncEngineOptions struct {
	logger      Logger
	instanceID  string
	policy      refreshPolicy
	syncTimeout time.Duration
}

// syncPlan is one Sync attempt to send. request belongs to the engine; the driver sends it
// unchanged.
type syncPlan struct {
	address      string // "": the main target
	request      *pb.SyncRequest
	sent         time.Time // the time the plan was made for
	deadline     time.Time // sent + timeout
	waitForReady bool
}

func (p *syncPlan) timeout() time.Duration { return p.deadline.Sub(p.sent) }

// finalPlan is one final request to send (at most finalSyncAttempts times).
type finalPlan struct {
	address      string
	request      *pb.SyncRequest
	timeout      time.Duration
	waitForReady bool
}

// attemptOutcome is what an attempt gave: its status (OK: response is the answer).
type attemptOutcome struct {
	st       *status.Status
	response *pb.SyncResponse
	woken    bool // cancelled by a wake while it waited for the channel
}

type pendingSync struct {
	request   *pb.SyncRequest
	tenants   []*TenantBudget // request.Tenants[i] belongs to tenants[i]
	firstSent time.Time
}

// syncRoute is one destination: the main target (address "") or one owner. The state of the
// rules.
type syncRoute struct {
	address  string
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

func newRoute(address string) *syncRoute {
	return &syncRoute{address: address, lastSend: farPast, retryAt: farPast,
		failingSince: farFuture, maxTenants: maxTenantsPerClient}
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

// attemptResult is what an ended attempt means for the rest of its route's Sync in a step.
type attemptResult int

const (
	resultDone          attemptResult = iota // a new request was answered
	resultSplit                              // refused as a whole: smaller chunks, same tenants
	resultResentPending                      // an earlier request was resent and answered
	resultRetryLater                         // failed or cut short: retryAt is set
)

// stepPhase is where a step is: the main route alone (no redirect seen yet), then the rounds
// over every route (one more round per redirect, at most maxRedirectHops + 1).
type stepPhase int

const (
	phaseMainOnly stepPhase = iota
	phaseRoutedStart
	phaseRoundStart
	phaseRound
	phaseDone
)

// routeSync is the route being synced in a step: its due tenants go out in requests of at
// most chunk.
type routeSync struct {
	route    *syncRoute
	tenants  []*TenantBudget
	done     int  // tenants answered
	chunk    int  // tenants per request (lowered by a split)
	sent     int  // tenants in the attempt in flight
	resend   bool // the attempt in flight resends the route's pending request
	checkCut bool // a request of this route ended: stop at the cut
	finished bool // failed, cut short, or a resend answered: nothing more this step
}

type engineStep struct {
	tenants   []*TenantBudget
	cut       time.Time
	phase     stepPhase
	round     int
	groups    []routeGroup // this round's routes (fixed for the round)
	nextGroup int
	syncing   bool // sync is a route being synced
	sync      routeSync
}

// finalSync is the final Sync in progress: the routes with tenants, the one being reported,
// its entries and the request in flight.
type finalSync struct {
	tenants     []*TenantBudget
	groups      []routeGroup
	group       int
	started     bool // groups[group]'s entries are filled
	entries     []*pb.TenantSync
	done        int
	chunk       int
	inRequest   int
	routeResult error
	result      error
}

// syncEngine holds the protocol's decisions. Not thread-safe: the driver serialises every
// call (the refresher holds its mutex for a whole step). channels may be nil (redirects are
// then not followed).
type syncEngine struct {
	opts     syncEngineOptions
	registry *tenantRegistry
	metrics  clientMetrics
	channels ownerChannels

	seq         uint64 // per instance, across every route
	main        *syncRoute
	owners      map[string]*syncRoute
	routed      map[*TenantBudget]*tenantRoute // empty until a redirect is seen
	redirected  bool                           // a redirect in this round of a step
	step        engineStep
	lastStatus  error
	lastRefusal time.Time
	notLogged   uint64
	shutDown    bool
	final       finalSync
}

func newSyncEngine(opts syncEngineOptions, reg *tenantRegistry, m clientMetrics, channels ownerChannels) *syncEngine {
	return &syncEngine{opts: opts, registry: reg, metrics: m, channels: channels,
		main: newRoute(""), owners: map[string]*syncRoute{},
		routed: map[*TenantBudget]*tenantRoute{}, lastRefusal: farPast}
}

// ---- a step ----

// BeginStep starts a step at `now`: steps every tenant (ends expired leases, enters, refills
// or leaves fallback) and returns the first attempt due, or nil.
func (e *syncEngine) BeginStep(now time.Time) *syncPlan {
	e.step = engineStep{phase: phaseDone, cut: farFuture}
	if e.shutDown {
		return nil
	}
	e.step.tenants = e.registry.snapshot()
	nextStep, leaseEnds := farFuture, farFuture
	for _, t := range e.step.tenants {
		nextStep = minTime(nextStep, t.step(now, e.stateFor(t, now)))
		leaseEnds = minTime(leaseEnds, t.leaseEndsAt())
	}
	// The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
	// expiry, a fallback step runs at most minFallbackStepWindow late, and a server unreachable
	// since an earlier attempt turns "down" on time (a spent lease then falls back at once, not
	// when an attempt waiting for the channel gives up a syncTimeout later).
	nextStep = minTime(nextStep, e.nextDown(now))
	e.step.cut = minTime(leaseEnds, maxTime(nextStep, now.Add(minFallbackStepWindow)))
	e.step.phase = phaseMainOnly
	return e.NextPlan(now)
}

// NextPlan is the next attempt of this step at `now` (another request of a split, another
// route, a redirected tenant's owner), or nil.
func (e *syncEngine) NextPlan(now time.Time) *syncPlan {
	for {
		if e.step.syncing {
			if plan := e.planAttempt(now); plan != nil {
				return plan
			}
			e.step.syncing = false
		}
		if !e.nextRouteSync(now) {
			return nil
		}
	}
}

func (e *syncEngine) routing() bool { return len(e.routed) > 0 || len(e.owners) > 0 }

// nextRouteSync picks the next route of the step to sync; false: the step sends nothing more.
func (e *syncEngine) nextRouteSync(now time.Time) bool {
	s := &e.step
	start := func(route *syncRoute, tenants []*TenantBudget) {
		s.sync = routeSync{route: route, tenants: tenants, chunk: route.maxTenants}
		s.syncing = true
	}
	for {
		switch s.phase {
		case phaseMainOnly:
			// Without a redirect seen, every tenant is on the main route.
			s.phase = phaseRoutedStart
			if len(s.tenants) > 0 && !e.routing() && !e.syncDue(e.main, s.tenants).After(now) {
				start(e.main, s.tenants)
				return true
			}
		case phaseRoutedStart:
			if len(s.tenants) == 0 || !e.routing() {
				s.phase = phaseDone
				break
			}
			e.pruneRoutes()
			s.round = 0
			s.phase = phaseRoundStart
		case phaseRoundStart:
			// A redirected tenant goes to its owner in the same step: one more round per
			// redirect, at most maxRedirectHops + 1 rounds.
			if s.round > maxRedirectHops || !now.Before(s.cut) {
				s.phase = phaseDone
				break
			}
			e.redirected = false
			s.groups = e.groupByRoute(s.tenants)
			s.nextGroup = 0
			s.phase = phaseRound
		case phaseRound:
			if s.nextGroup < len(s.groups) && now.Before(s.cut) {
				g := s.groups[s.nextGroup]
				s.nextGroup++
				if e.syncDue(g.route, g.tenants).After(now) {
					break
				}
				start(g.route, g.tenants)
				return true
			}
			if !e.redirected {
				s.phase = phaseDone
				break
			}
			s.round++
			s.phase = phaseRoundStart
		case phaseDone:
			return false
		}
	}
}

// planAttempt is the next attempt of the route being synced, or nil (the route is done; it
// may have been dropped: owner-unreachable-parks).
func (e *syncEngine) planAttempt(now time.Time) *syncPlan {
	s := &e.step.sync
	// Up to route.maxTenants tenants per request; the rest go in the next requests of this
	// step. A request the server refuses as a whole is split (applyRefusal).
	if s.finished || s.done >= len(s.tenants) {
		return nil
	}
	if s.checkCut && !now.Before(e.step.cut) {
		return nil
	}
	route := s.route
	rest := s.tenants[s.done:]
	p := e.opts.policy
	if route.pending != nil && now.Sub(route.pending.firstSent) >= p.refreshPeriod {
		// Failing for a whole refresh period: a new request (abandon-after-refresh-period).
		route.pending = nil
		if route.address != "" {
			e.dropRoute(route, rest)
			return nil
		}
	}
	s.resend = route.pending != nil
	if !s.resend {
		// A new request: new seq, counters as of now. Kept until a response arrives, so a
		// retry resends exactly this message (the server then answers it the same way).
		n := s.chunk
		if n < 1 {
			n = 1
		}
		if n > len(rest) {
			n = len(rest)
		}
		e.seq++
		pend := &pendingSync{request: &pb.SyncRequest{InstanceId: e.opts.instanceID, Seq: e.seq},
			firstSent: now}
		for _, t := range rest[:n] {
			pend.request.Tenants = append(pend.request.Tenants, t.fillSync(now, p))
			pend.tenants = append(pend.tenants, t)
		}
		route.pending = pend
	}
	s.sent = len(route.pending.tenants)
	route.lastSend = now
	return &syncPlan{address: route.address, request: route.pending.request, sent: now,
		deadline: minTime(now.Add(e.opts.syncTimeout), e.step.cut),
		// Once an attempt failed the server is known unreachable: wait for the channel to
		// connect instead of failing at once (fail-fast-then-wait-for-ready).
		waitForReady: route.failures > 0}
}

// dropRoute: an owner that cannot be reached for a refresh period; its tenants go back to the
// main target (which redirects them again once the shard has an owner), unreachable until a
// grant.
func (e *syncEngine) dropRoute(route *syncRoute, tenants []*TenantBudget) {
	e.logf("retrybudget: owner %s unreachable for a refresh period; its tenants go "+
		"back to the main target", route.address)
	for _, t := range tenants {
		tr := e.routeOf(t)
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
}

// EndAttempt applies the outcome of `plan`'s attempt, which ended at `received`.
func (e *syncEngine) EndAttempt(plan *syncPlan, outcome attemptOutcome, received time.Time) {
	if !e.step.syncing {
		return
	}
	s := &e.step.sync
	e.countAttempt(outcome.st)
	switch e.applyOutcome(s, plan, outcome, received) {
	case resultDone:
		s.done += s.sent
		s.checkCut = true
	case resultSplit:
		s.checkCut = true
	case resultResentPending, resultRetryLater: // (resent: the rest are due on their schedule)
		s.finished = true
	}
}

func (e *syncEngine) countAttempt(st *status.Status) {
	e.metrics.syncAttempted(st.Code() == codes.OK)
	if st.Code() != codes.OK {
		e.metrics.syncFailed(st.Code())
	}
	e.lastStatus = syncError(st)
}

func (e *syncEngine) applyOutcome(s *routeSync, plan *syncPlan, outcome attemptOutcome, received time.Time) attemptResult {
	route, st, p := s.route, outcome.st, e.opts.policy
	cutShort := plan.deadline.Before(plan.sent.Add(e.opts.syncTimeout)) &&
		st.Code() == codes.DeadlineExceeded && !received.Before(plan.deadline.Add(-deadlineSlack))
	if cutShort || (outcome.woken && st.Code() == codes.Canceled) {
		// Interrupted for a duty (cut-short-is-interrupted): no verdict on the server, no
		// backoff; the same request goes out again. If the server applied it, the resend (same
		// seq) gets the same answer.
		route.retryAt = received
		return resultRetryLater
	}
	if isRequestRefusal(st.Code()) {
		return e.applyRefusal(s, st, received)
	}
	route.state = stateAfter(st.Code())
	in := route.pending
	if st.Code() != codes.OK {
		if route.failures == 0 {
			route.failingSince = plan.sent
		}
		route.failures++
		// Counted from the attempt's start: one that waited out its deadline was its own
		// backoff.
		route.retryAt = maxTime(received, plan.sent.Add(retryBackoff(route.failures, p)))
		if route.failures == 1 {
			e.logf("retrybudget: Sync seq %d failed; retrying (tenants whose lease ends "+
				"meanwhile fall back): %v", in.request.Seq, e.lastStatus)
		}
		return resultRetryLater
	}
	if route.failures > 0 {
		e.logf("retrybudget: Sync seq %d succeeded after %d failed attempts", in.request.Seq,
			route.failures)
	}
	route.answered()
	route.pending = nil
	if outcome.response.GetStale() {
		// The server applied a newer seq of this instance: nothing here was applied
		// (stale-dropped).
		e.logf("retrybudget: Sync seq %d answered as stale; ignored", in.request.Seq)
	} else {
		e.applyResponse(in, outcome.response, received)
	}
	if s.resend {
		return resultResentPending
	}
	return resultDone
}

// applyRefusal: the server answered and refuses this request as a whole
// (request-refused-split, tenant-refused); it applied nothing, so the counters simply go in
// the next request.
func (e *syncEngine) applyRefusal(s *routeSync, st *status.Status, received time.Time) attemptResult {
	route := s.route
	route.state = answering
	route.answered()
	refused := route.pending
	route.pending = nil
	if size := len(refused.tenants); size > 1 {
		if named := tenantLimitIn(st.Message()); named > 0 && named < size {
			route.maxTenants = named
			s.chunk = named
		} else {
			s.chunk = size / 2
		}
		e.logRefusal(received, fmt.Sprintf("Sync seq %d with %d tenants refused; "+
			"splitting it into requests of %d: %v", refused.request.Seq, size, s.chunk, e.lastStatus))
		return resultSplit
	}
	refused.tenants[0].applyRefusal(st.Code(), st.Message(), received, e.opts.policy)
	e.logRefusal(received, fmt.Sprintf("Sync seq %d for tenant %q refused; the tenant "+
		"is denied: %v", refused.request.Seq, refused.tenants[0].name, e.lastStatus))
	return resultDone
}

// EndStep ends the step at `now`: steps the tenants again with the outcomes (a response may
// carry a lease that already ended; a failed attempt sends tenants without a lease into
// fallback now, not a step later) and updates the metrics. Returns when the next step is due;
// farFuture when nothing is scheduled.
func (e *syncEngine) EndStep(now time.Time) time.Time {
	tenants := e.step.tenants
	e.step = engineStep{phase: phaseDone, cut: farFuture}
	if e.shutDown {
		return farFuture
	}
	next := farFuture
	for _, g := range e.groupByRoute(tenants) {
		next = minTime(next, e.syncDue(g.route, g.tenants))
	}
	for _, t := range tenants {
		next = minTime(next, t.step(now, e.stateFor(t, now)))
	}
	next = minTime(next, e.nextDown(now))
	e.updateMetrics(tenants)
	return next
}

// ---- the final Sync (final-sync) ----

// BeginFinal prepares the final requests (final=true on the last of each route, every
// counter, every unspent token returned, want 0) to every route that holds tenants. Once only.
func (e *syncEngine) BeginFinal() {
	if e.shutDown {
		return
	}
	e.shutDown = true
	e.final = finalSync{tenants: e.registry.snapshot()}
	e.main.pending = nil
	for _, o := range e.owners {
		o.pending = nil
	}
	if len(e.final.tenants) > 0 {
		e.final.groups = e.groupByRoute(e.final.tenants)
	}
}

// NextFinal is the next final request to send at `now`, or nil. Each route's requests hold at
// most route.maxTenants tenants (split further if the server refuses one as a whole); only the
// last carries final=true: the server forgets the instance on it.
func (e *syncEngine) NextFinal(now time.Time) *finalPlan {
	f := &e.final
	for f.group < len(f.groups) {
		g := f.groups[f.group]
		if !f.started {
			f.entries = make([]*pb.TenantSync, len(g.tenants))
			for i, t := range g.tenants {
				f.entries[i] = t.fillFinal(now)
			}
			f.done, f.chunk, f.started = 0, g.route.maxTenants, true
		}
		if f.done >= len(f.entries) {
			if f.result == nil {
				f.result = f.routeResult
			}
			f.group++
			f.started, f.routeResult = false, nil
			continue
		}
		n := f.chunk
		if n < 1 {
			n = 1
		}
		if n > len(f.entries)-f.done {
			n = len(f.entries) - f.done
		}
		f.inRequest = n
		// A new seq even if a request is still unanswered: if the server applied it, its grant
		// is reclaimed from our tokens_received; if not, these cumulative counters cover it.
		e.seq++
		req := &pb.SyncRequest{InstanceId: e.opts.instanceID, Seq: e.seq,
			Final: f.done+n == len(f.entries), Tenants: f.entries[f.done : f.done+n]}
		// With the server answering, each attempt may wait for a connection being re-made;
		// with it known unreachable, fail fast rather than hold Close for 3 x syncTimeout.
		return &finalPlan{address: g.route.address, request: req, timeout: e.opts.syncTimeout,
			waitForReady: !g.route.state.isUnreachable()}
	}
	return nil
}

// EndFinalAttempt applies attempt number `attempt` (from 1) of the current final request.
// Returns how long to wait before sending it again (same seq) and true, or false when it is
// done.
func (e *syncEngine) EndFinalAttempt(outcome attemptOutcome, attempt int) (time.Duration, bool) {
	st := outcome.st
	e.countAttempt(st)
	refusal := isRequestRefusal(st.Code())
	if st.Code() != codes.OK && !refusal && attempt < finalSyncAttempts {
		return retryBackoff(attempt, e.opts.policy), true
	}
	f := &e.final
	n := f.inRequest
	if refusal && n > 1 {
		route := f.groups[f.group].route
		if named := tenantLimitIn(st.Message()); named > 0 && named < n {
			route.maxTenants = named
			f.chunk = named
		} else {
			f.chunk = n / 2
		}
		return 0, false
	}
	if st.Code() != codes.OK {
		f.routeResult = e.lastStatus
		e.logf("retrybudget: final Sync failed; unspent tokens are forfeited: %v", e.lastStatus)
		if !refusal {
			f.done = len(f.entries) // unreachable: the rest would fail too
			return 0, false
		}
	}
	f.done += n
	return 0, false
}

// FinishFinal is the final Sync's result once NextFinal returned nil: its first failure (nil
// when there was nothing to report); updates the metrics.
func (e *syncEngine) FinishFinal() error {
	if len(e.final.tenants) > 0 {
		e.updateMetrics(e.final.tenants)
	}
	return e.final.result
}

// ---- the rules' state ----

func (e *syncEngine) updateMetrics(tenants []*TenantBudget) {
	for _, t := range tenants {
		e.metrics.tenantUpdated(t.name, t.Stats())
	}
}

func (e *syncEngine) logf(format string, args ...interface{}) {
	if e.opts.logger != nil {
		e.opts.logger.Printf(format, args...)
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

// stateOf is what `route` says of its server at `now`: down once it has been unreachable for
// a refresh period.
func (e *syncEngine) stateOf(route *syncRoute, now time.Time) serverState {
	if route.state == unreachable && now.Sub(route.failingSince) >= e.opts.policy.refreshPeriod {
		return down
	}
	return route.state
}

// nextDown is the earliest time after `now` at which a route (unreachable since its
// failingSince) or a parked tenant (since its unavailableSince) turns down, a refresh period
// later; farFuture when none will. A step is due then, and a Sync attempt is cut short for it.
func (e *syncEngine) nextDown(now time.Time) time.Time {
	next := farFuture
	consider := func(since time.Time) {
		if !since.Before(farFuture) {
			return
		}
		if at := addDur(since, e.opts.policy.refreshPeriod); at.After(now) {
			next = minTime(next, at)
		}
	}
	if e.main.state == unreachable {
		consider(e.main.failingSince)
	}
	for _, o := range e.owners {
		if o.state == unreachable {
			consider(o.failingSince)
		}
	}
	for _, tr := range e.routed {
		if tr.unavailable {
			consider(tr.unavailableSince)
		}
	}
	return next
}

// stateFor is what `t`'s route says of its server at `now`; down for a tenant parked
// because no owner can grant once it has been parked for a refresh period.
func (e *syncEngine) stateFor(t *TenantBudget, now time.Time) serverState {
	tr, ok := e.routed[t]
	if !ok {
		return e.stateOf(e.main, now)
	}
	if tr.unavailable {
		// A live server said the shard has no owner that can grant: a failover once it lasts.
		if now.Sub(tr.unavailableSince) >= e.opts.policy.refreshPeriod {
			return down
		}
		return unreachable
	}
	if tr.owner == "" {
		return e.stateOf(e.main, now)
	}
	if o, ok := e.owners[tr.owner]; ok {
		return e.stateOf(o, now)
	}
	return e.stateOf(e.main, now)
}

// groupByRoute is the tenants of each route, the main route first, owners in the order
// their first tenant appears.
func (e *syncEngine) groupByRoute(tenants []*TenantBudget) []routeGroup {
	groups := []routeGroup{{route: e.main}}
	if len(e.routed) == 0 {
		groups[0].tenants = tenants
		return groups
	}
	index := map[*syncRoute]int{}
	for _, t := range tenants {
		route := e.main
		if tr, ok := e.routed[t]; ok && tr.owner != "" {
			if o, ok := e.owners[tr.owner]; ok {
				route = o
			}
		}
		if route == e.main {
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

// pruneRoutes drops owner routes no tenant uses any more (and closes their channels).
func (e *syncEngine) pruneRoutes() {
	used := map[string]bool{}
	for _, tr := range e.routed {
		if tr.owner != "" {
			used[tr.owner] = true
		}
	}
	for addr, o := range e.owners {
		if !used[addr] && o.pending == nil {
			if e.channels != nil {
				e.channels.close(addr)
			}
			delete(e.owners, addr)
		}
	}
	for t, tr := range e.routed {
		if tr.owner == "" && tr.hops == 0 && !tr.unavailable {
			delete(e.routed, t)
		}
	}
}

func (e *syncEngine) routeOf(t *TenantBudget) *tenantRoute {
	tr, ok := e.routed[t]
	if !ok {
		tr = &tenantRoute{}
		e.routed[t] = tr
	}
	return tr
}

func (e *syncEngine) redirect(t *TenantBudget, owner string, received time.Time) {
	e.metrics.redirected()
	tr := e.routeOf(t)
	tr.hops++
	if tr.hops > maxRedirectHops || e.channels == nil {
		e.logRefusal(received, fmt.Sprintf("tenant %q redirected %d times without a grant "+
			"(last to %s); treated as unavailable", t.name, tr.hops, owner))
		e.park(t, received)
		return
	}
	if _, ok := e.owners[owner]; !ok {
		if len(e.owners) >= maxOwnerRoutes {
			e.logRefusal(received, fmt.Sprintf("tenant %q redirected to %s but %d owner "+
				"channels are open; treated as unavailable", t.name, owner, maxOwnerRoutes))
			e.park(t, received)
			return
		}
		if ok, err := e.channels.open(owner); !ok {
			e.logRefusal(received, fmt.Sprintf("tenant %q redirected to %q, which cannot be "+
				"dialled (%v); treated as unavailable", t.name, owner, err))
			e.park(t, received)
			return
		}
		e.owners[owner] = newRoute(owner)
	}
	tr.owner = owner
	tr.unavailable = false
	tr.unavailableSince = farFuture
	e.redirected = true
	t.syncAgainAt(farPast) // at once, on the owner's route
}

func (e *syncEngine) park(t *TenantBudget, received time.Time) {
	tr := e.routeOf(t)
	tr.owner = ""
	tr.hops = 0
	if !tr.unavailable {
		tr.unavailableSince = received
	}
	tr.unavailable = true
	t.syncAgainAt(received.Add(e.opts.policy.refreshPeriod))
}

func (e *syncEngine) syncDue(route *syncRoute, tenants []*TenantBudget) time.Time {
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
	return maxTime(due, addDur(route.lastSend, e.opts.policy.minSyncInterval))
}

func (e *syncEngine) logRefusal(now time.Time, line string) {
	// At most one line a minute; the lines left out are counted in the next.
	if now.Sub(e.lastRefusal) < time.Minute {
		e.notLogged++
		return
	}
	e.logf("retrybudget: %s (%d more refusals since the last such line)", line, e.notLogged)
	e.lastRefusal = now
	e.notLogged = 0
}

func (e *syncEngine) applyResponse(in *pendingSync, resp *pb.SyncResponse, received time.Time) {
	if len(resp.Tenants) != len(in.request.Tenants) {
		e.logf("retrybudget: Sync response has %d tenant entries for %d in the request",
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
			e.logf("retrybudget: Sync response entry %d is for tenant %q, not %q", i,
				g.GetTenant(), sent.Tenant)
			continue
		}
		if te := g.GetError(); te != nil {
			code := codes.Code(te.GetCode())
			switch {
			case code == codes.FailedPrecondition && te.GetOwner() != "":
				// Not this server's shard: nothing was applied; sync it with its owner.
				e.redirect(t, te.GetOwner(), received)
				continue
			case code == codes.Unavailable && te.GetOwner() == "":
				// The shard has no owner that can grant now: the tokens left in the lease are
				// spent, then fallback (down: an empty lease falls back at once).
				e.park(t, received)
				continue
			case code != codes.OK:
				e.logf("retrybudget: budget server refused tenant %q (%s): %s", sent.Tenant,
					codeName(code), te.GetMessage())
				t.applyRefusal(code, te.GetMessage(), received, e.opts.policy)
				continue
			}
		}
		t.applyGrant(g, sent, in.firstSent, received, e.opts.policy)
		if tr, ok := e.routed[t]; ok {
			tr.hops = 0
			tr.unavailable = false
			tr.unavailableSince = farFuture
		}
	}
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
