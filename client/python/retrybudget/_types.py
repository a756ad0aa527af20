"""Public value types and exceptions of the retrybudget package."""

from dataclasses import dataclass
from typing import Optional

# Where a tenant's retry tokens come from right now (the `mode` label of the client metrics).
NO_LEASE = "no_lease"            # no lease in force and the server answering: deny
LEASE = "lease"                  # a lease from the server is in force
FALLBACK = "fallback"            # server unreachable, no lease: the local fallback bucket
DENY_FALLBACK = "deny_fallback"  # server unreachable, no lease, fallback="deny": deny
MODES = (NO_LEASE, LEASE, FALLBACK, DENY_FALLBACK)

# Whether a tenant's budget denies (TenantStats.enforcement, from TenantGrant.mode).
ENFORCE = "enforce"  # a retry with no token is denied (a new tenant, until its first grant)
SHADOW = "shadow"    # a dry run: every retry is allowed; those without a token are counted


@dataclass(frozen=True)
class TenantStats:
    """Counters of one tenant in this process, cumulative since the client was created."""
    successes: int = 0
    # Retries: try_acquire() returned True taking tokens, minus the refund() calls that gave
    # tokens back (lease + fallback). A count, whatever each retry cost.
    retries_allowed: int = 0
    retries_denied: int = 0     # try_acquire() returned False
    # Of tokens_spent, those from the local fallback bucket (retries, when each costs 1).
    fallback_allowed: int = 0
    tokens_received: int = 0    # granted by the server and received
    tokens_returned: int = 0    # given back unspent
    tokens_held: int = 0        # in the lease right now
    # refund() calls that gave tokens back (deducted from retries_allowed; their tokens from
    # tokens_spent).
    refunds: int = 0
    # Of successes, those whose credit this process's fallback buckets deposited locally
    # (success-funded fallback; the server does not credit them again).
    successes_credited_locally: int = 0
    lease_active: bool = False  # a lease from the server is in force
    mode: str = NO_LEASE        # one of MODES
    # Tokens the allowed retries took (a retry of cost c takes c), minus those refunded.
    tokens_spent: int = 0
    requests: int = 0           # record_request() calls
    # Of requests, those whose credit this process's fallback buckets deposited locally.
    requests_credited_locally: int = 0
    # Shadow mode: retries allowed that enforcement would have denied (no token taken), and
    # their cost not yet refunded.
    shadow_denied: int = 0
    unbacked: int = 0
    enforcement: str = ENFORCE  # ENFORCE or SHADOW
    # Why the server refused this tenant in the last Sync (e.g. "NOT_FOUND: ..."); None when the
    # last answer for it was a grant or none came yet.
    error: Optional[str] = None


class InvalidOptions(ValueError):
    """A ClientOptions field (or a tenant name) is out of range; the message names it and its
    value."""


class ClientClosed(RuntimeError):
    """A new tenant was asked for after close()."""


class BudgetExhausted(Exception):
    """The retry budget denied a retry. Raised by the retry helpers (and the tenacity hooks)
    from the last attempt's error, which is `last_error` (also `__cause__`)."""

    def __init__(self, last_error: BaseException, attempts: int):
        super().__init__(f"retry budget exhausted after {attempts} attempt(s); last error: "
                         f"{last_error!r}")
        self.last_error = last_error
        self.attempts = attempts
