"""One tenant's budget inside a client: the handle workers call, and the per-tenant half of the
leasing protocol the refresher drives (a port of the C++ TenantBudgetImpl and Lease)."""

import asyncio
import re
import threading
from typing import Callable, List, NamedTuple, Optional

from . import _ledger
from ._bucket_math import (INFINITE_FUTURE, INFINITE_PAST, MAX_LEASE_TOKENS, BucketShape,
                           DemandEstimator, FallbackBucket, RecentSmallest, low_water_mark,
                           next_sync_delay, want_for)
from ._proto import budget_pb2
from ._types import (DENY_FALLBACK, ENFORCE, FALLBACK, LEASE, NO_LEASE, SHADOW, TenantStats)

_TENANT_RE = re.compile(r"[A-Za-z0-9._:/-]{1,128}")

# Internal modes (the C++ LeaseMode); public ones are _types.MODES.
AWAITING = "awaiting_lease"
LEASED = "leased"
EXPIRED = "expired"
REFUSED = "refused"
IN_FALLBACK = "fallback"
IN_DENY_FALLBACK = "deny_fallback"
SHUTDOWN = "shutdown"
_PUBLIC_MODE = {LEASED: LEASE, IN_FALLBACK: FALLBACK, IN_DENY_FALLBACK: DENY_FALLBACK}

# What the refresher knows of the server from its last Sync attempt.
ANSWERING = "answering"      # no attempt yet, or the last one got a response
UNREACHABLE = "unreachable"  # the last attempt failed: fall back
REFUSING = "refusing"        # UNAUTHENTICATED / PERMISSION_DENIED: deny
# The longest lease a policy allows (BudgetPolicy.lease_ttl_ms); a longer grant is read as this.
MAX_LEASE_TTL_MS = 600_000
DOWN = "down"                # unreachable for a refresh period (or the shard has no owner):
                             # a spent lease falls back at once


# The largest cost of one retry (try_acquire(cost), refund(cost)).
MAX_COST = 1_000_000
# The default cost: the hot path checks it by identity (every int 1 is this object in CPython;
# True and 1.0 are not), anything else by type and range.
_ONE = 1


def check_cost(cost) -> None:
    """Raises ValueError naming `cost` and its value unless it is an int (not a bool) in
    [1, MAX_COST]."""
    if type(cost) is not int and (isinstance(cost, bool) or not isinstance(cost, int)):
        raise ValueError(f"cost is {cost!r}; it must be an integer in [1, {MAX_COST}]")
    if not 1 <= cost <= MAX_COST:
        raise ValueError(f"cost is {cost}; it must be in [1, {MAX_COST}]")


class LocalCredit:
    """The books of one kind of event that funds the fallback bucket (successes, requests): the
    most events any request built so far carried (the server may credit all of those), the
    count up to which fallback steps considered crediting, and how many the fallback buckets
    credited (TenantSync.successes_credited_locally, requests_credited_locally). Each event is
    credited once, locally or by the server. Not thread-safe: the refresher's, under `_mu`."""

    __slots__ = ("in_requests", "considered", "credited_locally")

    def __init__(self):
        self.in_requests = 0
        self.considered = 0
        self.credited_locally = 0

    def creditable(self, count: int) -> int:
        """Of `count` events so far, those since the last fallback step that no request built
        so far carries; marks them considered."""
        start = max(self.in_requests, self.considered)
        self.considered = max(self.considered, count)
        return count - start if count > start else 0

    def carried(self, count: int) -> None:
        """A request built now carries `count` events: the server may credit every one."""
        self.in_requests = max(self.in_requests, count)


def check_tenant_name(name) -> None:
    from ._types import InvalidOptions
    if not isinstance(name, str) or not _TENANT_RE.fullmatch(name):
        raise InvalidOptions(f"tenant {name!r} is malformed; expected 1-128 characters of "
                             "[A-Za-z0-9._:/-]")


class TenantBudget:
    """A tenant's budget as seen from this process. Thread-safe.

    try_acquire(), refund(), record_success() and record_request() are the hot path: each takes
    one lock for the counter update only, never blocks on anything else, never performs I/O and
    never reads a clock. The other methods belong to the refresher (serialised by it) and take
    `_mu`."""

    def __init__(self, tenant: str, waker, created: float, fallback_mode: str,
                 never_reached: BucketShape):
        self.tenant = tenant
        self._waker = waker  # callable: wake the refresher (cheap, never blocks)
        self._fallback_mode = fallback_mode
        self._never_reached = never_reached
        # The lease word: tokens held, the low-water mark, closed; and the hot-path counters.
        self._lock = threading.Lock()
        self._held = 0
        self._mark = 0
        self._closed = True
        # Shadow (TenantGrant.mode MODE_SHADOW of the last applied grant): a denial is allowed
        # and counted instead (rule shadow.allow-and-count).
        self._shadow = False
        self._successes = 0
        self._requests = 0
        self._allowed = 0         # try_acquire() true with tokens: retries, whatever their cost
        self._denied = 0
        self._shadow_denied = 0   # would-be denials let through in shadow
        self._unbacked = 0        # their cost, until refunded (rule shadow.refund-unbacked-first)
        self._denied_tokens = 0   # the cost of every denial and would-be denial: demand
        self._refunds = 0         # refund() calls that gave tokens back
        self._sync_wanted = False
        # Refresher side.
        self._mu = threading.Lock()
        self._mode = AWAITING
        self._ledger = _ledger.TenantLedger()
        self._demand = DemandEstimator(created)
        self._expiry = INFINITE_PAST
        self._next_due = INFINITE_PAST
        self._dry_until = INFINITE_PAST
        self._error = None
        self._safe_shares = RecentSmallest()
        self._last_safe_share_at = INFINITE_PAST
        self._fallback = None
        # Fallback episodes: [shape cap, refill, start, end or None] (see fallback_allowance()).
        self._episodes = []
        # Success- and request-funded fallback (rules success-funded-fallback,
        # requests.fallback-credit).
        self._success_credit = LocalCredit()
        self._request_credit = LocalCredit()
        # The tenant's first answer (a grant, a refusal, or the fallback because the server
        # cannot be reached; or the client's shutdown): set once, never cleared. Callbacks run
        # once when it is set (they must not block: they hand the news to a waiter).
        self._in_a_request = False
        self._ready = threading.Event()
        self._ready_lock = threading.Lock()
        self._ready_callbacks: List[Callable[[], None]] = []
        # The thread whose blocking waits would stall the refresher (an AsyncBudgetClient's
        # event loop), or None.
        self._refresher_thread: Optional[int] = None

    # ---- worker side (hot path) ----

    def try_acquire(self, cost: int = 1) -> bool:
        """Asks for one retry costing `cost` tokens (an int in [1, 1000000], else ValueError
        naming it): True when `cost` tokens were taken (send the retry), False when fewer are
        available (fail the call now); never a partial take. A tenant in shadow mode answers
        True where enforcement would deny, taking no token and counting a would-be denial.
        Never blocks, never performs I/O; on a denial (or when the lease runs low) it wakes the
        refresher so a grant arrives within one round trip."""
        if cost is not _ONE and (type(cost) is not int or not 0 < cost <= MAX_COST):
            check_cost(cost)
        with self._lock:
            held = self._held - cost
            if held >= 0 and not self._closed:
                self._held = held
                self._allowed += 1
                if held > self._mark or held + cost <= self._mark:
                    return True  # not across the low-water mark
                allowed = True
            else:
                allowed = self._shadow
                if allowed:
                    self._shadow_denied += 1
                    self._unbacked += cost
                else:
                    self._denied += 1
                self._denied_tokens += cost
        self._request_sync()
        return allowed

    def refund(self, cost: int = 1) -> None:
        """Gives back the `cost` tokens taken by try_acquire(cost) for a retry that was never
        sent (e.g. cancelled during backoff); at most once per successful try_acquire(), with
        its cost (ValueError naming `cost` when it is not an int in [1, 1000000]). While
        would-be denials of shadow mode are out (their cost not yet refunded), a refund of at
        most their cost cancels theirs instead and gives nothing back."""
        if cost is not _ONE and (type(cost) is not int or not 0 < cost <= MAX_COST):
            check_cost(cost)
        with self._lock:
            if self._unbacked >= cost:
                self._unbacked -= cost
                return
            self._held += cost
            self._refunds += 1

    def record_success(self) -> None:
        """Records one successful logical call; it earns the budget `success_credit`."""
        with self._lock:
            self._successes += 1

    def record_request(self) -> None:
        """Records one request (a logical call's first attempt); a windowed policy's budget
        earns `retry_ratio` for it. The retry helpers call it once per call."""
        with self._lock:
            self._requests += 1

    def is_ready(self) -> bool:
        """True once the tenant had its first answer: a lease granted, a refusal, or the
        fallback (the server could not be reached), or the client closed. Before that,
        try_acquire() denies. Never blocks."""
        return self._ready.is_set()

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the tenant's first answer (see is_ready()), at most `timeout` seconds
        (None: no limit; the answer comes within about one Sync round trip, at most the
        client's sync_timeout when the server cannot be reached). Returns is_ready(). Not for
        the event loop's thread of an AsyncBudgetClient (its refresher runs there, so the
        answer could not come): RuntimeError there; await ready() instead."""
        if not self._may_block():
            raise RuntimeError("TenantBudget.wait_ready() on the event loop of its "
                               "AsyncBudgetClient would stall its refresher; await ready()")
        return self._ready.wait(timeout)

    def _may_block(self) -> bool:
        return self._refresher_thread is None or threading.get_ident() != self._refresher_thread

    async def ready(self, timeout: Optional[float] = None) -> bool:
        """wait_ready() for asyncio: awaits the tenant's first answer, at most `timeout`
        seconds; cancelling the task cancels the wait. Returns is_ready()."""
        if self._ready.is_set():
            return True
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(_=None):
            if not future.done():
                future.set_result(None)

        def notify():
            try:
                loop.call_soon_threadsafe(done)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        self._on_ready(notify)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._remove_ready_callback(notify)
        return self._ready.is_set()

    def _on_ready(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once the tenant is ready (at once, here, if it already is)."""
        with self._ready_lock:
            if not self._ready.is_set():
                self._ready_callbacks.append(callback)
                return
        callback()

    def _remove_ready_callback(self, callback: Callable[[], None]) -> None:
        with self._ready_lock:
            if callback in self._ready_callbacks:
                self._ready_callbacks.remove(callback)

    def _mark_ready(self) -> None:
        # Refresher side. The event is set first, so a waiter woken by a callback sees it.
        if self._ready.is_set():
            return
        with self._ready_lock:
            self._ready.set()
            callbacks, self._ready_callbacks = self._ready_callbacks, []
        for callback in callbacks:
            callback()

    def _request_sync(self) -> None:
        # The first worker to find the lease low or empty since the last applied response wakes
        # the refresher; later ones see the flag set.
        if not self._sync_wanted:
            self._sync_wanted = True
            self._waker()

    def stats(self) -> TenantStats:
        """A snapshot of this process's counters for the tenant (not a hot-path call)."""
        with self._mu:
            c = self._counters()
            return TenantStats(
                successes=c.successes,
                retries_allowed=c.allowed - c.refunds,
                retries_denied=c.denied,
                fallback_allowed=self._ledger.exact_fallback_spent(c.held),
                tokens_spent=self._ledger.exact_spent(c.held),
                tokens_received=self._ledger.tokens_received,
                tokens_returned=self._ledger.tokens_returned,
                tokens_held=c.held,
                refunds=c.refunds,
                successes_credited_locally=self._success_credit.credited_locally,
                requests=c.requests,
                requests_credited_locally=self._request_credit.credited_locally,
                shadow_denied=c.shadow_denied,
                unbacked=c.unbacked,
                lease_active=self._mode == LEASED and not c.closed,
                mode=_PUBLIC_MODE.get(self._mode, NO_LEASE),
                enforcement=SHADOW if c.shadow else ENFORCE,
                error=self._error)

    def _counters(self) -> "_Counters":
        """The hot-path counters and the word, read together (one lock)."""
        with self._lock:
            return _Counters(self._held, self._closed, self._shadow, self._successes,
                             self._requests, self._allowed, self._denied, self._shadow_denied,
                             self._unbacked, self._denied_tokens, self._refunds)

    @property
    def lease_mode(self) -> str:
        """The internal lease mode (AWAITING ... SHUTDOWN above: "awaiting_lease", "leased",
        "expired", "refused", "fallback", "deny_fallback", "shutdown"), as the conformance
        corpus spells it. Read-only; not a hot-path call."""
        with self._mu:
            return self._mode

    def fallback_allowance(self, now: float) -> float:
        """What this tenant's fallback buckets may have handed out so far: the sum over its
        fallback episodes of capacity (at least 1 when refilling) + refill * seconds. For fleet
        checks; not a hot-path call."""
        with self._mu:
            return sum(cap + refill * ((now if end is None else end) - start)
                       for cap, refill, start, end in self._episodes)

    # ---- the lease word, refresher side ----

    def _deposit(self, tokens: int, mark: int) -> int:
        with self._lock:
            added = 0 if self._held >= MAX_LEASE_TOKENS else min(tokens, MAX_LEASE_TOKENS - self._held)
            self._held += added
            self._mark = mark
            self._closed = False
            return added

    def _replace(self, tokens: int, mark: int) -> int:
        with self._lock:
            old = self._held
            self._held = min(tokens, MAX_LEASE_TOKENS)
            self._mark = mark
            self._closed = False
            return old

    def _withdraw_and_close(self) -> int:
        with self._lock:
            old = self._held
            self._held = 0
            self._mark = 0
            self._closed = True
            return old

    def _held_now(self) -> int:
        with self._lock:
            return self._held

    # ---- refresher side ----

    def sync_due_at(self) -> float:
        with self._mu:
            if self._mode == SHUTDOWN:
                return INFINITE_FUTURE
            if self._sync_wanted:
                return min(self._next_due, self._dry_until)
            return self._next_due

    def awaiting_first_sync(self) -> bool:
        """No request has carried this tenant yet (it may be in fallback already, created while
        its server is unreachable): its first Sync is due at once (not held back by
        min_sync_interval)."""
        with self._mu:
            return not self._in_a_request and self._mode != SHUTDOWN

    def lease_ends_at(self) -> float:
        with self._mu:
            return self._expiry if self._mode == LEASED else INFINITE_FUTURE

    def _end_episode(self, now: float) -> None:
        if self._episodes and self._episodes[-1][3] is None:
            self._episodes[-1][3] = now

    def _withdraw_all(self, now: float) -> None:
        withdrawn = self._withdraw_and_close()
        self._ledger.withdrew(withdrawn, self._held_now())
        self._ledger.switch_to(_ledger.LEASE)
        if self._fallback is not None:
            self._end_episode(now)
        self._fallback = None

    def _fallback_mark(self) -> int:
        # A full bucket asks to hear of the very first take (mark = held - 1, and the wake flag
        # cleared) so its refill restarts at once; otherwise an empty word wakes the refresher.
        fb = self._fallback
        if not fb.full() or fb.held == 0:
            return 0
        self._sync_wanted = False
        return fb.held - 1

    def _enter_fallback(self, now: float, start_full: bool = True) -> None:
        if self._fallback_mode == "deny":
            self._withdraw_all(now)
            self._mode = IN_DENY_FALLBACK
            self._mark_ready()  # the server cannot be reached: the fallback is the answer
            return
        share = (None if self._last_safe_share_at == INFINITE_PAST
                 else self._safe_shares.get(self._last_safe_share_at))
        self._fallback = FallbackBucket(share or self._never_reached, now, start_full)
        self._episodes.append([self._fallback.cap, self._fallback.shape.refill_per_second, now,
                               None])
        first = self._refill_bucket(now, 0)
        withdrawn = self._replace(first, self._fallback_mark())
        self._ledger.withdrew(withdrawn, 0)
        self._ledger.switch_to(_ledger.FALLBACK)
        self._ledger.fallback_deposited(min(first, MAX_LEASE_TOKENS))
        self._mode = IN_FALLBACK
        self._mark_ready()  # with the bucket's first tokens in the word

    def _refill_bucket(self, now: float, held: int) -> int:
        # One fallback step's refill, crediting the successes and requests recorded since the
        # last step that no request built so far carries.
        with self._lock:
            successes, requests = self._successes, self._requests
        add = self._fallback.refill(now, held, self._success_credit.creditable(successes),
                                    self._request_credit.creditable(requests))
        self._success_credit.credited_locally += self._fallback.last_credited
        self._request_credit.credited_locally += self._fallback.last_requests_credited
        return add

    def _refill_fallback(self, now: float) -> float:
        add = self._refill_bucket(now, self._held_now())
        self._ledger.fallback_deposited(self._deposit(add, self._fallback_mark()))
        return self._fallback.next_token_at()

    def step(self, now: float, server: str) -> float:
        """One refresher step at `now`: ends a lease at its expiry, enters / refills / leaves
        fallback. Returns when this tenant next needs a step."""
        unreachable = server in (UNREACHABLE, DOWN)
        with self._mu:
            if self._mode == LEASED:
                if now < self._expiry:
                    if server != DOWN or self._held_now() > 0:
                        return self._expiry
                    # The lease is spent and the server has been down a while: fall back now
                    # rather than deny until the lease's expiry (a blip is not "down"), into an
                    # EMPTY bucket: the share of the burst went in the lease (a slow server is
                    # "down" too), only refill and the instance's own credit fund it.
                    self._enter_fallback(now, start_full=False)
                    return (self._refill_fallback(now) if self._mode == IN_FALLBACK
                            else INFINITE_FUTURE)
                if unreachable:
                    self._enter_fallback(now)
                    return (self._refill_fallback(now) if self._mode == IN_FALLBACK
                            else INFINITE_FUTURE)
                # The lease ends at send time + TTL: every unspent token goes back.
                self._withdraw_all(now)
                self._mode = EXPIRED
                return INFINITE_FUTURE
            if self._mode == IN_FALLBACK:
                if server != REFUSING:
                    return self._refill_fallback(now)
                self._withdraw_all(now)
                self._mode = EXPIRED
                return INFINITE_FUTURE
            if self._mode == IN_DENY_FALLBACK and server == REFUSING:
                self._mode = EXPIRED
            if server == REFUSING:
                self._mark_ready()  # the server refuses this client (credentials): deny
            if self._mode in (AWAITING, EXPIRED) and unreachable:
                self._enter_fallback(now)
                return self._refill_fallback(now) if self._mode == IN_FALLBACK else INFINITE_FUTURE
            # A closed word: tokens can only be there from a refund racing a withdrawal.
            if self._held_now() > 0:
                withdrawn = self._withdraw_and_close()
                self._ledger.withdrew(withdrawn, self._held_now())
            return INFINITE_FUTURE

    def _fill_counters(self, c: "_Counters", out) -> None:
        out.tenant = self.tenant
        out.successes = c.successes
        out.requests = c.requests
        self._ledger.report(c.held)
        out.retries_spent = self._ledger.reported_spent
        out.retries_refunded = self._ledger.reported_refunded
        out.retries_denied = c.denied
        out.shadow_denied = c.shadow_denied
        # A retry taken and refunded before any report is in no retries_spent: at most that.
        out.retries_allowed = min(c.allowed, out.retries_spent)
        out.tokens_returned = self._ledger.tokens_returned
        out.tokens_received = self._ledger.tokens_received
        out.fallback_spent = self._ledger.reported_fallback_spent
        out.fallback_refunded = self._ledger.reported_fallback_refunded
        out.successes_credited_locally = self._success_credit.credited_locally
        out.requests_credited_locally = self._request_credit.credited_locally
        # From now on the server may credit every success and request this request carries.
        self._success_credit.carried(c.successes)
        self._request_credit.carried(c.requests)

    def fill_sync(self, now: float, policy, out) -> None:
        """Fills `out` (a TenantSync) for a NEW request built at `now`."""
        with self._mu:
            c = self._counters()
            held = c.held
            self._in_a_request = True
            self._fill_counters(c, out)
            # Demand in tokens: those spent, and the cost of every denial (or would-be denial).
            self._demand.observe(now, out.retries_spent + c.denied_tokens)
            leased = held if self._ledger.source == _ledger.LEASE else 0
            out.want = want_for(self._demand.rate, policy.refresh_period, policy.lease_burst,
                                leased)

    def apply_grant(self, grant, sent_entry, sent: float, received: float, policy) -> None:
        """Applies a grant answering a request first sent at `sent`: the lease (every token held)
        now ends at `sent` + lease_ttl_ms."""
        with self._mu:
            if self._mode == SHUTDOWN:
                return
            self._sync_wanted = False
            # Rule shadow.mode-from-response: every entry applied sets the mode, before its
            # tokens land.
            with self._lock:
                self._shadow = grant.mode == budget_pb2.MODE_SHADOW
            granted = grant.granted
            if self._ledger.source == _ledger.FALLBACK:
                # Back from fallback: swap the fallback tokens for the leased ones at once.
                deposited = min(granted, MAX_LEASE_TOKENS)
                withdrawn = self._replace(granted, low_water_mark(granted))
                self._ledger.withdrew(withdrawn, 0)
                self._ledger.switch_to(_ledger.LEASE)
                self._end_episode(received)
                self._fallback = None
            else:
                deposited = self._deposit(granted, low_water_mark(granted))
            self._ledger.received(granted, deposited)
            if grant.HasField("safe_share"):
                share = grant.safe_share
                self._safe_shares.note(BucketShape(share.capacity, share.refill_per_second,
                                                   share.success_credit, share.request_credit),
                                       received)
                self._last_safe_share_at = received
            # A TTL above the longest a policy allows (600 s) is read as that.
            self._expiry = sent + min(max(0, grant.lease_ttl_ms), MAX_LEASE_TTL_MS) / 1000.0
            self._mode = LEASED
            self._error = None
            delay = next_sync_delay(grant.next_sync_ms, policy)
            self._next_due = received + delay
            self._dry_until = received + delay if granted < sent_entry.want else INFINITE_PAST
            self._mark_ready()

    def apply_refusal(self, code_name: str, message: str, received: float, policy) -> None:
        with self._mu:
            if self._mode == SHUTDOWN:
                return
            self._sync_wanted = False
            if self._mode in (LEASED, IN_FALLBACK) or self._held_now() > 0:
                self._withdraw_all(received)
            self._mode = REFUSED
            self._error = f"{code_name}: budget server refused tenant \"{self.tenant}\": {message}"
            self._next_due = received + policy.refresh_period
            self._dry_until = self._next_due
            self._mark_ready()

    def sync_again_at(self, due: float) -> None:
        """The server did not apply this tenant's entry (it named another owner, or none can
        grant now): the lease stays as it is; the next sync is due at `due`."""
        with self._mu:
            if self._mode == SHUTDOWN:
                return
            self._next_due = due
            self._dry_until = due

    def fill_final(self, now: float, out) -> None:
        """Shuts the tenant down for good: withdraws every token, fills the final counters."""
        with self._mu:
            self._mode = SHUTDOWN
            self._withdraw_all(now)
            self._fill_counters(self._counters(), out)
            out.want = 0
        self._mark_ready()  # closed: waiters stop waiting (try_acquire() denies from now on)


class _Counters(NamedTuple):
    held: int
    closed: bool
    shadow: bool
    successes: int
    requests: int
    allowed: int
    denied: int
    shadow_denied: int
    unbacked: int
    denied_tokens: int
    refunds: int
