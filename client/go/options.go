package retrybudget

import (
	"crypto/rand"
	"encoding/hex"
	"log"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ClientOptions are the C++ client's retrybudget::ClientOptions, same names in Go style and
// same meaning. Start from DefaultClientOptions(): a zero duration is refused, not defaulted.
type ClientOptions struct {
	// Target is the gRPC target of the budget server, e.g. "127.0.0.1:50051", or of several
	// servers of one cluster: "ipv4:127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", or
	// "dns:///budget.example:50051". The channel is round_robin over the target's addresses
	// (a hung server holds only the Syncs sent to it); a tenant a cluster redirects is then
	// synced with its owner over a channel of its own (one address, pick_first; same
	// credentials and dial options), one Sync per owner per refresh. Name servers of one
	// cluster only: independent single servers would each grant from their own bucket.
	Target string
	// InstanceID: random if empty. 1-128 printable ASCII characters.
	InstanceID string
	// RefreshPeriod: how often the refresher syncs when nothing wakes it earlier (the server
	// may ask for less). Default 200 ms.
	RefreshPeriod time.Duration
	// MinSyncInterval: never sync more often than this, even when woken. Default 5 ms; in
	// [0, RefreshPeriod].
	MinSyncInterval time.Duration
	// SyncTimeout is the deadline of one Sync RPC. A Sync in flight is cut short (and resent
	// with the same seq) when a lease ends or a fallback token is due before it. Default 1 s.
	SyncTimeout time.Duration
	// MaxReconnectBackoff is the longest wait between two attempts to (re)connect (gRPC's
	// reconnect backoff starts at 100 ms and grows 1.6x with jitter up to this). Default 1 s;
	// in [1 ms, 1 h].
	MaxReconnectBackoff time.Duration
	// LeaseBurst: tokens asked for on top of the estimated spend of one refresh period.
	// Default 2; at most 1000000.
	LeaseBurst uint64
	// Clock is the time source; RealClock() if nil.
	Clock Clock

	// Fallback is what a tenant does once its lease expired (or it never had one) and the
	// last Sync attempt failed with anything but UNAUTHENTICATED or PERMISSION_DENIED, or
	// once its lease holds no token and the server has been unreachable for RefreshPeriod
	// (or its shard has no owner). It stays there until a response grants it a lease again;
	// the next Sync reports the retries allowed in fallback. A lease with tokens left is
	// spent first; one failed Sync never opens a fallback bucket.
	Fallback FallbackMode
	// The local bucket of a tenant the server never answered for, per process: starts full
	// at FallbackCapacity, refilled at FallbackRefillPerSecond. Defaults 1 and 0.1 (one retry
	// now, then one per 10 s). Ranges [0, 1e9].
	FallbackCapacity        float64
	FallbackRefillPerSecond float64

	// MetricsRegistry receives the retry_budget_client_* metrics (retries allowed, denied and
	// allowed in fallback, a shadow tenant's would-be denials, successes, requests, tokens held,
	// mode per tenant; syncs by result, sync errors by code, redirects). Nil: no metrics. Two
	// clients must not share one registry.
	MetricsRegistry prometheus.Registerer

	// TransportCredentials of the channels (e.g. credentials.NewTLS with a client
	// certificate for mutual TLS). Nil: insecure plaintext, fit only for loopback and tests.
	TransportCredentials credentials.TransportCredentials
	// BearerToken: when non-empty every Sync carries `authorization: Bearer <BearerToken>`.
	// 1-4096 printable ASCII characters, no spaces. Sent in the clear unless TLS.
	BearerToken string
	// Logger receives the client's rare log lines (Sync failures and recoveries, refusals at
	// most once a minute, redirect loops). Nil: the standard library's log package.
	Logger Logger
	// DialOptions are added to every channel the client dials (after its own).
	DialOptions []grpc.DialOption
}

// DefaultClientOptions are the defaults of every field; set Target (and what else you need).
func DefaultClientOptions() ClientOptions {
	return ClientOptions{
		Target:                  "127.0.0.1:50051",
		RefreshPeriod:           200 * time.Millisecond,
		MinSyncInterval:         5 * time.Millisecond,
		SyncTimeout:             time.Second,
		MaxReconnectBackoff:     time.Second,
		LeaseBurst:              2,
		Fallback:                FallbackLocalBucket,
		FallbackCapacity:        1,
		FallbackRefillPerSecond: 0.1,
	}
}

// Logger is where the client logs (a *log.Logger fits).
type Logger interface {
	Printf(format string, args ...interface{})
}

const (
	maxFallbackValue     = 1e9
	maxBearerTokenLength = 4096
)

func randomInstanceID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("retrybudget: no randomness for an instance id: " + err.Error())
	}
	return "rb-" + hex.EncodeToString(b[:])
}

// validateAndDefault returns a copy with the instance id and clock filled in, or an error
// (ErrInvalidOptions) naming the first bad field and its value.
func validateAndDefault(o ClientOptions) (ClientOptions, error) {
	if o.Target == "" {
		return o, invalidf("options.Target is empty; expected e.g. 127.0.0.1:50051")
	}
	if o.InstanceID == "" {
		o.InstanceID = randomInstanceID()
	} else if len(o.InstanceID) > 128 || !printableASCII(o.InstanceID, true) {
		return o, invalidf("options.InstanceID is %q; expected 1-128 printable ASCII characters", o.InstanceID)
	}
	if o.RefreshPeriod <= 0 {
		return o, invalidf("options.RefreshPeriod is %v; it must be positive (start from DefaultClientOptions())", o.RefreshPeriod)
	}
	if o.MinSyncInterval < 0 || o.MinSyncInterval > o.RefreshPeriod {
		return o, invalidf("options.MinSyncInterval is %v; it must be in [0, RefreshPeriod = %v]", o.MinSyncInterval, o.RefreshPeriod)
	}
	if o.SyncTimeout <= 0 {
		return o, invalidf("options.SyncTimeout is %v; it must be positive (start from DefaultClientOptions())", o.SyncTimeout)
	}
	if o.MaxReconnectBackoff < time.Millisecond || o.MaxReconnectBackoff > time.Hour {
		return o, invalidf("options.MaxReconnectBackoff is %v; it must be in [1ms, 1h]", o.MaxReconnectBackoff)
	}
	if o.LeaseBurst > maxWant {
		return o, invalidf("options.LeaseBurst is %d; at most %d is allowed", o.LeaseBurst, maxWant)
	}
	if o.Fallback != FallbackLocalBucket && o.Fallback != FallbackDeny {
		return o, invalidf("options.Fallback is %d; expected FallbackLocalBucket or FallbackDeny", int(o.Fallback))
	}
	for _, f := range []struct {
		name  string
		value float64
	}{{"FallbackCapacity", o.FallbackCapacity}, {"FallbackRefillPerSecond", o.FallbackRefillPerSecond}} {
		if math.IsNaN(f.value) || f.value < 0 || f.value > maxFallbackValue {
			return o, invalidf("options.%s is %v; it must be in [0, 1e9]", f.name, f.value)
		}
	}
	if t := o.BearerToken; t != "" {
		if len(t) > maxBearerTokenLength {
			return o, invalidf("options.BearerToken has %d characters; at most %d are allowed", len(t), maxBearerTokenLength)
		}
		for i := 0; i < len(t); i++ {
			// gRPC metadata values must be printable ASCII; a space would split "Bearer <token>".
			if c := t[i]; c <= 0x20 || c >= 0x7f {
				return o, invalidf("options.BearerToken has character code %d at position %d; only printable ASCII without spaces is allowed", c, i)
			}
		}
	}
	if o.Clock == nil {
		o.Clock = RealClock()
	}
	if o.Logger == nil {
		o.Logger = log.Default()
	}
	return o, nil
}

func printableASCII(s string, spaceOK bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x7f || c < 0x20 || (c == 0x20 && !spaceOK) {
			return false
		}
	}
	return true
}
