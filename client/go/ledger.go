package retrybudget

// tenantLedger is the refresher's books for one tenant (the C++ TenantLedger): what went into
// the lease word and what came out, per source (server leases, local fallback bucket), turned
// into the cumulative counters a Sync reports. Not thread-safe: the tenant's mu serialises it.
//
//	spent = in - out - held          (takes minus refunds)
//	tokens_received = lease.in, tokens_returned = lease.out,
//	fallback_spent = fallback.reportedSpent, retries_spent = lease.reported + fallback_spent
//
// A reported count never goes back: a refund after a report is absorbed (counted as spent).
type tokenAccount struct {
	in, out, absorbed, reportedSpent uint64
}

func subU64(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

func (a *tokenAccount) withdrew(withdrawn, heldAfter uint64) {
	unaccounted := subU64(subU64(a.in, a.out), a.reportedSpent)
	back := minU64(withdrawn, subU64(unaccounted, heldAfter))
	a.out += back
	a.absorbed += withdrawn - back
}

func (a *tokenAccount) reportSpent(held uint64) uint64 {
	if s := subU64(a.in, a.out+held); s > a.reportedSpent {
		a.reportedSpent = s
	}
	return a.reportedSpent
}

func (a *tokenAccount) exactSpent(held uint64) uint64 {
	return subU64(a.in, a.out+a.absorbed+held)
}

type tokenSource int

const (
	sourceLease tokenSource = iota
	sourceFallback
)

type tenantLedger struct {
	lease, fallback tokenAccount
	source          tokenSource
}

func (l *tenantLedger) heldBy(s tokenSource, held uint64) uint64 {
	if l.source == s {
		return held
	}
	return 0
}

func (l *tenantLedger) received(granted, deposited uint64) {
	l.lease.in += granted
	if deposited < granted {
		l.lease.out += granted - deposited
	}
}

func (l *tenantLedger) fallbackDeposited(n uint64) { l.fallback.in += n }

func (l *tenantLedger) withdrew(withdrawn, heldAfter uint64) {
	if l.source == sourceLease {
		l.lease.withdrew(withdrawn, heldAfter)
	} else {
		l.fallback.withdrew(withdrawn, heldAfter)
	}
}

func (l *tenantLedger) switchTo(s tokenSource) { l.source = s }

func (l *tenantLedger) reportSpent(held uint64) uint64 {
	return l.lease.reportSpent(l.heldBy(sourceLease, held)) +
		l.fallback.reportSpent(l.heldBy(sourceFallback, held))
}

func (l *tenantLedger) exactSpent(held uint64) uint64 {
	return l.lease.exactSpent(l.heldBy(sourceLease, held)) + l.exactFallbackSpent(held)
}

func (l *tenantLedger) exactFallbackSpent(held uint64) uint64 {
	return l.fallback.exactSpent(l.heldBy(sourceFallback, held))
}

func (l *tenantLedger) tokensReceived() uint64        { return l.lease.in }
func (l *tenantLedger) tokensReturned() uint64        { return l.lease.out }
func (l *tenantLedger) reportedFallbackSpent() uint64 { return l.fallback.reportedSpent }
