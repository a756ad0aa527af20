package retrybudget

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

const (
	// First wait before reconnecting (gRPC's default is 1 s): a restarted server is usually
	// back within a few hundred milliseconds.
	initialReconnectBackoff = 100 * time.Millisecond
	// Least time one connection attempt (TCP, TLS, HTTP/2 handshakes) is given.
	minConnectTimeout = time.Second
	// HTTP/2 keepalive while a Sync is in flight: a connection that went dead silently is
	// closed after this long without traffic plus the timeout (the server allows it: the
	// refresher sends data at least every refresh period).
	keepaliveTime    = 20 * time.Second
	keepaliveTimeout = 10 * time.Second
	// The main channel's policy: a connection to every address of the target, each Sync to
	// the next connected one. Owner channels (one address) keep pick_first.
	roundRobinConfig = `{"loadBalancingConfig":[{"round_robin":{}}]}`
)

var resolverSeq atomic.Uint64

// dialOptions are the C++ client's channel arguments: a short reconnect backoff, no
// transparent retries (the refresher resends a failed Sync itself, with the same seq),
// keepalive with calls in flight.
func dialOptions(o ClientOptions) []grpc.DialOption {
	base := initialReconnectBackoff
	if o.MaxReconnectBackoff < base {
		base = o.MaxReconnectBackoff
	}
	connect := minConnectTimeout
	if o.MaxReconnectBackoff > connect {
		connect = o.MaxReconnectBackoff
	}
	opts := []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: base, Multiplier: 1.6, Jitter: 0.2,
				MaxDelay: o.MaxReconnectBackoff},
			MinConnectTimeout: connect,
		}),
		grpc.WithDisableRetry(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime,
			Timeout: keepaliveTimeout, PermitWithoutStream: false}),
	}
	if o.TransportCredentials != nil {
		opts = append(opts, grpc.WithTransportCredentials(o.TransportCredentials))
	} else {
		opts = append(opts, grpc.WithInsecure())
	}
	return append(opts, o.DialOptions...)
}

// dialTarget opens the channel to a target. grpc-go has no `ipv4:` / `ipv6:` scheme (gRPC
// C++ and Python do): such a target, "ipv4:HOST:PORT,HOST:PORT", is given to the channel
// through a resolver of its own that lists exactly those addresses, so every client accepts
// the same targets. With `roundRobin` the channel balances over every address.
func dialTarget(target string, o ClientOptions, roundRobin bool) (*grpc.ClientConn, error) {
	opts := dialOptions(o)
	if roundRobin {
		opts = append(opts, grpc.WithDefaultServiceConfig(roundRobinConfig))
	}
	dial := target
	for _, scheme := range []string{"ipv4:", "ipv6:"} {
		if !strings.HasPrefix(target, scheme) {
			continue
		}
		addrs, err := parseAddressList(strings.TrimPrefix(target, scheme), scheme == "ipv6:")
		if err != nil {
			return nil, invalidf("options.Target %q: %v", target, err)
		}
		r := manual.NewBuilderWithScheme(fmt.Sprintf("retrybudget-static-%d", resolverSeq.Add(1)))
		state := resolver.State{}
		for _, a := range addrs {
			state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
		}
		r.InitialState(state)
		opts = append(opts, grpc.WithResolvers(r))
		dial = r.Scheme() + ":///" + strings.TrimPrefix(target, scheme)
	}
	conn, err := grpc.Dial(dial, opts...)
	if err != nil {
		return nil, invalidf("options.Target %q: cannot create a channel: %v", target, err)
	}
	return conn, nil
}

// parseAddressList parses "HOST:PORT,HOST:PORT" of an ipv4: / ipv6: target (an optional
// leading "//" authority part is ignored; a missing port is 443, as in gRPC C++).
func parseAddressList(list string, ipv6 bool) ([]string, error) {
	list = strings.TrimPrefix(list, "//")
	if list == "" {
		return nil, fmt.Errorf("no address")
	}
	var out []string
	for _, a := range strings.Split(list, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			host, port = strings.Trim(a, "[]"), "443"
		}
		ip := net.ParseIP(host)
		if ip == nil || (ip.To4() == nil) != ipv6 {
			return nil, fmt.Errorf("%q is not an %s address", a, map[bool]string{false: "IPv4", true: "IPv6"}[ipv6])
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("%q has no valid port", a)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

// checkOwnerAddress refuses an owner address a server named that is not HOST:PORT (a
// garbage or hostile answer is never dialled: the tenant is handled as UNAVAILABLE).
func checkOwnerAddress(addr string) error {
	if len(addr) > 261 || !printableASCII(addr, false) {
		return fmt.Errorf("owner address %q is not HOST:PORT", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || strings.ContainsAny(host, "/,") {
		return fmt.Errorf("owner address %q is not HOST:PORT", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("owner address %q has no valid port", addr)
	}
	return nil
}
