package retrybudget

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc/codes"
)

// Budget is what the retry helpers need of a tenant's budget; *TenantBudget implements it.
type Budget interface {
	// TryAcquire is TryAcquireN(1).
	TryAcquire() bool
	// TryAcquireN asks for one retry of `cost` tokens (in [1, MaxCost]): true when the tokens
	// were taken (send the retry), false when not (fail the call now). Never blocks, never
	// performs I/O.
	TryAcquireN(cost int) bool
	// Refund is RefundN(1).
	Refund()
	// RefundN gives back the `cost` tokens of a retry that was never sent: at most once per
	// successful TryAcquireN, with the same cost.
	RefundN(cost int)
	// RecordSuccess records one successful logical call.
	RecordSuccess()
	// RecordRequest records one request (a logical call's first attempt).
	RecordRequest()
}

// MaxCost is the largest cost of one retry (TryAcquireN, RefundN, WithCost).
const MaxCost = 1_000_000

// leaseMode is the tenant's internal state (the C++ LeaseMode). leased and fallback let
// TryAcquire take tokens (both from the same lease word); every other mode keeps it closed.
type leaseMode int

const (
	awaitingLease  leaseMode = iota // no grant yet, server not known unreachable: deny
	leased                          // a lease is in force until its expiry
	expired                         // the lease expired, no Sync renewed it (server answering)
	refused                         // the server refused the tenant: deny
	inFallback                      // server unreachable, no lease: the local fallback bucket
	inDenyFallback                  // server unreachable, no lease, FallbackDeny: deny
	shutdown                        // Close: every token returned
)

// serverState is what the refresher knows of a route's server from its last Sync attempt.
type serverState int

const (
	answering serverState = iota // no attempt yet, or the last one got a response
	// unreachable: the last attempt failed (unavailable, deadline, ...): fall back once the
	// lease has expired.
	unreachable
	// down: unreachable for at least a refresh period (or the tenant's shard has no owner that
	// can grant): a spent lease falls back at once. Counts as unreachable everywhere.
	down
	refusing // UNAUTHENTICATED / PERMISSION_DENIED: deny
)

// isUnreachable: the server cannot be reached (unreachable or down).
func (s serverState) isUnreachable() bool { return s == unreachable || s == down }

var tenantNameRE = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,128}$`)

func checkTenantName(name string) error {
	if !tenantNameRE.MatchString(name) {
		return invalidf("tenant %q is malformed; expected 1-128 characters of [A-Za-z0-9._:/-]", name)
	}
	return nil
}

type fallbackConfig struct {
	mode         FallbackMode
	neverReached bucketShape
}

// fallbackEpisode: a bucket's cap and refill from start to end (zero end: still in it).
type fallbackEpisode struct {
	cap, refill float64
	start, end  time.Time
}

// TenantBudget is a tenant's budget as seen from this process. Thread-safe; owned by its
// Client. TryAcquire, Refund and RecordSuccess are the hot path: lock-free, atomics only,
// never blocking, no I/O, no clock read. A TryAcquire of cost 1 that finds its token is one
// CAS loop on the lease word; a cost above 1 adds one atomic (extra, see tenantLedger); a
// denial, and a shadow-mode would-be denial, a few more. The other methods take mu; the
// refresher is their only writer.
type TenantBudget struct {
	name  string
	waker func()
	fb    fallbackConfig

	lease     *lease
	_         [56]byte // the word above and the counters below on separate cache lines
	successes atomic.Uint64
	requests  atomic.Uint64
	_         [48]byte
	denied    atomic.Uint64
	// deniedTokens: the cost of the retries denied and of the shadow's would-be denials (the
	// demand estimator counts tokens).
	deniedTokens atomic.Uint64
	// shadow: the last answer's TenantGrant.mode was MODE_SHADOW (shadow.mode-from-response).
	shadow atomic.Bool
	// shadowDenied: would-be denials let through in shadow (TenantSync.shadow_denied);
	// unbacked: their tokens not yet refunded (shadow.refund-unbacked-first).
	shadowDenied atomic.Uint64
	unbacked     atomic.Uint64
	refunds      atomic.Uint64
	// refundedTokens: the tokens RefundN put back into the word; extra: of the takes of cost
	// c > 1, the c - 1 above one token (tenantLedger.takes derives retries_allowed from both).
	refundedTokens atomic.Uint64
	extra          atomic.Uint64
	syncWanted     atomic.Bool
	costLog        *costLogger // nil: bad costs are not logged
	// ready is closed at the tenant's first answer (Ready); readyOnce closes it.
	ready     chan struct{}
	readyOnce sync.Once

	mu              sync.Mutex
	mode            leaseMode
	ledger          tenantLedger
	demand          demandEstimator
	expiry          time.Time
	nextDue         time.Time
	dryUntil        time.Time
	synced          bool // a request carried the tenant (its first Sync skips minSyncInterval)
	err             error
	safeShares      recentSmallest
	lastSafeShareAt time.Time
	fallback        *fallbackBucket
	episodes        []fallbackEpisode
	// Success- and request-funded fallback (TenantSync.successes_credited_locally,
	// requests_credited_locally).
	successCredit, requestCredit localCredit
	// reportedAllowed: the retries_allowed of the last request built (monotonic).
	reportedAllowed uint64
}

func newTenantBudget(name string, waker func(), created time.Time, fb fallbackConfig) *TenantBudget {
	return &TenantBudget{
		name:       name,
		waker:      waker,
		fb:         fb,
		lease:      newLease(),
		ready:      make(chan struct{}),
		demand:     demandEstimator{last: created},
		expiry:     farPast,
		nextDue:    farPast,
		dryUntil:   farPast,
		safeShares: recentSmallest{window: SafeShareMemory, start: farPast},
	}
}

// Tenant is the tenant's name.
func (t *TenantBudget) Tenant() string { return t.name }

// TryAcquire asks for one retry of cost 1: TryAcquireN(1). A take that finds its token is
// one CAS loop on the lease word and nothing else.
func (t *TenantBudget) TryAcquire() bool {
	switch t.lease.tryTake(1) {
	case taken:
		return true
	case takenLow:
		t.requestSync()
		return true
	}
	return t.acquireSlow(1)
}

// TryAcquireN asks for one retry that costs `cost` tokens. It returns true when the tokens
// were taken (the retry may be sent), false when not (the retry must not be sent: fail the
// call now). All or nothing: `cost` tokens from the lease (or, in fallback, from the local
// bucket), never part of them. Never blocks, never performs I/O; on false, or when the lease
// runs low, it wakes the refresher so a grant arrives within one round trip.
//
// A tenant in shadow mode (its policy's dry run) returns true where enforcement would return
// false: no token is taken, and the retry is counted as a would-be denial (ShadowDenied).
//
// A cost outside [1, MaxCost] denies, counts nothing and is logged (at most once a minute,
// naming the cost): a bug in the caller, not a retry.
func (t *TenantBudget) TryAcquireN(cost int) bool {
	if cost < 1 || cost > MaxCost {
		t.costLog.bad("TryAcquireN", t.name, cost)
		return false
	}
	if cost == 1 {
		return t.TryAcquire()
	}
	// Counted before the take (and taken back if it fails): the refresher reads extra after
	// the word, so a take it sees always has its extra tokens counted (tenantLedger.takes
	// never counts a take of cost c as c retries).
	c := uint64(cost)
	t.extra.Add(c - 1)
	switch t.lease.tryTake(c) {
	case taken:
		return true
	case takenLow:
		t.requestSync()
		return true
	}
	t.extra.Add(-(c - 1))
	return t.acquireSlow(cost)
}

// acquireSlow: fewer than `cost` tokens in the word, or the word closed: counts the denial (in
// shadow mode the would-be denial, and allows) and wakes the refresher.
func (t *TenantBudget) acquireSlow(cost int) bool {
	t.deniedTokens.Add(uint64(cost))
	t.requestSync()
	if t.shadow.Load() {
		t.shadowDenied.Add(1)
		t.unbacked.Add(uint64(cost))
		return true
	}
	t.denied.Add(1)
	return false
}

// Refund gives back a token taken by TryAcquire: RefundN(1).
func (t *TenantBudget) Refund() { t.RefundN(1) }

// RefundN gives back the `cost` tokens taken by TryAcquireN(cost) for a retry that was never
// sent (for example cancelled during its backoff). Call it at most once per successful
// TryAcquireN, with the same cost. In shadow mode, would-be denials are refunded first: while
// at least `cost` of their tokens are outstanding, RefundN only forgets them (they took no
// token). A cost outside [1, MaxCost] does nothing but log (at most once a minute).
func (t *TenantBudget) RefundN(cost int) {
	if cost < 1 || cost > MaxCost {
		t.costLog.bad("RefundN", t.name, cost)
		return
	}
	c := uint64(cost)
	for u := t.unbacked.Load(); u >= c; u = t.unbacked.Load() {
		if t.unbacked.CompareAndSwap(u, u-c) {
			return
		}
	}
	t.lease.refund(c)
	// After the word: a snapshotWord that reads this count reads the word with the tokens.
	t.refundedTokens.Add(c)
	t.refunds.Add(1)
}

// snapshotWord reads the lease word and the workers' counts of it in the order tenantLedger
// needs: refunded tokens, then the word, then the extra tokens.
func (t *TenantBudget) snapshotWord() wordSnapshot {
	var w wordSnapshot
	w.refunded = t.refundedTokens.Load()
	w.held = t.lease.held()
	w.extra = t.extra.Load()
	return w
}

// RecordSuccess records one successful logical call; it earns the budget success_credit.
func (t *TenantBudget) RecordSuccess() { t.successes.Add(1) }

// RecordRequest records one request: a logical call's first attempt (a windowed policy
// deposits retry_ratio per request). Do and UnaryClientInterceptor call it once per call.
func (t *TenantBudget) RecordRequest() { t.requests.Add(1) }

// Shadow reports whether the tenant is in shadow mode (the last answer for it said
// MODE_SHADOW): TryAcquireN lets every retry through and counts would-be denials.
func (t *TenantBudget) Shadow() bool { return t.shadow.Load() }

// Ready is closed once the tenant has its first answer: a lease granted, the server's refusal,
// or the configured fallback because the server cannot be reached (or the client was closed).
// Until then TryAcquire denies. The refresher asks for the first lease when the handle is
// created, so on a reachable server Ready closes about one connection set-up and one Sync
// later. Do and UnaryClientInterceptor wait for it within the backoff they sleep anyway.
func (t *TenantBudget) Ready() <-chan struct{} { return t.ready }

// WaitReady waits until the tenant has its first answer (Ready) or ctx is done. Returns nil
// with a lease or in fallback (Stats().Mode tells which), the *TenantError with which the
// server refused the tenant, ErrClientClosed after Close, or ctx.Err(). Never needed for
// correctness (TryAcquire simply denies until then); for a program whose very first call may
// need a retry.
func (t *TenantBudget) WaitReady(ctx context.Context) error {
	select {
	case <-t.ready:
	case <-ctx.Done():
		select {
		case <-t.ready: // both: the answer wins
		default:
			return ctx.Err()
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.mode == shutdown:
		return ErrClientClosed
	case t.mode == refused && t.err != nil:
		return t.err
	}
	return nil
}

// markReadyLocked: the tenant has its first answer (any later call does nothing).
func (t *TenantBudget) markReadyLocked() { t.readyOnce.Do(func() { close(t.ready) }) }

// requestSync: the first worker to find the lease low or empty since the last applied
// response wakes the refresher; later ones see the flag set.
func (t *TenantBudget) requestSync() {
	// The load first: workers denied while a wake is pending only read the flag's line.
	if !t.syncWanted.Load() && !t.syncWanted.Swap(true) {
		t.waker()
	}
}

func publicMode(m leaseMode) Mode {
	switch m {
	case leased:
		return ModeLease
	case inFallback:
		return ModeFallback
	case inDenyFallback:
		return ModeDenyFallback
	}
	return ModeNoLease
}

// Stats is a snapshot of this process's counters for the tenant (not a hot-path call).
func (t *TenantBudget) Stats() TenantStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	// The refunds first: a RefundN counted after its allowed retry never makes the net count
	// wrap.
	refunds := t.refunds.Load()
	word := t.snapshotWord()
	held := word.held
	return TenantStats{
		Successes:                t.successes.Load(),
		Requests:                 t.requests.Load(),
		RetriesAllowed:           subU64(t.ledger.takes(word), refunds),
		TokensSpent:              t.ledger.exactSpent(held),
		RetriesDenied:            t.denied.Load(),
		ShadowDenied:             t.shadowDenied.Load(),
		FallbackAllowed:          t.ledger.exactFallbackSpent(held),
		TokensReceived:           t.ledger.tokensReceived(),
		TokensReturned:           t.ledger.tokensReturned(),
		TokensHeld:               int64(held),
		Refunds:                  refunds,
		SuccessesCreditedLocally: t.successCredit.creditedLocally,
		RequestsCreditedLocally:  t.requestCredit.creditedLocally,
		Shadow:                   t.shadow.Load(),
		LeaseActive:              t.mode == leased && t.lease.open(),
		Mode:                     publicMode(t.mode),
		Err:                      t.err,
	}
}

// FallbackAllowance is what this tenant's fallback buckets may have handed out up to `now`
// (on the client's clock): the sum over its fallback episodes of the bucket's capacity (at
// least 1 when it refills) + refill * seconds in fallback. For fleet checks; not a hot-path
// call.
func (t *TenantBudget) FallbackAllowance(now time.Time) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var sum float64
	for _, e := range t.episodes {
		end := e.end
		if end.IsZero() {
			end = now
		}
		sum += e.cap + e.refill*end.Sub(e.start).Seconds()
	}
	return sum
}

// ---- refresher side (t.mu) ----

// syncDueAt is when the tenant's next Sync is due; first: no request carried it yet.
func (t *TenantBudget) syncDueAt() (due time.Time, first bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mode == shutdown {
		return farFuture, false
	}
	if t.syncWanted.Load() {
		// A worker found the lease low or empty: sync now, unless the server said the
		// bucket is dry (it granted less than wanted): then not before its retry-after.
		return minTime(t.nextDue, t.dryUntil), !t.synced
	}
	return t.nextDue, !t.synced
}

func (t *TenantBudget) leaseEndsAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mode == leased {
		return t.expiry
	}
	return farFuture
}

func (t *TenantBudget) endEpisodeLocked(now time.Time) {
	if n := len(t.episodes); n > 0 && t.episodes[n-1].end.IsZero() {
		t.episodes[n-1].end = now
	}
}

func (t *TenantBudget) withdrawAllLocked(now time.Time) {
	withdrawn := t.lease.withdrawAndClose()
	t.ledger.withdrew(withdrawn, t.lease.held())
	t.ledger.switchTo(sourceLease)
	if t.fallback != nil {
		t.endEpisodeLocked(now)
	}
	t.fallback = nil
}

// fallbackMarkLocked: a full bucket asks to hear of the very first take (mark = held - 1, and
// the wake flag cleared) so its refill restarts at once; otherwise mark 0: an empty word wakes
// the refresher only if no wake is pending (never a busy loop on an empty bucket: the next
// token's time is scheduled anyway).
func (t *TenantBudget) fallbackMarkLocked() uint64 {
	if !t.fallback.full() || t.fallback.held == 0 {
		return 0
	}
	t.syncWanted.Store(false)
	return t.fallback.held - 1
}

func (t *TenantBudget) enterFallbackLocked(now time.Time, startFull bool) {
	defer t.markReadyLocked()
	if t.fb.mode == FallbackDeny {
		t.withdrawAllLocked(now)
		t.mode = inDenyFallback
		return
	}
	// The instance's share of the fleet's budget as the server last saw it (the smallest of
	// the minute before its last answer); a tenant never answered for gets the configured
	// conservative bucket.
	shape := t.fb.neverReached
	if !t.lastSafeShareAt.Equal(farPast) {
		if s := t.safeShares.get(t.lastSafeShareAt); s != nil {
			shape = *s
		}
	}
	t.fallback = newFallbackBucket(shape, now, startFull)
	t.episodes = append(t.episodes, fallbackEpisode{cap: t.fallback.cap,
		refill: t.fallback.shape.refillPerSecond, start: now})
	successes, requests := t.creditableLocked()
	first := t.fallback.refill(now, 0, successes, requests)
	withdrawn := t.lease.replace(first, t.fallbackMarkLocked())
	t.ledger.withdrew(withdrawn, 0) // leased tokens (or raced-in refunds): returned
	t.ledger.switchTo(sourceFallback)
	t.ledger.fallbackDeposited(cappedTokens(first))
	t.mode = inFallback
}

// creditableLocked is what the fallback bucket may credit now: the successes and the requests
// recorded since the last fallback step that no request built so far carries (both through
// the same localCredit rule).
func (t *TenantBudget) creditableLocked() (successes, requests *creditOffer) {
	return t.successCredit.offer(t.successes.Load()), t.requestCredit.offer(t.requests.Load())
}

// refillFallbackLocked puts the tokens the fallback bucket owes into the word, with the credit
// of the successes and requests that may be credited locally; returns when the next step is
// due.
func (t *TenantBudget) refillFallbackLocked(now time.Time) time.Time {
	successes, requests := t.creditableLocked()
	add := t.fallback.refill(now, t.lease.held(), successes, requests)
	// Deposit even 0 tokens: it sets the low-water mark for the new level.
	t.ledger.fallbackDeposited(t.lease.deposit(add, t.fallbackMarkLocked()))
	return t.fallback.nextTokenAt()
}

func (t *TenantBudget) enterFallbackAndRefillLocked(now time.Time, startFull bool) time.Time {
	t.enterFallbackLocked(now, startFull)
	if t.mode == inFallback {
		return t.refillFallbackLocked(now)
	}
	return farFuture
}

// step is one refresher step at `now`, given what the last Sync attempt said of the server:
// ends a lease at its expiry; with no lease in force and the server unreachable, or with the
// lease spent (no token held) and the server down, enters fallback (the local bucket, or
// deny); in fallback, refills the word from the local bucket; with the server refusing the
// client, leaves fallback (deny); withdraws tokens refunded into a closed word. Returns when
// this tenant next needs a step.
func (t *TenantBudget) step(now time.Time, server serverState) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch t.mode {
	case leased:
		if now.Before(t.expiry) {
			if server != down || t.lease.held() > 0 {
				return t.expiry
			}
			// The lease is spent and the server has been unreachable for a while: fall back
			// now instead of denying every retry until the lease's expiry, into an EMPTY
			// bucket: the instance spent its share of the burst in the lease (a slow server is
			// "down" too), so only its share of the refill and its own successes' credit fund
			// it. A blip (one failed Sync) is not "down", so lost responses open no bucket.
			return t.enterFallbackAndRefillLocked(now, false)
		}
		if server.isUnreachable() {
			// The lease ran out while the server cannot be reached: fall back (the leased
			// tokens left are returned in the next Sync that gets through).
			return t.enterFallbackAndRefillLocked(now, true)
		}
		// The lease ends at send time + TTL: every unspent token goes back.
		t.withdrawAllLocked(now)
		t.mode = expired
		return farFuture
	case inFallback:
		if server != refusing {
			return t.refillFallbackLocked(now)
		}
		// The server answered and refuses this client (credentials): no fallback for that.
		t.withdrawAllLocked(now)
		t.mode = expired
		return farFuture
	}
	if t.mode == inDenyFallback && server == refusing {
		t.mode = expired
	}
	if (t.mode == awaitingLease || t.mode == expired) && server.isUnreachable() {
		return t.enterFallbackAndRefillLocked(now, true)
	}
	// A closed word: tokens can only be there from a Refund racing a withdrawal. They cannot
	// be spent; give them back too.
	if t.lease.held() > 0 {
		withdrawn := t.lease.withdrawAndClose()
		t.ledger.withdrew(withdrawn, t.lease.held())
	}
	return farFuture
}

func (t *TenantBudget) fillCountersLocked(word wordSnapshot, out *pb.TenantSync) {
	out.Tenant = t.name
	out.Successes = t.successes.Load()
	t.ledger.report(word.held)
	out.RetriesSpent = t.ledger.reportedSpent()
	out.RetriesRefunded = t.ledger.reportedRefunded()
	out.RetriesDenied = t.denied.Load()
	out.TokensReturned = t.ledger.tokensReturned()
	out.TokensReceived = t.ledger.tokensReceived()
	out.FallbackSpent = t.ledger.reportedFallbackSpent()
	out.FallbackRefunded = t.ledger.reportedFallbackRefunded()
	out.SuccessesCreditedLocally = t.successCredit.creditedLocally
	out.Requests = t.requests.Load()
	out.RequestsCreditedLocally = t.requestCredit.creditedLocally
	out.ShadowDenied = t.shadowDenied.Load()
	// A take refunded before any report is in neither retries_spent nor the server's books, but
	// was counted as allowed: retries_allowed stays at most retries_spent (both monotonic).
	if allowed := minU64(t.ledger.takes(word), out.RetriesSpent); allowed > t.reportedAllowed {
		t.reportedAllowed = allowed
	}
	out.RetriesAllowed = t.reportedAllowed
	// From now on the server may credit every success and request this request carries.
	t.successCredit.carried(out.Successes)
	t.requestCredit.carried(out.Requests)
}

// fillSync fills the entry of a NEW request built at `now`.
func (t *TenantBudget) fillSync(now time.Time, p refreshPolicy) *pb.TenantSync {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.synced = true
	out := &pb.TenantSync{}
	word := t.snapshotWord()
	held := word.held
	t.fillCountersLocked(word, out)
	// Demand is the tokens workers asked for, allowed or not: a starved tenant's denials (and
	// a shadow tenant's would-be denials) count.
	t.demand.observe(now, out.RetriesSpent+t.deniedTokens.Load())
	// Fallback tokens are withdrawn when a grant arrives: only leased tokens reduce the want.
	var leasedHeld uint64
	if t.ledger.source == sourceLease {
		leasedHeld = held
	}
	out.Want = wantFor(t.demand.rate, p.refreshPeriod, p.leaseBurst, leasedHeld)
	return out
}

// applyGrant applies a grant answering a request first sent at `sent`: the lease (every
// token held) now ends at `sent` + lease_ttl_ms, so the client's clock can only end it
// earlier than the server's view. A TTL <= 0 ends it at once (the safe reading of a missing
// value); one above budget.proto's range is read as that range's top.
func (t *TenantBudget) applyGrant(g *pb.TenantGrant, sentEntry *pb.TenantSync, sent, received time.Time, p refreshPolicy) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mode == shutdown {
		return
	}
	// Cleared before the tokens land: a worker that runs dry after this wakes the refresher
	// again; one that ran dry before is served by this grant.
	t.syncWanted.Store(false)
	granted := g.GetGranted()
	var deposited uint64
	if t.ledger.source == sourceFallback {
		// Back from fallback: swap the fallback tokens for the leased ones in one exchange.
		// What was spent of them is in the ledger and goes out as fallback_spent.
		deposited = cappedTokens(granted)
		withdrawn := t.lease.replace(granted, lowWaterMark(granted))
		t.ledger.withdrew(withdrawn, 0)
		t.ledger.switchTo(sourceLease)
		t.endEpisodeLocked(received)
		t.fallback = nil
	} else {
		deposited = t.lease.deposit(granted, lowWaterMark(granted))
	}
	t.ledger.received(granted, deposited)
	if s := g.GetSafeShare(); s != nil {
		t.safeShares.note(bucketShape{s.GetCapacity(), s.GetRefillPerSecond(), s.GetSuccessCredit(),
			s.GetRequestCredit()}, received)
		t.lastSafeShareAt = received
	}
	ttl := time.Duration(0)
	if ms := g.GetLeaseTtlMs(); ms > 0 {
		ttl = maxLeaseTTL
		if ms < maxLeaseTTL.Milliseconds() {
			ttl = time.Duration(ms) * time.Millisecond
		}
	}
	t.expiry = sent.Add(ttl)
	t.shadow.Store(g.GetMode() == pb.Mode_MODE_SHADOW)
	t.mode = leased
	t.err = nil
	t.markReadyLocked()
	delay := nextSyncDelay(g.GetNextSyncMs(), p)
	t.nextDue = received.Add(delay)
	// Granted less than asked: the bucket is dry; next_sync_ms is then the retry-after.
	if granted < sentEntry.GetWant() {
		t.dryUntil = received.Add(delay)
	} else {
		t.dryUntil = farPast
	}
}

// TenantError is why the budget server refused a tenant (TenantStats.Err).
type TenantError struct {
	Tenant  string
	Code    codes.Code
	Message string
}

func (e *TenantError) Error() string {
	return fmt.Sprintf("%s: budget server refused tenant %q: %s", e.Code, e.Tenant, e.Message)
}

func (t *TenantBudget) applyRefusal(code codes.Code, message string, received time.Time, p refreshPolicy) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mode == shutdown {
		return
	}
	t.syncWanted.Store(false)
	if t.mode == leased || t.mode == inFallback || t.lease.held() > 0 {
		t.withdrawAllLocked(received)
	}
	t.mode = refused
	if code == codes.OK {
		code = codes.Unknown
	}
	t.err = &TenantError{Tenant: t.name, Code: code, Message: message}
	t.markReadyLocked()
	t.nextDue = received.Add(p.refreshPeriod)
	t.dryUntil = t.nextDue
}

// syncAgainAt: the server did not apply this tenant's entry (it named another owner, or none
// can grant now): the lease stays as it is; the next sync is due at `due`.
func (t *TenantBudget) syncAgainAt(due time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mode == shutdown {
		return
	}
	t.nextDue = due
	t.dryUntil = due
}

// fillFinal shuts the tenant down for good: withdraws every token, fills the final counters.
func (t *TenantBudget) fillFinal(now time.Time) *pb.TenantSync {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mode = shutdown
	t.markReadyLocked()
	t.withdrawAllLocked(now)
	out := &pb.TenantSync{}
	t.fillCountersLocked(t.snapshotWord(), out)
	out.Want = 0
	return out
}

func (t *TenantBudget) internalMode() leaseMode {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mode
}

// costLogger logs a cost outside [1, MaxCost] handed to TryAcquireN / RefundN: at most one
// line a minute per client (on its clock), the lines left out counted in the next. Only the
// bad-cost path reads the clock. Thread-safe.
type costLogger struct {
	clock      Clock
	logger     Logger
	mu         sync.Mutex
	lastLogged time.Time
	notLogged  uint64
}

func (c *costLogger) bad(call, tenant string, cost int) {
	if c == nil || c.logger == nil {
		return
	}
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastLogged.IsZero() && now.Sub(c.lastLogged) < time.Minute {
		c.notLogged++
		return
	}
	c.logger.Printf("retrybudget: %s(%d) on tenant %q: cost %d is outside [1, %d]; denied, "+
		"nothing counted (%d more such calls since the last such line)", call, cost, tenant,
		cost, MaxCost, c.notLogged)
	c.lastLogged = now
	c.notLogged = 0
}
