package retrybudget

import (
	"errors"
	"fmt"
)

// Mode is where a tenant's retry tokens come from right now.
type Mode int

const (
	// ModeNoLease: no lease in force and the server answering (none yet, expired, refused,
	// shut down): TryAcquire denies until a grant arrives.
	ModeNoLease Mode = iota
	// ModeLease: a lease from the server is in force.
	ModeLease
	// ModeFallback: the server is unreachable and no lease is in force, or the lease holds
	// no token and the server is down (unreachable for a refresh period, or the tenant's shard
	// has no owner): tokens come from the local fallback bucket.
	ModeFallback
	// ModeDenyFallback: as ModeFallback, with ClientOptions.Fallback FallbackDeny: deny.
	ModeDenyFallback
)

// String is "no_lease", "lease", "fallback" or "deny_fallback" (the `mode` label of the
// client metrics).
func (m Mode) String() string {
	switch m {
	case ModeNoLease:
		return "no_lease"
	case ModeLease:
		return "lease"
	case ModeFallback:
		return "fallback"
	case ModeDenyFallback:
		return "deny_fallback"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

var allModes = []Mode{ModeNoLease, ModeLease, ModeFallback, ModeDenyFallback}

// FallbackMode is what a client does once the server is unreachable and its lease expired
// (or is spent with the server down; see ClientOptions.Fallback).
type FallbackMode int

const (
	// FallbackLocalBucket allows retries from a local token bucket: the SafeShare the server
	// sent for the tenant (the smallest of SafeShareMemory before its last answer), or
	// FallbackCapacity / FallbackRefillPerSecond when the server never answered for it.
	FallbackLocalBucket FallbackMode = iota
	// FallbackDeny denies every retry until the server answers again.
	FallbackDeny
)

// TenantStats are the counters of one tenant in this process, cumulative since the client
// was created.
type TenantStats struct {
	Successes uint64
	Requests  uint64 // RecordRequest calls (first attempts)
	// Retries TryAcquireN allowed with tokens (true, whatever the cost), minus the RefundN
	// calls that gave tokens back (lease + fallback). A count of retries.
	RetriesAllowed uint64
	// The tokens those retries spent (a retry of cost c spends c), net of refunds.
	TokensSpent   uint64
	RetriesDenied uint64 // TryAcquireN returned false (never in shadow mode)
	// Would-be denials: retries a shadow tenant let through that enforcement would have
	// denied (no token taken).
	ShadowDenied    uint64
	FallbackAllowed uint64 // of TokensSpent, the tokens from the local fallback bucket
	TokensReceived  uint64 // granted by the server and received
	TokensReturned  uint64 // given back unspent
	TokensHeld      int64  // in the lease right now
	Refunds         uint64 // RefundN calls that gave tokens back (deducted from RetriesAllowed)
	// Of Successes, those whose credit (SafeShare.success_credit) went into this process's
	// fallback bucket (TenantSync.successes_credited_locally); the server credits the others.
	SuccessesCreditedLocally uint64
	// Of Requests, those whose credit (SafeShare.request_credit) went into this process's
	// fallback bucket (TenantSync.requests_credited_locally).
	RequestsCreditedLocally uint64
	// Shadow: the tenant's policy is a dry run (the last answer for it said MODE_SHADOW).
	Shadow      bool
	LeaseActive bool // a lease from the server is in force
	Mode        Mode
	// Why the server refused this tenant in the last Sync (e.g. NOT_FOUND on a strict
	// server); nil when the last answer for it was a grant or none came yet.
	Err error
}

var (
	// ErrBudgetExhausted marks an error returned because the retry budget denied a retry:
	// errors.Is(err, ErrBudgetExhausted). The error also wraps the last attempt's error.
	ErrBudgetExhausted = errors.New("retry budget exhausted")
	// ErrInvalidOptions marks a bad option; the message names the option and its value.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrClientClosed: a new tenant was asked for after Close.
	ErrClientClosed = errors.New("retrybudget: client closed")
)

func invalidf(format string, args ...interface{}) error {
	return fmt.Errorf("%w: "+format, append([]interface{}{ErrInvalidOptions}, args...)...)
}
