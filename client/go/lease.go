package retrybudget

import "sync/atomic"

// lease is the tokens this process holds for one tenant: the only state TryAcquire touches.
// One 64-bit atomic word, so taking a token is one compare-and-swap loop that never lets the
// count go below zero (the layout of the C++ client's Lease):
//
//	bits  0-31  tokens held
//	bits 32-62  low-water mark: the take that brings the count down to it reports takenLow,
//	            so the refresher is woken to refresh early (~20% of the last grant)
//	bit  63     closed: no token may be taken (no lease yet, expired, refused, deny
//	            fallback, shut down); tokens in a closed word (a Refund racing a withdrawal)
//	            cannot be taken
//
// The word holds leased tokens or, while the server is unreachable, tokens the refresher puts
// in from the local fallback bucket; the ledger keeps the books of each.
//
// Thread-safe: every method may be called from any goroutine at any time.
type lease struct {
	word atomic.Uint64
}

const (
	maxLeaseTokens = uint64(1)<<31 - 1
	maxLeaseMark   = uint64(1)<<31 - 1
	markShift      = 32
	tokenMask      = uint64(1)<<markShift - 1
	closedBit      = uint64(1) << 63
)

type take int

const (
	taken    take = iota // the tokens were taken
	takenLow             // taken, and the count fell to the low-water mark (or below it, or to 0)
	empty                // nothing taken: the count is below the cost or the lease is closed
)

func newLease() *lease {
	l := &lease{}
	l.word.Store(closedBit) // no lease until the first grant
	return l
}

func wordTokens(w uint64) uint64 { return w & tokenMask }
func wordMark(w uint64) uint64   { return (w &^ closedBit) >> markShift }

// tryTake takes `cost` (>= 1, at most maxCost) tokens if the lease is open and holds that
// many: all or nothing, never a partial take. Lock-free, no allocation, no clock read. A CAS
// loop rather than one atomic add: an unconditional subtraction from a word holding less would
// borrow into the mark, and every exchange of the refresher would then have to carry
// in-flight debts over (see the C++ Lease::TryTake for the whole argument). takenLow when the
// take crosses the low-water mark (from above it to at or below it), so a take of several
// tokens that jumps past the mark still wakes the refresher, once.
func (l *lease) tryTake(cost uint64) take {
	w := l.word.Load()
	for w&closedBit == 0 && wordTokens(w) >= cost {
		if l.word.CompareAndSwap(w, w-cost) {
			if after, mark := wordTokens(w)-cost, wordMark(w); after <= mark && wordTokens(w) > mark {
				return takenLow
			}
			return taken
		}
		w = l.word.Load()
	}
	return empty
}

// refund puts back `cost` tokens taken by tryTake. If the lease was closed meanwhile the
// tokens stay unspendable until the refresher withdraws them.
func (l *lease) refund(cost uint64) { l.word.Add(cost) }

// deposit adds up to n tokens (the count is capped at maxLeaseTokens), sets the low-water mark
// and opens the lease. Returns how many tokens were added; the caller accounts for the rest
// as given back.
func (l *lease) deposit(n, mark uint64) uint64 {
	if mark > maxLeaseMark {
		mark = maxLeaseMark
	}
	for {
		w := l.word.Load()
		held := wordTokens(w)
		var added uint64
		if held < maxLeaseTokens {
			added = minU64(n, maxLeaseTokens-held)
		}
		if l.word.CompareAndSwap(w, (held+added)|mark<<markShift) {
			return added
		}
	}
}

// replace takes every token out and puts capped(n) in with the mark, open, in one exchange
// (workers never see an empty word in between). Returns the tokens taken out.
func (l *lease) replace(n, mark uint64) uint64 {
	if mark > maxLeaseMark {
		mark = maxLeaseMark
	}
	return wordTokens(l.word.Swap(cappedTokens(n) | mark<<markShift))
}

func cappedTokens(n uint64) uint64 { return minU64(n, maxLeaseTokens) }

// withdrawAndClose closes the lease and takes every token out. Returns the tokens taken out.
func (l *lease) withdrawAndClose() uint64 { return wordTokens(l.word.Swap(closedBit)) }

// held is the tokens in the word right now (spendable or not).
func (l *lease) held() uint64 { return wordTokens(l.word.Load()) }

// open reports whether a lease is in force.
func (l *lease) open() bool { return l.word.Load()&closedBit == 0 }

func minU64(a, b uint64) uint64 {
	if a < b {
		return a
	}
	return b
}
