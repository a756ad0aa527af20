"""The numbers behind a tenant's leases and its fallback bucket (a port of the C++ client's
refresh_policy, demand_estimator, fallback_bucket and recent_extreme). Plain values and
single-owner objects: nothing here is thread-safe; the owner serialises calls."""

import math
from dataclasses import dataclass

# Largest `want` a request may carry (budget.proto: TenantSync.want).
MAX_WANT = 1_000_000
# Most tokens a lease holds (the C++ word's 31-bit count).
MAX_LEASE_TOKENS = (1 << 31) - 1
# Fraction of the last grant at which the lease counts as low and the refresher is woken.
LOW_WATER_FRACTION = 0.2
# First and largest wait before resending a Sync that failed.
FIRST_RETRY_BACKOFF = 0.020
MAX_RETRY_BACKOFF = 1.0
# A Sync is cut short for a fallback step due sooner than this (never for a lease expiry).
MIN_FALLBACK_STEP_WINDOW = 0.020
# Attempts of the final Sync sent by close(), each bounded by sync_timeout.
FINAL_SYNC_ATTEMPTS = 3
# A fallback bucket is the smallest SafeShare of this long before the server's last answer.
SAFE_SHARE_MEMORY = 60.0
# Longest wait between two fallback steps of a bucket funded by success or request credit.
CREDIT_STEP_INTERVAL = 0.050
# Decay time constant of the demand rate.
DEMAND_TAU = 1.0

INFINITE_FUTURE = math.inf
INFINITE_PAST = -math.inf


@dataclass(frozen=True)
class RefreshPolicy:
    refresh_period: float = 0.2
    min_sync_interval: float = 0.005
    lease_burst: int = 2


def low_water_mark(granted: int) -> int:
    """ceil(20%) of a grant: any grant of one token or more has a mark of at least 1."""
    return int(math.ceil(granted * LOW_WATER_FRACTION))


def next_sync_delay(next_sync_ms: int, policy: RefreshPolicy) -> float:
    """The server's hint, at most refresh_period and at least min_sync_interval."""
    if next_sync_ms <= 0:
        return policy.refresh_period
    return max(policy.min_sync_interval, min(next_sync_ms / 1000.0, policy.refresh_period))


def retry_backoff(failures: int, policy: RefreshPolicy) -> float:
    """20 ms doubling up to 1 s after `failures` (>= 1) failed Syncs, never below
    min_sync_interval."""
    backoff = FIRST_RETRY_BACKOFF
    i = 1
    while i < failures and backoff < MAX_RETRY_BACKOFF:
        backoff *= 2
        i += 1
    return max(policy.min_sync_interval, min(backoff, MAX_RETRY_BACKOFF))


class DemandEstimator:
    """Exponentially decayed rate of retry demand (spent + denied) per second."""

    def __init__(self, start: float):
        self._last = start
        self._last_total = 0
        self.rate = 0.0

    def observe(self, now: float, cumulative_demand: int) -> None:
        dt = max(0.0, now - self._last)
        delta = max(0, cumulative_demand - self._last_total)
        self.rate = self.rate * math.exp(-dt / DEMAND_TAU) + delta / DEMAND_TAU
        self._last = max(self._last, now)
        self._last_total = max(self._last_total, cumulative_demand)


def want_for(rate: float, period: float, burst: int, held: int) -> int:
    """Enough for `rate` per second over `period`, plus `burst`, minus what is `held`."""
    total = math.ceil(max(0.0, rate) * period) + burst
    if total <= held:
        return 0
    return min(MAX_WANT, int(total - held))


@dataclass(frozen=True)
class BucketShape:
    capacity: float = 0.0           # tokens
    refill_per_second: float = 0.0  # tokens per second
    success_credit: float = 0.0     # tokens per success recorded in fallback (not divided)
    request_credit: float = 0.0     # tokens per request recorded in fallback (not divided)

    def smaller(self, other: "BucketShape") -> "BucketShape":
        return BucketShape(min(self.capacity, other.capacity),
                           min(self.refill_per_second, other.refill_per_second),
                           min(self.success_credit, other.success_credit),
                           min(self.request_credit, other.request_credit))


class RecentSmallest:
    """The smallest shape noted within the last window: two aligned slots, exactly as the C++
    RecentExtreme (covers [now - window, now], never anything 2 windows old)."""

    def __init__(self, window: float = SAFE_SHARE_MEMORY):
        self._window = window
        self._start = INFINITE_PAST
        self._current = None
        self._previous = None

    def _roll(self, now: float) -> None:
        age = now - self._start
        if age < self._window:
            return
        if age < 2 * self._window:
            self._previous = self._current
            self._start += self._window
        else:
            self._previous = None
            self._start = now
        self._current = None

    def note(self, shape: BucketShape, now: float) -> None:
        self._roll(now)
        self._current = shape if self._current is None else self._current.smaller(shape)

    def get(self, now: float):
        self._roll(now)
        if self._previous is None:
            return self._current
        if self._current is None:
            return self._previous
        return self._current.smaller(self._previous)


_EPSILON = 1e-6


def _sanitize(value: float, most: float) -> float:
    if not math.isfinite(value) or value < 0:
        return 0.0
    return min(value, most)


class FallbackBucket:
    """The local bucket of a tenant whose server is unreachable. Its whole tokens sit in the
    lease, where workers take them without telling anyone; refill() is told what the lease holds
    and returns how many whole tokens to add. Starts full at `capacity` (at least one token when
    it refills at all), refills at `refill_per_second`; tokens taken between two steps count as
    taken just before the later one, so over a run: handed out <= cap + refill * elapsed
    + success_credit * successes credited + request_credit * requests credited.

    Success- and request-funded fallback: refill() also takes the successes and the requests
    recorded since the last step that may be credited here (only those no request carried yet:
    the server may have credited any it saw). Each deposits its credit (success_credit,
    request_credit) up to the cap, successes first; one whose credit does not fit is not
    credited here and stays the server's to credit; `last_credited` and
    `last_requests_credited` say how many the last refill() credited."""

    def __init__(self, shape: BucketShape, now: float, start_full: bool = True):
        self.shape = BucketShape(_sanitize(shape.capacity, MAX_LEASE_TOKENS),
                                 _sanitize(shape.refill_per_second, MAX_LEASE_TOKENS),
                                 _sanitize(shape.success_credit, MAX_LEASE_TOKENS),
                                 _sanitize(shape.request_credit, MAX_LEASE_TOKENS))
        self.cap = (max(self.shape.capacity, 1.0) if self.shape.refill_per_second > 0
                    else self.shape.capacity)
        # Empty for a spent lease falling back early (its share of the burst went in the lease).
        self._level = self.shape.capacity if start_full else 0.0
        self.held = 0
        self.last_credited = 0
        self.last_requests_credited = 0
        self._last = now

    def refill(self, now: float, held: int, successes: int = 0, requests: int = 0) -> int:
        dt = max(0.0, now - self._last)
        self._last = max(self._last, now)
        grown = max(self._level, min(self.cap, self._level + self.shape.refill_per_second * dt))
        level = max(grown - self.held + held, float(held))
        level, self.last_credited = self._credit(level, successes, self.shape.success_credit)
        level, self.last_requests_credited = self._credit(level, requests,
                                                          self.shape.request_credit)
        whole = math.floor(level + _EPSILON)
        add = int(whole) - held if whole > held else 0
        self._level = level
        self.held = held + add
        return add

    def _credit(self, level: float, events: int, credit: float):
        """Deposits `credit` for as many of `events` as fit under the cap: (level, how many)."""
        if events <= 0 or credit <= 0 or level >= self.cap:
            return level, 0
        fit = min(events, int(math.floor((self.cap - level) / credit + _EPSILON)))
        return level + fit * credit, fit

    def _credits(self) -> bool:
        return self.shape.success_credit > 0 or self.shape.request_credit > 0

    def full(self) -> bool:
        return (self.shape.refill_per_second > 0
                and math.floor(self._level + _EPSILON) + 1 > self.cap + _EPSILON)

    def next_token_at(self) -> float:
        """The next step: the next whole token of refill or, while success or request credit
        can still fit, at most CREDIT_STEP_INTERVAL away (successes and requests are only seen
        at steps)."""
        credit_step = (self._last + CREDIT_STEP_INTERVAL
                       if self._credits() and self._level + _EPSILON < self.cap
                       else INFINITE_FUTURE)
        if self.shape.refill_per_second <= 0 or self.full():
            return credit_step
        next_whole = math.floor(self._level + _EPSILON) + 1
        micros = (next_whole - self._level) / self.shape.refill_per_second * 1e6
        return min(credit_step, self._last + max(1.0, math.ceil(micros - 1e-3)) / 1e6)
