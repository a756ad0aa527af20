"""The refresher's books for one tenant (the ledger rule of the C++ client's tenant_ledger): what
went into the lease word and what came out, per source (server leases, local fallback bucket),
turned into the cumulative counters a Sync reports. Not thread-safe: the owner serialises calls.

Per source, with `held` the tokens of that source in the word now:

    exact    = in - out - held                      (takes minus refunds: retries really sent)
    refunded = max(refunded, reported_spent - exact)  at each report
    reported_spent = exact + refunded               at each report

so both reported counters are monotonic and `reported_spent - refunded` is the exact count at
the report: a token refunded after the Sync that reported it is reported as refunded, and goes
back to the server when it is withdrawn (expiry, shutdown) or is spent again. A withdrawal counts
as out only the tokens this source can have in the word, `min(withdrawn, in - out - held_after)`;
the rest (refunds that landed after the source switched) stay spent in the other source's books.

Wire: retries_spent = lease.reported_spent + fallback.reported_spent, retries_refunded =
lease.refunded + fallback.refunded, fallback_spent = fallback.reported_spent, fallback_refunded =
fallback.refunded, tokens_returned = lease.out, tokens_received = lease.in. Then every report
has `net leased spent + tokens_returned = lease.in - held <= tokens_received`."""

LEASE = "lease"
FALLBACK = "fallback"


def _sub(a: int, b: int) -> int:
    return a - b if a > b else 0


class TokenAccount:
    __slots__ = ("in_", "out", "absorbed", "reported_spent", "refunded")

    def __init__(self):
        self.in_ = 0
        self.out = 0
        self.absorbed = 0  # withdrawn tokens that were not this source's (diagnostics only)
        self.reported_spent = 0
        self.refunded = 0

    def withdrew(self, withdrawn: int, held_after: int) -> None:
        back = min(withdrawn, _sub(self.in_, self.out + held_after))
        self.out += back
        self.absorbed += withdrawn - back

    def report(self, held: int) -> None:
        exact = self.exact_spent(held)
        self.refunded = max(self.refunded, self.reported_spent - exact)
        self.reported_spent = exact + self.refunded

    def exact_spent(self, held: int) -> int:
        return _sub(self.in_, self.out + held)


class TenantLedger:
    def __init__(self):
        self._lease = TokenAccount()
        self._fallback = TokenAccount()
        self.source = LEASE

    def _held_by(self, source: str, held: int) -> int:
        return held if self.source == source else 0

    def received(self, granted: int, deposited: int) -> None:
        self._lease.in_ += granted
        if deposited < granted:
            self._lease.out += granted - deposited

    def fallback_deposited(self, n: int) -> None:
        self._fallback.in_ += n

    def withdrew(self, withdrawn: int, held_after: int) -> None:
        account = self._lease if self.source == LEASE else self._fallback
        account.withdrew(withdrawn, held_after)

    def switch_to(self, source: str) -> None:
        self.source = source

    def report(self, held: int) -> None:
        """Brings both sources' reported counters up to date while the word holds `held`; read
        them with the properties below."""
        self._lease.report(self._held_by(LEASE, held))
        self._fallback.report(self._held_by(FALLBACK, held))

    def report_spent(self, held: int) -> int:
        """report(held), then the cumulative retries_spent."""
        self.report(held)
        return self.reported_spent

    def exact_spent(self, held: int) -> int:
        return self._lease.exact_spent(self._held_by(LEASE, held)) + self.exact_fallback_spent(held)

    def exact_fallback_spent(self, held: int) -> int:
        return self._fallback.exact_spent(self._held_by(FALLBACK, held))

    @property
    def reported_spent(self) -> int:
        return self._lease.reported_spent + self._fallback.reported_spent

    @property
    def reported_refunded(self) -> int:
        return self._lease.refunded + self._fallback.refunded

    @property
    def reported_fallback_spent(self) -> int:
        return self._fallback.reported_spent

    @property
    def reported_fallback_refunded(self) -> int:
        return self._fallback.refunded

    @property
    def tokens_received(self) -> int:
        return self._lease.in_

    @property
    def tokens_returned(self) -> int:
        return self._lease.out
