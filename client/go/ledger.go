package retrybudget

// tenantLedger is the refresher's books for one tenant (the C++ TenantLedger): what went into
// the lease word and what came out, per source (server leases, local fallback bucket), turned
// into the cumulative counters a Sync reports. Not thread-safe: the tenant's mu serialises it.
//
// Per source, with held = this source's tokens now in the word:
//
//	exact = in - out - held                 (takes minus refunds: the retries really sent)
//	at each report: refunded = max(refunded, reportedSpent - exact)
//	                reportedSpent = exact + refunded
//
// so both reported counters are monotonic and reportedSpent - refunded = exact: a Refund after
// the Sync that reported its take is reported as refunded (the server gives the token back to
// the bucket when it comes back as returned), never absorbed. The wire counters are
//
//	retries_spent = lease.reportedSpent + fallback.reportedSpent
//	retries_refunded = lease.refunded + fallback.refunded
//	fallback_spent = fallback.reportedSpent, fallback_refunded = fallback.refunded
//	tokens_returned = lease.out, tokens_received = lease.in
//
// and the server's checks hold for every report: refunded <= spent (per source),
// fallback_refunded <= retries_refunded, and lease.exact + lease.out <= lease.in, i.e.
// (retries_spent - fallback_spent) - (retries_refunded - fallback_refunded) + tokens_returned
// <= tokens_received.
type tokenAccount struct {
	in, out, reportedSpent, refunded uint64
}

func subU64(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

// withdrew: `withdrawn` tokens left the word, which holds heldAfter of this source's tokens
// right after. They count as out except those that are not this source's (a Refund that landed
// after the source switched): only what keeps exact >= 0 counts; the rest stay spent in the
// other source's books (the safe direction).
func (a *tokenAccount) withdrew(withdrawn, heldAfter uint64) {
	back := minU64(withdrawn, subU64(subU64(a.in, a.out), heldAfter))
	a.out += back
}

// exact is the retries this source really allowed: takes minus refunds. Not monotonic.
func (a *tokenAccount) exact(held uint64) uint64 { return subU64(a.in, a.out+held) }

// report fills reportedSpent and refunded for a new request (both monotonic).
func (a *tokenAccount) report(held uint64) {
	e := a.exact(held)
	if r := subU64(a.reportedSpent, e); r > a.refunded {
		a.refunded = r
	}
	a.reportedSpent = e + a.refunded
}

type tokenSource int

const (
	sourceLease tokenSource = iota
	sourceFallback
)

// wordSnapshot is what workers changed in the lease word besides the refresher's deposits and
// withdrawals, as the refresher reads it for a report or Stats: refunded first, then held, then
// extra (TenantBudget.snapshotWord), so a take or a refund racing with the read is at worst
// left out of this reading, never counted ahead of the word.
type wordSnapshot struct {
	refunded uint64 // tokens RefundN put back into the word, cumulative
	held     uint64 // tokens in the word
	extra    uint64 // of the takes of cost c > 1, the c - 1 above one token, cumulative
}

// tenantLedger is both sources' books. put and withdrawn count every token the refresher put
// into the word or took out of it (either source), so the takes, the retries allowed with
// tokens whatever their cost (TenantSync.retries_allowed before its cap), are what the word
// lost to workers less the extra tokens of the takes of cost above 1:
//
//	takes = put + refunded - withdrawn - held - extra
//
// The hot path counts nothing for a take of cost 1 (the C++ TenantLedger::Takes).
type tenantLedger struct {
	lease, fallback tokenAccount
	source          tokenSource
	put, withdrawn  uint64
}

func (l *tenantLedger) heldBy(s tokenSource, held uint64) uint64 {
	if l.source == s {
		return held
	}
	return 0
}

func (l *tenantLedger) received(granted, deposited uint64) {
	l.lease.in += granted
	l.put += deposited
	if deposited < granted {
		l.lease.out += granted - deposited
	}
}

func (l *tenantLedger) fallbackDeposited(n uint64) {
	l.fallback.in += n
	l.put += n
}

func (l *tenantLedger) withdrew(withdrawn, heldAfter uint64) {
	l.withdrawn += withdrawn
	if l.source == sourceLease {
		l.lease.withdrew(withdrawn, heldAfter)
	} else {
		l.fallback.withdrew(withdrawn, heldAfter)
	}
}

func (l *tenantLedger) switchTo(s tokenSource) { l.source = s }

// report updates both sources' reported counters for a request built while the word holds
// `held` tokens.
func (l *tenantLedger) report(held uint64) {
	l.lease.report(l.heldBy(sourceLease, held))
	l.fallback.report(l.heldBy(sourceFallback, held))
}

// takes is the successful takes the word shows (refunds not deducted; see tenantLedger).
func (l *tenantLedger) takes(w wordSnapshot) uint64 {
	return subU64(subU64(l.put+w.refunded, l.withdrawn+w.held), w.extra)
}

func (l *tenantLedger) exactSpent(held uint64) uint64 {
	return l.lease.exact(l.heldBy(sourceLease, held)) + l.exactFallbackSpent(held)
}

func (l *tenantLedger) exactFallbackSpent(held uint64) uint64 {
	return l.fallback.exact(l.heldBy(sourceFallback, held))
}

func (l *tenantLedger) reportedSpent() uint64 {
	return l.lease.reportedSpent + l.fallback.reportedSpent
}
func (l *tenantLedger) reportedRefunded() uint64      { return l.lease.refunded + l.fallback.refunded }
func (l *tenantLedger) tokensReceived() uint64        { return l.lease.in }
func (l *tenantLedger) tokensReturned() uint64        { return l.lease.out }
func (l *tenantLedger) reportedFallbackSpent() uint64 { return l.fallback.reportedSpent }
func (l *tenantLedger) reportedFallbackRefunded() uint64 {
	return l.fallback.refunded
}
