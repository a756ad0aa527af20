"""The leasing protocol of one client, without its transport, on the clock it is given (the
shape of the C++ SyncEngine, client/cpp/sync_engine.h, and of the JS one). The thread of
BudgetClient and the task of AsyncBudgetClient drive it and only do the I/O:

    plan = engine.begin_step()        # steps the tenants; a Sync attempt to send, or None
    while plan:                       # one per route (main target, owners) that is due
        engine.end_attempt(plan, <outcome of sending plan.request to plan.address>)
        plan = engine.next_plan()
    next_time = engine.end_step()     # steps the tenants again with the outcomes

and at shutdown, if engine.begin_final(): for each (address, request) engine.next_final()
gives, send it until engine.end_final(outcome, attempt) says None (else sleep the delay it
returns); at last engine.finish_final().

The rules kept here (with TenantBudget) are the client rulebook's, client/conformance/RULES.md,
by id; tests/python/test_conformance.py runs the conformance corpus that pins them through this
engine:
 * Requests and seq: one-request-per-route, seq-new-request, resend-unchanged (retry_backoff),
   abandon-after-refresh-period, server-state-from-outcome (the state each tenant's step()
   sees: ANSWERING, UNREACHABLE, REFUSING, or DOWN once unreachable for a refresh period),
   stale-dropped, grants-match-request, lease-ends-at-first-send, min-sync-interval,
   first-sync-at-once (BudgetClient.tenant() wakes the refresher), next-sync-from-grant;
   low-water-wakes and want-from-demand in TenantBudget.
 * Deadlines and connections: sync-deadline (MIN_FALLBACK_STEP_WINDOW),
   cut-short-is-interrupted (also an attempt a wake cancelled: Outcome.woken),
   fail-fast-then-wait-for-ready (Plan.wait_for_ready).
 * Refusals: request-refused-split (tenant_limit_in), tenant-refused.
 * Routing (a cluster): every rule above holds per route, the main target (address None) or one
   owner (plan.address), each with its own pending request, backoff, failures and server state:
   redirect-followed, redirect-hop-limit (MAX_REDIRECT_HOPS), owner-route-limit
   (MAX_OWNER_ROUTES), unavailable-parks, owner-unreachable-parks. Nothing of it runs until a
   redirect is seen.
 * final-sync: begin_final .. finish_final.
 * Costs, shadow mode and requests, in TenantBudget (each request's entries carry its
   cumulative requests, requests_credited_locally, shadow_denied and retries_allowed):
   cost.all-or-nothing, cost.refund, retries-allowed.reported, shadow.mode-from-response,
   shadow.allow-and-count, shadow.refund-unbacked-first, requests.counted,
   requests.fallback-credit (with success-funded-fallback: LocalCredit, FallbackBucket.refill).
Why some of them are as they are: client/cpp/sync_engine.h and refresher.h.

Not thread-safe: the driver serialises calls (it holds `mu` for a whole step)."""

import logging
import threading
from dataclasses import dataclass, field
from typing import List, Optional

import grpc

from ._bucket_math import (FINAL_SYNC_ATTEMPTS, INFINITE_FUTURE, INFINITE_PAST,
                           MIN_FALLBACK_STEP_WINDOW, RefreshPolicy, retry_backoff)
from ._proto import budget_pb2
from .tenant_budget import ANSWERING, DOWN, REFUSING, UNREACHABLE

_log = logging.getLogger("retrybudget")
_DEADLINE_SLACK = 0.001
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


MAX_REDIRECT_HOPS = 4
MAX_OWNER_ROUTES = 64
# A request refused as a whole with one of these means the server answers and applied nothing:
# a request of several tenants is split, a single tenant is refused (denied until its refresh).
_REQUEST_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE)
_AT_MOST = "at most "


def tenant_limit_in(message: str) -> int:
    """The tenant limit a refusal names ("... at most N are allowed in one request"), or 0."""
    at = message.find(_AT_MOST)
    if at < 0 or message.find("request", at) < 0:
        return 0
    limit = 0
    for c in message[at + len(_AT_MOST):]:
        if not "0" <= c <= "9":
            break
        limit = min(limit * 10 + ord(c) - ord("0"), 1 << 20)
    return limit
_FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


@dataclass
class _Pending:
    request: "budget_pb2.SyncRequest"
    tenants: list
    first_sent: float


@dataclass
class Plan:
    """One Sync attempt to send: `request` with `timeout` seconds, wait_for_ready or not."""
    request: "budget_pb2.SyncRequest"
    timeout: float
    wait_for_ready: bool
    sent: float
    deadline: float
    address: Optional[str] = None  # None: the main target, else an owner's HOST:PORT
    resend: bool = False  # the route's pending request sent again


@dataclass
class Outcome:
    """What sending a Plan gave: code None for a response."""
    code: Optional[grpc.StatusCode] = None
    details: str = ""
    response: Optional["budget_pb2.SyncResponse"] = None
    woken: bool = False  # cancelled by a wake while waiting for a connection


class _Route:
    """One destination: the main target (address None) or an owner."""

    def __init__(self, address: Optional[str]):
        self.address = address
        self.pending: Optional[_Pending] = None
        self.last_send = INFINITE_PAST
        self.retry_at = INFINITE_PAST
        self.failures = 0
        self.failing_since = INFINITE_FUTURE  # start of the first of those failed attempts
        self.server_state = ANSWERING
        self.max_tenants_per_sync = INFINITE_FUTURE  # the server's limit once it named one
        self.chunk = INFINITE_FUTURE  # this step's limit (a split lowers it)


class _TenantRoute:
    """A tenant that is not simply on the main route."""

    def __init__(self):
        self.owner: Optional[str] = None
        self.hops = 0  # redirects since the last grant
        self.unavailable = False  # no owner could grant: unreachable until a grant
        # Since when: down once a refresh period old (a shard without an owner for a moment,
        # while servers join, is a blip).
        self.unavailable_since = INFINITE_FUTURE


@dataclass
class _StepState:
    tenants: List = field(default_factory=list)
    now: float = 0.0
    cut: float = INFINITE_FUTURE
    round: int = 0
    visited: set = field(default_factory=set)
    # Per route address, the tenants its requests of this round carried (a request of part of
    # them, after a split or under the server's limit, is followed by one of the rest), and the
    # routes whose rest goes out now, due or not.
    carried: dict = field(default_factory=dict)
    again: set = field(default_factory=set)


class SyncEngine:
    def __init__(self, instance_id: str, policy: RefreshPolicy, sync_timeout: float,
                 bearer_token: str, clock, registry, metrics=None):
        self.mu = threading.Lock()
        self.instance_id = instance_id
        self.policy = policy
        self.sync_timeout = sync_timeout
        self.metadata = (("authorization", f"Bearer {bearer_token}"),) if bearer_token else None
        self._clock = clock
        self._registry = registry
        self._metrics = metrics
        self.seq = 0  # per instance, across every route
        self._main = _Route(None)
        self._owners = {}  # address -> _Route
        self._routed = {}  # tenant -> _TenantRoute; empty until a redirect is seen
        self._redirected = False
        self.dropped_addresses = []  # owner routes dropped; the driver closes their channels
        self.redirects = 0
        self.last_status = None  # None: OK; else "CODE: details"
        self.shut_down = False
        self._step = _StepState()
        self._final_tenants = []
        self._finals = []  # [_FinalRoute]
        self._final_now = None  # the _FinalRoute of the request being sent
        self._final_error = None

    @property
    def failures(self) -> int:
        return self._main.failures

    @property
    def server_state(self) -> str:
        return self._main.server_state

    def _down_at(self, since: float) -> float:
        """When a route unreachable since `since` (its first failed attempt), or a tenant parked
        since then, turns DOWN: a refresh period later. _state_for and _next_down both use it,
        so the step scheduled for that moment sees the server down."""
        return since + self.policy.refresh_period

    def _state_of(self, route, now: float) -> str:
        if route.server_state == UNREACHABLE and now >= self._down_at(route.failing_since):
            return DOWN
        return route.server_state

    def _state_for(self, tenant, now: float) -> str:
        if not self._routed:
            return self._state_of(self._main, now)
        r = self._routed.get(tenant)
        if r is None:
            return self._state_of(self._main, now)
        if r.unavailable:  # a live server said the shard has no owner: a failover once it lasts
            return DOWN if now >= self._down_at(r.unavailable_since) else UNREACHABLE
        route = self._owners.get(r.owner) if r.owner else None
        return self._state_of(route or self._main, now)

    def _next_down(self, now: float) -> float:
        """The earliest time after `now` at which a route (unreachable, a refresh period after
        its first failure) or a parked tenant (a refresh period after it was parked) turns DOWN;
        INFINITE_FUTURE when none will. A step is due then, and a Sync attempt is cut short
        for it."""
        sinces = [route.failing_since for route in (self._main, *self._owners.values())
                  if route.server_state == UNREACHABLE]
        sinces += [r.unavailable_since for r in self._routed.values() if r.unavailable]
        return min((self._down_at(since) for since in sinces if self._down_at(since) > now),
                   default=INFINITE_FUTURE)

    def _groups(self, tenants):
        """[(route, its tenants)], the main route first."""
        if not self._routed:
            return [(self._main, tenants)]
        groups = {None: (self._main, [])}
        for t in tenants:
            r = self._routed.get(t)
            route = self._owners.get(r.owner) if r is not None and r.owner else None
            if route is None:
                groups[None][1].append(t)
            else:
                groups.setdefault(route.address, (route, []))[1].append(t)
        return list(groups.values())

    def _prune(self) -> None:
        used = {r.owner for r in self._routed.values() if r.owner}
        for address in [a for a, route in self._owners.items()
                        if a not in used and route.pending is None]:
            del self._owners[address]
            self.dropped_addresses.append(address)
        for t in [t for t, r in self._routed.items()
                  if not r.owner and r.hops == 0 and not r.unavailable]:
            del self._routed[t]

    def _sync_due(self, route, tenants) -> float:
        if route.pending is not None:
            return route.retry_at
        if not tenants:
            return INFINITE_FUTURE
        if any(t.awaiting_first_sync() for t in tenants):
            return INFINITE_PAST  # a new tenant's first Sync goes out at once
        due = min(t.sync_due_at() for t in tenants)
        if due == INFINITE_FUTURE:
            return due
        return max(due, route.last_send + self.policy.min_sync_interval)

    def begin_step(self) -> Optional[Plan]:
        if self.shut_down:
            self._step = _StepState()
            return None
        tenants = self._registry.snapshot()
        now = self._clock()
        next_step = INFINITE_FUTURE
        lease_ends = INFINITE_FUTURE
        for t in tenants:
            next_step = min(next_step, t.step(now, self._state_for(t, now)))
            lease_ends = min(lease_ends, t.lease_ends_at())
        # The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
        # expiry, a fallback step runs at most MIN_FALLBACK_STEP_WINDOW late, and a server
        # unreachable since an earlier attempt turns "down" on time (a spent lease then falls
        # back at once, not when an attempt waiting for the channel gives up a sync_timeout
        # later).
        next_step = min(next_step, self._next_down(now))
        cut = min(lease_ends, max(next_step, now + MIN_FALLBACK_STEP_WINDOW))
        self._step = _StepState(tenants, now, cut)
        if self._routed or self._owners:
            self._prune()
        self._redirected = False
        for route in (self._main, *self._owners.values()):
            route.chunk = route.max_tenants_per_sync
        return self.next_plan()

    def next_plan(self) -> Optional[Plan]:
        """The next route's attempt in this step, or None when every due route was tried (a
        redirected tenant gets one more round, at most MAX_REDIRECT_HOPS + 1 rounds)."""
        step = self._step
        if not step.tenants:
            return None
        while True:
            now = self._clock()
            if now >= step.cut and step.visited:
                return None
            for route, group in self._groups(step.tenants):
                if route.address in step.visited:
                    continue
                if route.address not in step.again and self._sync_due(route, group) > now:
                    continue
                step.visited.add(route.address)
                step.again.discard(route.address)
                plan = self._plan(route, group, now, step.cut)
                if plan is not None:
                    return plan
            if not self._redirected or step.round >= MAX_REDIRECT_HOPS:
                return None
            step.round += 1
            step.visited = set()
            step.carried = {}
            step.again = set()
            self._redirected = False

    def _plan(self, route, tenants, now, cut) -> Optional[Plan]:
        if (route.pending is not None
                and now - route.pending.first_sent >= self.policy.refresh_period):
            route.pending = None  # failing for a whole refresh period: a new request
            if route.address is not None:
                # An owner that cannot be reached: its tenants go back to the main target.
                _log.error("retrybudget: owner %s unreachable for a refresh period; its tenants "
                           "go back to the main target", route.address)
                for t in tenants:  # unreachable since the owner's first failure
                    self._park(t, None, since=route.failing_since)
                route.failures = 0
                route.failing_since = INFINITE_FUTURE
                route.server_state = ANSWERING
                return None
        resend = route.pending is not None
        if not resend:
            # At most route.chunk of the tenants this round's requests did not carry yet.
            carried = self._step.carried.get(route.address, ())
            rest = [t for t in tenants if t not in carried]
            if not rest:
                return None
            if route.chunk < len(rest):
                rest = rest[:max(1, int(route.chunk))]
            request = budget_pb2.SyncRequest(instance_id=self.instance_id)
            self.seq += 1
            request.seq = self.seq
            for t in rest:
                t.fill_sync(now, self.policy, request.tenants.add())
            route.pending = _Pending(request, rest, now)
        route.last_send = now
        deadline = min(now + self.sync_timeout, cut)
        return Plan(route.pending.request, max(0.0, deadline - now), route.failures > 0, now,
                    deadline, route.address, resend)

    def _route_of(self, plan: Plan) -> _Route:
        if plan.address is None:
            return self._main
        return self._owners[plan.address]

    def end_attempt(self, plan: Plan, outcome: Outcome) -> None:
        route = self._route_of(plan)
        received = self._clock()
        if self._metrics is not None:
            self._metrics.sync_attempted(outcome.code is None)
        self.last_status = (None if outcome.code is None
                            else f"{outcome.code.name}: Sync to the budget server failed: "
                                 f"{outcome.details}")
        cut_short = (plan.deadline < plan.sent + self.sync_timeout
                     and outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED
                     and received >= plan.deadline - _DEADLINE_SLACK)
        if cut_short or (outcome.woken and outcome.code == grpc.StatusCode.CANCELLED):
            route.retry_at = received
            return
        if outcome.code in _REQUEST_REFUSALS:
            self._refused(route, plan, outcome, received)
            return
        if outcome.code is None:
            route.server_state = ANSWERING
        elif outcome.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            route.server_state = REFUSING
        else:
            route.server_state = UNREACHABLE
        if outcome.code is not None:
            if route.failures == 0:
                route.failing_since = plan.sent
            route.failures += 1
            route.retry_at = max(received, plan.sent + retry_backoff(route.failures, self.policy))
            if route.failures == 1:
                _log.error("retrybudget: Sync seq %d failed; retrying (tenants whose lease ends "
                           "meanwhile fall back): %s", plan.request.seq, self.last_status)
            return
        if route.failures > 0:
            _log.info("retrybudget: Sync seq %d succeeded after %d failed attempts",
                      plan.request.seq, route.failures)
        route.failures = 0
        route.failing_since = INFINITE_FUTURE
        done, route.pending = route.pending, None
        if not plan.resend:
            self._carried(route, done)  # a resend answered: the rest are due on their schedule
        if outcome.response.stale:
            _log.error("retrybudget: Sync seq %d answered as stale; ignored", done.request.seq)
            return
        self._apply_response(done, outcome.response, received)

    def _carried(self, route, done: _Pending) -> None:
        """`done`'s tenants had their answer in this step: the route's other tenants, if any, go
        in the next request at once."""
        self._step.carried.setdefault(route.address, set()).update(done.tenants)
        self._step.visited.discard(route.address)
        self._step.again.add(route.address)

    def _refused(self, route, plan: Plan, outcome: Outcome, received: float) -> None:
        # The server answered: it is reachable, and this request as a whole is refused. It
        # applied nothing, so the counters simply go in the next request.
        route.server_state = ANSWERING
        route.failures = 0
        route.failing_since = INFINITE_FUTURE
        refused, route.pending = route.pending, None
        size = len(refused.tenants)
        if size > 1:
            # Too large, or one entry is bad: split. A limit the server names is kept for later
            # requests; otherwise halve this request only, down to single tenants.
            named = tenant_limit_in(outcome.details)
            if 0 < named < size:
                route.max_tenants_per_sync = named
                route.chunk = named
            else:
                route.chunk = size // 2
            _log.error("retrybudget: Sync seq %d with %d tenants refused; splitting it into "
                       "requests of %d: %s", refused.request.seq, size, route.chunk,
                       self.last_status)
            self._step.visited.discard(route.address)  # the same tenants go again at once
            self._step.again.add(route.address)
            return
        # One tenant, refused: deny it until its next refresh (not fallback: the server answers).
        _log.error("retrybudget: Sync seq %d for tenant %r refused; the tenant is denied: %s",
                   refused.request.seq, refused.tenants[0].tenant, self.last_status)
        refused.tenants[0].apply_refusal(outcome.code.name, outcome.details, received,
                                         self.policy)
        self._carried(route, refused)

    def _redirect(self, tenant, owner: str, received: float) -> None:
        self.redirects += 1
        if self._metrics is not None:
            self._metrics.redirected()
        r = self._routed.setdefault(tenant, _TenantRoute())
        r.hops += 1
        if r.hops > MAX_REDIRECT_HOPS or (owner not in self._owners
                                          and len(self._owners) >= MAX_OWNER_ROUTES):
            _log.error("retrybudget: tenant %r redirected %d times without a grant (last to %s), "
                       "or too many owners; treated as unavailable", tenant.tenant, r.hops, owner)
            self._park(tenant, received)
            return
        if owner not in self._owners:
            self._owners[owner] = _Route(owner)
        r.owner = owner
        r.unavailable = False
        r.unavailable_since = INFINITE_FUTURE
        self._redirected = True
        tenant.sync_again_at(INFINITE_PAST)  # at once, on the owner's route

    def _park(self, tenant, received: Optional[float], since: Optional[float] = None) -> None:
        r = self._routed.setdefault(tenant, _TenantRoute())
        r.owner = None
        r.hops = 0
        if not r.unavailable:
            r.unavailable_since = since if since is not None else (
                received if received is not None else self._clock())
        r.unavailable = True
        if received is not None:
            tenant.sync_again_at(received + self.policy.refresh_period)

    def _apply_response(self, pending: _Pending, response, received: float) -> None:
        n = min(len(response.tenants), len(pending.request.tenants))
        if len(response.tenants) != len(pending.request.tenants):
            _log.error("retrybudget: Sync response has %d tenant entries for %d in the request",
                       len(response.tenants), len(pending.request.tenants))
        for i in range(n):
            grant = response.tenants[i]
            sent = pending.request.tenants[i]
            if grant.tenant != sent.tenant:
                _log.error("retrybudget: Sync response entry %d is for tenant %r, not %r", i,
                           grant.tenant, sent.tenant)
                continue
            if grant.HasField("error") and grant.error.code == _FAILED_PRECONDITION \
                    and grant.error.owner:
                # Not this server's shard: nothing was applied; sync the tenant with its owner.
                self._redirect(pending.tenants[i], grant.error.owner, received)
                continue
            if grant.HasField("error") and grant.error.code == _UNAVAILABLE \
                    and not grant.error.owner:
                # The shard has no owner that can grant now: lease to expiry, then fallback.
                self._park(pending.tenants[i], received)
                continue
            if grant.HasField("error") and grant.error.code != 0:
                code_name = _CODE_NAMES.get(grant.error.code, f"CODE_{grant.error.code}")
                _log.error("retrybudget: budget server refused tenant %r (%s): %s", sent.tenant,
                           code_name, grant.error.message)
                pending.tenants[i].apply_refusal(code_name, grant.error.message, received,
                                                 self.policy)
                continue
            pending.tenants[i].apply_grant(grant, sent, pending.first_sent, received,
                                           self.policy)
            r = self._routed.get(pending.tenants[i]) if self._routed else None
            if r is not None:
                r.hops = 0
                r.unavailable = False
                r.unavailable_since = INFINITE_FUTURE

    def end_step(self) -> float:
        """Steps the tenants again with the attempts' outcomes; returns the next step's time."""
        tenants = self._step.tenants
        if self.shut_down or not tenants:
            return INFINITE_FUTURE
        now = self._clock()
        nxt = INFINITE_FUTURE
        for route, group in self._groups(tenants):
            nxt = min(nxt, self._sync_due(route, group))
        for t in tenants:
            nxt = min(nxt, t.step(now, self._state_for(t, now)))
        nxt = min(nxt, self._next_down(now))
        self.update_metrics(tenants)
        return nxt

    def update_metrics(self, tenants) -> None:
        if self._metrics is not None:
            for t in tenants:
                self._metrics.tenant_updated(t.tenant, t.stats())

    # ---- the final Sync ----

    def begin_final(self) -> bool:
        """Shuts every tenant down and takes its final counters (every token returned, want 0),
        per route that has tenants; True when there is something to report (then send each
        request of next_final()), False when there is none or it was already done."""
        if self.shut_down:
            return False
        self.shut_down = True
        tenants = self._registry.snapshot()
        self._step = _StepState()
        self._finals = []
        self._final_error = None
        now = self._clock()
        for route, group in self._groups(tenants):
            route.pending = None
            if not group:
                continue
            entries = []
            for t in group:
                entry = budget_pb2.TenantSync()
                t.fill_final(now, entry)
                entries.append(entry)
            self._finals.append(_FinalRoute(route, entries, route.server_state))
        self._final_tenants = tenants
        return bool(self._finals)

    def next_final(self):
        """The next final request to send, as (address, request), or None when all are done.
        A request carries at most the route's limit of tenants (a new seq each, even with a
        request pending); only a route's last one has final=true (the server forgets the
        instance on it)."""
        for final in self._finals:
            left = len(final.entries) - final.done
            if left <= 0:
                continue
            n = left if final.chunk >= left else max(1, int(final.chunk))
            request = budget_pb2.SyncRequest(instance_id=self.instance_id,
                                             final=final.done + n == len(final.entries))
            self.seq += 1
            request.seq = self.seq
            request.tenants.extend(final.entries[final.done:final.done + n])
            final.sending = n
            self._final_now = final
            return final.route.address, request
        return None

    def final_wait_for_ready(self, address: Optional[str] = None) -> bool:
        # With the server known unreachable, fail fast rather than hold close() 3 x timeout.
        for final in self._finals:
            if final.route.address == address:
                return final.state != UNREACHABLE
        return True

    def end_final(self, outcome: Outcome, attempt: int) -> Optional[float]:
        """Takes the outcome of attempt number `attempt` (from 1) of the request next_final()
        gave; returns how long to wait before sending it again (same seq), or None when it is
        done (answered, refused as a whole, or FINAL_SYNC_ATTEMPTS attempts made): then call
        next_final() again."""
        if self._metrics is not None:
            self._metrics.sync_attempted(outcome.code is None)
        self.last_status = (None if outcome.code is None
                            else f"{outcome.code.name}: Sync to the budget server failed: "
                                 f"{outcome.details}")
        refused = outcome.code in _REQUEST_REFUSALS
        if outcome.code is not None and not refused and attempt < FINAL_SYNC_ATTEMPTS:
            return retry_backoff(attempt, self.policy)
        final, n = self._final_now, self._final_now.sending
        if refused and n > 1:
            # Split as a request of the refresher's (named limit kept, else halved); again.
            named = tenant_limit_in(outcome.details)
            if 0 < named < n:
                final.route.max_tenants_per_sync = named
            final.chunk = named if 0 < named < n else n // 2
            return None
        if outcome.code is not None and self._final_error is None:
            self._final_error = self.last_status
        # Unreachable: the rest of this route would fail too.
        final.done = final.done + n if outcome.code is None or refused else len(final.entries)
        return None

    def finish_final(self) -> None:
        self.last_status = self._final_error
        if self.last_status is not None:
            _log.error("retrybudget: final Sync failed; unspent tokens are forfeited: %s",
                       self.last_status)
        self.update_metrics(self._final_tenants)


@dataclass
class _FinalRoute:
    """One route's final requests: its tenants' final entries, how many were done."""
    route: _Route
    entries: list
    state: str  # the route's server state when the final Sync began
    done: int = 0
    sending: int = 0  # entries in the request being sent
    chunk: float = INFINITE_FUTURE

    def __post_init__(self):
        self.chunk = self.route.max_tenants_per_sync
