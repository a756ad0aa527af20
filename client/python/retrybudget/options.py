"""ClientOptions: the same options, with the same meaning and names, as the C++ client's
retrybudget::ClientOptions (durations in seconds, as floats or datetime.timedelta)."""

import datetime
import math
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from ._types import InvalidOptions

_MAX_FALLBACK_VALUE = 1e9
_MAX_BEARER_TOKEN_LENGTH = 4096
_MAX_WANT = 1_000_000


@dataclass
class ClientOptions:
    # gRPC target of the budget server, e.g. "127.0.0.1:50051" or "dns:///budget:50051", or of
    # several servers of a cluster: "ipv4:10.0.0.1:50051,10.0.0.2:50051". round_robin over its
    # addresses, as the C++ client (client.h, ClientOptions::target): a Sync that waited out
    # sync_timeout on a hung server is resent to the next address.
    target: str = "127.0.0.1:50051"
    # Random if empty. 1-128 printable ASCII characters.
    instance_id: str = ""
    # How often the refresher syncs when nothing wakes it earlier (the server may ask for less).
    refresh_period: float = 0.2
    # Never sync more often than this, even when woken.
    min_sync_interval: float = 0.005
    # Deadline of one Sync RPC; a Sync in flight is cut short (and resent with the same seq)
    # when a lease ends or a fallback token is due before it.
    sync_timeout: float = 1.0
    # Longest wait between two attempts to (re)connect to the server. Range [1 ms, 1 h].
    max_reconnect_backoff: float = 1.0
    # Tokens asked for on top of the estimated spend of one refresh period.
    lease_burst: int = 2
    # Time source (seconds, monotonic); time.monotonic if None.
    clock: Optional[Callable[[], float]] = None
    # When the server is unreachable and the lease has expired: "local_bucket" (the SafeShare
    # the server sent, the smallest of the last minute; or the bucket below if the server never
    # answered for the tenant) or "deny".
    fallback: str = "local_bucket"
    # The local bucket of a tenant the server never answered for, per process. Ranges [0, 1e9].
    fallback_capacity: float = 1.0
    fallback_refill_per_second: float = 0.1
    # A prometheus_client CollectorRegistry for the retry_budget_client_* metrics; None: none.
    # Two clients must not share one registry.
    metrics_registry: Any = None
    # grpc.ChannelCredentials of the channel (e.g. grpc.ssl_channel_credentials(...), mutual TLS
    # with a client key and certificate); None: insecure plaintext, for loopback and tests.
    channel_credentials: Any = None
    # When non-empty, every Sync carries `authorization: Bearer <bearer_token>`.
    # 1-4096 printable ASCII characters, no spaces.
    bearer_token: str = ""


def _seconds(field: str, value) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidOptions(f"options.{field} is {value!r}; expected seconds (a number or a "
                             "datetime.timedelta)")
    return float(value)


def validate_and_default(options: ClientOptions) -> ClientOptions:
    """A copy of `options` with defaults filled in; InvalidOptions naming the first bad field."""
    o = replace(options)
    if not isinstance(o.target, str) or not o.target:
        raise InvalidOptions(f"options.target is {o.target!r}; expected e.g. 127.0.0.1:50051")
    if not o.instance_id:
        o.instance_id = "rb-" + secrets.token_hex(16)
    elif (not isinstance(o.instance_id, str) or len(o.instance_id) > 128
          or any(not (0x20 <= ord(c) < 0x7f) for c in o.instance_id)):
        raise InvalidOptions(f"options.instance_id is {o.instance_id!r}; expected 1-128 "
                             "printable ASCII characters")
    for field in ("refresh_period", "min_sync_interval", "sync_timeout", "max_reconnect_backoff"):
        setattr(o, field, _seconds(field, getattr(o, field)))
    if not (o.refresh_period > 0 and math.isfinite(o.refresh_period)):
        raise InvalidOptions(f"options.refresh_period is {o.refresh_period}; it must be positive")
    if not 0 <= o.min_sync_interval <= o.refresh_period:
        raise InvalidOptions(f"options.min_sync_interval is {o.min_sync_interval}; it must be in "
                             f"[0, refresh_period = {o.refresh_period}]")
    if not (o.sync_timeout > 0 and math.isfinite(o.sync_timeout)):
        raise InvalidOptions(f"options.sync_timeout is {o.sync_timeout}; it must be positive")
    if not 0.001 <= o.max_reconnect_backoff <= 3600:
        raise InvalidOptions(f"options.max_reconnect_backoff is {o.max_reconnect_backoff}; it "
                             "must be in [0.001, 3600] seconds")
    if (isinstance(o.lease_burst, bool) or not isinstance(o.lease_burst, int)
            or not 0 <= o.lease_burst <= _MAX_WANT):
        raise InvalidOptions(f"options.lease_burst is {o.lease_burst!r}; it must be an integer "
                             f"in [0, {_MAX_WANT}]")
    if o.fallback not in ("local_bucket", "deny"):
        raise InvalidOptions(f"options.fallback is {o.fallback!r}; expected 'local_bucket' or "
                             "'deny'")
    for field in ("fallback_capacity", "fallback_refill_per_second"):
        value = getattr(o, field)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not (math.isfinite(value) and 0 <= value <= _MAX_FALLBACK_VALUE)):
            raise InvalidOptions(f"options.{field} is {value!r}; it must be in [0, 1e9]")
    token = o.bearer_token
    if token:
        if not isinstance(token, str) or len(token) > _MAX_BEARER_TOKEN_LENGTH:
            raise InvalidOptions("options.bearer_token is too long or not a string; at most "
                                 f"{_MAX_BEARER_TOKEN_LENGTH} characters are allowed")
        for i, c in enumerate(token):
            if not 0x20 < ord(c) < 0x7f:
                raise InvalidOptions(f"options.bearer_token has character code {ord(c)} at "
                                     f"position {i}; only printable ASCII without spaces is "
                                     "allowed")
    if o.clock is None:
        o.clock = time.monotonic
    return o


def channel_options(o: ClientOptions, main: bool = True):
    """The channel arguments the C++ client sets (client/client.cc): a short reconnect backoff,
    no transparent retries (the refresher resends with the same seq), keepalive with calls; and
    for the main channel (`main`, the target's) round_robin: a connection to every address of the
    target, each Sync to the next connected one, so a hung server holds only the Syncs sent to
    it (see ClientOptions.target). An owner's channel (one address) keeps pick_first."""
    max_ms = max(1, int(o.max_reconnect_backoff * 1000))
    lb = [("grpc.lb_policy_name", "round_robin")] if main else []
    return lb + [
        ("grpc.initial_reconnect_backoff_ms", min(100, max_ms)),
        ("grpc.max_reconnect_backoff_ms", max_ms),
        ("grpc.min_reconnect_backoff_ms", max(1000, max_ms)),
        ("grpc.enable_retries", 0),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 0),
    ]
