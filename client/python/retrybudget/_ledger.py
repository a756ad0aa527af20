"""The refresher's books for one tenant (a port of the C++ client's tenant_ledger): what went
into the lease and what came out, per source (server leases, local fallback bucket), turned into
the cumulative counters a Sync reports. Not thread-safe: the owner serialises calls.

    spent = in - out - held          (takes minus refunds)
    tokens_received = lease.in, tokens_returned = lease.out,
    fallback_spent = fallback.reported_spent, retries_spent = lease.reported + fallback_spent

A reported count never goes back: a refund after a report is absorbed (counted as spent)."""

LEASE = "lease"
FALLBACK = "fallback"


def _sub(a: int, b: int) -> int:
    return a - b if a > b else 0


class TokenAccount:
    __slots__ = ("in_", "out", "absorbed", "reported_spent")

    def __init__(self):
        self.in_ = 0
        self.out = 0
        self.absorbed = 0
        self.reported_spent = 0

    def withdrew(self, withdrawn: int, held_after: int) -> None:
        unaccounted = _sub(_sub(self.in_, self.out), self.reported_spent)
        back = min(withdrawn, _sub(unaccounted, held_after))
        self.out += back
        self.absorbed += withdrawn - back

    def report_spent(self, held: int) -> int:
        self.reported_spent = max(self.reported_spent, _sub(self.in_, self.out + held))
        return self.reported_spent

    def exact_spent(self, held: int) -> int:
        return _sub(self.in_, self.out + self.absorbed + held)


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

    def report_spent(self, held: int) -> int:
        return (self._lease.report_spent(self._held_by(LEASE, held))
                + self._fallback.report_spent(self._held_by(FALLBACK, held)))

    def exact_spent(self, held: int) -> int:
        return self._lease.exact_spent(self._held_by(LEASE, held)) + self.exact_fallback_spent(held)

    def exact_fallback_spent(self, held: int) -> int:
        return self._fallback.exact_spent(self._held_by(FALLBACK, held))

    @property
    def tokens_received(self) -> int:
        return self._lease.in_

    @property
    def tokens_returned(self) -> int:
        return self._lease.out

    @property
    def reported_fallback_spent(self) -> int:
        return self._fallback.reported_spent
