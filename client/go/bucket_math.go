package retrybudget

import (
	"math"
	"time"
)

// The numbers behind a tenant's leases and its fallback bucket (the C++ client's
// refresh_policy, demand_estimator, fallback_bucket and recent_extreme). Plain values and
// single-owner objects: nothing here is thread-safe; the owner serialises calls.

const (
	// maxWant is the largest `want` a request may carry (budget.proto: TenantSync.want).
	maxWant = 1_000_000
	// lowWaterFraction of the last grant: the lease counts as low and the refresher is woken.
	lowWaterFraction = 0.2
	// First and largest wait before resending a Sync that failed.
	firstRetryBackoff = 20 * time.Millisecond
	maxRetryBackoff   = time.Second
	// A Sync is cut short for a fallback step due sooner than this (never for a lease expiry).
	minFallbackStepWindow = 20 * time.Millisecond
	// finalSyncAttempts of the final Sync sent by Close, each bounded by SyncTimeout.
	finalSyncAttempts = 3
	// SafeShareMemory: a fallback bucket is the smallest SafeShare the server sent for the
	// tenant within this long before its last answer (a server that restarted sees the fleet
	// rejoin one by one and may offer the first instances the share of a smaller fleet).
	SafeShareMemory = 60 * time.Second
	// demandTau is the decay time constant of the demand rate.
	demandTau = 1.0
	// maxLeaseTTL: a lease_ttl_ms above budget.proto's range (600000) is read as this.
	maxLeaseTTL = 600 * time.Second
	// maxTenantsPerClient: one Sync carries at most 256 entries (budget.proto).
	maxTenantsPerClient = 256
	// creditStepInterval: the longest wait between two steps of a fallback bucket funded by
	// success credit that is not full (successes are only seen at steps, and credit that waits
	// while workers run dry is retries denied).
	creditStepInterval = 50 * time.Millisecond
)

// farFuture and farPast stand for "never" and "long ago" (absl's InfiniteFuture/Past).
var (
	farFuture = time.Unix(1<<40, 0)
	farPast   = time.Time{}
)

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// addDur is t + d that stays at farFuture / farPast instead of moving them.
func addDur(t time.Time, d time.Duration) time.Time {
	if !t.Before(farFuture) || t.Equal(farPast) {
		return t
	}
	return t.Add(d)
}

type refreshPolicy struct {
	refreshPeriod   time.Duration
	minSyncInterval time.Duration
	leaseBurst      uint64
}

// lowWaterMark is ceil(20%) of a grant: a grant of one token or more has a mark of >= 1.
func lowWaterMark(granted uint64) uint64 {
	return uint64(math.Ceil(float64(granted) * lowWaterFraction))
}

// nextSyncDelay is the server's hint, at most refreshPeriod and at least minSyncInterval.
func nextSyncDelay(nextSyncMs int64, p refreshPolicy) time.Duration {
	if nextSyncMs <= 0 {
		return p.refreshPeriod
	}
	d := p.refreshPeriod
	if nextSyncMs < p.refreshPeriod.Milliseconds()+1 {
		d = time.Duration(nextSyncMs) * time.Millisecond
		if d > p.refreshPeriod {
			d = p.refreshPeriod
		}
	}
	if d < p.minSyncInterval {
		d = p.minSyncInterval
	}
	return d
}

// retryBackoff is 20 ms doubling up to 1 s after `failures` (>= 1) failed Syncs, never below
// minSyncInterval.
func retryBackoff(failures int, p refreshPolicy) time.Duration {
	b := firstRetryBackoff
	for i := 1; i < failures && b < maxRetryBackoff; i++ {
		b *= 2
	}
	if b > maxRetryBackoff {
		b = maxRetryBackoff
	}
	if b < p.minSyncInterval {
		b = p.minSyncInterval
	}
	return b
}

// demandEstimator is the exponentially decayed rate of retry demand (spent + denied) per second.
type demandEstimator struct {
	last      time.Time
	lastTotal uint64
	rate      float64
}

func (d *demandEstimator) observe(now time.Time, cumulative uint64) {
	dt := now.Sub(d.last).Seconds()
	if dt < 0 {
		dt = 0
	}
	delta := subU64(cumulative, d.lastTotal)
	d.rate = d.rate*math.Exp(-dt/demandTau) + float64(delta)/demandTau
	d.last = maxTime(d.last, now)
	if cumulative > d.lastTotal {
		d.lastTotal = cumulative
	}
}

// wantFor is enough for `rate` per second over `period`, plus `burst`, minus what is `held`.
func wantFor(rate float64, period time.Duration, burst, held uint64) uint64 {
	if !(rate > 0) {
		rate = 0
	}
	total := math.Ceil(rate*period.Seconds()) + float64(burst)
	if total <= float64(held) {
		return 0
	}
	w := total - float64(held)
	if w > maxWant {
		return maxWant
	}
	return uint64(w)
}

// bucketShape is a bucket's capacity (tokens), refill (tokens per second), success credit
// and request credit (tokens per success / request recorded in fallback, not divided:
// SafeShare.success_credit, request_credit).
type bucketShape struct {
	capacity, refillPerSecond, successCredit, requestCredit float64
}

// smaller is the smaller of two shapes in each dimension.
func (s bucketShape) smaller(o bucketShape) bucketShape {
	return bucketShape{math.Min(s.capacity, o.capacity), math.Min(s.refillPerSecond, o.refillPerSecond),
		math.Min(s.successCredit, o.successCredit), math.Min(s.requestCredit, o.requestCredit)}
}

// localCredit is the books of one counter that funds fallback buckets (successes, requests):
// the most any request built so far carried (the server may credit all of those), the count
// up to which fallback steps have considered crediting, and how many the fallback buckets
// credited (cumulative, never above the counter; TenantSync.*_credited_locally). Each count is
// credited once, locally or by the server.
type localCredit struct {
	inRequests, considered, creditedLocally uint64
}

// creditOffer is what a fallback step may credit of one counter: `count` recorded since the
// last step and carried by no request, `credited` of them taken by the bucket.
type creditOffer struct {
	count, credited uint64
	into            *localCredit
}

// offer is the counts up to `total` recorded since the last fallback step that no request
// built so far carries (the server may have applied any request built, so only later ones may
// be credited by the fallback bucket); marks them as considered. The bucket's refill fills
// the offer's credited count, which the offer adds to creditedLocally.
func (c *localCredit) offer(total uint64) *creditOffer {
	from := c.inRequests
	if c.considered > from {
		from = c.considered
	}
	if total > c.considered {
		c.considered = total
	}
	return &creditOffer{count: subU64(total, from), into: c}
}

// carried: a request built now carries `total` (the server may credit them all).
func (c *localCredit) carried(total uint64) {
	if total > c.inRequests {
		c.inRequests = total
	}
}

// recentSmallest is the smallest shape noted within the last window: two aligned slots, as
// the C++ RecentExtreme (covers [now - window, now], never anything 2 windows old).
type recentSmallest struct {
	window            time.Duration
	start             time.Time
	current, previous *bucketShape
}

func (r *recentSmallest) roll(now time.Time) {
	age := now.Sub(r.start)
	if age < r.window {
		return
	}
	if age < 2*r.window {
		r.previous = r.current
		r.start = r.start.Add(r.window)
	} else {
		r.previous = nil
		r.start = now
	}
	r.current = nil
}

func (r *recentSmallest) note(s bucketShape, now time.Time) {
	r.roll(now)
	if r.current == nil {
		r.current = &s
	} else {
		c := r.current.smaller(s)
		r.current = &c
	}
}

func (r *recentSmallest) get(now time.Time) *bucketShape {
	r.roll(now)
	if r.previous == nil {
		return r.current
	}
	if r.current == nil {
		return r.previous
	}
	c := r.current.smaller(*r.previous)
	return &c
}

const bucketEpsilon = 1e-6

// sanitize turns NaN, infinite and negative values (a lying server) into 0, and caps the rest.
func sanitize(v, most float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return math.Min(v, most)
}

// fallbackBucket is the local bucket of a tenant whose server is unreachable. Its whole tokens
// sit in the lease word, where workers take them without telling anyone; refill is told what
// the word holds and returns how many whole tokens to add. Starts full at capacity (at least
// one token when it refills at all), refills at refillPerSecond; tokens taken between two
// steps count as taken just before the later one, so over a run:
// handed out <= cap + refill * elapsed + successCredit * (successes credited).
//
// Success- and request-funded fallback: refill also takes the successes and the requests
// recorded since the last step that may be credited here (the caller offers only those it has
// put in no request: the server may have applied any request built). Each success deposits
// successCredit, then each request requestCredit, up to the cap; one whose credit does not fit
// is not credited here, and the caller reports it to the server as an ordinary success or
// request (credited there). So each is credited once, locally or centrally.
type fallbackBucket struct {
	shape bucketShape
	cap   float64
	level float64
	held  uint64
	last  time.Time
}

// newFallbackBucket is full, or empty with startFull false (a spent lease falling back early:
// its share of the burst went in the lease).
func newFallbackBucket(s bucketShape, now time.Time, startFull bool) *fallbackBucket {
	shape := bucketShape{sanitize(s.capacity, float64(maxLeaseTokens)),
		sanitize(s.refillPerSecond, float64(maxLeaseTokens)),
		sanitize(s.successCredit, float64(maxLeaseTokens)),
		sanitize(s.requestCredit, float64(maxLeaseTokens))}
	c := shape.capacity
	if shape.refillPerSecond > 0 {
		c = math.Max(c, 1)
	}
	level := shape.capacity
	if !startFull {
		level = 0
	}
	return &fallbackBucket{shape: shape, cap: c, level: level, last: now}
}

// refill is the whole tokens to put into the word at `now`, which holds `held` tokens right
// now (taken tokens lower it, refunds raise it); the caller deposits exactly that count.
// `successes` then `requests` may be credited (see the type comment): whole ones only, as many
// as fit below the cap; each offer's credited count and books are updated.
func (b *fallbackBucket) refill(now time.Time, held uint64, successes, requests *creditOffer) (add uint64) {
	dt := now.Sub(b.last).Seconds()
	if dt < 0 {
		dt = 0
	}
	b.last = maxTime(b.last, now)
	// Growth since the last step, as if every take since then happened just now.
	grown := math.Max(b.level, math.Min(b.cap, b.level+b.shape.refillPerSecond*dt))
	level := math.Max(grown-float64(b.held)+float64(held), float64(held))
	level = b.credit(level, successes, b.shape.successCredit)
	level = b.credit(level, requests, b.shape.requestCredit)
	// The epsilon absorbs rounding in rate * time (a token due at t is there at t).
	whole := math.Floor(level + bucketEpsilon)
	if whole > float64(held) {
		add = uint64(whole) - held
	}
	b.level = level
	b.held = held + add
	return add
}

// credit deposits `per` tokens for each of the offer's counts that fits below the cap (whole
// ones only: those that do not fit stay the server's to credit); returns the new level.
func (b *fallbackBucket) credit(level float64, o *creditOffer, per float64) float64 {
	if o == nil || o.count == 0 || per <= 0 || level >= b.cap {
		return level
	}
	room := math.Floor((b.cap-level)/per + bucketEpsilon)
	o.credited = o.count
	if room < float64(o.count) {
		o.credited = uint64(room)
	}
	o.into.creditedLocally += o.credited
	return level + float64(o.credited)*per
}

func (b *fallbackBucket) full() bool {
	return b.shape.refillPerSecond > 0 && math.Floor(b.level+bucketEpsilon)+1 > b.cap+bucketEpsilon
}

// nextTokenAt is when the next step is due if nobody takes a token: the next whole token of
// refill or, for a bucket funded by success credit and not full, at most creditStepInterval
// away. farFuture when the bucket is full or gains nothing. Valid after refill.
func (b *fallbackBucket) nextTokenAt() time.Time {
	creditStep := farFuture
	if (b.shape.successCredit > 0 || b.shape.requestCredit > 0) && b.level+bucketEpsilon < b.cap {
		creditStep = b.last.Add(creditStepInterval)
	}
	if b.shape.refillPerSecond <= 0 || b.full() {
		return creditStep
	}
	next := math.Floor(b.level+bucketEpsilon) + 1
	micros := (next - b.level) / b.shape.refillPerSecond * 1e6
	return minTime(creditStep,
		b.last.Add(time.Duration(math.Min(math.Max(1, math.Ceil(micros-1e-3)), 1e15))*time.Microsecond))
}
